"""SoftmaxTopK's TIR pieces on their own (tvm/ops/softmax_topk.py, tvm/ops/_te.py): the sum-only
2^u, the block maxima built from int32 bits, and the heap selection on rows that stress its floors.
The op as a whole against the float64 reference, every sample: tests/ops/test_conformance.py."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm", reason="the TVM backend is optional: pip install 'softdeploy[tvm]'")

from tvm import te  # noqa: E402

from softdeploy import conformance  # noqa: E402
from softdeploy.ops import REGISTRY  # noqa: E402
from softdeploy.ops._schema import Sample  # noqa: E402
from softdeploy.tvm.ops import _te, softmax_topk  # noqa: E402
from softdeploy.tvm.session import TVMSession  # noqa: E402

pytestmark = pytest.mark.tvm  # for `-m` selection; without the `tvm` extra the module skips at import

TARGET = "llvm"  # the host, without CPU-specific flags: these tests check values, not speed


def _build(func):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET)
    return lib["main"]


def _ranking_key(v: np.ndarray) -> np.ndarray:
    """The ranking key of float32 values, NaN counted as +inf (as the block maxima report it)."""
    v = np.where(np.isnan(v), np.float32(np.inf), v).astype(np.float32)
    bits = np.where(v == 0, np.float32(0), v).view(np.int32)
    return np.where(bits < 0, bits ^ np.int32(0x7FFFFFFF), bits)


def test_pow2_sum_term_is_exp2_within_its_contract():
    u = np.concatenate(
        [
            -np.linspace(0, 125, 20001, dtype=np.float32),
            np.float32([-0.5, -1.5, -2.5, -1e-7, -124.999, -126.0, -1000.0, -np.inf]),
        ]
    ).astype(np.float32)
    x = te.placeholder(u.shape, "float32", name="u")
    y = te.compute(u.shape, lambda i: _te.pow2_sum_term_f32(x[i]), name="y")
    fn = _build(te.create_prim_func([x, y]))
    out = tvm.runtime.empty(u.shape, "float32")
    fn(tvm.runtime.tensor(u), out)
    got, want = out.numpy().astype(np.float64), np.exp2(u.astype(np.float64))
    normal = u >= -125
    assert np.max(np.abs(got[normal] - want[normal]) / want[normal]) <= 2e-7
    # below 2^-125 (-inf included): a tiny positive term, never more than 2^-124
    assert np.all((got[~normal] > 0) & (got[~normal] <= 2.0**-124))


def test_block_maxima_from_bits_handle_every_sign_and_nan():
    """Lanes of only negatives (the max is the smallest magnitude), with -0 (ranks as +0), with a
    negative NaN (bits above -inf's: counted as +inf), only -inf, and mixed signs with +NaN."""
    rows, n = 3, 2 * softmax_topk.BLOCK + 7  # two blocks and a tail the maxima do not cover
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
    x[0] = -np.abs(x[0]) - 1.0  # all negative
    x[0, 3] = np.float32(-0.0)  # lane 3 of block 0: its max is -0 -> key 0
    neg_nan = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
    x[0, 256 + 9] = neg_nan  # lane 9 of block 1, otherwise negative: counted as +inf
    x[1, 256 : 2 * 256] = -np.inf  # block 1 of row 1: only -inf
    x[1, 256 + 2] = -5.0
    x[2, 17] = np.nan  # +NaN in a mixed lane
    x[2, 256 + 4] = np.inf
    keys = tvm.runtime.empty((rows, 2, softmax_topk.LANES), "int32")
    groups = tvm.runtime.empty((rows, 1, softmax_topk.LANES), "int32")
    _build(softmax_topk.block_max([rows, n], "float32"))(tvm.runtime.tensor(x), keys, groups)
    lanes = x[:, : 2 * softmax_topk.BLOCK].reshape(rows, 2, 16, softmax_topk.LANES)
    want = _ranking_key(np.where(np.isnan(lanes), np.float32(np.inf), lanes).max(axis=2))
    np.testing.assert_array_equal(keys.numpy(), want)
    np.testing.assert_array_equal(groups.numpy()[:, 0], want.max(axis=1))
    assert keys.numpy()[0, 0, 3] == 0 and keys.numpy()[0, 1, 9] == 0x7F800000


def _stress_rows(n: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    rows = [
        np.full(n, 1.5, np.float32),  # all tied: the k lowest indices, whatever lane they sit in
        -np.abs(rng.standard_normal(n)).astype(np.float32),  # all negative, one negative NaN on top
        np.full(n, -np.inf, np.float32),  # fewer than k above -inf: no floor, the -inf ties by index
        (rng.standard_normal(n) * 3).astype(np.float32),  # ordinary, with ties at the k-th place
    ]
    rows[1][n // 2] = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
    rows[2][[n - 1, 300, 17]] = [2.0, 1.0, 2.0]
    top = np.sort(rows[3])[::-1]
    rows[3][np.argsort(-rows[3])[: 3 * 20 : 3]] = top[10]  # 20 equal values straddle k
    return np.stack(rows)


@pytest.mark.parametrize("k", [1, 5, 50])
@pytest.mark.parametrize("n", [4 * softmax_topk.BLOCK * softmax_topk.GROUP + 37, 1000])
def test_selection_on_ties_negative_nan_and_rows_without_a_floor(k, n):
    op = REGISTRY["SoftmaxTopK"]
    sample = Sample("stress", inputs=[_stress_rows(n)], attrs={"k": k})
    got = TVMSession(op.make_model(sample), shapes={"X": [4, n]}).run(op.feeds(sample))
    want = op.reference(*sample.inputs, **sample.attrs)
    conformance.compare(op, sample, got, want, 2e-6, 1e-37)


def test_written_scheduled_kernels_are_left_to_themselves():
    """The block maxima and the selection carry their own loops (attr tirx.is_scheduled): no hand
    schedule rule applies to them, and tuning leaves them out (softdeploy.tvm.ops.is_scheduled)."""
    from softdeploy.tvm.ops import apply_schedules, is_scheduled

    for func in (softmax_topk.block_max([4, 1000], "float32"), softmax_topk.select_top_k([4, 1000], 5, "float32")):
        assert is_scheduled(func)
        assert apply_schedules(func) is None


def test_shipped_records_schedule_the_tunable_kernels_at_the_benchmark_shape():
    """At bench/tvm_ops.py's shape the sums and values kernels come from softdeploy/tvm/records/avx512 (a
    change to their TIR needs a retune), and the build report counts the two written-scheduled
    kernels apart. The target is pinned to the records' class (znver4), whatever CPU runs the test."""
    from softdeploy.tvm.target import host_target

    op = REGISTRY["SoftmaxTopK"]
    x = np.random.default_rng(0).standard_normal((4, 32000)).astype(np.float32)
    sample = Sample("vocab", inputs=[x], attrs={"k": 5})
    report = TVMSession(op.make_model(sample), shapes={"X": [4, 32000]}, target=host_target("znver4")).report
    assert (report.written, report.tasks, report.from_database) == (2, 2, 2), report.summary()
    assert "2 written scheduled" in report.summary()
    assert "tuned records: avx512 class for -mcpu=znver4" in report.summary()


def test_small_kernels_keep_no_parallel_loop():
    """A kernel whose largest buffer holds fewer than two of the C++ kernels' tasks (65536 entries each)
    runs serial loops: waking the pool's workers cost more than it saved (build.PARALLEL_MIN_ELEMENTS)."""
    from softdeploy.tvm.build import PARALLEL_MIN_ELEMENTS, _largest_buffer, _parse_with_element_alignment

    small = softmax_topk.select_top_k([4, 32000], 5, "float32")
    large = softmax_topk.select_top_k([64, 32000], 5, "float32")
    assert _largest_buffer(small) < PARALLEL_MIN_ELEMENTS <= _largest_buffer(large)
    assert "T.parallel" not in _parse_with_element_alignment(small, serial=True).script()
    assert "T.parallel" in _parse_with_element_alignment(large).script()
