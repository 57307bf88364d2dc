"""The softening operators against their axioms (hypothesis, float64), and top-k truncation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softdeploy.distill import SOFTENING, PowerSoftening, UniformMixing, entropy, get_softening, truncate_topk
from softdeploy.distill.softening import SofteningOperator, register_softening
from softdeploy.errors import ArgumentError

FAMILIES = sorted(SOFTENING)


@st.composite
def distributions(draw: st.DrawFn, min_size: int = 2, max_size: int = 12, floor: float = 0.0) -> torch.Tensor:
    """A random point of the simplex (float64); entries >= floor before normalisation."""
    n = draw(st.integers(min_size, max_size))
    w = draw(st.lists(st.floats(floor, 1.0), min_size=n, max_size=n).filter(lambda v: sum(v) > 1e-3))
    p = torch.tensor(w, dtype=torch.float64)
    return p / p.sum()


def temps(op: SofteningOperator) -> st.SearchStrategy[float]:
    lo = max(op.min_temperature, 0.05)
    return st.floats(lo, 20.0)


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_ranking_preservation(family: str, data: st.DataObject) -> None:
    op = get_softening(family)
    p = data.draw(distributions())
    t = data.draw(temps(op))
    q = op(p, t)
    for i in range(len(p)):
        for j in range(len(p)):
            if p[i] > p[j] * (1 + 1e-6) and p[i] - p[j] > 1e-12:
                assert q[i] > q[j], (p, t, q)
            if p[i] == p[j]:
                assert torch.isclose(q[i], q[j], rtol=1e-12, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_continuity_in_p_and_t(family: str, data: st.DataObject) -> None:
    op = get_softening(family)
    p = data.draw(distributions(floor=1e-3))
    t = data.draw(temps(op))
    noise = torch.tensor(data.draw(st.lists(st.floats(-1.0, 1.0), min_size=len(p), max_size=len(p))))
    p2 = (p + 1e-9 * noise.to(p)).clamp_min(0)
    p2 = p2 / p2.sum()
    assert (op(p2, t) - op(p, t)).abs().max() < 1e-5
    assert (op(p, t * (1 + 1e-9)) - op(p, t)).abs().max() < 1e-6


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_entropy_is_monotone_in_temperature(family: str, data: st.DataObject) -> None:
    op = get_softening(family)
    p = data.draw(distributions())
    t1, t2 = sorted((data.draw(temps(op)), data.draw(temps(op))))
    assert entropy(op(p, t1)) <= entropy(op(p, t2)) + 1e-12


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=40, deadline=None)
@given(p=distributions())
def test_identity_at_one(family: str, p: torch.Tensor) -> None:
    assert torch.allclose(get_softening(family)(p, 1.0), p, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=40, deadline=None)
@given(p=distributions())
def test_boundary_is_uniform(family: str, p: torch.Tensor) -> None:
    op = get_softening(family)
    q = op(p, 1e9)
    support = p > 0 if op.boundary_support else torch.ones_like(p, dtype=torch.bool)
    want = support.to(p) / support.sum()
    assert torch.allclose(q, want, atol=1e-6), (p, q)
    assert float(q.sum()) == pytest.approx(1.0, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(p=distributions())
def test_power_cold_limit_is_argmax(p: torch.Tensor) -> None:
    q = PowerSoftening()(p, 1e-4)
    top = p == p.max()
    # entries within a factor (1 - 1e-3) of the max still carry mass at T = 1e-4 only when near-tied
    if bool(((p > p.max() * (1 - 1e-2)) & ~top).any()):
        return
    assert torch.allclose(q, top.to(p) / top.sum(), atol=1e-9)


def test_power_matches_temperature_softmax_and_keeps_zeros() -> None:
    z = torch.tensor([[2.0, -1.0, 0.5, 3.0]], dtype=torch.float64)
    for t in (0.3, 1.0, 4.0):
        assert torch.allclose(PowerSoftening()(torch.softmax(z, -1), t), torch.softmax(z / t, -1), atol=1e-15)
        assert torch.allclose(PowerSoftening().soften_logits(z, t), torch.softmax(z / t, -1), atol=1e-15)
    p = torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64)
    assert PowerSoftening()(p, 3.0).tolist() == [0.5, 0.0, 0.5]


def test_uniform_mixing_known_values_and_domain() -> None:
    p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    assert torch.allclose(UniformMixing()(p, 2.0), torch.tensor([0.35 + 1 / 6, 0.1 + 1 / 6, 0.05 + 1 / 6]).double())
    assert torch.allclose(UniformMixing()(p, math.inf), torch.full((3,), 1 / 3, dtype=torch.float64))
    with pytest.raises(ArgumentError, match=r"uniform_mixing.*temperature 0.5.*>= 1"):
        UniformMixing()(p, 0.5)
    with pytest.raises(ArgumentError, match=r"power.*temperature 0.*> 0"):
        PowerSoftening()(p, 0.0)
    with pytest.raises(ArgumentError, match="temperature nan"):
        PowerSoftening()(p, float("nan"))


def test_registry_is_open_and_checked() -> None:
    with pytest.raises(ArgumentError, match=r"'nope' is not one of \['power', 'uniform_mixing'"):
        get_softening("nope")
    with pytest.raises(ArgumentError, match="taken"):

        @register_softening
        class Again(PowerSoftening):
            name = "power"

    @register_softening
    class Sqrt(PowerSoftening):
        """A family added as one class: the power family re-parametrised, T' = T^2."""

        name = "test_sqrt_power"

        def soften(self, p: torch.Tensor, temperature: float) -> torch.Tensor:
            return super().soften(p, temperature**2)

    try:
        assert isinstance(get_softening("test_sqrt_power"), Sqrt)
        p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
        assert torch.allclose(get_softening("test_sqrt_power")(p, 2.0), PowerSoftening()(p, 4.0))
    finally:
        del SOFTENING["test_sqrt_power"]


@settings(max_examples=50, deadline=None)
@given(
    z=st.lists(st.floats(-8, 8), min_size=3, max_size=16, unique=True),
    k_frac=st.floats(0, 1),
    t=st.floats(0.1, 10),
)
def test_power_soften_then_truncate_equals_truncate_then_soften_under_renorm(
    z: list[float], k_frac: float, t: float
) -> None:
    logits = torch.tensor([z], dtype=torch.float64)
    k = 1 + int(k_frac * (len(z) - 1))
    first_soften = truncate_topk(logits / t, k, "renorm")  # S_T(softmax(z)) = softmax(z / T), then truncate
    first_truncate = PowerSoftening()(truncate_topk(logits, k, "renorm"), t)
    # SoftmaxTopK's torch form computes in float32
    assert torch.allclose(first_soften, first_truncate, atol=2e-6)


def test_truncate_topk_completions() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.1, 0.3, 0.06, 0.04]], dtype=torch.float64))
    renorm = truncate_topk(logits, 2, "renorm")
    assert np.allclose(renorm.numpy(), [[0.625, 0, 0.375, 0, 0]], atol=1e-6)
    tail = truncate_topk(logits, 2, "tail")
    assert np.allclose(tail.numpy(), [[0.5, 0.2 / 3, 0.3, 0.2 / 3, 0.2 / 3]], atol=1e-6)
    full = truncate_topk(logits, 5, "tail")
    assert np.allclose(full.numpy(), torch.softmax(logits, -1).numpy(), atol=1e-6)
    with pytest.raises(ArgumentError, match="completion 'drop'"):
        truncate_topk(logits, 2, "drop")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="k 6 is out of range"):
        truncate_topk(logits, 6)
