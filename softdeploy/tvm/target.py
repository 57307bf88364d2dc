"""The TVM target for this machine (or a named CPU), as a dict: TVM 0.27 rejects string targets."""

from __future__ import annotations

import os
import platform
from typing import Any

from softdeploy.cpu import ISA_FEATURES
from softdeploy.tvm import SUPPORTED_TVM
from softdeploy.tvm.errors import TVMNotInstalledError


def import_tvm() -> Any:
    """``import tvm``, with a clear error when it is missing or not the version the backend is written for.

    Also sizes TVM's thread pool when the user has not (neither TVM_NUM_THREADS nor OMP_NUM_THREADS
    set): to the physical cores. TVM reads the variable when it first runs a parallel kernel. Left to
    its own default, every kernel ran ~1.8x slower on a 2-core host at any ``set_threads`` (bench/results/tvm_ops.md)."""
    if "TVM_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = str(physical_cores())
    try:
        import tvm
    except ImportError as e:
        raise TVMNotInstalledError(
            f'the TVM backend needs apache-tvm {SUPPORTED_TVM}: pip install ".[tvm]" in the softdeploy checkout '
            '(or pip install "apache-tvm==0.27.0.post1" "apache-tvm-ffi==0.1.14.post0" psutil); '
            f"import failed: {e}"
        ) from e
    if not tvm.__version__.startswith(SUPPORTED_TVM):
        raise TVMNotInstalledError(
            f"the TVM backend is written for apache-tvm {SUPPORTED_TVM}.x (renamed APIs, private importer "
            f"map); found {tvm.__version__}"
        )
    return tvm


def physical_cores() -> int:
    """Physical cores (psutil; all logical CPUs where it is missing): the size of TVM's thread pool unless
    TVM_NUM_THREADS or OMP_NUM_THREADS says otherwise (TVM's own default ran kernels ~1.8x slower on a 2-core host)."""
    try:
        import psutil

        return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)
    except ImportError:
        return os.cpu_count() or 1


def host_target(mcpu: str | None = None, num_cores: int | None = None) -> dict[str, Any]:
    """LLVM target for this CPU. ``mcpu`` defaults to LLVM's name of the host CPU (``mcpu=native`` is
    rejected by TVM 0.27); the triple is set explicitly because the wheel's default is its build's
    (x86_64-conda-linux-gnu)."""
    import_tvm()
    from tvm.target import codegen

    cpu = mcpu or str(codegen.llvm_get_system_cpu())
    if not codegen.llvm_is_valid_cpu(cpu, ""):  # an empty triple means the host's
        raise ValueError(f"LLVM does not know the CPU {cpu!r}")
    machine = platform.machine() or "x86_64"
    triple = {"Linux": f"{machine}-linux-gnu", "Darwin": f"{machine}-apple-darwin"}.get(platform.system())
    target: dict[str, Any] = {"kind": "llvm", "mcpu": cpu, "num-cores": num_cores or physical_cores()}
    if triple:
        target["mtriple"] = triple
    return target


def make_target(spec: dict[str, Any] | None = None) -> Any:
    """A tvm.target.Target from ``spec`` (default: this host's CPU, see host_target)."""
    tvm = import_tvm()
    return tvm.target.Target(spec or host_target())


def target_has(features: tuple[str, ...] | list[str]) -> bool:
    """Whether the current TVM target (``with make_target(...)``) generates code for a CPU with every one of LLVM's
    ``features`` ("avx512f", "avxvnni", ...): False outside a target context and for a target that is not LLVM x86;
    True for no features. What the hand schedules ask to choose their tile and instructions."""
    if not features:
        return True
    from tvm.target import Target, codegen

    target = Target.current(allow_none=True)
    if target is None:
        return False
    try:
        return bool(codegen.llvm_cpu_has_features(list(features), target))
    except Exception:  # not an LLVM x86 target
        return False


# Tuning records are measured schedules: what is fastest depends on the vector width and the number of
# vector registers (AVX-512: 32 x 512 bit; AVX2: 16 x 256 bit), so records tuned for one class are not
# applied to a target of another (znver4's records on a znver3 target ran MiniLM at 1.89x
# onnxruntime's time, against 1.07x on znver4). The classes are the native kernels' variants (avx512 = F, BW, VL,
# DQ; avx2 = AVX2 + FMA), LLVM's -mcpu names of common x86-64 CPUs mapped to them so that no LLVM is
# needed to read the table (LLVM 22's names: Kaby/Coffee/Comet Lake are "skylake" there); other names are
# asked of LLVM (llvm_cpu_has_features). tests/tvm_backend/test_records.py checks the table against LLVM.
RECORD_CLASS_FEATURES: dict[str, tuple[str, ...]] = {
    isa: tuple(sorted(ISA_FEATURES[isa])) for isa in ("avx512", "avx2")
}  # the kernels' one ISA rule (softdeploy.cpu), as LLVM feature names
MCPU_RECORD_CLASS: dict[str, str] = {
    **dict.fromkeys(
        (
            "znver4",
            "znver5",
            "skylake-avx512",
            "cascadelake",
            "cooperlake",
            "cannonlake",
            "icelake-client",
            "icelake-server",
            "tigerlake",
            "rocketlake",
            "sapphirerapids",
            "emeraldrapids",
            "graniterapids",
            "graniterapids-d",
            "x86-64-v4",
        ),
        "avx512",
    ),
    **dict.fromkeys(
        (
            "haswell",
            "broadwell",
            "skylake",
            "alderlake",
            "raptorlake",
            "meteorlake",
            "arrowlake",
            "arrowlake-s",
            "lunarlake",
            "gracemont",
            "sierraforest",
            "grandridge",
            "znver1",
            "znver2",
            "znver3",
            "x86-64-v3",
        ),
        "avx2",
    ),
}


def record_class(spec: dict[str, Any]) -> str | None:
    """The tuning-record class (``"avx512"`` or ``"avx2"``, see :data:`RECORD_CLASS_FEATURES`) of the
    CPU that target ``spec`` generates code for, or None when it is neither (an older x86-64, another
    architecture): such a target gets no shipped records. Known ``mcpu`` names are looked up in
    :data:`MCPU_RECORD_CLASS`; other names, and any target with ``mattr`` (which can switch features
    on or off), are asked of LLVM."""
    if spec.get("kind", "llvm") != "llvm":
        return None
    triple = str(spec.get("mtriple", "") or platform.machine())
    if not triple.startswith(("x86_64", "amd64", "AMD64")):
        return None
    mcpu = str(spec.get("mcpu", ""))
    if mcpu in MCPU_RECORD_CLASS and not spec.get("mattr"):
        return MCPU_RECORD_CLASS[mcpu]
    import_tvm()
    from tvm.target import codegen

    target = make_target(spec)
    for name, features in RECORD_CLASS_FEATURES.items():  # widest first
        if codegen.llvm_cpu_has_features(list(features), target):
            return name
    return None
