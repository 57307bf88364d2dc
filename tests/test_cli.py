from __future__ import annotations

import subprocess
import sys


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "softdeploy.cli", *args], capture_output=True, text=True, timeout=300)


def test_ops_lists_the_registry():
    from softdeploy.ops import REGISTRY

    out = _cli("ops")
    assert out.returncode == 0, out.stderr
    for name in REGISTRY:
        assert name[:12] in out.stdout


def test_doctor_finds_the_library():
    out = _cli("doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "libsoftdeploy_ops" in out.stdout.replace("\n", "")
    assert "onnxruntime" in out.stdout
