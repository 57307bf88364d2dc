from __future__ import annotations

import re
import subprocess
import sys


def test_ops_lists_the_registry(run_cli):
    from softdeploy.ops import REGISTRY

    out = run_cli("ops")
    assert out.returncode == 0, out.stderr
    for name in REGISTRY:
        assert name[:12] in out.stdout


def test_ops_is_readable_at_80_columns(run_cli, monkeypatch):
    """`softdeploy ops` once cut op names at 80 columns ("AdaptiveTemp…"). Nothing is truncated: every op name
    whole on one line, every input, output and attribute whole, no line past 80."""
    from softdeploy.ops import REGISTRY

    for columns in ("80", "200"):
        monkeypatch.setenv("COLUMNS", columns)
        out = run_cli("ops")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert "…" not in out.stdout
        assert max(len(line) for line in lines) <= int(columns)
        words = set(re.findall(r"[A-Za-z_][\w?]*", out.stdout))
        for d in REGISTRY.values():
            assert any(re.search(rf"[│ ]{d.name}[│ ]", line) for line in lines), (d.name, out.stdout)
            for name in [p.name for p in (*d.inputs, *d.outputs)] + [a.name for a in d.attrs]:
                assert name in words or name + "?" in words, (d.name, name, out.stdout)


def test_python_dash_m_runs_the_cli_in_a_fresh_interpreter():
    """Smoke test of ``python -m softdeploy.cli`` in its own process (the rest of the suite calls main()): the
    exit status and stdout of a real process, and a usage error's exit 2 with its message on stderr."""
    out = subprocess.run([sys.executable, "-m", "softdeploy.cli", "ops"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "TwoPassSoftmax" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "softdeploy.cli", "ops", "--no-such-flag"], capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 2 and "--no-such-flag" in bad.stderr, bad.stderr
