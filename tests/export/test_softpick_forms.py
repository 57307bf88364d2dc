"""Softpick as users write it in torch, exported by torch.onnx, then `softdeploy optimize`d: the paper's formula written
plainly (no torch.where(isfinite)) and the softpick authors' code both become one com.softdeploy Softpick node, whose
values agree with torch's -- masked (-inf) entries included, each form counting them as it does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from softdeploy import DOMAIN
from softdeploy.export.rewrites import optimize
from softdeploy.export.torch_export import export_program
from softdeploy.runtime import Session


class PaperSoftpick(nn.Module):
    """softpick(x) = ReLU(exp(x - m) - exp(-m)) / (sum |exp(x - m) - exp(-m)| + eps), m the row's max (arXiv
    2504.20966, eq. 3 shifted by m), written as the formula reads."""

    def __init__(self, dim: int = -1, eps: float | None = 1e-6, amax: bool = False) -> None:
        super().__init__()
        self.dim, self.eps, self.amax = dim, eps, amax

    def forward(self, x: Tensor) -> Tensor:
        m = torch.amax(x, dim=self.dim, keepdim=True) if self.amax else x.max(dim=self.dim, keepdim=True).values
        e = torch.exp(x - m) - torch.exp(-m)
        den = e.abs().sum(dim=self.dim, keepdim=True)
        return torch.relu(e) / (den if self.eps is None else den + self.eps)


class AuthorsSoftpick(nn.Module):
    """``softpick`` of zaydzuhri/softpick-attention: non-finite entries left out of the sum."""

    def __init__(self, dim: int = -1, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x: Tensor) -> Tensor:
        x_m = torch.max(x, dim=self.dim, keepdim=True).values
        x_m_e_m = torch.exp(-x_m)
        x_e_1 = torch.exp(x - x_m) - x_m_e_m
        r_x_e_1 = torch.nn.functional.relu(x_e_1)
        a_x_e_1 = torch.where(x.isfinite(), torch.abs(x_e_1), 0)
        return r_x_e_1 / (torch.sum(a_x_e_1, dim=self.dim, keepdim=True) + self.eps)


def scores() -> Tensor:
    x = torch.randn(2, 3, 6, 40, generator=torch.Generator().manual_seed(0)) * 3
    x[0, 1, 2, :7] = -torch.inf  # a masked row: -inf entries, as masked_fill writes them
    x[1, 0, :4, 30:] = -torch.inf  # along dim 2 too: 4 of 6 masked (a row with none finite is NaN in torch)
    return x


@pytest.mark.parametrize(
    "module",
    [
        PaperSoftpick(),
        PaperSoftpick(eps=None, amax=True),
        PaperSoftpick(dim=2),
        AuthorsSoftpick(),
        AuthorsSoftpick(dim=2),
    ],
    ids=["paper", "paper-amax-no-eps", "paper-dim2", "authors", "authors-dim2"],
)
def test_softpick_written_in_torch_becomes_the_fused_op_and_agrees(module: nn.Module) -> None:
    x = scores()
    model, _ = export_program(module.eval(), (torch.randn(2, 3, 6, 40),))
    feeds = {model.graph.input[0].name: x.numpy()}
    result = optimize(model, feeds=feeds)
    assert result.counts["softpick"] == 1
    assert [n.op_type for n in result.model.graph.node if n.domain == DOMAIN] == ["Softpick"]
    assert not any(n.op_type in ("Exp", "ReduceSum", "Abs", "Div") for n in result.model.graph.node)
    assert result.ok
    with torch.no_grad():
        want = module(x).numpy()
    assert np.isfinite(want).all()
    for backend in ("native", "portable"):
        got = Session(result.model, kernels=backend).run(feeds)[0]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7, err_msg=backend)


def test_the_two_forms_differ_on_masked_rows_and_each_is_kept() -> None:
    """The paper's plain sum counts each -inf entry as exp(-m); the authors' code leaves it out: the fused models
    keep that difference (a rewrite that made them equal would change one of them)."""
    x = scores()
    outs = []
    for module in (PaperSoftpick(), AuthorsSoftpick()):
        model, _ = export_program(module.eval(), (torch.randn(2, 3, 6, 40),))
        feeds = {model.graph.input[0].name: x.numpy()}
        outs.append(Session(optimize(model, feeds=feeds).model, kernels="native").run(feeds)[0])
    masked = np.isinf(x.numpy()).any(axis=-1)
    assert not np.allclose(outs[0][masked], outs[1][masked], rtol=1e-3)
    np.testing.assert_allclose(outs[0][~masked], outs[1][~masked], rtol=2e-5, atol=1e-7)
