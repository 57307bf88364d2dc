"""TwoPassSoftmax invariants beyond the conformance samples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from softdeploy import conformance
from softdeploy.ops import REGISTRY, Sample

OP = REGISTRY["TwoPassSoftmax"]

finite_rows = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=300),
    elements=st.floats(-1e4, 1e4, width=32),
)


@given(finite_rows)
def test_rows_sum_to_one_and_match_reference(x):
    (y,) = conformance.run(OP, Sample("h", (x,)), "kernel")
    np.testing.assert_allclose(y.astype(np.float64).sum(axis=-1), 1.0, rtol=5e-6)
    (want,) = OP.reference(x)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-37)


@given(finite_rows, st.floats(-50, 50, width=32))
def test_shift_invariance(x, c):
    """softmax(x + c) = softmax(x): the kernel has no max pass, so this checks its exponent bookkeeping."""
    shifted = (x.astype(np.float64) + c).astype(np.float32)
    (a,) = conformance.run(OP, Sample("h", (x,)), "kernel")
    (b,) = conformance.run(OP, Sample("h", (shifted,)), "kernel")
    (ra,) = OP.reference(x)
    (rb,) = OP.reference(shifted)
    # compare each against its own oracle (x + c is rounded to float32, so a and b may differ slightly)
    np.testing.assert_allclose(a, ra, rtol=1e-6, atol=1e-37)
    np.testing.assert_allclose(b, rb, rtol=1e-6, atol=1e-37)


@given(
    hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 80)), elements=st.floats(-30, 30, width=32)),
    st.data(),
)
def test_masked_entries_are_exact_zeros(x, data):
    mask = data.draw(hnp.arrays(np.bool_, x.shape))
    mask[:, 0] = False  # keep one finite entry per row
    x = np.where(mask, -np.inf, x).astype(np.float32)
    for isa in conformance.available_isas():
        (y,) = conformance.run(OP, Sample("h", (x,)), "kernel", isa=isa)
        assert (y[mask] == 0).all()
        assert (y[~mask] > 0).all() or (x[~mask] < -80).any()  # tiny but nonzero unless underflow
        np.testing.assert_allclose(y.astype(np.float64).sum(-1), 1.0, rtol=5e-6)


def test_agrees_with_onnxruntime_softmax_on_large_rows():
    """The 64 x 256000 benchmark shape (streaming stores, several tasks) against the reference."""
    x = (np.random.default_rng(3).standard_normal((64, 256000)) * 3).astype(np.float32)
    (y,) = conformance.run(OP, Sample("big", (x,)), "kernel", threads=2)
    (want,) = OP.reference(x)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-37)


def test_long_unaligned_rows_with_special_rows_on_every_isa():
    """17 rows of 250007 (odd, so rows start at every 4-byte offset of a cache line; 244 summation
    blocks and a ragged last one; 17 MB, so x is read with the non-temporal hint) on every ISA, next to rows that fall back to the reference loop
    (NaN, all masked), hold masks, or sit at |x| ~ 5e3: the contract's 1e-6 holds for long rows too."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((17, 250007)) * 3).astype(np.float32)
    x[3, 12345] = np.nan
    x[5, :] = -np.inf
    x[7, ::3] = -np.inf
    x[9, :] += 5e3
    want = OP.reference(x)[0]
    for isa in conformance.available_isas():
        (y,) = conformance.run(OP, Sample("long_rows", (x,)), "kernel", isa=isa)
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-37, err_msg=isa)
        assert (y[7, ::3] == 0).all()


@pytest.mark.parametrize("top", [16.0, 15.9, -16.0, 16.1, 40.0])
def test_one_step_reduction_holds_the_contract_at_its_bound(top):
    """Blocks whose lane maxima are all within +-16 reduce x by one fma with a rounded ln2 (an error
    that grows with |x|): at the edge (max +-16, entries down to ~1e-37 of the output) the result
    must still be within 1e-6 of the reference; above it (16.1, 40) the two-step reduction runs."""
    rng = np.random.default_rng(5)
    x = rng.uniform(top - 85.0, top, (8, 4096)).astype(np.float32)
    x[:, ::97] = top  # every lane of every block reaches the maximum
    (want,) = OP.reference(x)
    for isa in conformance.available_isas():
        (y,) = conformance.run(OP, Sample("one_step", (x,)), "kernel", isa=isa)
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-37, err_msg=isa)


def _block_reference_rows() -> np.ndarray:
    """Rows that exercise the block reference of the vector rows (ops/two_pass_softmax_kernels.h, Row): each block's
    exponent comes from its first entries (and the blocks before), entries up to 79 above it are taken as they
    are, and more send the block (and the rest of the row) to the per-lane maxima."""
    rng = np.random.default_rng(17)
    n, block = 4 * 1024 + 77, 1024
    rows = np.tile(rng.uniform(-3.0, 3.0, n).astype(np.float32), (6, 1))
    # 0: block 0's head at 0 and its body at 79 (just inside), block 1's head at 88: block 0's sum, 2^114
    #    relative to its reference, is 2^-127 of the next reference -- its mass (~12% of the row) must survive
    rows[0, :block] = 79.0
    rows[0, :32] = 0.0
    rows[0, block] = 88.0
    # 1: the same with the body 79.5 above the head: block 0 is redone from its lane maxima
    rows[1, :block] = 79.5
    rows[1, :32] = 0.0
    # 2: a large-logit row (N(0, 120)): references far below the row's maximum, outputs down to 1e-37
    rows[2] = rng.normal(0.0, 120.0, n).astype(np.float32)
    # 3: a padding prefix of -1e4 (an additive mask), then the logits: the first reference fails once
    rows[3, :1500] = -1e4
    # 4: ascending: every block's body lies above its head (up to the 79 margin, then beyond)
    rows[4] = np.linspace(-300.0, 300.0, n, dtype=np.float32)
    # 5: one-step edge: heads at 16, bodies up to 95 (|x| <= 16 + 85 for every output that matters)
    rows[5] = rng.uniform(10.0, 95.0, n).astype(np.float32)
    for b in range(0, n, block):
        rows[5, b : b + 32] = 16.0
    return rows


def test_block_reference_rows_hold_the_contract_on_every_isa():
    """The block-reference path of pass 1 (no per-block max pass) and its fallback, on every ISA, against the
    float64 reference: a reference far below the row's maximum must not flush a block's mass (AVX2's 2^k products
    flush below 2^-126) or its outputs, and a failed reference recomputes the block."""
    x = _block_reference_rows()
    (want,) = OP.reference(x)
    for isa in conformance.available_isas():
        (y,) = conformance.run(OP, Sample("block_reference", (x,)), "kernel", isa=isa)
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-37, err_msg=isa)
