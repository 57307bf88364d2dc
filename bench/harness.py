"""Shared helpers for softdeploy's benchmarks: arguments, thread limits, raw onnxruntime sessions, markdown, the
report header, in-run yardsticks, the AVX2-against-function-body comparison and the emulated AVX2 CPU.

Conventions (all scripts):
  * every script runs as ``python -m bench.NAME [--threads 1,2] [--quick]`` from the repository root and prints
    markdown tables;
  * timings are the library's (softdeploy.compare.latency.time_batches_interleaved, re-exported here as
    ``bench_interleaved`` / ``quiet_bench``): MEDIANS over many interleaved rounds (peers of one configuration run
    in turn, A B C A B C ..., in a rotated order each round), so ratios between peers are measured in the same run
    and resist drift on a shared, noisy machine;
  * "1 thread" means torch.set_num_threads(1), ORT intra_op_num_threads=1, OpenBLAS limited to 1 via threadpoolctl.

Importing ``bench`` (which ``python -m bench.NAME`` does first) sets the thread pools' idle policy (bench/__init__.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench import SPIN as SPIN
from softdeploy.compare.environment import LoadMeter as LoadMeter
from softdeploy.compare.environment import background_load as background_load
from softdeploy.compare.environment import wait_quiet as _wait_quiet
from softdeploy.compare.latency import BatchTiming, time_batches_interleaved, time_batches_quietly

Timing = BatchTiming  # the scripts' name for the library's per-call timing

# ---------------------------------------------------------------------------------------------------------------------
# argument helpers


def int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def str_list(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def base_parser(desc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=desc, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--threads", type=int_list, default=[1, 2], help="thread counts to measure")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds per configuration (median taken)")
    p.add_argument("--batch-ms", type=float, default=20.0, help="target duration of one timed batch of calls")
    p.add_argument("--quick", action="store_true", help="fewer rounds / shapes, for smoke tests")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="before each block, wait up to this many seconds for other processes to go idle",
    )
    add_emulate_avx2(p)
    p.add_argument(
        "--tries",
        type=int,
        default=3,
        help="re-measure a configuration (up to this many times) when other processes used > 0.3 cores "
        "during it; the quietest try is kept and its background load printed",
    )
    return p


# ---------------------------------------------------------------------------------------------------------------------
# threads


@contextmanager
def threads(n: int):
    """Limit torch intra-op threads and OpenBLAS/OpenMP pools to n (ORT sessions take n explicitly)."""
    old_torch = None
    try:
        import torch

        old_torch = torch.get_num_threads()
        torch.set_num_threads(n)
    except ImportError:
        pass
    try:
        from threadpoolctl import threadpool_limits

        ctx = threadpool_limits(limits=n)
    except ImportError:  # numpy BLAS then uses its default (all cores)
        ctx = None
    try:
        yield
    finally:
        if ctx is not None:
            ctx.restore_original_limits()
        if old_torch is not None:
            import torch

            torch.set_num_threads(old_torch)


def build_cmake_library(source: Path, build: Path, name: str) -> Path:
    """Configures and builds a benchmark-only CMake project (bench/micro/<name>/: a custom-op library; CMake finds
    onnxruntime's headers as for the kernels) into ``build``; returns ``build/lib<name>.so``. Exits with CMake's
    output when a step fails."""
    import subprocess

    for cmd in (["cmake", "-S", str(source), "-B", str(build)], ["cmake", "--build", str(build)]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    return build / f"lib{name}.so"


def ort_session(
    model_bytes_or_path, n_threads: int, opt_level: str = "all", providers=None, library=None, disabled_optimizers=None
):
    """A raw onnxruntime session with the benchmarks' options; ``library``: a custom-op library to register;
    ``disabled_optimizers``: onnxruntime optimizers turned off (None: softdeploy's DISABLED_OPTIMIZERS, as its own
    sessions)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = n_threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }[opt_level]
    so.log_severity_level = 3
    if not SPIN:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if library is not None:
        so.register_custom_ops_library(str(library))
    from softdeploy.runtime.session import DISABLED_OPTIMIZERS  # as softdeploy's own sessions (measured slower)

    return ort.InferenceSession(
        model_bytes_or_path,
        so,
        providers=providers or ["CPUExecutionProvider"],
        disabled_optimizers=list(DISABLED_OPTIMIZERS if disabled_optimizers is None else disabled_optimizers),
    )


# ---------------------------------------------------------------------------------------------------------------------
# timing: the library's (softdeploy.compare.latency), in the scripts' units (batch_ms)


def bench_interleaved(
    fns: dict[str, Callable[[], object]], rounds: int = 15, batch_ms: float = 20.0, warmup_rounds: int = 1
) -> dict[str, Timing]:
    """Per-call seconds of several callables timed in turn (median over rounds): ``time_batches_interleaved``."""
    return time_batches_interleaved(fns, rounds=rounds, batch_seconds=batch_ms / 1e3, warmup_rounds=warmup_rounds)


def bench(fn: Callable[[], object], rounds: int = 15, batch_ms: float = 20.0) -> Timing:
    """One callable's per-call timing (:func:`bench_interleaved` of it alone)."""
    return bench_interleaved({"f": fn}, rounds, batch_ms)["f"]


def quiet_bench(
    fns: dict[str, Callable[[], object]],
    rounds: int = 15,
    batch_ms: float = 20.0,
    max_tries: int = 3,
    wait_s: float = 30.0,
    threshold: float = 0.3,
) -> tuple[dict[str, Timing], float]:
    """:func:`bench_interleaved`, re-measured while other processes were busy: ``time_batches_quietly``. Returns
    (timings of the quietest try, its background load in cores)."""
    return time_batches_quietly(
        fns, rounds=rounds, batch_seconds=batch_ms / 1e3, max_tries=max_tries, wait_seconds=wait_s, threshold=threshold
    )


def wait_quiet(max_wait_s: float = 60.0, threshold: float = 0.3) -> float:
    """Waits (up to max_wait_s) until other processes use less than ``threshold`` cores; returns the last reading."""
    return _wait_quiet(max_wait_s, threshold)


# ---------------------------------------------------------------------------------------------------------------------
# formatting


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_num(x: float | None, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if x != x:  # nan
        return "nan"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{nd}f}"


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    rows = [[str(c) for c in r] for r in rows]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def header(title: str) -> None:
    """Prints the report's title and environment: the library's description (softdeploy.compare.environment:
    CPU model, ISA flags, cores, package versions, the kernel variant the library runs), the thread-pool
    environment, whether the CPUID is emulated, and how timings are taken."""
    from softdeploy.compare.environment import environment

    env_info = environment(threads=0)
    versions = ", ".join(f"{name} {version}" for name, version in env_info["packages"].items() if version)
    env = {
        k: os.environ[k]
        for k in (
            "OPENBLAS_CORETYPE",
            "OPENBLAS_L2_SIZE",
            "OMP_NUM_THREADS",
            "OMP_WAIT_POLICY",
            "OPENBLAS_THREAD_TIMEOUT",
            "PERF_SPIN",
            "TVM_NUM_THREADS",
            "TVM_THREAD_POOL_SPIN_COUNT",
        )
        if k in os.environ
    }
    print(f"# {title}\n")
    print(
        f"- host: {env_info['cpu']}, {env_info['cores']} logical CPUs, python {platform.python_version()}; {versions}"
    )
    variant = env_info["softdeploy_kernels"] or "no library"
    print(f"- CPU flags: {' '.join(env_info['isa'])}; softdeploy kernel variant: {variant}")
    print(
        f"- env: {env}; idle spinning of thread pools {'ON (PERF_SPIN=1)' if SPIN else 'OFF (see bench/__init__.py)'}"
    )
    print(f"- {cpuid_note()}")
    print(
        "- timing: median per call over interleaved rounds; spread = IQR/median; bg load = CPU cores used by other "
        "processes DURING the measurement (shared machine; a configuration is re-measured while it is > 0.3)\n"
    )
    sys.stdout.flush()


def sync_print(*a, **k):
    print(*a, **k)
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------------------------------------
# in-run yardsticks (so that ratios vs physical limits are measured in the same process/run)


def stream_yardsticks(n_threads: int, mbytes: int = 256, rounds: int = 9) -> dict[str, float]:
    """DRAM-resident copy and read bandwidth with torch (which is OpenMP-parallel): GB/s, STREAM counting
    (copy counts read+write bytes, no write-allocate)."""
    import torch

    n = mbytes * (1 << 20) // 4
    a = torch.ones(n, dtype=torch.float32)
    b = torch.empty_like(a)
    with threads(n_threads):
        t, bg = quiet_bench({"copy": lambda: b.copy_(a), "read": lambda: torch.amax(a)}, rounds=rounds, batch_ms=1)
    return {"copy_GBs": 2 * n * 4 / t["copy"].median / 1e9, "read_GBs": n * 4 / t["read"].median / 1e9, "bg": bg}


# ---------------------------------------------------------------------------------------------------------------------
# issue 13's floor: "no op's AVX2 variant slower than the same op's function body in stock onnxruntime at any
# benchmarked shape (the benchmark prints that comparison)". Every op's benchmark times the two peers below in the
# same interleaved rounds as its others and prints body time / AVX2 time per shape, then the shapes where it is < 1.
# (On an AVX-512 host onnxruntime's MLAS inside the body still uses AVX-512: the comparison is then conservative.)

AVX2_PEER = "avx2"


def avx2_variant() -> str:
    """What the kernel library runs under SOFTDEPLOY_ISA=avx2 (it may be lower on a CPU without AVX2)."""
    from softdeploy.conformance import forced_isa
    from softdeploy.runtime import library_status

    with forced_isa("avx2"):
        info = library_status().info
    return info.isa_summary() if info else "no library"


def avx2_session(model, n_threads: int):
    """A softdeploy Session of ``model`` with the kernel library, its kernels created under SOFTDEPLOY_ISA=avx2
    (kernels read it once, at session creation)."""
    from softdeploy.conformance import forced_isa
    from softdeploy.runtime import Session

    with forced_isa("avx2"):
        return Session(model, kernels="native", threads=n_threads)


def body_session(model, n_threads: int):
    """A softdeploy Session of ``model`` without the kernel library: stock onnxruntime runs the op's function body."""
    from softdeploy.runtime import Session

    return Session(model, kernels="portable", threads=n_threads)


class Avx2VsBody:
    """The AVX2-vs-function-body comparison of one benchmark: ``add`` one measured shape (median seconds of the
    op's function body in stock onnxruntime and of its AVX2 variant, same interleaved rounds) and get the table
    cell; ``print_summary`` prints the floor's verdict and every shape where the AVX2 variant loses."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.rows: list[tuple[str, float]] = []

    def add(self, label: str, body_s: float, avx2_s: float) -> str:
        """Records body_s / avx2_s for ``label``; returns it formatted ("2.31x", "0.85x LOSES" below 1)."""
        ratio = body_s / avx2_s
        self.rows.append((label, ratio))
        return f"{ratio:.2f}x" + (" LOSES" if ratio < 1.0 else "")

    @staticmethod
    def print_variant() -> None:
        """The header line naming the AVX2 peer's kernel variant."""
        sync_print(f"- AVX2 peer `{AVX2_PEER}`: the native kernel under SOFTDEPLOY_ISA=avx2, variant: {avx2_variant()}")

    def print_summary(self) -> None:
        """Issue 13's floor over every shape added: the smallest ratio, and each shape where AVX2 loses."""
        if not self.rows:
            return
        lost = [(label, r) for label, r in self.rows if r < 1.0]
        worst = min(self.rows, key=lambda row: row[1])
        sync_print(
            f"\nFloor (issue 13): {self.op}'s AVX2 variant not slower than its function body in stock onnxruntime "
            f"at any benchmarked shape: {'MET' if not lost else 'NOT MET'} ({len(self.rows)} shapes; smallest "
            f"body/avx2 {worst[1]:.2f}x at {worst[0]})"
        )
        for label, r in lost:
            sync_print(f"- AVX2 loses at {label}: body/avx2 {r:.2f}x")


# ---------------------------------------------------------------------------------------------------------------------
# an AVX2-only CPU without VNNI, on this host (bench/cpuid_avx2.c)

CPUID_ENV = "SOFTDEPLOY_BENCH_CPUID"  # "avx2" in a process re-executed under the shim


def emulate_avx2(cpu: str = "avx2") -> None:
    """Re-execute this benchmark (same interpreter, same arguments) with every library in it seeing an AVX2-only CPU
    without VNNI: bench/cpuid_avx2.c, built here with gcc, preloaded (CPUID faulting; the AVX-512 and VNNI bits
    cleared). onnxruntime's MLAS, numpy, torch and softdeploy's kernels then run their AVX2 paths on this core.
    ``cpu="no-vnni"``: only the VNNI bits cleared (SD_CPUID_MASK=vnni), an AVX-512 CPU without VNNI (Skylake-SP),
    whose MLAS int8 kernel is the 64-byte vpmaddubsw one. In the re-executed process this returns once it has
    checked that the shim is active. Exits with a message where gcc is missing or the host cannot fault CPUID."""
    import ctypes
    import subprocess
    import tempfile

    if os.environ.get(CPUID_ENV) in ("avx2", "no-vnni"):
        try:
            active = ctypes.CDLL(None).cpuid_avx2_active()
        except AttributeError:
            active = 0
        if active != 1:
            raise SystemExit("--emulate-avx2: the CPUID shim is not loaded in the re-executed process")
        # Only this process is emulated: the programs it starts (the compilers of bench/micro's helpers) see the
        # host's CPUID, as they would build for it.
        rest = [x for x in os.environ.get("LD_PRELOAD", "").split() if not x.endswith("/cpuid_avx2.so")]
        if rest:
            os.environ["LD_PRELOAD"] = " ".join(rest)
        else:
            os.environ.pop("LD_PRELOAD", None)
        return
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpuid_avx2.c")
    out = os.path.join(tempfile.mkdtemp(prefix="softdeploy-cpuid-"), "cpuid_avx2.so")
    try:
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", src, "-o", out, "-ldl"], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"--emulate-avx2: cannot build {src} with gcc: {e}") from None
    preload = " ".join(x for x in (out, os.environ.get("LD_PRELOAD", "")) if x)
    env = dict(os.environ, LD_PRELOAD=preload, **{CPUID_ENV: cpu})
    if cpu == "no-vnni":
        env["SD_CPUID_MASK"] = "vnni"
    sys.stdout.flush()
    main_spec = getattr(sys.modules["__main__"], "__spec__", None)
    # `python -m bench.NAME` again (its imports need the repository root as the working folder's sys.path entry)
    argv = ["-m", main_spec.name, *sys.argv[1:]] if main_spec is not None else sys.argv
    os.execve(sys.executable, [sys.executable, *argv], env)


class _EmulateAvx2(argparse.Action):
    """--emulate-avx2: re-executes the script under the CPUID shim while the arguments are parsed."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True)
        emulate_avx2()


class _EmulateNoVnni(argparse.Action):
    """--emulate-no-vnni: re-executes the script under the CPUID shim, only the VNNI bits hidden."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True)
        emulate_avx2("no-vnni")


def add_emulate_avx2(p: argparse.ArgumentParser) -> None:
    """The --emulate-avx2 and --emulate-no-vnni flags (see :func:`emulate_avx2`); base_parser has them."""
    p.add_argument(
        "--emulate-avx2",
        action=_EmulateAvx2,
        nargs=0,
        default=False,
        help="rerun with every library seeing an AVX2-only CPU without VNNI (bench/cpuid_avx2.c): onnxruntime, numpy "
        "and torch then run their AVX2 (non-VNNI) kernels too",
    )
    p.add_argument(
        "--emulate-no-vnni",
        action=_EmulateNoVnni,
        nargs=0,
        default=False,
        help="rerun with every library seeing an AVX-512 CPU without VNNI (bench/cpuid_avx2.c, SD_CPUID_MASK=vnni): "
        "onnxruntime's int8 then runs its 64-byte vpmaddubsw kernel",
    )


def cpuid_note() -> str:
    """One line for a report's header: whether this process sees the host's CPUID or the emulated AVX2 CPU."""
    if os.environ.get(CPUID_ENV) == "avx2":
        return (
            "CPUID: an AVX2-only CPU without VNNI, emulated on this host (bench/cpuid_avx2.c: AVX-512 and VNNI bits "
            "cleared for every library; the instruction set of such a CPU, the microarchitecture of this one)"
        )
    if os.environ.get(CPUID_ENV) == "no-vnni":
        return (
            "CPUID: an AVX-512 CPU without VNNI, emulated on this host (bench/cpuid_avx2.c with SD_CPUID_MASK=vnni: "
            "only the VNNI bits cleared for every library)"
        )
    return "CPUID: the host's"
