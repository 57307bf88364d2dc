"""The hand schedules of our TIR computes apply, and a failing one is reported, never swallowed.

A kernel without its hand schedule still computes the right values (dlight's or TVM's default loop
nest), so no value test notices; it only runs slower (30-77x measured for a broken rule). These
tests hold the path: each op's kernel gets ITS rule (BuildReport.schedules), no rule raises, and a
deliberately broken rule shows up in the report, as a warning, and as an error where tuning uses it.
The shipped tuning records are left out (they would schedule the benchmark shapes before any rule).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("tvm", reason="the TVM backend is optional: pip install 'softdeploy[tvm]'")

from softdeploy.ops import REGISTRY
from softdeploy.tvm.build import schedule
from softdeploy.tvm.errors import ScheduleError, ScheduleWarning
from softdeploy.tvm.frontend import import_model, prepare

pytestmark = pytest.mark.tvm  # for `-m` selection; without the `tvm` extra the module skips at import

# op -> (its kernel, the SCHEDULES rule that must schedule it, samples in the form the rule is for).
# Row-wise rules take the vector form (last axis, a nonzero multiple of 16 long; the others get dlight).
HAND = {
    "AdaptiveTemperatureSoftmax": (
        "adaptive_temperature_softmax",
        "AdaptiveTemperatureSoftmax",
        ["vocab_4x32000", "n1024"],
    ),
    "MaxSim": ("max_sim", "MaxSim", ["colbert_2x32_vs_9x40_d128", "tile_lq15_ld7_dim3", "int8_2x33_vs_5x19_d128"]),
    "MultiMax": ("multi_max", "TwoPassSoftmax", ["n1024"]),
    # the GEMM (its quantization kernel too: tests/tvm_backend/test_rowwise_int8_tir.py)
    "RowwiseInt8MatMul": ("rowwise_int8_matmul", "RowwiseInt8MatMul", ["tokens_2x64x384_u8", "m13_k31_n65", "bias"]),
    "SignedMaxSim": ("signed_max_sim", "MaxSim", ["colbert_2x32_vs_9x40_d128", "tile_lq17_ld9_dim17"]),
    "SoftmaxTopK": ("softmax_topk_sums", "SoftmaxTopK", ["vocab_4x32000_k50", "k_200_of_2000"]),
    "Softpick": ("softpick", "Softpick", ["vocab_4x32000", "n64", "n1024"]),
    "TwoPassSoftmax": ("two_pass_softmax", "TwoPassSoftmax", ["vocab_4x32000", "n48", "n1024"]),
}


def _schedule(op, sample):
    shapes = {p.name: list(np.shape(v)) for p, v in zip(op.inputs, sample.inputs, strict=False) if v is not None}
    return schedule(import_model(prepare(op.make_model(sample), shapes)), shipped_records=False)


def _sample(op, name):
    found = [s for s in op.samples(np.random.default_rng(0)) if s.name == name]
    assert found, f"{op.name} has no sample {name!r}"
    return found[0]


def test_every_op_with_a_tir_compute_has_a_hand_schedule_here():
    from softdeploy.tvm.ops import SCHEDULES, TIR_OPS

    assert set(HAND) == set(TIR_OPS)
    # and every rule is used; "MatMul" and "Injective" schedule standard ops (tests/tvm_backend/test_standard_kernels.py)
    assert {rule for _, rule, _ in HAND.values()} == set(SCHEDULES) - {"MatMul", "Injective"}


@pytest.mark.parametrize(
    ("name", "sample_name"), [(name, s) for name, (_, _, samples) in sorted(HAND.items()) for s in samples]
)
def test_hand_schedule_applies(name, sample_name):
    op = REGISTRY[name]
    kernel, rule, _ = HAND[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleWarning)  # no rule may raise on the way
        _, report = _schedule(op, _sample(op, sample_name))
    assert report.schedules.get(kernel) == f"hand ({rule})", report.summary()
    assert report.schedule_errors == {}, report.summary()
    assert kernel not in report.unscheduled


# Shapes on which a rule RAISED (found once failures were no longer swallowed): rows of one vector and
# float64 sums of one block (loops of extent 1, which compute_at drops), MaxSim with one token or an
# empty batch. The rules now decline them (dlight schedules them) or schedule them; none may raise.
RAISED_BEFORE = {
    "AdaptiveTemperatureSoftmax": ["n16", "n48", "n256"],
    "MaxSim": ["tile_lq1_ld1_dim1", "int8_lq1_ld1_dim1", "empty_batch", "no_documents"],
    "MultiMax": ["n16"],
    "SignedMaxSim": ["empty_batch", "no_documents"],
    "SoftmaxTopK": ["n16", "n512", "k_equals_n_64"],
    "Softpick": ["n16"],
    "TwoPassSoftmax": ["n16"],
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "sample_name"), [(name, s) for name, samples in sorted(RAISED_BEFORE.items()) for s in samples]
)
def test_no_rule_raises_on_edge_shapes(name, sample_name):
    op = REGISTRY[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleWarning)
        _, report = _schedule(op, _sample(op, sample_name))
    assert report.schedule_errors == {}, report.summary()


def test_a_broken_rule_is_reported_warned_and_raised(monkeypatch, tmp_path):
    from softdeploy.tvm import ops as tvm_ops
    from softdeploy.tvm.tuning import tune

    real = tvm_ops.SCHEDULES["TwoPassSoftmax"]

    def broken(sch):
        if real(sch):  # recognised the kernel, then a primitive fails
            raise RuntimeError("deliberately broken rule")
        return False

    monkeypatch.setitem(tvm_ops.SCHEDULES, "TwoPassSoftmax", broken)
    op = REGISTRY["TwoPassSoftmax"]
    sample = _sample(op, "vocab_4x32000")
    with pytest.warns(ScheduleWarning, match=r"two_pass_softmax .*TwoPassSoftmax: RuntimeError: deliberately broken"):
        _, report = _schedule(op, sample)
    assert report.schedule_errors == {"two_pass_softmax": {"TwoPassSoftmax": "RuntimeError: deliberately broken rule"}}
    assert not report.schedules.get("two_pass_softmax", "").startswith("hand")
    assert "hand schedule TwoPassSoftmax failed: RuntimeError: deliberately broken rule" in report.summary()
    # MetaSchedule measures the hand schedule first: tuning refuses to go on without it
    mod = import_model(prepare(op.make_model(sample), {"X": list(sample.inputs[0].shape)}))
    with pytest.raises(ScheduleError, match=r"(?s)two_pass_softmax.*deliberately broken"):
        tune(mod, tmp_path / "db", trials=1)


def test_kernels_no_rule_schedules_are_listed_with_the_reason():
    """An empty input: dlight refuses the zero-extent loops; the build still works, and says so."""
    op = REGISTRY["TwoPassSoftmax"]
    _, report = _schedule(op, _sample(op, "empty_rows"))
    assert "two_pass_softmax" in report.unscheduled and "dlight raised" in report.unscheduled["two_pass_softmax"]
    assert "two_pass_softmax: NO schedule (dlight raised" in report.summary()


def test_written_and_recorded_kernels_are_labelled():
    op = REGISTRY["SoftmaxTopK"]
    sample = _sample(op, "vocab_4x32000_k50")
    shapes = {"X": list(sample.inputs[0].shape)}
    from softdeploy.tvm.target import host_target

    # with the shipped records, of the avx512 class (pinned: the test must not depend on the CPU it runs on)
    _, report = schedule(import_model(prepare(op.make_model(sample), shapes)), target=host_target("znver4"))
    assert report.schedules["softmax_topk_block_max"] == report.schedules["softmax_topk_select"] == "written"
    assert report.schedules["softmax_topk_sums"] == report.schedules["softmax_topk_values"] == "tuning record"
    assert report.unscheduled == {} and report.schedule_errors == {}
