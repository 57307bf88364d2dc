"""The TVM tables (softdeploy.tvm.ops) are derived from REGISTRY and each op's own module
softdeploy/tvm/ops/<stem>.py: every op is accounted for once, and the operator reference (docs/gen_ops.py,
which reads the same modules without importing TVM) says what the tables say."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("tvm", reason="the TVM backend is optional: pip install 'softdeploy[tvm]'")

from softdeploy.ops import REGISTRY
from softdeploy.tvm import ops as tvm_ops

pytestmark = pytest.mark.tvm

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_op_module_declares_one_tvm_path(name):
    """convert (a TIR compute, optionally with schedule and KEEP_BLOCKS), FUNCTION_BODY_ONLY or NOT_IMPORTABLE:
    exactly one, so that the derived tables put the op in exactly one place."""
    module = tvm_ops.OP_MODULES.get(name)
    paths = [n for n in ("convert", "FUNCTION_BODY_ONLY", "NOT_IMPORTABLE") if module and hasattr(module, n)]
    if module is None:
        assert name in tvm_ops.FUNCTION_BODY_ONLY and name not in tvm_ops.TIR_OPS
        return
    assert len(paths) == 1, f"softdeploy/tvm/ops/{REGISTRY[name].stem}.py declares {paths or 'no TVM path'}"
    if paths[0] != "convert":
        assert not hasattr(module, "schedule") and not hasattr(module, "KEEP_BLOCKS"), "a rule without a TIR compute"
        assert isinstance(getattr(module, paths[0]), str) and getattr(module, paths[0])
    in_tables = [t for t in ("TIR_OPS", "FUNCTION_BODY_ONLY", "NOT_IMPORTABLE") if name in getattr(tvm_ops, t)]
    assert len(in_tables) == 1, in_tables


def test_rules_follow_the_ops_and_end_with_the_standard_op_rules():
    names = list(tvm_ops.SCHEDULES)
    assert names[-2:] == ["MatMul", "Injective"]
    assert set(names[:-2]) <= set(tvm_ops.TIR_OPS)
    for name in names[:-2]:
        assert tvm_ops.SCHEDULES[name] is tvm_ops.OP_MODULES[name].schedule


def test_operator_reference_reads_the_same_tables():
    spec = importlib.util.spec_from_file_location("gen_ops", ROOT / "docs" / "gen_ops.py")
    assert spec is not None and spec.loader is not None
    gen_ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_ops)
    tir, body_only, not_importable = gen_ops.tvm_tables()
    assert tir == set(tvm_ops.TIR_OPS)
    assert body_only == tvm_ops.FUNCTION_BODY_ONLY
    assert not_importable == tvm_ops.NOT_IMPORTABLE
