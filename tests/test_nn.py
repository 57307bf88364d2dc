"""softdeploy.nn: each module computes its equation (checked against plain torch written from the
math) and exports through softdeploy.export to com.softdeploy nodes that agree with torch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import softdeploy
from softdeploy import nn as sdnn

G = torch.Generator().manual_seed(0)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=G)


def attention_ref(module: sdnn.SoftAttention, x: torch.Tensor, weights_fn, mask=None) -> torch.Tensor:
    b, t, e = x.shape
    h, hk, d = module.num_heads, module.num_kv_heads, module.head_dim
    q = module.q_proj(x).view(b, t, h, d).transpose(1, 2)
    k = module.k_proj(x).view(b, t, hk, d).transpose(1, 2).repeat_interleave(h // hk, 1)
    v = module.v_proj(x).view(b, t, hk, d).transpose(1, 2).repeat_interleave(h // hk, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if mask is not None:
        s = s + mask
    return module.out_proj((weights_fn(s) @ v).transpose(1, 2).reshape(b, t, e))


@torch.no_grad()
def test_softmax_attention_through_two_pass_softmax_exports():
    module = sdnn.SoftAttention(16, 4, sdnn.TwoPassSoftmax(), num_kv_heads=2, causal=True).eval()
    x = randn(2, 5, 16)
    causal = torch.full((5, 5), -math.inf).triu(1)
    want = attention_ref(module, x, lambda s: torch.softmax(s, -1), causal)
    torch.testing.assert_close(module(x), want, rtol=1e-5, atol=1e-6)
    result = softdeploy.export(module, (x,))
    assert result.custom_ops == ["TwoPassSoftmax"]
    assert result.validation is not None and result.validation.ok


def _greedy_nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float, score_threshold: float) -> list:
    out = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            order = [i for i in np.argsort(-scores[b, c], kind="stable") if scores[b, c, i] >= score_threshold]
            kept: list[int] = []
            for i in order:
                if all(_iou(boxes[b, i], boxes[b, j]) <= iou_threshold for j in kept):
                    kept.append(i)
            out += [[b, c, i] for i in kept]
    return out


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    y1, x1 = max(a[0], b[0]), max(a[1], b[1])
    y2, x2 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, y2 - y1) * max(0.0, x2 - x1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


def _boxes(n: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(3)
    corner = rng.uniform(0, 8, (1, n, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(1, 4, (1, n, 2))], -1).astype(np.float32)
    scores = (rng.permutation(2 * n).reshape(1, 2, n) / (2 * n) + 0.01).astype(np.float32)
    return torch.from_numpy(boxes), torch.from_numpy(scores)


@torch.no_grad()
def test_soft_nms_hard_is_greedy_nms_and_linear_decays():
    boxes, scores = _boxes()
    hard = sdnn.SoftNMS("hard", iou_threshold=0.4, score_threshold=0.05)
    selected, selected_scores = hard(boxes, scores)
    assert selected.tolist() == _greedy_nms(boxes.numpy(), scores.numpy(), 0.4, 0.05)
    torch.testing.assert_close(selected_scores, scores[selected[:, 0], selected[:, 1], selected[:, 2]])
    linear, linear_scores = sdnn.SoftNMS("linear", iou_threshold=0.3)(boxes, scores)
    assert len(linear) >= len(selected)  # decayed, not removed
    assert (linear_scores <= scores[linear[:, 0], linear[:, 1], linear[:, 2]] + 1e-7).all()
    with pytest.raises(ValueError, match="method"):
        sdnn.SoftNMS("fast")


def _modules():
    return [
        ("softmax_attention", sdnn.SoftAttention(16, 2, sdnn.TwoPassSoftmax()), (randn(2, 6, 16),), "TwoPassSoftmax"),
        ("softmax_head", sdnn.NormalizedHead(16, 30, sdnn.TwoPassSoftmax()), (randn(4, 16),), "TwoPassSoftmax"),
        ("soft_nms", sdnn.SoftNMS("gaussian", score_threshold=0.05), _boxes(), "SoftNMS"),
    ]


@pytest.mark.parametrize(("name", "module", "inputs", "op"), _modules(), ids=lambda v: v if isinstance(v, str) else "")
def test_module_exports_to_its_softdeploy_op_and_validates(name, module, inputs, op):
    result = softdeploy.export(module, inputs)
    assert op in result.custom_ops
    assert op in [f.name for f in result.model.functions]
    assert result.validation is not None and result.validation.ok, result.validation


def test_attention_exports_with_dynamic_batch_and_sequence():
    module = sdnn.SoftAttention(16, 2, sdnn.TwoPassSoftmax(), causal=True).eval()
    batch, seq = torch.export.Dim("batch", max=16), torch.export.Dim("seq", min=2, max=128)
    result = softdeploy.export(module, (randn(2, 6, 16),), dynamic_shapes=({0: batch, 1: seq},))
    from softdeploy.runtime import Session

    x = randn(3, 11, 16)
    (y,) = Session(result.model, kernels="native").run({result.model.graph.input[0].name: x.numpy()})
    np.testing.assert_allclose(y, module(x).detach().numpy(), rtol=1e-4, atol=1e-5)
