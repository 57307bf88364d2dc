"""Ctrl-C at any moment of a command, its start-up included: one line ``softdeploy: interrupted`` and exit code 130,
never a traceback or an abort ("terminate called ...") from a native library interrupted in its start-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _interrupt_after(delay: float, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen(
        [sys.executable, "-m", "softdeploy.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.fixture(scope="module", autouse=True)
def _compiled_byte_code() -> None:
    """Writes the repository's byte-code cache first, as pip does at install time: a Ctrl-C while the interpreter
    compiles ``softdeploy.cli`` itself comes before any of softdeploy's code runs (Python's own traceback)."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(ROOT / "softdeploy")],
        capture_output=True,
        timeout=300,
        check=True,
    )


# From just after the interpreter is up (it installs Python's SIGINT handler within ~30 ms) through the imports of
# onnxruntime and the kernel library (the start-up of `doctor` takes ~2-3 s on a 2-core machine) to its end.
DELAYS = [0.15, 0.3, 0.5, 0.7, 0.9, 1.1, 1.4, 1.7, 2.0, 2.5]


@pytest.mark.parametrize("delay", DELAYS)
def test_ctrl_c_during_start_up_is_one_line_and_exit_130(delay: float, tmp_path: Path) -> None:
    run = _interrupt_after(delay, "doctor", cwd=tmp_path)
    if run.returncode == 0:  # finished before the signal (or during its shutdown, which ignores Ctrl-C): no message
        assert "softdeploy: interrupted" not in run.stderr and "Traceback" not in run.stderr, run.stderr
        return
    assert run.returncode == 130, run.stderr
    assert "Traceback" not in run.stderr and "terminate called" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines() == ["softdeploy: interrupted"], run.stderr


def test_in_process_main_returns_130_on_ctrl_c(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from softdeploy import cli

    def interrupted(**_: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_parser", interrupted)
    before = signal.getsignal(signal.SIGINT)  # Python's own, unless a library in this process installed another
    assert cli.main(["ops"]) == 130
    assert capsys.readouterr().err.strip() == "softdeploy: interrupted"
    assert signal.getsignal(signal.SIGINT) is before  # the handler is restored


def test_ctrl_c_turned_into_a_librarys_error_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A native module interrupted in its import (pybind11's) raises ``ImportError: initialization failed`` from the
    KeyboardInterrupt: still Ctrl-C, not an error with exit code 1."""
    from softdeploy import cli

    def interrupted_import(args: object) -> int:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise ImportError("initialization failed") from e

    parser = cli._parser

    def patched(**kwargs: object) -> object:
        made = parser(**kwargs)  # type: ignore[arg-type]
        made.set_defaults(fn=interrupted_import)
        for sub in made._subparsers._group_actions[0].choices.values():  # type: ignore[union-attr]
            sub.set_defaults(fn=interrupted_import)
        return made

    monkeypatch.setattr(cli, "_parser", patched)
    assert cli.main(["ops"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "softdeploy: interrupted"


_SLOW_MODULE = """
import os, signal, sys
os.kill(os.getpid(), signal.SIGINT)
total = 0
for i in range(200_000):  # bytecode on which an unheld handler would raise at once
    total += i
import json  # a nested import: the hold lasts until the outermost import statement returns
sys.slow_module_finished = True
"""


def test_ctrl_c_inside_an_import_is_held_until_the_import_has_finished(tmp_path: Path) -> None:
    """The rule of softdeploy.interrupts: the interrupt lands inside a module's import (as one inside onnx's or
    torch's pybind11 start-up would), the module's body runs to its end, and KeyboardInterrupt is raised as the
    import statement returns -- never inside the body, where a native library would turn it into an abort."""
    (tmp_path / "slow_module.py").write_text(_SLOW_MODULE)
    probe = (
        "import os, signal, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from softdeploy.interrupts import hold_during_imports\n"
        "hold_during_imports()\n"
        "try:\n"
        "    import slow_module\n"
        "    print('not interrupted')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted; body finished:', getattr(sys, 'slow_module_finished', False))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "interrupted; body finished: True", run.stdout + run.stderr
