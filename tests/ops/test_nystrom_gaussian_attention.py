"""NystromGaussianAttention: properties the generic conformance tests cannot know
(docs/ops/NystromGaussianAttention.md; softdeploy/ops/nystrom_gaussian_attention.py;
ops/nystrom_gaussian_attention.cc)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from softdeploy import conformance
from softdeploy.ops import REGISTRY, Sample
from softdeploy.runtime import Session

OP = REGISTRY["NystromGaussianAttention"]
ISAS = conformance.available_isas()
RTOL, ATOL = OP.tolerance["float32"]
isa_param = pytest.mark.parametrize("isa", ISAS)


@functools.cache
def _session(isa: str, iters: int, reg: float) -> Session:
    tiny = np.zeros((1, 1, 1, 1), np.float32)
    model = OP.make_model(Sample("s", (tiny, tiny, tiny), {"newton_iters": iters, "regularization": reg}))
    with conformance.forced_isa(isa):
        return Session(model, kernels="native")


def kernel(q, v, lm, isa: str = ISAS[-1], *, iters: int = 20, reg: float = 0.01) -> np.ndarray:
    return _session(isa, iters, reg).run({"Q": q, "V": v, "Landmarks": lm})[0]


def pooled(q: np.ndarray, m: int) -> np.ndarray:
    """Average pools of n // m consecutive rows (the rest left out)."""
    b, h, n, d = q.shape
    return q[:, :, : (n // m) * m].reshape(b, h, m, n // m, d).mean(axis=3).astype(np.float32)


def soft_newton_inv(mat: np.ndarray, iters: int = 20) -> np.ndarray:
    """fudan-zvg/SOFT kernel/inverse.py newton_inv, in float64 (their alpha from the row sums of the
    matrix they are given, V_0 = alpha * mat^T)."""
    alpha = 2 / (np.max(np.sum(mat, axis=-1), axis=-1) ** 2)[..., None, None] * 0.9
    v = alpha * np.swapaxes(mat, -1, -2)
    for _ in range(iters):
        v = 2 * v - v @ mat @ v
    return v


@isa_param
@pytest.mark.parametrize(("n", "m", "d", "dv"), [(128, 16, 16, 16), (300, 32, 64, 40), (1000, 64, 64, 64)])
def test_kernel_matches_reference(isa, n, m, d, dv):
    rng = np.random.default_rng(n + m)
    q = (rng.standard_normal((1, 2, n, d)) * 0.5).astype(np.float32)
    v = rng.standard_normal((1, 2, n, dv)).astype(np.float32)
    lm = pooled(q, m)
    got, want = kernel(q, v, lm, isa), OP.reference(q, v, lm)[0]
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(got / scale, want / scale, rtol=RTOL, atol=ATOL)


def test_reference_is_softs_formula_with_ops_md_alpha():
    """The same composition as SOFT's released forward (kernel from |q|^2 + |k|^2 - 2 q.k on Q / d^(1/4),
    newton_inv on K2 + 0.01 I) where the contract's alpha (from K2, 1.8 = 0.9 * 2) equals theirs up to the
    regulariser in the row sums: with landmarks far apart K2 ~ I, so both alphas are ~1.8."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 64, 8)) * 3.0
    lm = np.concatenate([q[:, :, :4], q[:, :, 32:36]], axis=2)
    v = rng.standard_normal((1, 1, 64, 5))
    qs, ls = q / 8**0.25, lm / 8**0.25
    k1 = np.exp(
        -np.maximum((qs**2).sum(-1)[..., :, None] + (ls**2).sum(-1)[..., None, :] - 2 * qs @ np.swapaxes(ls, -1, -2), 0)
        / 2
    )
    k2 = np.exp(
        -np.maximum((ls**2).sum(-1)[..., :, None] + (ls**2).sum(-1)[..., None, :] - 2 * ls @ np.swapaxes(ls, -1, -2), 0)
        / 2
    )
    p = k2 + 0.01 * np.eye(8)
    theirs = k1 @ (soft_newton_inv(p) @ (np.swapaxes(k1, -1, -2) @ v))
    ours = OP.reference(q.astype(np.float32), v.astype(np.float32), lm.astype(np.float32))[0]
    np.testing.assert_allclose(ours, theirs, rtol=2e-3, atol=2e-3 * np.abs(theirs).max())


@isa_param
def test_newton_schulz_converges_to_the_regularised_inverse(isa):
    """Well-separated landmarks: 20 steps reach (K2 + reg I)^-1, so O equals the exact Nystrom form."""
    rng = np.random.default_rng(1)
    q = (rng.standard_normal((1, 1, 80, 4)) * 4.0).astype(np.float32)
    lm = q[:, :, ::10].copy()
    v = rng.standard_normal((1, 1, 80, 3)).astype(np.float32)
    q64, l64 = q.astype(np.float64), lm.astype(np.float64)
    kern = lambda a, b: np.exp(-((a[..., :, None, :] - b[..., None, :, :]) ** 2).sum(-1) / (2 * 2.0))  # noqa: E731
    k1, k2 = kern(q64, l64), kern(l64, l64)
    exact = k1 @ np.linalg.inv(k2 + np.float64(np.float32(0.01)) * np.eye(8)) @ (np.swapaxes(k1, -1, -2) @ v)
    np.testing.assert_allclose(kernel(q, v, lm, isa, iters=40), exact, rtol=1e-3, atol=1e-3 * np.abs(exact).max())


@isa_param
def test_cost_is_linear_in_n_no_n_by_n_matrix(isa):
    """Doubling n doubles nothing quadratic: outputs for the first rows do not change when rows are
    appended whose K1 rows are 0 (far away) -- and a 20000-row head runs (an n x n float32 matrix
    would be 1.6 GB)."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 1, 20000, 16)).astype(np.float32)
    v = rng.standard_normal((1, 1, 20000, 16)).astype(np.float32)
    lm = pooled(q[:, :, :19968], 64)
    out = kernel(q, v, lm, isa)
    assert out.shape == (1, 1, 20000, 16) and np.all(np.isfinite(out))
