"""Export keeps every dimension asked to be dynamic: every op's torch path is shape-generic, and a
model that fixes a requested dimension fails the export naming the code that fixed it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import softdeploy
import softdeploy.nn
from softdeploy.errors import ExportError
from softdeploy.export.torch_export import export_program
from softdeploy.ops import REGISTRY
from softdeploy.ops._torch import torch_op


class OpModule(torch.nn.Module):
    """One softdeploy op as a module: tensors in, the op's first output out."""

    def __init__(self, op, attrs):
        super().__init__()
        self.op, self.attrs, self.op_inputs = torch_op(op), dict(attrs), op.inputs

    def forward(self, x0, x1=None, x2=None, x3=None, x4=None, x5=None):  # named: dynamic_shapes align by position
        tensors = (x0, x1, x2, x3, x4, x5)[: len(self.op_inputs)]
        out = self.op(*tensors, **self.attrs)
        return out[0] if isinstance(out, (tuple, list)) else out


def _first_typical(op):
    return next(s for s in op.samples(np.random.default_rng(0)) if s.kind == "typical")


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_every_op_keeps_a_dynamic_leading_dimension(op):
    sample = _first_typical(op)
    present = [v is not None for v in sample.inputs]
    # Trailing omitted optional inputs are dropped; an omitted one in the middle stays None.
    last = max(i for i, p in enumerate(present) if p)
    tensors = tuple(None if v is None else torch.from_numpy(np.array(v)) for v in sample.inputs[: last + 1])
    # Every input of rank >= 2 whose leading size is input 0's shares its dimension (a mask [B, L] beside
    # Q [B, L, dim]); rank-1 inputs are parameters (MultiMax's Ranges).
    batch = torch.export.Dim("batch")
    lead = tensors[0].shape[0]
    dims = tuple({0: batch} if t is not None and t.dim() >= 2 and t.shape[0] == lead else None for t in tensors)
    model, _ = export_program(OpModule(op, sample.attrs), tensors, dynamic_shapes=dims)
    first = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert first.dim_param, f"{op.name}: input 0's leading dimension was fixed at {first.dim_value}"


def test_a_specialised_dimension_fails_the_export_naming_where():
    from export.specialising_model import FixesTheBatch  # a plain module: pytest rewrites test files

    batch = torch.export.Dim("batch")
    with pytest.raises(ExportError, match=r"'x' axis 0 \(fixed at 3\).*specialising_model.py:\d+ in forward"):
        export_program(FixesTheBatch(), (torch.randn(3, 5),), dynamic_shapes=({0: batch},))


def test_maxsim_scorer_exports_with_a_dynamic_batch():
    """The new-user report: MaxSim's input check fixed the query batch at the example's 8."""
    scorer = softdeploy.nn.MaxSimScorer()
    batch = torch.export.Dim("batch")
    q, d = torch.randn(8, 5, 16), torch.randn(10, 7, 16)
    result = softdeploy.export(scorer, (q, d), dynamic_shapes={"queries": {0: batch}, "documents": None})
    assert result.model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    from softdeploy.runtime import Session

    q3 = torch.randn(3, 5, 16)
    (got,) = Session(result.model).run(
        {result.model.graph.input[0].name: q3.numpy(), result.model.graph.input[1].name: d.numpy()}
    )
    np.testing.assert_allclose(got, scorer(q3, d).numpy(), rtol=1e-5, atol=1e-5)
