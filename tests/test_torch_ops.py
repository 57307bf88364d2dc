"""The softdeploy::<stem> torch ops: schema, eager, fake (export) and autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from softdeploy.export.torch_export import export_module
from softdeploy.ops import REGISTRY
from softdeploy.ops._torch import register_torch_ops
from softdeploy.runtime import Session


def test_every_registry_op_is_a_torch_op():
    ops = register_torch_ops()
    assert set(ops) == set(REGISTRY)
    for name, d in REGISTRY.items():
        assert ops[name]._qualified_op_name == f"softdeploy::{d.stem}"


def test_two_pass_softmax_gradient_matches_torch_softmax():
    register_torch_ops()
    x = torch.randn(3, 17, dtype=torch.float32, requires_grad=True)
    w = torch.randn(3, 17)
    (torch.ops.softdeploy.two_pass_softmax(x, axis=-1) * w).sum().backward()
    x2 = x.detach().clone().requires_grad_(True)
    (torch.softmax(x2, dim=-1) * w).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


class _Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 50)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.softdeploy.two_pass_softmax(self.linear(x), axis=-1)


def test_export_to_custom_node_with_function_body(tmp_path):
    register_torch_ops()
    module = _Classifier().eval()
    x = torch.randn(4, 8)
    path = tmp_path / "m.onnx"
    model = export_module(module, (x,), path)
    assert [(n.domain, n.op_type) for n in model.graph.node if n.domain] == [("com.softdeploy", "TwoPassSoftmax")]
    assert [f.name for f in model.functions] == ["TwoPassSoftmax"]
    want = module(x).detach().numpy()
    feeds = {model.graph.input[0].name: x.numpy()}
    for kernels in ("native", "portable"):
        np.testing.assert_allclose(Session(path, kernels=kernels).run(feeds)[0], want, rtol=1e-5, atol=1e-7)


def test_export_refuses_to_overwrite(tmp_path):
    from softdeploy import ExportError

    register_torch_ops()
    path = tmp_path / "m.onnx"
    path.write_bytes(b"precious")
    with pytest.raises(ExportError, match="exists"):
        export_module(_Classifier().eval(), (torch.randn(2, 8),), path)
    assert path.read_bytes() == b"precious"
