"""SignedMaxSim beyond the generic conformance tests: the sparse construction under which it equals
any real-valued sparse inner product (which plain MaxSim cannot), argmax tie and mask rules, and
invariants (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from softdeploy import OpContractError, conformance
from softdeploy.ops import REGISTRY, Sample
from softdeploy.ops.max_sim import unit_tokens
from softdeploy.runtime import Session

OP = REGISTRY["SignedMaxSim"]
MAXSIM = REGISTRY["MaxSim"]


def kernel(*inputs: np.ndarray | None, isa: str | None = None) -> np.ndarray:
    # No function bodies: attaching them fills omitted masks (all true); the kernel must see them omitted.
    sample = Sample("t", tuple(inputs))
    with conformance.forced_isa(isa):
        session = Session(OP.make_model(sample, with_function=False), kernels="native")
    return session.run(OP.feeds(sample))[0]


def lift(x: dict[int, float], document: bool) -> tuple[np.ndarray, np.ndarray]:
    """Magnitude vectors of the sparse lifting (|x_t| (1, -t^2, 2t, -1) for queries, |y_s| (1, 1, s, s^2)
    plus the zero vector for documents) and the signs sign(x_t)."""
    rows, signs = [], []
    for t, v in sorted(x.items()):
        a = abs(v)
        rows.append([a, a, a * t, a * t * t] if document else [a, -a * t * t, 2 * a * t, -a])
        signs.append(1.0 if v > 0 else -1.0)
    if document:
        rows.append([0.0, 0.0, 0.0, 0.0])
        signs.append(1.0)
    return np.array(rows, np.float32).reshape(-1, 4), np.array(signs, np.float32)


nonzero = st.integers(-6, 6).filter(lambda v: v != 0).map(float)
sparse_real = st.dictionaries(st.integers(0, 40), nonzero, min_size=1, max_size=8)


@given(x=sparse_real, y=sparse_real)
def test_sparse_construction_gives_any_real_inner_product_exactly(x, y):
    q, qs = lift(x, document=False)
    d, ds = lift(y, document=True)
    want = sum(v * y.get(t, 0.0) for t, v in x.items())
    for isa in conformance.available_isas():
        got = kernel(q[None], qs[None], d[None], ds[None], isa=isa)
        assert got[0, 0] == want, isa


def test_plain_maxsim_cannot_represent_a_negative_inner_product():
    """x = (1), y = (-1): <x, y> = -1. SignedMaxSim gives it; MaxSim over the signed lift cannot go
    below the zero document vector's 0."""
    q, qs = lift({3: 1.0}, document=False)
    d, ds = lift({3: -1.0}, document=True)
    assert kernel(q[None], qs[None], d[None], ds[None])[0, 0] == -1.0
    signed_d = d * ds[:, None]
    plain = conformance.run(MAXSIM, Sample("t", (q[None], signed_d[None])), "kernel")[0]
    assert plain[0, 0] == 0.0


def test_ties_take_the_lowest_valid_token():
    q = np.array([[[1.0, 0.0]]], np.float32)
    d = np.array([[[2.0, 0.0], [2.0, 0.0], [2.0, 0.0]]], np.float32)
    ds = np.array([[-1.0, 0.5, 1.0]], np.float32)
    qs = np.ones((1, 1), np.float32)
    for isa in conformance.available_isas():
        assert kernel(q, qs, d, ds, isa=isa)[0, 0] == -2.0
        assert kernel(q, qs, d, ds, None, np.array([[False, True, True]]), isa=isa)[0, 0] == 1.0


def test_match_is_chosen_on_magnitude_then_signed():
    """The larger magnitude wins even when its sign makes the contribution negative."""
    q = np.array([[[1.0, 0.0]]], np.float32)
    d = np.array([[[3.0, 0.0], [1.0, 0.0]]], np.float32)
    got = kernel(q, np.ones((1, 1), np.float32), d, np.array([[-1.0, 1.0]], np.float32))
    assert got[0, 0] == -3.0


@pytest.mark.parametrize("backend", ["reference", "torch", "kernel"])
def test_sign_range_is_checked(backend):
    q, d = np.ones((1, 2, 3), np.float32), np.ones((1, 2, 3), np.float32)
    qs = np.array([[1.0, -1.25]], np.float32)
    with pytest.raises(OpContractError, match=r"QSign\[0, 1\] = -1.25 is outside \[-1, 1\]"):
        conformance.run(OP, Sample("t", (q, qs, d, np.ones((1, 2), np.float32))), backend)


shapes = st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(1, 4), st.integers(1, 20), st.integers(1, 40))


@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_invariants(shape, seed):
    """Matches the reference; all +1 signs reduce to MaxSim; flipping every query sign negates the
    scores; every ISA agrees."""
    b, lq, n, ld, dim = shape
    rng = np.random.default_rng(seed)
    q, d = np.abs(unit_tokens(rng, b, lq, dim)), np.abs(unit_tokens(rng, n, ld, dim))
    qs = rng.choice(np.array([-1.0, 1.0], np.float32), (b, lq))
    ds = rng.uniform(-1, 1, (n, ld)).astype(np.float32)
    qm, dm = rng.random((b, lq)) < 0.9, rng.random((n, ld)) < 0.8
    base = kernel(q, qs, d, ds, qm, dm)
    want = conformance.run(OP, Sample("t", (q, qs, d, ds, qm, dm)), "reference")[0]
    np.testing.assert_allclose(base, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(kernel(q, -qs, d, ds, qm, dm), -base)
    ones_q, ones_d = np.ones_like(qs), np.ones_like(ds)
    plain = conformance.run(MAXSIM, Sample("t", (q, d, qm, dm)), "kernel")[0]
    np.testing.assert_allclose(kernel(q, ones_q, d, ones_d, qm, dm), plain, rtol=1e-6, atol=1e-6)
    for isa in conformance.available_isas():
        np.testing.assert_allclose(kernel(q, qs, d, ds, qm, dm, isa=isa), base, rtol=1e-5, atol=1e-5)
