"""REGISTRY (Python), ops/ops.inc (C++) and the ops the built library registers are one set."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from softdeploy.ops import REGISTRY, register_onnx_schemas
from softdeploy.runtime import Session

ROOT = Path(__file__).resolve().parents[2]


def ops_inc() -> list[tuple[str, str]]:
    text = (ROOT / "ops" / "ops.inc").read_text()
    return re.findall(r"^SD_OP\((\w+), *(\w+)\)", text, flags=re.M)


def test_registry_matches_ops_inc():
    inc = ops_inc()
    assert [n for n, _ in inc] == sorted(n for n, _ in inc), "ops.inc must stay sorted"
    assert {n for n, _ in inc} == set(REGISTRY)
    for name, stem in inc:
        assert REGISTRY[name].stem == stem
        assert (ROOT / "ops" / f"{stem}.cc").is_file()
        assert (ROOT / "softdeploy" / "ops" / f"{stem}.py").is_file()


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_library_registers_op(op):
    """A one-node model WITHOUT the function body only runs if the library provides the kernel."""
    sample = next(iter(op.samples(np.random.default_rng(0))))
    Session(op.make_model(sample, with_function=False), kernels="native").run(op.feeds(sample))


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_op_module_is_complete(op):
    assert "=" in op.doc and len(op.doc) > 200, "the docstring must state the equation"
    assert op.function.name == op.name
    register_onnx_schemas()
    assert onnx.defs.has(op.name, 1, "com.softdeploy")
    assert op.source


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_models_pass_the_checker(op):
    for sample in op.samples(np.random.default_rng(0)):
        onnx.checker.check_model(op.make_model(sample), full_check=True)
