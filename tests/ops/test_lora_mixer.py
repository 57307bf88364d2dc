"""LoRAMixer beyond the generic conformance tests: signed factors against an elementwise error bound
from the conditioning, the kernel never reading an unselected expert, omitted optional outputs, and
a fuzz of shapes and routings over every kernel variant."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from softdeploy import OpContractError, conformance
from softdeploy.ops import REGISTRY, Sample
from softdeploy.ops.lora_mixer import make_case
from softdeploy.runtime import Session

OP = REGISTRY["LoRAMixer"]
ISAS = conformance.available_isas()
U = 2.0**-24


def kernel(sample: Sample, isa: str | None = None, outputs: int = 3) -> list[np.ndarray]:
    with conformance.forced_isa(isa):
        session = Session(OP.make_model(sample, with_function=False, outputs=outputs), kernels="native")
    return session.run(OP.feeds(sample))


def error_bound(x, a, bm, router, top_k: int, scaling: float) -> np.ndarray:
    """Elementwise worst-case bound on |Delta - reference| for float32 arithmetic (any summation order):
    u * M_o * (2 (in + r) + 2 in max_e sum_i |Router_ei x_i|), where
    M_o = |scaling| sum_{e in S} w_e sum_j |Bm_e,oj| sum_i |A_e,ji x_i| is the size of the terms (the
    first factor: the dot products' rounding; the second: the gates' error through the logits)."""
    x2 = x.reshape(-1, x.shape[-1]).astype(np.float64)
    _, experts, gates = OP.reference(x, a, bm, router, top_k=top_k, scaling=scaling)
    experts, gates = experts.reshape(-1, top_k), gates.reshape(-1, top_k)
    m = np.zeros((x2.shape[0], bm.shape[1]))
    for slot in range(top_k):
        e = experts[:, slot]
        t = np.einsum("nri,ni->nr", np.abs(a[e].astype(np.float64)), np.abs(x2))
        m += gates[:, slot, None] * np.einsum("nor,nr->no", np.abs(bm[e].astype(np.float64)), t)
    m *= abs(scaling)
    rx = (np.abs(x2) @ np.abs(router.astype(np.float64)).T).max(axis=-1, keepdims=True)
    n_in, r = a.shape[2], a.shape[1]
    return (U * m * (2 * (n_in + r) + 2 * n_in * rx)).reshape(*x.shape[:-1], bm.shape[1])


def signed_case(rng, lead, n_in, n_out, e, r):
    x = rng.standard_normal((*lead, n_in)).astype(np.float32)
    a = (rng.standard_normal((e, r, n_in)) / np.sqrt(n_in)).astype(np.float32)
    bm = (rng.standard_normal((e, n_out, r)) / np.sqrt(r)).astype(np.float32)
    router = (rng.standard_normal((e, n_in)) / np.sqrt(n_in)).astype(np.float32)
    return x, a, bm, router


def routing_margin(x, router, top_k: int) -> float:
    """Smallest gap between the top_k-th and the next logit (float64): where it is below the logits'
    float32 error, the selection itself is ill-conditioned and backends may rightly differ."""
    logits = np.sort(x.reshape(-1, x.shape[-1]).astype(np.float64) @ router.astype(np.float64).T, axis=-1)[:, ::-1]
    if logits.shape[0] == 0 or top_k == logits.shape[1]:
        return np.inf
    return float((logits[:, top_k - 1] - logits[:, top_k]).min())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("n_in", "n_out", "e", "r", "top_k"), [(384, 384, 8, 8, 2), (100, 37, 5, 13, 3)])
def test_signed_factors_within_the_conditioning_bound(isa, n_in, n_out, e, r, top_k):
    rng = np.random.default_rng(3)
    x, a, bm, router = signed_case(rng, (64,), n_in, n_out, e, r)
    assert routing_margin(x, router, top_k) > 1e-4
    sample = Sample("signed", (x, a, bm, router), {"top_k": top_k, "scaling": 0.5})
    want = OP.reference(x, a, bm, router, top_k=top_k, scaling=0.5)
    delta, experts, gates = kernel(sample, isa)
    np.testing.assert_array_equal(experts, want[1])
    err = np.abs(delta - want[0])
    bound = error_bound(x, a, bm, router, top_k, 0.5)
    assert np.all(err <= bound), f"max err / bound {np.max(err / bound):.3g}"
    np.testing.assert_allclose(gates, want[2], rtol=2 * U * n_in * 8, atol=0)


def test_unselected_experts_are_never_computed():
    """Factors of an expert that no token selects, finite but so large that any product with them
    overflows float32, cannot reach the kernel's output: it never computes with them. The dense
    function body, which does (times a gate of 0), gets inf * 0 = NaN there."""
    rng = np.random.default_rng(4)
    x, a, bm, router = make_case(rng, (40,), 64, 32, 6, 8)
    router[3] = -np.abs(router[3]) - 10.0  # expert 3: logit far below the others (x >= 0)
    a_big, bm_big = a.copy(), bm.copy()
    a_big[3] = 3e38
    bm_big[3] = -3e38
    big = Sample("huge_expert", (x, a_big, bm_big, router), {"top_k": 2})
    clean = Sample("clean", (x, a, bm, router), {"top_k": 2})
    for isa in ISAS:
        got = kernel(big, isa)
        assert not np.isin(3, got[1])
        for g, w in zip(got, kernel(clean, isa), strict=True):
            np.testing.assert_array_equal(g, w, err_msg=isa)
    body = conformance.run(OP, big, "function")[0]
    assert np.isnan(body).all()  # what computing the unselected expert does


def test_non_finite_weights_are_refused_even_when_unselected():
    rng = np.random.default_rng(4)
    x, a, bm, router = make_case(rng, (8,), 16, 8, 4, 2)
    router[3] = -np.abs(router[3]) - 10.0  # expert 3 is never selected
    a[3, 1, 2] = np.nan
    for isa in ISAS:
        with pytest.raises(
            OpContractError, match=r"LoRAMixer: A holds a non-finite value \(NaN or \+-inf\) at \[3, 1, 2\]"
        ):
            kernel(Sample("nan", (x, a, bm, router), {"top_k": 1}), isa)


@pytest.mark.parametrize("r", [8, 3])  # r = 8: the register-permute transpose of Bm (and its tail rows)
@pytest.mark.parametrize(
    ("name", "index"),
    [("A", (1, 2, 5)), ("Bm", (1, 3, 1)), ("Bm", (2, 37, 0)), ("Router", (0, 7))],
)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_of_selected_experts_are_refused(name, index, value, r):
    """The kernel checks a selected expert's factors through its own work (A_e . x, the transpose of
    Bm_e, the logits) instead of a separate scan: each case must still fail naming the entry."""
    rng = np.random.default_rng(7)
    x, a, bm, router = make_case(rng, (40,), 24, 40, 4, r)
    _, experts, _ = OP.reference(x, a, bm, router, top_k=2)
    inputs = {"A": a, "Bm": bm, "Router": router}
    index = (*index[:-1], min(index[-1], inputs[name].shape[-1] - 1))
    inputs[name][index] = value
    assert name == "Router" or index[0] in experts  # the expert is selected by some token
    where = "[" + ", ".join(str(i) for i in index) + "]"
    for isa in ISAS:
        with pytest.raises(
            OpContractError, match=re.escape(f"LoRAMixer: {name} holds a non-finite value (NaN or +-inf) at {where}")
        ):
            kernel(Sample("bad", (x, a, bm, router), {"top_k": 2}), isa)


def test_overflow_with_finite_weights_is_not_an_error():
    """A_e . x overflowing float32 (finite X and weights) gives a non-finite Delta for that token, not
    the non-finite-weight error that the same sign triggers a scan for."""
    rng = np.random.default_rng(8)
    x, a, bm, router = make_case(rng, (6,), 16, 20, 4, 8)
    router *= 1e-30  # logits stay finite
    x[2] *= 1e30
    a *= 1e15
    for isa in ISAS:
        delta, _, gates = kernel(Sample("big", (x, a, bm, router), {"top_k": 2}), isa)
        assert not np.isfinite(delta[2]).all(), isa
        assert np.isfinite(np.delete(delta, 2, axis=0)).all() and np.isfinite(gates).all(), isa


@pytest.mark.parametrize("backend", ["reference", "function", "torch", *(f"kernel-{i}" for i in ISAS)])
def test_a_logit_beyond_float32_makes_the_token_non_finite_in_every_form(backend):
    """The logits are float32 values in every form (the float64 reference rounds them to float32 to decide
    finiteness): a logit of 4e38 (finite in float64) makes its token non-finite -- Delta and Gates NaN,
    Experts 0..k-1 -- and one of 3e38 (float32's max is 3.4e38) does not. Each logit is one product
    plus an exact 0 (no partial sum larger than the logit)."""
    x = np.array([[2e38, 0.0], [2e38, 0.0], [1.0, 1.0]], np.float32)
    router = np.array([[2.0, 0.0], [1.5, 0.0], [0.0, 1.0]], np.float32)  # token 0: logits 4e38, 3e38, 0
    x[1, 0] = 1e38  # token 1: logits 2e38, 1.5e38, 0 -- finite
    a = np.full((3, 2, 2), 0.25, np.float32)
    bm = np.full((3, 4, 2), 1e-39, np.float32)  # Delta of token 0/1 stays within float32 when finite
    sample = Sample("logit_overflow", (x, a, bm, router), {"top_k": 2})
    if backend.startswith("kernel-"):
        delta, experts, gates = kernel(sample, backend.removeprefix("kernel-"))
    else:
        delta, experts, gates = conformance.run(OP, sample, backend)
    assert np.isnan(delta[0]).all() and np.isnan(gates[0]).all(), (delta, gates)
    assert experts[0].tolist() == [0, 1]
    assert np.isfinite(delta[1:]).all() and np.isfinite(gates[1:]).all(), (delta, gates)
    assert experts[1].tolist() == [0, 1] and experts[2].tolist() == [0, 1]


def test_omitted_optional_outputs():
    rng = np.random.default_rng(5)
    sample = Sample("s", make_case(rng, (9,), 32, 16, 4, 8), {"top_k": 2})
    full = kernel(sample)
    (delta,) = kernel(sample, outputs=1)
    np.testing.assert_array_equal(delta, full[0])
    delta2, experts = kernel(sample, outputs=2)
    np.testing.assert_array_equal(delta2, full[0])
    np.testing.assert_array_equal(experts, full[1])


def test_tie_rule_and_special_tokens():
    sample = next(s for s in OP.samples(np.random.default_rng(0)) if s.name == "tied_router_rows")
    x, _, _, router = sample.inputs
    _, experts, _ = kernel(sample)
    logits = x.astype(np.float64) @ router.astype(np.float64).T
    for t in range(x.shape[0]):  # expert 2 never ranks above its twin 1, nor 5 above 4
        row = list(experts[t])
        if 2 in row:
            assert 1 in row and row.index(1) < row.index(2), (t, row, logits[t])
        if 5 in row:
            assert 4 in row and row.index(4) < row.index(5), (t, row, logits[t])
    sample = next(s for s in OP.samples(np.random.default_rng(0)) if s.name == "nan_inf_tokens")
    delta, experts, gates = kernel(sample)
    bad = [1, 4, 6, 8]
    assert np.isnan(delta[bad]).all() and np.isnan(gates[bad]).all()
    np.testing.assert_array_equal(experts[bad], np.tile(np.arange(2), (4, 1)))
    good = np.setdiff1d(np.arange(delta.shape[0]), bad)
    assert np.isfinite(delta[good]).all() and np.isfinite(gates[good]).all()


dims = st.tuples(
    st.integers(0, 70),  # tokens
    st.integers(1, 80),  # in
    st.integers(1, 40),  # out
    st.integers(1, 12),  # E
    st.integers(0, 20),  # r
)


@settings(max_examples=40, deadline=None)
@given(d=dims, k_frac=st.floats(0, 1), seed=st.integers(0, 2**31 - 1), scaling=st.sampled_from([1.0, 0.125, -3.0]))
def test_fuzz_against_reference(d, k_frac, seed, scaling):
    n_tok, n_in, n_out, e, r = d
    top_k = max(1, min(e, round(k_frac * e)))
    rng = np.random.default_rng(seed)
    x, a, bm, router = signed_case(rng, (n_tok,), n_in, n_out, e, r)
    assume(routing_margin(x, router, top_k) > 1e-4)
    sample = Sample("fuzz", (x, a, bm, router), {"top_k": top_k, "scaling": scaling})
    want = OP.reference(x, a, bm, router, top_k=top_k, scaling=scaling)
    bound = error_bound(x, a, bm, router, top_k, scaling)
    for isa in ISAS:
        delta, experts, gates = kernel(sample, isa)
        np.testing.assert_array_equal(experts, want[1], err_msg=isa)
        assert np.all(np.abs(delta - want[0]) <= bound), isa
        np.testing.assert_allclose(gates, want[2], rtol=2 * U * max(n_in, 1) * 16, atol=1e-30, err_msg=isa)
