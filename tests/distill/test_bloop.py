"""Bloop on a quadratic bilevel problem with a known answer: main (t0 + t1 - 1)^2 is minimised on a line,
aux ||t - c||^2; the solution of min aux s.t. t in argmin main is the projection of c onto the line."""

from __future__ import annotations

import pytest
import torch

from softdeploy.distill import Bloop
from softdeploy.errors import ArgumentError

C = torch.tensor([2.0, 1.0], dtype=torch.float64)  # t0 + t1 = 3: off the line t0 + t1 = 1
PROJ = torch.tensor([1.0, 0.0], dtype=torch.float64)  # C - (C.sum() - 1) / 2 * (1, 1)


def losses(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (t.sum() - 1.0) ** 2, ((t - C) ** 2).sum()


def run(combine: str, steps: int = 3000, lam: float = 0.1) -> tuple[torch.Tensor, list[float], list[float]]:
    t = torch.tensor([-3.0, 5.0], dtype=torch.float64, requires_grad=True)
    b = Bloop(torch.optim.SGD([t], lr=0.05), lam=lam, ema=0.1, combine=combine)  # type: ignore[arg-type]
    mains, auxs = [], []
    for _ in range(steps):
        b.zero_grad()
        main, aux = losses(t)
        mains.append(float(main.detach()))
        auxs.append(float(aux.detach()))
        b.step(main, aux)
    return t.detach(), mains, auxs


def test_bloop_reaches_the_main_minimisers_and_then_the_aux_minimum_within_them() -> None:
    t, mains, auxs = run("bloop")
    # not exactly 0: eps in ratio = <e, a> / (||e||^2 + eps) leaks lam * a's normal part once ||e||^2 ~ eps,
    # a fixed point with ||g||^3 ~ lam * |a_n| * eps (main ~ 1e-6 for eps = 1e-7), as in ml-bloop
    assert mains[-1] < 1e-5
    assert torch.allclose(t, PROJ, atol=1e-3), t
    # once on the minimiser set (main ~ 0), the aux keeps decreasing along it
    on_set = [i for i, m in enumerate(mains) if m < 1e-4]
    assert on_set and auxs[on_set[0]] > auxs[-1] + 1e-3
    # the plain sum settles at a compromise off the minimiser set: main stays visibly > 0
    t_sum, mains_sum, _ = run("sum")
    assert mains_sum[-1] > 1e-3
    assert not torch.allclose(t_sum, PROJ, atol=1e-2)


def test_state_roundtrip_and_errors() -> None:
    t = torch.zeros(2, requires_grad=True)
    b = Bloop(torch.optim.SGD([t], lr=0.1))
    main, aux = (t.sum() - 1) ** 2, (t**2).sum()
    b.step(main, aux)
    s = b.state_dict()
    b2 = Bloop(torch.optim.SGD([t], lr=0.1))
    b2.load_state_dict(s)
    assert b2.grad_main_ema is not None and torch.equal(b2.grad_main_ema[0], b.grad_main_ema[0])  # type: ignore[index]
    with pytest.raises(ArgumentError, match="combine 'mean'"):
        Bloop(torch.optim.SGD([t], lr=0.1), combine="mean")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="ema 0 is out of range"):
        Bloop(torch.optim.SGD([t], lr=0.1), ema=0.0)
