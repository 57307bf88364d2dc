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


def test_ops_is_readable_at_80_columns():
    """Issue 12: `softdeploy ops` cut op names at 80 columns ("AdaptiveTemp…"). Nothing is truncated:
    every op name whole on one line, every input, output and attribute whole, no line past 80."""
    import os
    import re

    from softdeploy.ops import REGISTRY

    for columns in ("80", "200"):
        env = {**os.environ, "COLUMNS": columns}
        out = subprocess.run(
            [sys.executable, "-m", "softdeploy.cli", "ops"], capture_output=True, text=True, timeout=300, env=env
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert "…" not in out.stdout
        assert max(len(line) for line in lines) <= int(columns)
        words = set(re.findall(r"[A-Za-z_][\w?]*", out.stdout))
        for d in REGISTRY.values():
            assert any(re.search(rf"[│ ]{d.name}[│ ]", line) for line in lines), (d.name, out.stdout)
            for name in [p.name for p in (*d.inputs, *d.outputs)] + [a.name for a in d.attrs]:
                assert name in words or name + "?" in words, (d.name, name, out.stdout)


def test_doctor_finds_the_library():
    out = _cli("doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "libsoftdeploy_ops" in out.stdout.replace("\n", "")
    assert "onnxruntime" in out.stdout
