"""A clean terminal: the libraries' warnings and output (torch's W-log lines,
FutureWarnings, TVM's "Scope Saving" lines written by C++ to fd 2, MetaSchedule's TIR dumps) are kept
in a log file whose path is printed in one line; --verbose shows them; library use keeps Python's
default warnings. And `softdeploy compile` of a small model says how it compares with onnxruntime."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent

# What the libraries print that a user must not see by default: Python warnings of any category
# ("FutureWarning:", "UserWarning:", "TracerWarning:"), TVM's "Warning: Scope Saving:", torch's
# glog-style lines ("W1201 10:08:17.387000 24212 .../_registration.py:107] ..."), onnxruntime's
# calibration prints.
NOISE = [
    re.compile(r"Warning"),
    re.compile(r"^[WIEF]\d{4} \d\d:\d\d:\d\d", re.M),
    re.compile(r"Scope (Saving|Loaded)"),
    re.compile(r"torchvision"),
    re.compile(r"Collecting tensor data|Finding optimal threshold"),  # onnxruntime's calibration prints
]
LOG_LINE = re.compile(r"^softdeploy: (\d+) lines of library output \(torch, onnxruntime, TVM\) in (\S+\.log)$", re.M)

FACTORY = """
import torch
from torch import nn

import softdeploy.nn as snn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.top = snn.SoftmaxTopKHead(32, 10, 3)

    def forward(self, x):
        return self.top(torch.relu(self.fc(x)))


def make():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(4, 16),), {"x": {0: torch.export.Dim("batch")}}
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("SOFTDEPLOY_LOG_DIR", None)
    env.pop("COLUMNS", None)
    return subprocess.run(
        [sys.executable, "-m", "softdeploy.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )


def _noise(text: str) -> list[str]:
    return [m.group(0) for p in NOISE for m in [p.search(text)] if m]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("terminal")
    (d / "net.py").write_text(textwrap.dedent(FACTORY))
    rng = np.random.default_rng(0)
    np.savez(d / "data.npz", x=rng.standard_normal((32, 16)).astype(np.float32))
    return d


@pytest.fixture(scope="module")
def exported(workdir: Path) -> tuple[Path, subprocess.CompletedProcess]:
    run = _cli("export", "net.py:make", "net.onnx", cwd=workdir)
    assert run.returncode == 0, run.stdout + run.stderr
    return workdir / "net.onnx", run


def _assert_clean(run: subprocess.CompletedProcess, workdir: Path, *, expect_log: bool) -> str:
    """No library noise on stdout/stderr; the log line (when anything was captured) names a file
    holding the captured output. Returns the log's text ('' when none)."""
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert not _noise(out), f"library noise on the terminal: {_noise(out)}\n{out}"
    found = LOG_LINE.search(run.stderr)
    if not expect_log:
        return (workdir / found.group(2)).read_text() if found else ""
    assert found, f"no log-file line on stderr:\n{run.stderr}"
    log = (workdir / found.group(2)).read_text()
    assert int(found.group(1)) > 0 and log.strip()
    return log


@pytest.mark.slow
def test_export_keeps_torch_warnings_in_the_log_file(exported: tuple[Path, subprocess.CompletedProcess]) -> None:
    path, run = exported
    log = _assert_clean(run, path.parent, expect_log=True)
    assert "torchvision is not installed" in log  # torch's W1201 lines went here, not to the terminal
    assert "wrote net.onnx" in run.stdout and "| yes |" in run.stdout  # the command's own output stays


@pytest.mark.slow
def test_verbose_shows_the_libraries_output(exported: tuple[Path, subprocess.CompletedProcess]) -> None:
    path, _ = exported
    run = _cli("export", "net.py:make", "again.onnx", "--verbose", cwd=path.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "torchvision is not installed" in run.stderr
    assert re.search(r"^W\d{4} ", run.stderr, re.M)
    assert not LOG_LINE.search(run.stderr)


@pytest.mark.slow
def test_optimize_quantize_and_compare_are_quiet(exported: tuple[Path, subprocess.CompletedProcess]) -> None:
    path, _ = exported
    d = path.parent
    _assert_clean(_cli("optimize", "net.onnx", "opt.onnx", cwd=d), d, expect_log=False)
    # onnxruntime's histogram calibration prints "Collecting tensor data and making histogram ..."
    run = _cli("quantize", "net.onnx", "--mode", "static", "--data", "data.npz", "--calibrate-method", "entropy", cwd=d)
    log = _assert_clean(run, d, expect_log=True)
    assert "Collecting tensor data" in log and "Collecting" not in run.stdout + run.stderr
    assert "nodes int8" in run.stdout
    # compare of a torch factory exports it (torch's W-lines) and calibrates (onnxruntime's prints)
    workflow = {
        "name": "net",
        "model": {"factory": "net.py:make"},
        "data": {"inputs": "data.npz", "batch": 8},
        "quantize": {"mode": "static", "calibrate_method": "percentile"},
        "rounds": 1,
        "out": "cmp",
    }
    (d / "wf.json").write_text(json.dumps(workflow))
    run = _cli("compare", "--workflow", "wf.json", "--quick", cwd=d)
    log = _assert_clean(run, d, expect_log=True)
    assert "torchvision is not installed" in log and "Collecting tensor data" in log
    assert "ort-int8-static" in run.stdout and "torch-fp32" in run.stdout


@pytest.mark.slow
@pytest.mark.tvm
def test_compile_keeps_tvms_chatter_in_the_log_and_compares_with_onnxruntime(
    exported: tuple[Path, subprocess.CompletedProcess],
) -> None:
    path, _ = exported
    d = path.parent
    run = _cli("compile", "net.onnx", "--shape", "x=4x16", "--untuned", "-o", "net_tvm.so", cwd=d)
    log = _assert_clean(run, d, expect_log=True)
    assert "Scope Saving" in log  # written by TVM's C++ runtime straight to fd 2
    assert "wrote net_tvm.so" in run.stdout
    # The model is tiny and untuned: the latency against onnxruntime is measured and said in one line;
    # when TVM is the slower one, the line says why and what to do.
    note = re.search(
        r"^.*latency \(1 thread, median of \d+\): TVM ([\d.]+) ms, onnxruntime ([\d.]+) ms.*$", run.stdout, re.M
    )
    assert note, run.stdout
    tvm_ms, ort_ms = float(note.group(1)), float(note.group(2))
    if tvm_ms > 1.1 * ort_ms:
        assert note.group(0).startswith("note: TVM is ") and "slower than onnxruntime" in note.group(0)
        assert "untuned for this CPU" in note.group(0) and "--tune-trials N" in note.group(0)
        assert "small model" in note.group(0)
    run = _cli("compile", "net.onnx", "--shape", "x=4x16", "--untuned", "-o", "v_tvm.so", "--verbose", cwd=d)
    assert run.returncode == 0 and "Scope Saving" in run.stderr


@pytest.mark.slow
@pytest.mark.tvm
def test_tuning_shows_progress_and_summary_and_logs_the_tir(tmp_path: Path) -> None:
    """`compile --tune-trials`: MetaSchedule's per-task logs (TIR of every design space) go to the log
    file; the terminal shows a progress line and the summary."""
    from onnx import TensorProto, helper, numpy_helper, save

    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "one_matmul",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 8])],
        initializer=[numpy_helper.from_array(w, "W")],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), tmp_path / "mm.onnx")
    run = _cli("compile", "mm.onnx", "--tune-trials", "1", "--records", "db", cwd=tmp_path)
    log = _assert_clean(run, tmp_path, expect_log=True)
    assert "tune (MetaSchedule) trials measured" in run.stdout
    assert re.search(r"^tuned \d+/\d+ tasks, \d+ successful trials", run.stdout, re.M), run.stdout
    assert "# from tvm.script import" not in run.stdout  # no TIR dump on the terminal
    assert "MetaSchedule log" in log and "from tvm.script import" in log
    assert len(run.stdout.splitlines()) < 30, run.stdout


def test_a_session_routes_library_output_to_the_log_and_restores_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import logging

    from softdeploy import terminal

    monkeypatch.setenv("SOFTDEPLOY_LOG_DIR", str(tmp_path / "logs"))
    showwarning, handlers = warnings.showwarning, list(logging.getLogger().handlers)
    with terminal.cli_session("unit", verbose=False):
        with terminal.captured("a C++ library"):
            os.write(2, b"from C++ on fd 2\n")
            os.write(1, b"from C++ on fd 1\n")
            print("from Python inside the call")
        print("the command's own line", file=terminal.stdout())
        terminal.stdout().flush()
        with warnings.catch_warnings():  # pytest's own filters ignore FutureWarning (pyproject.toml)
            warnings.simplefilter("always")
            warnings.warn_explicit("a library's FutureWarning", FutureWarning, "/site-packages/lib/x.py", 3)
        logging.getLogger("some.library").warning("a library's log record")
    out, err = capfd.readouterr()
    assert "the command's own line" in out
    assert "from C++" not in out + err and "FutureWarning" not in err and "log record" not in err
    (log,) = (tmp_path / "logs").glob("unit-*.log")
    text = log.read_text()
    for line in ("from C++ on fd 2", "from C++ on fd 1", "from Python inside the call", "a library's FutureWarning"):
        assert line in text
    assert "a library's log record" in text
    assert f"lines of library output (torch, onnxruntime, TVM) in {log}" in err
    assert warnings.showwarning is showwarning and logging.getLogger().handlers == handlers
    assert not terminal.active()


def test_an_empty_log_is_removed_and_not_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from softdeploy import terminal

    monkeypatch.setenv("SOFTDEPLOY_LOG_DIR", str(tmp_path / "logs"))
    with terminal.cli_session("quiet", verbose=False), terminal.captured("a silent call"):
        pass
    assert not list((tmp_path / "logs").glob("*.log"))
    assert "library output" not in capfd.readouterr().err


def test_sessions_within_one_second_keep_their_own_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Two CLI sessions of one process in the same second (the API, a test suite) write two files, and each
    counts only its own lines (they once shared a name and the second counted the first's)."""
    from softdeploy import terminal

    monkeypatch.setenv("SOFTDEPLOY_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(terminal.time, "strftime", lambda fmt, *a: "20261201-000000" if "%Y" in fmt else "00:00:00")
    for lines in (3, 1):
        with terminal.cli_session("same", verbose=False), terminal.captured("a call"):
            os.write(2, b"library line\n" * lines)
    err = capfd.readouterr().err
    logs = sorted((tmp_path / "logs").glob("same-*.log"), key=lambda p: len(p.name))  # the first has no suffix
    assert len(logs) == 2
    assert f"3 lines of library output (torch, onnxruntime, TVM) in {logs[0]}" in err
    assert f"1 lines of library output (torch, onnxruntime, TVM) in {logs[1]}" in err


@pytest.mark.slow
def test_library_use_keeps_pythons_default_warnings(workdir: Path) -> None:
    """Outside the CLI nothing is filtered or captured: the Python API runs in the user's process, whose
    warnings and logs are the user's business."""
    script = textwrap.dedent("""
        import os, sys, warnings
        sys.path.insert(0, ".")
        from net import make
        from softdeploy import terminal
        from softdeploy.export.api import export

        module, example, dynamic = make()
        export(module, example, "lib.onnx", dynamic_shapes=dynamic, overwrite=True)
        with terminal.captured("no session"):  # a no-op outside the CLI
            os.write(2, b"visible on fd 2\\n")
        warnings.warn_explicit("a library's UserWarning", UserWarning, "/site-packages/lib/y.py", 1)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=workdir, capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0, run.stderr
    assert "torchvision is not installed" in run.stderr
    assert "visible on fd 2" in run.stderr and "UserWarning: a library's UserWarning" in run.stderr
    assert not LOG_LINE.search(run.stderr)


def test_softdeploys_own_warnings_stay_on_the_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SoftdeployWarning is shown; a library's warning goes to the log, also when it points at the
    softdeploy line that triggered it (torch's requires_grad UserWarning did, from demo.py)."""
    import softdeploy
    from softdeploy import terminal
    from softdeploy.errors import SoftdeployWarning

    monkeypatch.setenv("SOFTDEPLOY_LOG_DIR", str(tmp_path / "logs"))
    ours = str(Path(softdeploy.__file__).parent / "demo.py")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with terminal.cli_session("own", verbose=False):
            warnings.warn_explicit("softdeploy's own warning", SoftdeployWarning, ours, 1)
            warnings.warn_explicit("a library's warning", UserWarning, ours, 2)
    assert [str(w.message) for w in shown] == ["softdeploy's own warning"]  # shown as Python shows warnings
    (log,) = (tmp_path / "logs").glob("own-*.log")
    assert "a library's warning" in log.read_text() and "own warning" not in log.read_text()


def test_on_a_terminal_too(exported: tuple[Path, subprocess.CompletedProcess]) -> None:
    """On a terminal rich's live progress display proxies sys.stdout to the screen: the libraries'
    prints during it must still go to the log (a pseudo-terminal stands in for the user's)."""
    import pty

    path, _ = exported
    d = path.parent
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", "TERM": "xterm"}
    env.pop("SOFTDEPLOY_LOG_DIR", None)
    command = [sys.executable, "-m", "softdeploy.cli", "quantize", "net.onnx", "-o", "tty.onnx"]
    command += ["--mode", "static", "--data", "data.npz", "--calibrate-method", "entropy", "--overwrite"]
    master, slave = pty.openpty()
    proc = subprocess.Popen(command, cwd=d, env=env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=300) == 0
    screen = b"".join(chunks).decode(errors="replace")
    assert "wrote tty.onnx" in screen.replace("\r", "").replace("\n", "")
    assert not _noise(screen), screen
    assert "lines of library output" in screen


def test_a_log_folder_that_cannot_be_made_falls_back_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A working folder where softdeploy-logs/ cannot be created (here a file of that name; read-only folders and
    full disks alike) must not fail the command: the log goes to the temporary folder, said in one line."""
    from softdeploy import terminal

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SOFTDEPLOY_LOG_DIR", raising=False)
    (tmp_path / "softdeploy-logs").write_text("a file, not a folder")
    monkeypatch.setattr(terminal, "fallback_log_folder", lambda: tmp_path / "tmp" / "softdeploy-logs-0")
    with terminal.cli_session("fallback", verbose=False), terminal.captured("a call"):
        os.write(2, b"library line\n")
    err = capfd.readouterr().err
    (log,) = (tmp_path / "tmp").glob("softdeploy-logs-0/fallback-*.log")
    assert "library line" in log.read_text()
    (line,) = [x for x in err.splitlines() if x.startswith("softdeploy:")]
    assert (
        "cannot write logs to softdeploy-logs/" in line
        and f"1 lines of library output (torch, onnxruntime, TVM) in {log}" in line
    )


def test_no_folder_for_a_log_discards_it_and_the_command_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from softdeploy import terminal

    (tmp_path / "blocked").write_text("a file")
    monkeypatch.setenv("SOFTDEPLOY_LOG_DIR", str(tmp_path / "blocked" / "logs"))
    monkeypatch.setattr(terminal, "fallback_log_folder", lambda: tmp_path / "blocked" / "softdeploy-logs-0")
    with terminal.cli_session("nolog", verbose=False):
        with terminal.captured("a call"):
            os.write(2, b"library line\n")
        print("the command's own line", file=terminal.stdout())
        terminal.stdout().flush()
    out, err = capfd.readouterr()
    assert "the command's own line" in out and "library line" not in out + err
    assert "library output (torch, onnxruntime, TVM) discarded" in err
    assert len([x for x in err.splitlines() if x.startswith("softdeploy:")]) == 1


def test_softdeploys_own_warning_is_one_line_on_the_terminal(tmp_path: Path) -> None:
    """A SoftdeployWarning (a cache entry set aside, a fallback taken) is one line, without the source line that
    raised it (in a fresh interpreter: pytest records warnings instead of printing them)."""
    script = textwrap.dedent("""
        import warnings
        import softdeploy.cache
        from softdeploy import terminal
        from softdeploy.errors import SoftdeployWarning

        with terminal.cli_session("own", verbose=False):
            warnings.warn_explicit("cache entry x: set aside, rebuilding it", SoftdeployWarning, softdeploy.cache.__file__, 70)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SOFTDEPLOY_LOG_DIR": str(tmp_path / "logs")}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("\n") == 1, run.stderr
    assert "SoftdeployWarning: cache entry x: set aside, rebuilding it" in run.stderr
