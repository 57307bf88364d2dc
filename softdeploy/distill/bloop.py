"""Bloop (Hsieh, Thornton, Ndiaye, Klein, Cuturi, Ablin, ICML 2024, arXiv 2402.02998; apple/ml-bloop,
JAX only): an auxiliary objective minimised among the minimisers of the main one, as a wrapper around
any torch optimizer.

Per step, with the main gradient ``g`` and the auxiliary gradient ``a`` (all parameters as one vector)::

    e     <- e + ema * (g - e)                  (e = g at the first step: ml-bloop's init="grad")
    dir    = g + lam * (a - <e, a> / (||e||^2 + eps) * e)

so the auxiliary step is orthogonal to the EMA of the main gradient (the EMA, not ``g``, because a
mini-batch gradient is a noisy estimate of the main descent direction). ``combine="sum"`` gives the
plain mixed direction ``g + lam * a`` with the same optimizer, for measuring one against the other.
The direction is written into ``.grad`` and the wrapped optimizer steps on it (SGD, AdamW, ...).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch import Tensor

from softdeploy.errors import ArgumentError

Combine = Literal["bloop", "sum"]


class Bloop:
    """Wraps ``optimizer``: :meth:`step` takes the main and the auxiliary loss of one batch."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        lam: float = 0.1,
        ema: float = 0.1,
        eps: float = 1e-7,
        combine: Combine = "bloop",
        params: Iterable[Tensor] | None = None,
    ) -> None:
        if combine not in ("bloop", "sum"):
            raise ArgumentError(f"Bloop: combine {combine!r} is not one of ['bloop', 'sum']")
        if not 0.0 < ema <= 1.0:
            raise ArgumentError(f"Bloop: ema {ema:g} is out of range (rule: 0 < ema <= 1)")
        if lam < 0:
            raise ArgumentError(f"Bloop: lam {lam:g} is out of range (rule: lam >= 0)")
        self.optimizer = optimizer
        self.lam, self.ema, self.eps, self.combine = float(lam), float(ema), float(eps), combine
        if params is None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
        self.params = [p for p in params if p.requires_grad]
        self.grad_main_ema: list[Tensor] | None = None
        #: the last step's <e, a> / (||e||^2 + eps) (0 for combine="sum")
        self.last_ratio = 0.0

    def zero_grad(self) -> None:
        """Clears the parameters' gradients (the wrapped optimizer's zero_grad)."""
        self.optimizer.zero_grad(set_to_none=True)

    def direction(self, main_loss: Tensor, aux_loss: Tensor) -> list[Tensor]:
        """The combined descent direction per parameter (updates the EMA); does not step."""
        g = torch.autograd.grad(main_loss, self.params, retain_graph=True, allow_unused=True)
        a = torch.autograd.grad(aux_loss, self.params, allow_unused=True)
        g = [torch.zeros_like(p) if x is None else x for p, x in zip(self.params, g, strict=True)]
        a = [torch.zeros_like(p) if x is None else x for p, x in zip(self.params, a, strict=True)]
        if self.combine == "sum":
            return [gi + self.lam * ai for gi, ai in zip(g, a, strict=True)]
        if self.grad_main_ema is None:
            self.grad_main_ema = [gi.detach().clone() for gi in g]
        else:
            for e, gi in zip(self.grad_main_ema, g, strict=True):
                e.add_(gi.detach() - e, alpha=self.ema)
        e = self.grad_main_ema
        dot = sum((ei * ai).sum() for ei, ai in zip(e, a, strict=True))
        sq = sum((ei * ei).sum() for ei in e)
        ratio = dot / (sq + self.eps)
        self.last_ratio = float(ratio)
        return [gi + self.lam * (ai - ratio * ei) for gi, ai, ei in zip(g, a, e, strict=True)]

    def step(self, main_loss: Tensor, aux_loss: Tensor) -> None:
        """One optimizer step along :meth:`direction` of the two losses."""
        for p, d in zip(self.params, self.direction(main_loss, aux_loss), strict=True):
            p.grad = d.detach()
        self.optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        """The EMA (tensors, for a safetensors checkpoint) and the settings."""
        state: dict[str, Any] = {"lam": self.lam, "ema": self.ema, "eps": self.eps, "combine": self.combine}
        if self.grad_main_ema is not None:
            state["grad_main_ema"] = [e.clone() for e in self.grad_main_ema]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict` (a resumed run continues with the same EMA)."""
        self.lam, self.ema, self.eps, self.combine = state["lam"], state["ema"], state["eps"], state["combine"]
        ema = state.get("grad_main_ema")
        self.grad_main_ema = None if ema is None else [e.clone() for e in ema]
