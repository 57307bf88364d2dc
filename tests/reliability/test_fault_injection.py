"""Fault injection for the commands that write: ``softdeploy quantize``, ``optimize``, ``export``, ``compare``, ``run``,
``distill`` and ``demo`` run in a child (``python -m softdeploy.cli``, the tree under test first on PYTHONPATH) that is
killed (SIGKILL) or interrupted (SIGINT) at seeded random moments, killed inside a write (SIGXFSZ at a file size
limit), runs into a full disk (RLIMIT_FSIZE: Python ignores SIGXFSZ, so the write fails with EFBIG as it would with
ENOSPC) or writes into a read-only folder -- over a previous result, or an empty one where the command's own folders
(compare's and run's results folder, distill's OUT, demo's --out) cannot be made.

Afterwards every output's final name holds the complete previous result or the complete new one -- never a partial
file, which the next run would refuse as an existing result ("pass --overwrite") or take for a result (compare and run
replace their reports without asking) -- and a rerun succeeds and leaves no temporary file behind. Whole is judged per
type: an ONNX model loads, JSON parses, Markdown ends in a newline, a CSV table parses with a trailing newline, a PNG
runs from its signature to its IEND chunk, safetensors' ``safe_open`` reads the file. A write that fails is one line
naming the output (or the folder that could not be made), exit code 2. The faults of one command run side by side,
each in its own folder, to keep the file quick; the slower commands get fewer faults (compare's cover the write
failures of the path it shares with run).

TVM's compile is not run here (an untuned compile of the tiny model took 27 s on a loaded 2-core machine): its save
path, compare's reports and the up-front checks of every command (folders, hard links to an input) are tested
directly, without a child."""

from __future__ import annotations

import csv
import ctypes
import dataclasses
import io
import json
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from quant.tiny import mlp_with_custom_op

import softdeploy
from softdeploy.errors import OutputError, OverwriteError
from softdeploy.files import load_model

ROOT = Path(softdeploy.__file__).resolve().parents[1]
SIZE_LIMIT = 4096  # bytes: below every model written here (the smallest, export's, is ~18 KB)
_PR_CAPBSET_DROP = 24  # prctl option (linux/prctl.h)
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2  # linux/capability.h


# ---- the child -------------------------------------------------------------------------------------------------


def _env(logs: Path) -> dict[str, str]:
    path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)
    return {**os.environ, "PYTHONPATH": path, "SOFTDEPLOY_LOG_DIR": str(logs)}


def _size_limit() -> None:
    """preexec_fn: a file size limit in the child (a full disk for every file it writes)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (SIZE_LIMIT, SIZE_LIMIT))


def _without_root_override() -> None:
    """preexec_fn: permission bits bind the child even when it runs as root (as CI does). Dropping to another user is
    not an option here -- the interpreter may live under /root, which only root may enter -- so root keeps its uid and
    loses the capabilities that override file permissions (from its bounding set, which survives exec)."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


# SIGXFSZ back to its default action (Python ignores it): the child dies inside the write that crosses the limit
_DIE_IN_WRITE = (
    "import signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n"
    "from softdeploy.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@dataclasses.dataclass
class Fault:
    """One run of a command under one fault, in a folder of its own."""

    name: str
    previous: bool  # the outputs hold a complete previous result before the run (and --overwrite is given)
    signal: int | None = None  # sent after ``delay`` seconds ...
    delay: float = 0.0
    after_start: bool = False  # ... counted from the moment the command's work begins (see _started)
    preexec: Callable[[], None] | None = None
    die_in_write: bool = False
    read_only: bool = False
    folder: Path = Path()
    returncode: int = 0
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""


@dataclasses.dataclass
class Command:
    """A writing command: its arguments for an output folder, and its outputs there (paths relative to it)."""

    args: Callable[[Path], list[str]]
    outputs: list[str]
    overwrite: bool = True  # whether its runs over a previous result pass --overwrite (compare and run have none)
    finished: str = "wrote "  # what its stdout says once its outputs are written
    also: list[str] = dataclasses.field(default_factory=list)  # files it writes on the way (a write error may name one)


def _started(pid: int, logs: Path) -> bool:
    """Whether the child runs its command: it opens its log (``VERB-TIME-PID[-N].log``) as the command's work begins,
    past the interpreter's start-up and the argument parsing."""
    return any(logs.glob(f"*-{pid}.log")) or any(logs.glob(f"*-{pid}-*.log"))


def _run(command: Command, fault: Fault, logs: Path) -> None:
    argv = [*command.args(fault.folder), *(["--overwrite"] if fault.previous and command.overwrite else [])]
    cmd = (
        [sys.executable, "-c", _DIE_IN_WRITE, *argv]
        if fault.die_in_write
        else [sys.executable, "-m", "softdeploy.cli", *argv]
    )
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=fault.folder.parent,
        env=_env(logs),
        preexec_fn=fault.preexec,
    )
    if fault.signal is not None:
        if fault.after_start:
            deadline = time.monotonic() + 120
            while proc.poll() is None and not _started(proc.pid, logs) and time.monotonic() < deadline:
                time.sleep(0.02)
        time.sleep(fault.delay)
        if proc.poll() is None:
            proc.send_signal(fault.signal)
    fault.stdout, fault.stderr = proc.communicate(timeout=300)
    fault.returncode = proc.returncode
    fault.seconds = time.monotonic() - t0


# ---- what must hold afterwards -----------------------------------------------------------------------------------

PREVIOUS_JSON = b'{"previous": "a complete report"}\n'
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk: no data, then its CRC


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _previous_file(name: str, model: bytes) -> bytes:
    """A complete previous file of ``name``'s type: an ONNX model, a JSON document, a Markdown report, a CSV table, a
    PNG image (one grey pixel) or a safetensors file."""
    suffix = Path(name).suffix
    if suffix == ".json":
        return PREVIOUS_JSON
    if suffix == ".md":
        return b"# previous report\n\nA complete previous report.\n"
    if suffix == ".csv":
        return b"variant,previous\nort-fp32,1\n"
    if suffix == ".png":
        header = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
        return PNG_SIGNATURE + header + _png_chunk(b"IDAT", zlib.compress(b"\x00\x80")) + _png_chunk(b"IEND", b"")
    if suffix == ".safetensors":
        from safetensors.numpy import save

        return save({"previous": np.zeros(4, np.float32)}, metadata={"previous": "a complete student"})
    assert suffix == ".onnx", name
    return model


def _previous(folder: Path, command: Command, model: bytes) -> dict[str, bytes]:
    """Puts a complete previous result under every output name (its folders made); returns it by name."""
    folder.mkdir()
    made = {}
    for name in command.outputs:
        made[name] = _previous_file(name, model)
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(made[name])
    return made


def _whole(path: Path) -> None:
    """The file is a complete result of its type: a loadable ONNX model (its top level all there), a JSON document,
    Markdown text ending in a newline, a CSV table with a header and a trailing newline, a PNG image from its
    signature to its IEND chunk, a safetensors file whose header and tensors the file holds; else this raises."""
    suffix = path.suffix
    if suffix == ".json":
        json.loads(path.read_text())
    elif suffix == ".md":
        text = path.read_text(encoding="utf-8")
        assert text.strip() and text.endswith("\n"), f"{path}: a report cut short ({len(text)} chars)"
    elif suffix == ".csv":
        text = path.read_text(encoding="utf-8")
        rows = list(csv.reader(io.StringIO(text)))
        assert text.endswith("\n") and len(rows) >= 2, f"{path}: a table cut short ({len(text)} chars)"
        assert all(len(r) == len(rows[0]) for r in rows), f"{path}: rows of unequal length (a table cut short)"
    elif suffix == ".png":
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and data.endswith(PNG_END), f"{path}: not a whole PNG image"
    elif suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:  # checks that the file holds every tensor its header names
            assert list(f.keys()), f"{path}: no tensors"
    else:
        load_model(path)


def _check_outputs(command: Command, fault: Fault, previous: dict[str, bytes]) -> None:
    """Every output's name holds the complete previous file or a complete new one (or, without a previous result,
    nothing)."""
    for name in command.outputs:
        path = fault.folder / name
        if not path.exists():
            assert not previous, f"{fault.name}: the previous {name} is gone"
            continue
        if previous and path.read_bytes() == previous[name]:
            continue
        _whole(path)  # the complete new result, or this raises naming the partial file


_LEFTOVERS = (".partial-", ".fp32-export-")  # atomic_output's temporary files, compare's private export folders


def _partials(folder: Path) -> list[str]:
    """The temporary files (and export folders) under ``folder``, at any depth."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if any(x in p.name for x in _LEFTOVERS))


def _one_line(stderr: str) -> str:
    """The error line; every line the CLI printed is its own ``softdeploy: ...`` (the log note may precede it)."""
    lines = stderr.strip().splitlines()
    assert lines and all(line.startswith("softdeploy: ") for line in lines), stderr
    assert "Traceback" not in stderr, stderr
    return lines[-1]


def _faults(
    seed: int,
    slow: float,
    work: float,
    *,
    fresh: bool = True,
    die_in_write: bool = True,
    full_disk: bool = True,
    read_only: bool = True,
    read_only_fresh: bool = False,
    after_start: bool = True,
) -> list[Fault]:
    """The faults of one command: SIGKILL at a random moment once the command's work begins, over a previous result
    (and with ``fresh`` at a random moment from its start, into an empty folder), SIGINT at a random moment once the
    work begins, with ``die_in_write`` death inside the write that crosses a file size limit, with ``full_disk`` a full
    disk, with ``read_only`` a read-only folder over a previous result, with ``read_only_fresh`` an empty read-only
    folder (the command's own folders cannot be made). ``slow``: about how long the command takes here, seconds;
    ``work``: how long of it after its work begins (the random moments spread over these). ``after_start`` False:
    the moments of SIGKILL and SIGINT count from the process's start (a command that opens no log as its work
    begins; see _started), from 0.3 s to ``work``."""
    rng = random.Random(seed)
    start = 0.0 if after_start else 0.3
    return [
        *(
            [Fault("sigkill-fresh", previous=False, signal=signal.SIGKILL, delay=rng.uniform(0.3, slow))]
            if fresh
            else []
        ),
        Fault("sigkill", previous=True, signal=signal.SIGKILL, delay=rng.uniform(start, work), after_start=after_start),
        Fault("sigint", previous=True, signal=signal.SIGINT, delay=rng.uniform(start, work), after_start=after_start),
        *([Fault("die-in-write", previous=True, preexec=_size_limit, die_in_write=True)] if die_in_write else []),
        *([Fault("full-disk", previous=True, preexec=_size_limit)] if full_disk else []),
        *([Fault("read-only", previous=True, preexec=_without_root_override, read_only=True)] if read_only else []),
        *(
            [Fault("read-only-fresh", previous=False, preexec=_without_root_override, read_only=True)]
            if read_only_fresh
            else []
        ),
    ]


@pytest.fixture
def top() -> Iterator[Path]:
    # a folder of its own outside pytest's tmp_path, so that a read-only folder in it can be made writable again
    folder = Path(tempfile.mkdtemp(prefix="softdeploy-faults-"))
    try:
        yield folder
    finally:
        for p in folder.rglob("*"):
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(folder, ignore_errors=True)


def _inject(command: Command, top: Path, previous_model: bytes, faults: list[Fault]) -> None:
    """Runs every fault of ``command`` side by side, checks the outputs after each, then reruns where SIGKILL ended
    the command and checks that the rerun succeeds and leaves no temporary file."""
    logs = top / "logs"
    logs.mkdir()
    before: dict[str, dict[str, bytes]] = {}
    for fault in faults:
        fault.folder = top / fault.name
        if fault.previous:
            before[fault.name] = _previous(fault.folder, command, previous_model)
        else:
            fault.folder.mkdir()
        if fault.read_only:  # the folder and every folder in it: nothing can be made or replaced there
            for folder in [fault.folder, *(p for p in fault.folder.rglob("*") if p.is_dir())]:
                folder.chmod(0o555)
    with ThreadPoolExecutor(len(faults)) as pool:
        list(pool.map(lambda f: _run(command, f, logs), faults))

    for fault in faults:
        previous = before.get(fault.name, {})
        what = f"{fault.name}: rc {fault.returncode} after {fault.seconds:.1f} s, stderr {fault.stderr[-600:]!r}"
        _check_outputs(command, fault, previous)
        for name in command.outputs:  # no temporary file under a final name, ever
            assert ".partial-" not in (fault.folder / name).resolve().name
        if fault.signal == signal.SIGKILL:
            assert fault.returncode in (0, -signal.SIGKILL), what
        elif fault.signal == signal.SIGINT:
            # it may have finished first: Python restores SIGINT's default action as it exits, and the signal then
            # ends the process (-SIGINT) once the command has written its outputs and said so
            said = command.finished in fault.stdout
            finished = fault.returncode == 0 or (fault.returncode == -signal.SIGINT and said)
            if not finished:
                assert fault.returncode == 130, what
                assert fault.stderr.strip().splitlines() == ["softdeploy: interrupted"], what
            assert _partials(fault.folder) == [], what
        elif fault.die_in_write:
            assert fault.returncode == -signal.SIGXFSZ, what
            for name in command.outputs:
                assert (fault.folder / name).read_bytes() == previous[name], what
        else:
            reason = "Permission denied" if fault.read_only else "File too large"
            assert fault.returncode == 2, what
            line = _one_line(fault.stderr)
            assert line.startswith("softdeploy: error: ") and f"cannot be written: {reason}" in line, what
            if previous:
                named = [*command.outputs, *command.also]
                assert any(f" {fault.folder / name}: " in line for name in named), what  # the output's name
            else:  # the folder of an output that could not be made
                assert any(f" {fault.folder / name}: " in line for name in _folders(command)), what
            for name in command.outputs:
                if previous:
                    assert (fault.folder / name).read_bytes() == previous[name], what
                else:
                    assert not (fault.folder / name).exists(), what
            assert _partials(fault.folder) == [], what

    # the reruns: a killed run's leftovers are neither taken for a result nor kept
    reruns = [f for f in faults if f.signal == signal.SIGKILL]
    for fault in reruns:
        done = any((fault.folder / name).exists() for name in command.outputs)
        fault.previous = done  # --overwrite only where a file is there (a previous one, or the killed run's whole one)
        fault.signal, fault.preexec, fault.die_in_write = None, None, False
    with ThreadPoolExecutor(len(reruns)) as pool:
        list(pool.map(lambda f: _run(command, f, logs), reruns))
    for fault in reruns:
        assert fault.returncode == 0, f"rerun after {fault.name}: {fault.stderr[-600:]}"
        for name in command.outputs:
            _whole(fault.folder / name)
        assert _partials(fault.folder) == [], fault.name


def _folders(command: Command) -> list[str]:
    """The folders of the command's outputs, relative to the fault's folder (``a/b/c.md``: ``a``, ``a/b``)."""
    return sorted({str(p) for name in command.outputs for p in Path(name).parents if str(p) != "."})


@pytest.fixture
def inputs(top: Path) -> Path:
    """The inputs every fault's run reads (a folder the read-only runs may read): a tiny ONNX model and a torch
    factory; for compare and run a tiny model with an outlier and its data (as tests/workflow/test_rerun.py's)."""
    import onnx

    folder = top / "inputs"
    folder.mkdir()
    onnx.save(mlp_with_custom_op(with_function=True), folder / "tiny.onnx")
    onnx.save(mlp_with_custom_op(with_function=True, outlier=200.0), folder / "m.onnx")
    np.savez(folder / "x.npz", X=np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32))
    (folder / "factory.py").write_text(
        "import torch\n"
        "from softdeploy.ops._torch import register_torch_ops\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(64, 64)\n"
        "    def forward(self, x):\n"
        "        register_torch_ops()\n"
        "        return torch.ops.softdeploy.two_pass_softmax(self.fc(x), axis=-1)\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return M(), (torch.randn(3, 64),)\n"
    )
    return folder


def test_quantize_under_faults(top: Path, inputs: Path) -> None:
    model = inputs / "tiny.onnx"
    command = Command(lambda out: ["quantize", str(model), "-o", str(out / "q.onnx")], ["q.onnx", "q.json"])
    # no death inside a write: the first write to cross a limit is the quantizer's copy of its input in a temporary
    # folder (the quantized model is the smaller file), which the full disk covers already
    _inject(command, top, model.read_bytes(), _faults(seed=1, slow=4.0, work=0.15, die_in_write=False))


@pytest.mark.slow
def test_optimize_under_faults(top: Path, inputs: Path) -> None:
    model = inputs / "tiny.onnx"
    command = Command(lambda out: ["optimize", str(model), str(out / "o.onnx")], ["o.onnx"])
    _inject(command, top, model.read_bytes(), _faults(seed=2, slow=4.0, work=0.3))


@pytest.mark.slow
def test_export_under_faults(top: Path, inputs: Path) -> None:
    factory = f"{inputs / 'factory.py'}:make"
    command = Command(lambda out: ["export", factory, str(out / "e.onnx"), "--no-validate"], ["e.onnx"])
    # the slowest command: no separate kill into an empty folder (quantize's and optimize's cover that path)
    _inject(command, top, (inputs / "tiny.onnx").read_bytes(), _faults(seed=3, slow=10.0, work=4.0, fresh=False))


REPORTS = ["report.md", "results.csv", "results.json", "accuracy_vs_latency.png"]


@pytest.mark.slow
def test_compare_under_faults(top: Path, inputs: Path) -> None:
    model, data = inputs / "m.onnx", inputs / "x.npz"
    outputs = [*(f"m/{r}" for r in REPORTS), "m/models/fp32.onnx", "m/models/int8_dynamic.onnx"]
    variants = ["--variants", "ort-fp32,ort-int8-dynamic"]
    command = Command(
        lambda out: ["compare", str(model), "--data", str(data), "--quick", *variants, "--out", str(out)],
        outputs,
        overwrite=False,  # compare replaces its reports and models without asking
        finished="reports in ",
    )
    # no death inside a write: the first write to cross the limit is the private copy of the fp32 export, which the
    # full disk covers already
    faults = _faults(seed=4, slow=10.0, work=6.0, die_in_write=False, read_only_fresh=True)
    _inject(command, top, model.read_bytes(), faults)


@pytest.mark.slow
def test_run_under_faults(top: Path, inputs: Path) -> None:
    model, data = inputs / "m.onnx", inputs / "x.npz"

    def workflow(out: Path) -> Path:  # one per fault, in the inputs folder (the read-only runs' folder is theirs)
        path = inputs / f"workflow-{out.name}.json"
        spec = {
            "name": "wf",
            "model": str(model),
            "data": {"inputs": str(data)},
            "variants": ["ort-fp32", "ort-int8-dynamic"],
            "quantize": {"mode": "dynamic", "max_drop": 0.5},  # the budget search and budget.json
            "rounds": 1,
            "out": str(out),
        }
        path.write_text(json.dumps(spec))
        return path

    models = ["fp32.onnx", "int8_dynamic.onnx", "int8_dynamic_budget.onnx"]
    outputs = [*(f"wf/{r}" for r in [*REPORTS, "budget.json"]), *(f"wf/models/{m}" for m in models)]
    command = Command(
        lambda out: ["run", str(workflow(out)), "--quick"], outputs, overwrite=False, finished="reports in "
    )
    # compare's faults cover the write failures and the kill into an empty folder of the shared path: here a kill and
    # an interrupt over a previous result (the budget search, budget.json), and a folder that cannot be made
    faults = _faults(
        seed=5,
        slow=12.0,
        work=8.0,
        fresh=False,
        die_in_write=False,
        full_disk=False,
        read_only=False,
        read_only_fresh=True,
    )
    _inject(command, top, model.read_bytes(), faults)


# the smallest real distillation (tests/test_cli_distill.py's QUICK)
DISTILL_QUICK = ["--steps", "2", "--batch-size", "4", "--limit-texts", "8", "--max-length", "16", "--extra-count", "6"]


@pytest.mark.slow
def test_distill_under_faults(top: Path, inputs: Path) -> None:
    command = Command(
        lambda out: ["distill", str(out / "run"), *DISTILL_QUICK],
        ["run/student.safetensors", "run/distill.json"],
        also=["run/checkpoints/oneshot.safetensors"],  # the resume state, written as the training ends
    )
    # the write failures come after the training: a full disk over a previous result (the checkpoint is the first
    # write to fail), and a folder that cannot be made (before the teacher is loaded) stand for them
    faults = _faults(
        seed=6, slow=20.0, work=12.0, fresh=False, die_in_write=False, read_only=False, read_only_fresh=True
    )
    _inject(command, top, b"", faults)


@pytest.mark.slow
def test_demo_under_faults(top: Path, inputs: Path) -> None:
    from softdeploy.demo import MODEL_FILE

    command = Command(
        lambda out: ["demo", "--out", str(out / "demo")], [f"demo/{MODEL_FILE}"], finished="softdeploy demo:"
    )
    # demo opens no log as its work begins: the kills' moments count from the start
    faults = _faults(
        seed=7,
        slow=17.0,
        work=15.0,
        fresh=False,
        die_in_write=False,
        read_only=False,
        read_only_fresh=True,
        after_start=False,
    )
    model = (inputs / "tiny.onnx").read_bytes()
    _inject(command, top, model, faults)


# ---- the save paths of the slow commands, and the checks before any work ----------------------------------------


class _Library:
    """Stands in for TVM's executable: export_library writes ``body`` (half of it, then fails, when ``fail``)."""

    def __init__(self, body: bytes, fail: BaseException | None = None) -> None:
        self.body, self.fail, self.names = body, fail, []

    def export_library(self, name: str) -> None:
        self.names.append(name)
        if self.fail is not None:
            Path(name).write_bytes(self.body[: len(self.body) // 2])
            raise self.fail
        Path(name).write_bytes(self.body)


def _tvm_session(library: _Library, signature: str) -> object:
    from softdeploy.tvm.session import TVMSession

    sess = TVMSession.__new__(TVMSession)
    sess.executable = library

    class Signature:
        def to_json(self) -> str:
            return signature

    sess._signature = Signature()
    return sess


@pytest.mark.parametrize("fail", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_compile_save_leaves_the_previous_library_and_signature(tmp_path: Path, fail: BaseException) -> None:
    out = tmp_path / "model_tvm.so"
    out.write_bytes(b"previous library")
    out.with_suffix(".json").write_text('{"previous": 1}')
    library = _Library(b"new library" * 100, fail)
    with pytest.raises(OutputError if isinstance(fail, OSError) else KeyboardInterrupt) as caught:
        _tvm_session(library, '{"new": 1}').save(out)  # type: ignore[attr-defined]
    if isinstance(fail, OSError):
        assert str(caught.value) == (
            f"compiled library {out}: cannot be written: No space left on device (free some space or write elsewhere)"
        )
    assert out.read_bytes() == b"previous library"
    assert out.with_suffix(".json").read_text() == '{"previous": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_tvm.json", "model_tvm.so"]
    assert library.names[0].endswith(".so")  # TVM picks the linker's output format from the suffix


def test_compile_save_writes_both_files(tmp_path: Path) -> None:
    out = tmp_path / "model_tvm.so"
    out.write_bytes(b"previous library")
    _tvm_session(_Library(b"new library"), '{"new": 1}').save(out)  # type: ignore[attr-defined]
    assert out.read_bytes() == b"new library" and out.with_suffix(".json").read_text() == '{"new": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_tvm.json", "model_tvm.so"]


def test_compare_reports_are_each_whole_after_an_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from softdeploy.compare import report

    for name in report.REPORT_FILES.values():
        (tmp_path / name).write_text(f"previous {name}")

    def plot(result: object, path: Path) -> None:
        Path(path).write_bytes(b"\x89PNG half of a plot")
        raise KeyboardInterrupt

    class Result:
        def to_json(self) -> dict[str, int]:
            return {"new": 1}

    monkeypatch.setattr(report, "to_markdown", lambda result: "new report")
    monkeypatch.setattr(report, "write_csv", lambda result, path: Path(path).write_text("new,table\n"))
    monkeypatch.setattr(report, "plot", plot)
    with pytest.raises(KeyboardInterrupt):
        report.write_reports(Result(), tmp_path)  # type: ignore[arg-type]
    assert (tmp_path / "report.md").read_text() == "new report"
    assert json.loads((tmp_path / "results.json").read_text()) == {"new": 1}
    assert (tmp_path / "accuracy_vs_latency.png").read_text() == "previous accuracy_vs_latency.png"
    assert _partials(tmp_path) == []


def test_tuning_records_pruned_in_place_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from softdeploy.tvm.tuning import keep_best

    workloads = tmp_path / "database_workload.json"
    records = tmp_path / "database_tuning_record.json"
    workloads.write_text('["w0"]\n["w1"]\n')
    records.write_text("\n".join(json.dumps(r) for r in ([0, [0, [0.2]]], [0, [0, [0.1]]], [1, [0, [0.3]]])) + "\n")
    before = (workloads.read_text(), records.read_text())
    real_replace = os.replace

    def replace(src: object, dst: object) -> None:  # the disk fills before the first rename
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputError, match=r"database_tuning_record\.json: cannot be written: No space left"):
        keep_best(tmp_path, 1)
    assert (workloads.read_text(), records.read_text()) == before
    assert _partials(tmp_path) == []
    monkeypatch.setattr(os, "replace", real_replace)
    assert keep_best(tmp_path, 1) == (3, 2)
    assert [json.loads(line)[1][1] for line in records.read_text().splitlines()] == [[0.1], [0.3]]


def test_quantize_result_without_int8_nodes_keeps_the_previous_model(top: Path, inputs: Path) -> None:
    from softdeploy.quant import QuantConfig
    from softdeploy.quant.quantize import QuantizationError
    from softdeploy.workflow.quantize import quantize_file

    out = top / "q.onnx"
    out.write_bytes(b"previous model")  # replaced only by a model with int8 nodes (--overwrite was given)
    with pytest.raises(QuantizationError, match="would be a float model"):
        quantize_file(inputs / "tiny.onnx", out, QuantConfig(op_types=("Conv",)), max_drop=None)
    assert out.read_bytes() == b"previous model"
    assert _partials(top) == []


def _cli(argv: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """Runs the CLI in this process, expecting a softdeploy error (exit 2); returns its one stderr line."""
    from softdeploy.cli import main

    monkeypatch.chdir(cwd)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("softdeploy: error: "), err
    return err


def test_outputs_are_checked_before_any_work(
    top: Path, inputs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = inputs / "tiny.onnx"
    folder = top / "a-folder.onnx"
    folder.mkdir()
    err = _cli(["optimize", str(model), str(folder), "--overwrite"], top, monkeypatch, capsys)
    assert f"output {folder}: is a folder; give a file path" in err
    err = _cli(["quantize", str(model), "-o", str(folder), "--overwrite"], top, monkeypatch, capsys)
    assert f"output {folder}: is a folder" in err
    (top / "m.json").mkdir()  # the report beside the model: refused before the quantization too
    err = _cli(["quantize", str(model), "-o", str(top / "m.onnx"), "--overwrite"], top, monkeypatch, capsys)
    assert f"output {top / 'm.json'}: is a folder" in err
    err = _cli(["export", f"{inputs / 'factory.py'}:make", str(folder), "--overwrite"], top, monkeypatch, capsys)
    assert f"output {folder}: is a folder" in err
    err = _cli(["compile", str(model), "-o", str(folder), "--overwrite"], top, monkeypatch, capsys)
    assert f"output {folder}: is a folder" in err
    (top / "distilled" / "distill.json").mkdir(parents=True)  # refused before the teacher is loaded or a step run
    err = _cli(["distill", str(top / "distilled"), "--steps", "1"], top, monkeypatch, capsys)
    assert f"output {top / 'distilled' / 'distill.json'}: is a folder" in err
    dangling = top / "dangling.onnx"
    dangling.symlink_to(top / "nowhere" / "x.onnx")
    err = _cli(["optimize", str(model), str(dangling), "--overwrite"], top, monkeypatch, capsys)
    assert "which does not exist; softdeploy does not write through links" in err
    assert not (top / "nowhere").exists()


def test_hard_links_to_an_input_are_refused(
    top: Path, inputs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = inputs / "tiny.onnx"
    before = model.read_bytes()
    link = top / "link.onnx"
    os.link(model, link)
    for argv in (
        ["optimize", str(model), str(link), "--overwrite"],
        ["quantize", str(model), "-o", str(link), "--overwrite"],
    ):
        err = _cli(argv, top, monkeypatch, capsys)
        assert f"{link} is also the input {model}" in err
    factory = inputs / "factory.py"
    factory_link = top / "factory_link.onnx"
    os.link(factory, factory_link)
    err = _cli(["export", f"{factory}:make", str(factory_link), "--overwrite"], top, monkeypatch, capsys)
    assert f"{factory_link} is also the input {factory}" in err
    feeds = top / "feeds.npz"
    np.savez(feeds, X=np.zeros((2, 16), np.float32))
    feeds_link = top / "feeds_link.onnx"
    os.link(feeds, feeds_link)
    err = _cli(
        ["optimize", str(model), str(feeds_link), "--feeds", str(feeds), "--overwrite"], top, monkeypatch, capsys
    )
    assert "is also the input" in err
    assert model.read_bytes() == before


def test_demo_checks_its_model_path_before_training(tmp_path: Path) -> None:
    from softdeploy.demo import MODEL_FILE, run_demo

    (tmp_path / MODEL_FILE).write_bytes(b"the user's model")
    with pytest.raises(OverwriteError, match="pass --overwrite"):
        run_demo(out=str(tmp_path))
    (tmp_path / MODEL_FILE).unlink()
    (tmp_path / MODEL_FILE).mkdir()
    with pytest.raises(OutputError, match="is a folder"):
        run_demo(out=str(tmp_path), overwrite=True)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(OutputError, match="is a file; give a folder"):
        run_demo(out=str(tmp_path / "file.txt"))


def test_a_tuning_database_line_torn_by_a_kill_is_dropped(tmp_path: Path) -> None:
    from softdeploy.errors import SoftdeployWarning
    from softdeploy.tvm.build import drop_torn_lines
    from softdeploy.tvm.tuning import database_size

    workloads = tmp_path / "database_workload.json"
    records = tmp_path / "database_tuning_record.json"
    workloads.write_text('["w0"]\n')
    records.write_text("[0, [0, [0.1]]]\n[0, [0, [0.2")  # MetaSchedule killed while appending a record
    assert database_size(tmp_path) == 1
    with pytest.warns(SoftdeployWarning, match=r"database_tuning_record\.json: its last line \(12 bytes\) was cut"):
        assert drop_torn_lines(tmp_path) == [records]
    assert records.read_text() == "[0, [0, [0.1]]]\n" and workloads.read_text() == '["w0"]\n'
    assert drop_torn_lines(tmp_path) == [] and _partials(tmp_path) == []
