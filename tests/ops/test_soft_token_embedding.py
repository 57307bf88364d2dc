"""SoftTokenEmbedding beyond the generic conformance tests: invariants as hypothesis properties (weights sum to
1, ids distinct and ordered by weight, Mixed = Weights @ Embedding[Ids]), identical Ids under a fixed Noise
across the reference, the function body, every kernel variant and the torch op, the filters' prefix rule
against a literal composition of the samplers' steps, and the nn module."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softdeploy import OpContractError, conformance
from softdeploy.ops import REGISTRY, Sample
from softdeploy.ops.soft_token_embedding import reference

OP = REGISTRY["SoftTokenEmbedding"]
ISAS = conformance.available_isas()
BACKENDS = [("function", None), ("torch", None)] + [("kernel", isa) for isa in ISAS]


def run(backend: str, isa: str | None, inputs: tuple, attrs: dict) -> tuple[np.ndarray, ...]:
    return conformance.run(OP, Sample("h", inputs, attrs), backend, isa=isa)


# Rows of N(0, scale^2) logits with a fixed Noise: continuous values, so ties and threshold hits
# have probability 0 and every backend must give the same Ids.
rows = st.tuples(st.integers(1, 4), st.integers(2, 400), st.integers(1, 9), st.integers(0, 2**31 - 1))
filters = st.fixed_dictionaries(
    {
        "temperature": st.sampled_from([0.3, 0.6, 1.0, 2.0]),
        "top_k": st.sampled_from([0, 1, 3, 20]),
        "top_p": st.sampled_from([1.0, 0.95, 0.7]),
        "min_p": st.sampled_from([0.0, 0.001, 0.1]),
        "noise": st.sampled_from(["none", "gumbel"]),
        "tau": st.sampled_from([0.1, 0.5, 1.0]),
    }
)


def draw(shape: tuple[int, int, int, int], max_topk_frac: float) -> tuple[tuple, int]:
    b, v, e, seed = shape
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((b, v)) * 3).astype(np.float32)
    emb = rng.standard_normal((v, e)).astype(np.float32)
    u = rng.uniform(1e-6, 1 - 1e-6, (b, v)).astype(np.float32)
    mode = rng.integers(0, 2, b).astype(np.int64)
    return (x, emb, u, mode), max(1, min(v, round(max_topk_frac * 12) + 1))


@settings(max_examples=40, deadline=None)
@given(shape=rows, attrs=filters, k_frac=st.floats(0.0, 1.0))
def test_invariants_and_identical_ids_across_backends(shape, attrs, k_frac):
    inputs, k = draw(shape, k_frac)
    attrs = {**attrs, "max_topk": k, "after_thinking_top_k": 2}
    mixed, w, ids, entropy = reference(*inputs, **attrs)
    x, emb = inputs[0], inputs[1]
    np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-6)
    assert (w >= 0).all()
    for b in range(x.shape[0]):
        assert len(set(ids[b].tolist())) == k  # distinct
        assert (np.diff(w[b].astype(np.float64)) <= 1e-7).all()  # ordered by weight
    np.testing.assert_allclose(mixed, np.einsum("bk,bke->be", w, emb[ids]), rtol=1e-5, atol=1e-5)
    assert (entropy >= -1e-6).all() and (entropy <= np.log(x.shape[1]) + 1e-4).all()
    for backend, isa in BACKENDS:
        got = run(backend, isa, inputs, attrs)
        np.testing.assert_array_equal(got[2], ids, err_msg=f"{backend} {isa}")
        np.testing.assert_allclose(got[1], w, rtol=1e-4, atol=1e-6, err_msg=f"{backend} {isa}")
        np.testing.assert_allclose(got[3], entropy, rtol=1e-4, atol=3e-5, err_msg=f"{backend} {isa}")


def literal_steps(x: np.ndarray, t: float, top_k: int, top_p: float, min_p: float, k: int) -> tuple:
    """The samplers' steps one by one on the full probability row (top_k renorm -> top_p renorm -> min_p renorm ->
    top max_topk renorm), with ranks by logit and lower id first."""
    p = np.exp(x / t - (x / t).max())
    p /= p.sum()
    order = np.lexsort((np.arange(x.size), -x))
    ps = p[order].copy()
    if 0 < top_k < x.size:
        ps[top_k:] = 0
        ps /= ps.sum()
    if top_p < 1:
        before = np.concatenate(([0.0], np.cumsum(ps)[:-1]))
        ps[~(before < top_p)] = 0
        ps /= ps.sum()
    if min_p > 0:
        ps[ps < min_p * ps[0]] = 0
        ps /= ps.sum()
    w = ps[:k] / ps[:k].sum()
    return w, order[:k]


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p"),
    [(0, 1.0, 0.0), (7, 1.0, 0.0), (0, 0.6, 0.0), (30, 0.8, 0.0), (0, 1.0, 0.05), (25, 0.9, 0.01)],
)
def test_filters_equal_the_samplers_renormalisation_steps(top_k, top_p, min_p):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 500)) * 2).astype(np.float32)
    emb = rng.standard_normal((500, 4)).astype(np.float32)
    attrs = {"temperature": 0.7, "top_k": top_k, "top_p": top_p, "min_p": min_p, "max_topk": 12}
    _, w, ids, _ = reference(x, emb, **attrs)
    for b in range(3):
        want_w, want_ids = literal_steps(x[b].astype(np.float64), np.float32(0.7), top_k, top_p, min_p, 12)
        np.testing.assert_array_equal(ids[b], want_ids)
        np.testing.assert_allclose(w[b], want_w, rtol=1e-6, atol=1e-12)


def test_after_thinking_rows_use_their_filters_and_no_noise():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 300)) * 2).astype(np.float32)
    emb = rng.standard_normal((300, 4)).astype(np.float32)
    u = rng.uniform(0.01, 0.99, (2, 300)).astype(np.float32)
    attrs = {"noise": "gumbel", "tau": 0.3, "after_thinking_top_k": 3, "after_thinking_temperature": 0.5}
    both = reference(x, emb, u, np.array([0, 1], np.int64), **attrs)
    plain = reference(x[1:], emb, None, None, temperature=0.5, top_k=3)
    for got, want in zip(both[1:], plain[1:], strict=True):
        np.testing.assert_array_equal(got[1:], want)
    assert (both[1][1, 3:] == 0).all()  # top_k 3: the other slots weigh nothing
    assert (both[1][0] > 0).all()  # Gumbel: every slot of the thinking row gets weight


@pytest.mark.parametrize(("backend", "isa"), BACKENDS)
def test_special_rows_are_nan_with_ranked_ids(backend, isa):
    x = np.zeros((3, 8), np.float32)
    x[0, :] = -np.inf
    x[1, 5] = np.nan
    x[2, 2] = np.inf
    emb = np.ones((8, 2), np.float32)
    mixed, w, ids, entropy = run(backend, isa, (x, emb), {"max_topk": 3})
    assert np.isnan(w).all() and np.isnan(mixed).all() and np.isnan(entropy).all()
    np.testing.assert_array_equal(ids, [[0, 1, 2], [5, 0, 1], [2, 0, 1]])


@pytest.mark.parametrize("isa", ISAS)
def test_kernel_noise_error_names_the_lowest_row_at_any_thread_count(isa):
    x = np.zeros((4, 6), np.float32)
    u = np.full((4, 6), 0.5, np.float32)
    u[3, 0] = 2.0
    u[1, 0] = -1.0
    sample = Sample("bad", (x, np.zeros((6, 2), np.float32), u), {"max_topk": 6, "noise": "gumbel"})
    for threads in (1, 2):
        with pytest.raises(OpContractError, match=r"Noise\[1, 0\] = -1 is outside \[0, 1\]"):
            conformance.run(OP, sample, "kernel", isa=isa, threads=threads, task_grain=1)


def test_module_matches_the_reference_and_exports_to_the_op():
    import torch

    import softdeploy
    from softdeploy import nn as sdnn

    torch.manual_seed(0)
    table = torch.nn.Embedding(400, 8)
    module = sdnn.SoftTokenEmbedding(table, temperature=0.6, min_p=0.001, max_topk=5, noise="gumbel", tau=0.5)
    x, u, mode = torch.randn(3, 400) * 3, torch.rand(3, 400), torch.tensor([0, 1, 0])
    got = module(x, u, mode)
    want = reference(x.numpy(), table.weight.detach().numpy(), u.numpy(), mode.numpy(), **module.attrs)
    np.testing.assert_array_equal(got[2].numpy(), want[2])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.detach().numpy(), w, rtol=1e-5, atol=1e-6)
    result = softdeploy.export(module, (x, u, mode))
    assert result.custom_ops == ["SoftTokenEmbedding"]
    assert result.validation is not None and result.validation.ok, result.validation
    with pytest.raises(OpContractError, match="max_topk 401 is larger than V = 400"):
        sdnn.SoftTokenEmbedding(table, max_topk=401)
