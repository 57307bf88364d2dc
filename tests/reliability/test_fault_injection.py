"""Fault injection for the commands that write: ``softdeploy quantize``, ``optimize`` and ``export`` run in a child
(``python -m softdeploy.cli``, the tree under test first on PYTHONPATH) that is killed (SIGKILL) or interrupted (SIGINT)
at seeded random moments, killed inside a write (SIGXFSZ at a file size limit), runs into a full disk (RLIMIT_FSIZE:
Python ignores SIGXFSZ, so the write fails with EFBIG as it would with ENOSPC) or writes into a read-only folder.

Afterwards every output's final name holds the complete previous result or the complete new one -- never a partial
file, which the next run would refuse as an existing result ("pass --overwrite") -- and a rerun succeeds and leaves no
temporary file behind. The faults of one command run side by side, each in its own folder, to keep the file quick.

The save paths of the slow commands (TVM's compile, compare's reports) and the up-front checks of every command
(folders, hard links to an input) are tested directly, without a child."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import softdeploy
from softdeploy.files import load_model
from tests.quant.tiny import mlp_with_custom_op

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
    stdout: str = ""
    stderr: str = ""


@dataclasses.dataclass
class Command:
    """A writing command: its arguments for an output folder, and its outputs there."""

    args: Callable[[Path], list[str]]
    outputs: list[str]


def _started(pid: int, logs: Path) -> bool:
    """Whether the child runs its command: it opens its log (``VERB-TIME-PID[-N].log``) as the command's work begins,
    past the interpreter's start-up and the argument parsing."""
    return any(logs.glob(f"*-{pid}.log")) or any(logs.glob(f"*-{pid}-*.log"))


def _run(command: Command, fault: Fault, logs: Path) -> None:
    argv = [*command.args(fault.folder), *(["--overwrite"] if fault.previous else [])]
    cmd = (
        [sys.executable, "-c", _DIE_IN_WRITE, *argv]
        if fault.die_in_write
        else [sys.executable, "-m", "softdeploy.cli", *argv]
    )
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


# ---- what must hold afterwards -----------------------------------------------------------------------------------

PREVIOUS_JSON = b'{"previous": "a complete report"}\n'


def _previous(folder: Path, command: Command, model: bytes) -> dict[str, bytes]:
    """Puts a complete previous result under every output name; returns it by name."""
    folder.mkdir()
    made = {}
    for name in command.outputs:
        made[name] = PREVIOUS_JSON if name.endswith(".json") else model
        (folder / name).write_bytes(made[name])
    return made


def _whole(path: Path) -> None:
    """The file is a complete result: a loadable ONNX model (its top level all there), or a JSON document."""
    if path.suffix == ".json":
        json.loads(path.read_text())
    else:
        load_model(path)


def _check_outputs(command: Command, fault: Fault, previous: dict[str, bytes]) -> None:
    for name in command.outputs:
        path = fault.folder / name
        if not path.exists():
            assert not previous, f"{fault.name}: the previous {name} is gone"
            continue
        if previous and path.read_bytes() == previous[name]:
            continue
        _whole(path)  # the complete new result, or this raises naming the partial file


def _partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name)


def _one_line(stderr: str) -> str:
    """The error line; every line the CLI printed is its own ``softdeploy: ...`` (the log note may precede it)."""
    lines = stderr.strip().splitlines()
    assert lines and all(line.startswith("softdeploy: ") for line in lines), stderr
    assert "Traceback" not in stderr, stderr
    return lines[-1]


def _faults(seed: int, slow: float, work: float) -> list[Fault]:
    """The faults of one command: SIGKILL at two random moments (one into an empty folder, one over a previous
    result), SIGINT at a random moment once the command runs, death inside a write, a full disk, a read-only folder.
    ``slow``: about how long the command takes here, seconds; ``work``: how long of it after its work begins (the
    random moments spread over these)."""
    rng = random.Random(seed)
    return [
        Fault("sigkill-fresh", previous=False, signal=signal.SIGKILL, delay=rng.uniform(0.3, slow)),
        Fault("sigkill", previous=True, signal=signal.SIGKILL, delay=rng.uniform(0.3, slow)),
        Fault("sigint", previous=True, signal=signal.SIGINT, delay=rng.uniform(0.0, work), after_start=True),
        Fault("die-in-write", previous=True, preexec=_size_limit, die_in_write=True),
        Fault("full-disk", previous=True, preexec=_size_limit),
        Fault("read-only", previous=True, preexec=_without_root_override, read_only=True),
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


def _inject(command: Command, top: Path, *, seed: int, slow: float, work: float, previous_model: bytes) -> None:
    """Runs every fault of ``command`` side by side, checks the outputs after each, then reruns where a fault killed
    the command and checks that the rerun succeeds and leaves no temporary file."""
    logs = top / "logs"
    logs.mkdir()
    faults = _faults(seed, slow, work)
    before: dict[str, dict[str, bytes]] = {}
    for fault in faults:
        fault.folder = top / fault.name
        if fault.previous:
            before[fault.name] = _previous(fault.folder, command, previous_model)
        else:
            fault.folder.mkdir()
        if fault.read_only:
            fault.folder.chmod(0o555)
    with ThreadPoolExecutor(len(faults)) as pool:
        list(pool.map(lambda f: _run(command, f, logs), faults))

    for fault in faults:
        previous = before.get(fault.name, {})
        what = f"{fault.name}: rc {fault.returncode}, stderr {fault.stderr[-600:]!r}"
        _check_outputs(command, fault, previous)
        for name in command.outputs:  # no temporary file under a final name, ever
            assert ".partial-" not in (fault.folder / name).resolve().name
        if fault.signal == signal.SIGKILL:
            assert fault.returncode in (0, -signal.SIGKILL), what
        elif fault.signal == signal.SIGINT:
            # it may have finished first: Python restores SIGINT's default action as it exits, and the signal then
            # ends the process (-SIGINT) once the command has written its outputs and said so
            finished = fault.returncode == 0 or (fault.returncode == -signal.SIGINT and "wrote " in fault.stdout)
            if not finished:
                assert fault.returncode == 130, what
                assert _one_line(fault.stderr) == "softdeploy: interrupted", what
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
            assert any(name in line for name in command.outputs), what  # names the output
            for name in command.outputs:
                assert (fault.folder / name).read_bytes() == previous[name], what
            assert _partials(fault.folder) == [], what

    # the reruns: a killed run's leftovers are neither taken for a result nor kept
    reruns = [f for f in faults if f.signal == signal.SIGKILL or f.die_in_write]
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


@pytest.fixture
def inputs(top: Path) -> Path:
    """The inputs every fault's run reads (a folder the read-only runs may read): a tiny ONNX model and a torch
    factory."""
    import onnx

    folder = top / "inputs"
    folder.mkdir()
    onnx.save(mlp_with_custom_op(with_function=True), folder / "tiny.onnx")
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
    _inject(command, top, seed=1, slow=4.0, work=1.0, previous_model=model.read_bytes())


def test_optimize_under_faults(top: Path, inputs: Path) -> None:
    model = inputs / "tiny.onnx"
    command = Command(lambda out: ["optimize", str(model), str(out / "o.onnx")], ["o.onnx"])
    _inject(command, top, seed=2, slow=4.0, work=1.0, previous_model=model.read_bytes())


def test_export_under_faults(top: Path, inputs: Path) -> None:
    factory = f"{inputs / 'factory.py'}:make"
    command = Command(lambda out: ["export", factory, str(out / "e.onnx"), "--no-validate"], ["e.onnx"])
    _inject(command, top, seed=3, slow=10.0, work=4.0, previous_model=(inputs / "tiny.onnx").read_bytes())
