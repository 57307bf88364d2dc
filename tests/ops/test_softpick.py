"""Softpick: properties the generic conformance tests cannot know (docs/ops/Softpick.md;
softdeploy/ops/softpick.py; ops/softpick.cc).

Kernel runs go through onnxruntime with our library, in every ISA variant this CPU has."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from softdeploy import conformance
from softdeploy.ops import REGISTRY, Sample
from softdeploy.runtime import Session

OP = REGISTRY["Softpick"]
ISAS = conformance.available_isas()
RTOL, ATOL = OP.tolerance["float32"]


@functools.cache
def _session(isa: str, rank: int, axis: int, eps: float) -> Session:
    model = OP.make_model(Sample("s", (np.zeros([1] * rank, np.float32),), {"axis": axis, "eps": eps}))
    with conformance.forced_isa(isa):
        return Session(model, kernels="native")


def kernel(x: np.ndarray, isa: str = ISAS[-1], *, axis: int = -1, eps: float = 1e-6) -> np.ndarray:
    return _session(isa, x.ndim, axis, eps).run({"X": np.ascontiguousarray(x, np.float32)})[0]


def reference(x: np.ndarray, **attrs) -> np.ndarray:
    return OP.reference(x, **attrs)[0]


def authors_naive(x: np.ndarray, eps: float) -> np.ndarray:
    """naive_softpick_attn.softpick of zaydzuhri/softpick-attention, in float64 (finite rows)."""
    x = x.astype(np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m) - np.exp(-m)
    return np.maximum(e, 0) / (np.sum(np.where(np.isfinite(x), np.abs(e), 0), axis=-1, keepdims=True) + eps)


def rows(min_value: float = -30.0, max_value: float = 30.0, max_n: int = 300) -> st.SearchStrategy:
    """float32 matrices of finite logits: 1-4 rows of 1..max_n, covering SIMD tails and block edges."""
    shape = st.tuples(st.integers(1, 4), st.integers(1, max_n))
    elements = st.floats(min_value, max_value, width=32, allow_subnormal=min_value < 0 < max_value)
    return hnp.arrays(np.float32, shape, elements=elements)


isa_param = pytest.mark.parametrize("isa", ISAS)


# ---- hypothesis properties ---------------------------------------------------------------------


@isa_param
@given(x=rows())
def test_zero_exactly_where_x_is_not_positive(isa, x):
    y = kernel(x, isa)
    assert np.all(y[x <= 0] == 0)
    # and positive where x > 0, unless the exact value is below float32's normal range
    want = reference(x)
    assert np.all(y[(x > 0) & (want > 1e-37)] > 0)
    assert np.all(reference(x)[x <= 0] == 0)


@isa_param
@given(x=rows(), eps=st.sampled_from([0.0, 1e-8, 1e-6, 1.0]))
def test_row_sums_at_most_one(isa, x, eps):
    y = kernel(x, isa, eps=eps).astype(np.float64)
    assert np.all(y.sum(axis=-1) <= 1 + 1e-5)
    assert np.all(reference(x, eps=eps).sum(axis=-1) <= 1 + 1e-12)


@isa_param
@given(x=rows(-20.0, 20.0), eps=st.sampled_from([1e-8, 1e-6, 1e-2]))
def test_agrees_with_authors_naive_formula_on_finite_rows(isa, x, eps):
    want = authors_naive(x, eps)
    # The naive exp(x - m) - exp(-m) cancels for |x| << 1 (~1e-16 / |x| relative): 1e-7 is its accuracy
    # at |x| ~ 1e-8, ours (expm1-based) is exact there.
    np.testing.assert_allclose(reference(x, eps=eps), want, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(kernel(x, isa, eps=eps), want, rtol=1e-5, atol=1e-7)


@isa_param
@given(x=rows(), data=st.data())
def test_permuting_a_row_permutes_its_outputs(isa, x, data):
    perm = data.draw(st.permutations(range(x.shape[1])))
    y = kernel(x, isa)
    np.testing.assert_allclose(kernel(x[:, perm], isa), y[:, perm], rtol=RTOL, atol=ATOL)


@isa_param
@given(x=rows(max_n=100), data=st.data())
def test_masked_entries_change_nothing(isa, x, data):
    """Inserting -inf (mask), NaN or +inf entries leaves the other outputs as they were (they add
    nothing to m or the denominator); -inf outputs 0, NaN outputs NaN, +inf outputs +inf."""
    n = x.shape[1]
    where = data.draw(st.lists(st.integers(0, n), min_size=1, max_size=8))
    value = data.draw(st.sampled_from([-np.inf, np.nan, np.inf]))
    wide = np.insert(x, where, np.float32(value), axis=1)
    inserted = np.ones(wide.shape[1], bool)
    inserted[np.asarray(sorted(where)) + np.arange(len(where))] = False  # True at the original entries
    y = kernel(wide, isa)
    np.testing.assert_allclose(y[:, inserted], kernel(x, isa), rtol=RTOL, atol=ATOL)
    expected = 0.0 if value == -np.inf else value
    np.testing.assert_array_equal(y[:, ~inserted], np.full((x.shape[0], len(where)), expected, np.float32))


@isa_param
@given(x=rows(0.0625, 30.0, max_n=64), eps=st.sampled_from([0.0, 1e-6, 10.0]))
def test_ratios_of_outputs_do_not_depend_on_the_rest_of_the_row(isa, x, eps):
    """y_i / y_k = expm1(x_i) / expm1(x_k): the denominator (other entries, eps) cancels."""
    y = kernel(x, isa, eps=eps).astype(np.float64)
    ok = y[:, :1] > 1e-30
    want = np.expm1(x.astype(np.float64)) / np.expm1(x[:, :1].astype(np.float64))
    got = y / np.where(ok, y[:, :1], 1.0)
    big = ok & (y > 1e-30)
    np.testing.assert_allclose(got[big], want[big], rtol=5e-6)


@isa_param
@given(x=rows(max_n=80), extra=rows(max_n=80))
def test_rows_are_independent(isa, x, extra):
    """A row's output is the same, bit for bit, alone or in a batch (threads split rows)."""
    n = min(x.shape[1], extra.shape[1])
    batch = np.concatenate([x[:, :n], extra[:, :n]])
    np.testing.assert_array_equal(kernel(batch, isa)[: x.shape[0]], kernel(x[:, :n], isa))


# ---- numerics and special values ------------------------------------------------------------------


@isa_param
@pytest.mark.parametrize("shift", [-100.0, -1e4, -1e30])
def test_very_negative_max_gives_exact_zeros(isa, shift):
    """m << 0: exp(-m) overflows float32 in the shifted formula; every output is exactly 0."""
    x = (np.random.default_rng(0).standard_normal((3, 1000)) + shift).astype(np.float32)
    x[1, 5] = -np.inf
    y = kernel(x, isa)
    assert np.array_equal(y, np.zeros_like(y))


@isa_param
@pytest.mark.parametrize("shift", [50.0, 70.0, 200.0, 1e4, 6e4, 1e6])
def test_large_logits(isa, shift):
    """Rescaling paths: beyond ~69 the kernel raises its power-of-two scale; beyond 2^16 it switches
    to the double-precision row."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 3000)) * 3).astype(np.float32)
    x[0] += np.float32(shift)
    x[1, 2900] = shift  # found late: the staged prefix is rescaled
    x[2, ::7] = shift + rng.standard_normal(x[2, ::7].shape).astype(np.float32)
    np.testing.assert_allclose(kernel(x, isa), reference(x), rtol=RTOL, atol=ATOL)


@isa_param
def test_near_zero_inputs_keep_relative_precision(isa):
    """expm1 without cancellation: outputs of logits ~1e-6 stay accurate to float32 precision."""
    x = (np.random.default_rng(2).standard_normal((2, 500)) * 1e-6).astype(np.float32)
    x[1, 0] = 5.0
    np.testing.assert_allclose(kernel(x, isa), reference(x), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("backend", ["reference", "function", "torch", *(f"kernel-{i}" for i in ISAS)])
def test_non_finite_semantics_on_every_backend(backend):
    x = np.array(
        [
            [1.0, np.nan, -np.inf, np.inf, 2.0, -1.0],  # NaN -> NaN, -inf -> 0, +inf -> +inf, others as if absent
            [np.nan, -np.inf, np.inf, np.nan, -np.inf, np.inf],  # no finite entry -> all zeros
            [-np.inf] * 6,  # fully masked -> all zeros
            [-3.0, -2.0, 0.0, -0.0, -1.0, np.nan],  # all finite <= 0 -> zeros; NaN stays NaN
        ],
        np.float32,
    )
    name, _, isa = backend.partition("-")
    y = conformance.run(OP, Sample("special", (x,)), name, isa=isa or None)[0]
    alone = reference(np.array([[1.0, 2.0, -1.0]], np.float32))[0]
    np.testing.assert_allclose(y[0, [0, 4, 5]], alone, rtol=1e-4)
    assert np.isnan(y[0, 1]) and y[0, 2] == 0 and y[0, 3] == np.inf
    assert np.array_equal(y[1], np.zeros(6)) and np.array_equal(y[2], np.zeros(6))
    assert np.array_equal(y[3, :5], np.zeros(5)) and np.isnan(y[3, 5])


@isa_param
def test_eps_zero_with_zero_denominator_is_zero_not_nan(isa):
    x = np.array([[0.0, 0.0], [0.0, -0.0], [1e-30, 0.0]], np.float32)
    y = kernel(x, isa, eps=0.0)
    np.testing.assert_array_equal(y[:2], np.zeros((2, 2), np.float32))
    assert y[2, 0] == np.float32(1.0) and y[2, 1] == 0


def test_eps_scales_the_denominator_as_in_the_shifted_formula():
    """eps acts on the max-shifted sum: y = expm1(x_i) / (sum |expm1(x_j)| + eps * e^m)."""
    x = np.array([[3.0, 1.0, -2.0]], np.float32)
    t = np.abs(np.expm1(x.astype(np.float64))).sum()
    want = np.expm1(x.astype(np.float64)).clip(0) / (t + 0.5 * np.exp(3.0))
    np.testing.assert_allclose(kernel(x, eps=0.5), want, rtol=RTOL)


# ---- torch export ----------------------------------------------------------------------------


def test_torch_module_exports_and_runs_with_and_without_the_library(tmp_path):
    torch = pytest.importorskip("torch")
    from softdeploy.export.torch_export import export_module
    from softdeploy.ops._torch import register_torch_ops

    register_torch_ops()

    class Scores(torch.nn.Module):
        def forward(self, q, k):
            s = q @ k.transpose(-1, -2) * 0.25
            mask = torch.triu(torch.full((s.shape[-1], s.shape[-1]), float("-inf")), diagonal=1)
            return torch.ops.softdeploy.softpick(s + mask, -1, 1e-6)

    q, k = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    want = Scores().eval()(q, k).numpy()
    model = export_module(Scores().eval(), (q, k), tmp_path / "softpick.onnx", input_names=["q", "k"])
    nodes = [n for n in model.graph.node if n.domain == "com.softdeploy"]
    assert [n.op_type for n in nodes] == ["Softpick"]
    assert [f.name for f in model.functions] == ["Softpick"]
    feeds = {"q": q.numpy(), "k": k.numpy()}
    for kernels in ("native", "portable"):
        got = Session(tmp_path / "softpick.onnx", kernels=kernels).run(feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=kernels)
    assert np.all(want[..., np.triu_indices(5, 1)[0], np.triu_indices(5, 1)[1]] == 0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("eps", [0.388, 10.0])
@pytest.mark.parametrize("m", [70.5, 1000.25, 2.77e4, 6.5e4])
def test_significant_eps_keeps_precision_as_the_max_grows(isa, eps, m):
    """The eps term eps * e^m is formed at the row's scale 2^-R as e^(m - R ln2); m and R ln2 cancel, so
    evaluating that exponent in float32 lost ~ulp(m) / 2 (2.0e-4 relative in y portable, 2.1e-5 AVX2 at
    eps = 0.388, m = 2.77e4). The contract's 1e-6 holds at every magnitude up to the fast path's 2^16."""
    rng = np.random.default_rng(7)
    x = np.concatenate([np.full((2, 1), m), m + rng.standard_normal((2, 63)) * 3], axis=1).astype(np.float32)
    x[1, 1:] = rng.standard_normal(63)  # one large logit among small ones: y_0 = 1 / (1 + eps) almost
    np.testing.assert_allclose(kernel(x, isa, eps=eps), reference(x, eps=eps), rtol=RTOL, atol=ATOL)
