"""What importing softdeploy's light modules loads, checked in a fresh interpreter each (this process has
long since imported everything). The time these imports take is measured by bench/import_time.py, not here:
a timing assertion on a shared machine fails for reasons of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import softdeploy

# Seconds of start-up each (onnxscript pulls onnx_ir and sympy); none is needed to list or run ops.
HEAVY = ("onnxscript", "onnx_ir", "sympy", "torch", "tvm", "tvm_ffi")


def _loaded_after(code: str) -> list[str]:
    """The HEAVY top-level packages in sys.modules after ``code`` runs in a fresh interpreter that imports
    this very softdeploy (the one under test, not another copy on the path)."""
    package_root = str(Path(softdeploy.__file__).resolve().parents[1])
    probe = (
        "import json, sys\n"
        f"{code}\n"
        "import softdeploy\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        "print(json.dumps([softdeploy.__file__, heavy]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        # cwd: `python -c` puts the working folder first on sys.path, which would find a source tree there first
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
        cwd=package_root,
    )
    assert done.returncode == 0, done.stderr
    where, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(where).resolve() == Path(softdeploy.__file__).resolve()
    return heavy


@pytest.mark.parametrize("module", ["softdeploy.ops", "softdeploy.runtime"])
def test_import_loads_no_heavy_package(module: str) -> None:
    assert _loaded_after(f"import {module}") == []


def test_reading_the_whole_registry_compiles_no_body() -> None:
    """What lists or documents ops (the CLI's table, schemas for torch, the samples) reads every entry
    without compiling a function body."""
    code = (
        "import numpy as np\n"
        "from softdeploy.ops import REGISTRY\n"
        "for d in REGISTRY.values():\n"
        "    assert d.function.name == d.name and not d.function.compiled\n"
        "    d.torch_schema(), d.attr_defaults(), d.stem\n"
        "    list(d.samples(np.random.default_rng(0))), list(d.errors())\n"
    )
    assert _loaded_after(code) == []


@pytest.mark.parametrize("argv", [["ops"], ["--verbose", "ops"], ["ops", "--verbose"]])
def test_softdeploy_ops_verb_loads_no_heavy_package(argv: list[str]) -> None:
    code = (
        "import contextlib, io\n"
        "from softdeploy import cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    assert cli.main({argv!r}) == 0\n"
        "assert 'Softpick' in out.getvalue()\n"
    )
    assert _loaded_after(code) == []


def test_other_verbs_still_parse_their_options() -> None:
    """Only `ops` takes the short parser: another verb's options and the full verb list are all there."""
    code = (
        "import contextlib, io\n"
        "from softdeploy import cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    cli.main(['--help'])\n"
        "assert all(v in out.getvalue() for v in ('quantize', 'compare', 'distill', 'compile')), out.getvalue()\n"
        "args = cli._parser().parse_args(['quantize', 'm.onnx', '--mode', 'static'])\n"
        "assert args.mode == 'static'\n"
    )
    _loaded_after(code)


def test_a_function_body_imports_onnxscript_when_it_is_built() -> None:
    """The check above is not blind: asking for a body does load onnxscript."""
    code = "from softdeploy.ops import REGISTRY\nREGISTRY['Softpick'].function_proto()\n"
    assert "onnxscript" in _loaded_after(code)
