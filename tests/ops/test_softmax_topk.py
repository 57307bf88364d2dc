"""SoftmaxTopK beyond the generic conformance tests: properties against TwoPassSoftmax, the ranking
rule on ties and special values, every kernel variant agreeing, the optional LogSumExp output and
the torch -> ONNX export."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from softdeploy import conformance
from softdeploy.ops import REGISTRY, Sample
from softdeploy.runtime import Session

OP = REGISTRY["SoftmaxTopK"]
SOFTMAX = REGISTRY["TwoPassSoftmax"]
ISAS = conformance.available_isas()


def kernel(x: np.ndarray, isa: str | None = None, outputs: int = 3, **attrs: object) -> list[np.ndarray]:
    sample = Sample("h", (x,), attrs)
    # No function bodies: attaching them names omitted outputs, and the kernel must see the 2-output node.
    with conformance.forced_isa(isa):
        session = Session(OP.make_model(sample, with_function=False, outputs=outputs), kernels="native")
    return session.run(OP.feeds(sample))


def top_k_of(p: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of each row of p: value descending, lower index first."""
    order = np.lexsort((np.broadcast_to(np.arange(p.shape[-1]), p.shape), -p), axis=-1)
    return order[:, :k]


# Logits on a grid of 1/8 within [-8, 8]: many exact ties, and distinct logits give probabilities
# that differ by at least a factor e^(1/32) at T <= 4, so float32 probabilities order like the logits.
grid_rows = st.integers(1, 4).flatmap(
    lambda b: st.integers(1, 300).flatmap(
        lambda n: st.lists(st.integers(-64, 64), min_size=b * n, max_size=b * n).map(
            lambda v: (np.array(v, np.float32) / 8).reshape(b, n)
        )
    )
)


@given(x=grid_rows, k_frac=st.floats(0.0, 1.0), temperature=st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0]))
def test_equals_top_k_of_two_pass_softmax(x, k_frac, temperature):
    k = max(1, round(k_frac * x.shape[1]))
    p = conformance.run(SOFTMAX, Sample("p", (x / np.float32(temperature),)), "kernel")[0]
    want_idx = top_k_of(p, k)
    for isa in ISAS:
        values, indices, _ = kernel(x, isa, k=k, temperature=temperature)
        np.testing.assert_array_equal(indices, want_idx, err_msg=isa)
        np.testing.assert_allclose(values, np.take_along_axis(p, want_idx, -1), rtol=1e-5, err_msg=isa)
        assert np.all(np.diff(values, axis=-1) <= 0), "values must be sorted descending"


wide_rows = st.integers(1, 3).flatmap(
    lambda b: st.integers(1, 700).flatmap(
        lambda n: st.lists(
            st.one_of(st.floats(-1e4, 1e4, width=32), st.floats(-30, 30, width=32), st.just(float("-inf"))),
            min_size=b * n,
            max_size=b * n,
        ).map(lambda v: np.array(v, np.float32).reshape(b, n))
    )
)


@given(x=wide_rows, k=st.integers(1, 40), temperature=st.floats(0.05, 20.0))
def test_values_and_log_sum_exp_are_consistent(x, k, temperature):
    k = min(k, x.shape[1])
    ref_values, ref_indices, ref_lse = OP.reference(x, k=k, temperature=temperature)
    results = [kernel(x, isa, k=k, temperature=temperature) for isa in ISAS]
    for isa, (values, indices, lse) in zip(ISAS, results, strict=True):
        np.testing.assert_array_equal(indices, ref_indices, err_msg=isa)
        np.testing.assert_allclose(values, ref_values, rtol=2e-6, atol=1e-37, equal_nan=True, err_msg=isa)
        finite = np.isfinite(ref_lse[:, 0])
        # LogSumExp is absolutely accurate to ~1e-6 (the normaliser's relative error) ...
        np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=1e-6, atol=2e-6, err_msg=isa)
        np.testing.assert_array_equal(lse[~finite], ref_lse[~finite], err_msg=isa)
        # ... and log(Values) + LogSumExp gives back the scaled logits of the winners.
        z = np.take_along_axis(x.astype(np.float64), indices, -1) / temperature
        rows = finite & (values[:, -1] > 1e-30)
        np.testing.assert_allclose(
            np.log(values[rows].astype(np.float64)) + lse[rows], z[rows], rtol=1e-6, atol=5e-6, err_msg=isa
        )
        assert np.all(np.diff(values[finite], axis=-1) <= 0)
        assert np.all(values[finite].sum(-1) <= 1 + 1e-6)
    # Every variant selects the same entries and agrees on the values.
    for values, indices, _ in results[1:]:
        np.testing.assert_array_equal(indices, results[0][1])
        np.testing.assert_allclose(values, results[0][0], rtol=4e-6, atol=1e-37)


@pytest.mark.parametrize("isa", ISAS)
def test_ranking_rule_for_special_rows(isa):
    x = np.zeros((4, 6), np.float32)
    x[0] = [1.0, np.nan, np.inf, 3.0, np.nan, -np.inf]  # NaN (lower index first), +inf, then values
    x[1] = [1.0, np.inf, 2.0, np.inf, 3.0, 0.0]  # +inf row: the +inf entries first
    x[2] = -np.inf  # all -inf: indices 0, 1, 2, ...
    x[3] = [-np.inf, -1e30, -np.inf, 0.0, -1e30, -np.inf]  # zero probabilities keep ranking by logit
    values, indices, lse = kernel(x, isa, k=4)
    np.testing.assert_array_equal(indices, [[1, 4, 2, 3], [1, 3, 4, 2], [0, 1, 2, 3], [3, 1, 4, 0]])
    assert np.isnan(values[:3]).all()
    np.testing.assert_array_equal(values[3], [1.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(lse[:, 0], [np.nan, np.inf, -np.inf, 0.0])


@pytest.mark.parametrize("isa", ISAS)
def test_ties_across_simd_lanes_and_blocks_keep_lower_index(isa):
    # The same value at every 37th position of a 5000-long row: winners must come in index order.
    x = np.full((2, 5000), -1.0, np.float32)
    x[:, ::37] = 2.0
    values, indices, _ = kernel(x, isa, k=50)
    np.testing.assert_array_equal(indices, np.tile(np.arange(0, 50 * 37, 37), (2, 1)))
    assert np.all(values == values[:, :1])


@pytest.mark.parametrize("isa", ISAS)
def test_masked_rows_match_the_reference(isa):
    """Masked vocabularies (constrained decoding): the first 64 entries masked, fewer than k entries
    left above -inf (the top then ends in the first -inf entries by index), one entry left."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((4, 5000)) * 3).astype(np.float32)
    x[0, :64] = -np.inf
    x[1, :] = -np.inf
    x[1, [4000, 70, 2500]] = [1.0, 2.0, 1.0]
    x[2, :-1] = -np.inf
    x[3, 100:] = -np.inf
    got = kernel(x, isa, k=5)
    sample = Sample("masked", (x,), {"k": 5})
    conformance.compare(OP, sample, got, OP.reference(x, k=5), 2e-6, 1e-37)
    np.testing.assert_array_equal(got[1][1], [70, 2500, 4000, 0, 1])


def test_without_log_sum_exp_output():
    x = (np.random.default_rng(3).standard_normal((5, 1000)) * 3).astype(np.float32)
    two = kernel(x, outputs=2, k=7)
    three = kernel(x, outputs=3, k=7)
    assert len(two) == 2
    np.testing.assert_array_equal(two[0], three[0])
    np.testing.assert_array_equal(two[1], three[1])


@pytest.mark.parametrize("with_lse", [False, True])
def test_torch_module_exports_to_a_softmax_topk_node(with_lse, tmp_path):
    torch = pytest.importorskip("torch")
    from softdeploy.export.torch_export import export_module
    from softdeploy.ops._torch import register_torch_ops

    register_torch_ops()

    class Decoder(torch.nn.Module):
        def forward(self, logits):
            values, indices, lse = torch.ops.softdeploy.softmax_topk(logits * 2.0, 5, -1, 0.7)
            return (values, indices, lse) if with_lse else (values, indices)

    x = torch.randn(3, 2000)
    model = export_module(Decoder().eval(), (x,))
    nodes = [n for n in model.graph.node if n.domain == "com.softdeploy"]
    assert [n.op_type for n in nodes] == ["SoftmaxTopK"]
    # An unused LogSumExp is omitted (named ""), so the kernel does not compute it; stock
    # onnxruntime's function inliner needs the output slot to exist, so it is not dropped.
    assert [bool(o) for o in nodes[0].output] == [True, True, with_lse]
    want = OP.reference(x.numpy() * 2.0, k=5, temperature=0.7)[: 3 if with_lse else 2]
    feeds = {model.graph.input[0].name: x.numpy()}
    for kernels in ("native", "portable"):
        got = Session(model, kernels=kernels).run(feeds)
        assert len(got) == len(want)
        conformance.compare(OP, Sample("export", (x.numpy(),)), tuple(got), want, 1e-5, 1e-30)


def test_torch_op_on_a_huge_but_empty_input_returns_at_once():
    """X [0, 2^40]: nothing to select; torch's sort once tried to allocate along the 2^40 axis."""
    import torch

    from softdeploy.ops._torch import torch_op

    values, indices, lse = torch_op(OP)(torch.empty(0, 2**40), k=1)
    assert values.shape == indices.shape == (0, 1) and lse.shape == (0, 1) and indices.dtype == torch.int64
