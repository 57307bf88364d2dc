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


def softpick_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x = x.double()
    finite = torch.isfinite(x)
    m = torch.where(finite, x, torch.tensor(-math.inf, dtype=x.dtype)).amax(-1, keepdim=True)
    e = torch.where(finite, torch.exp(x - m) - torch.exp(-m), torch.zeros_like(x))
    return (e.clamp_min(0) / (e.abs().sum(-1, keepdim=True) + eps)).float()


def adaptive_ref(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    p = torch.softmax(x, -1)
    h = -(p * torch.log(p + 1e-9)).sum(-1, keepdim=True)
    poly = -0.037 * h**4 + 0.481 * h**3 - 2.3 * h**2 + 4.917 * h - 1.791
    beta = torch.where(h > 0.5, poly.clamp_min(1.0), torch.ones_like(h))
    return torch.softmax(beta * x, -1).float()


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


@torch.no_grad()
def test_softpick_attention_equation_with_gqa_and_causal_mask():
    module = sdnn.SoftpickAttention(16, 4, num_kv_heads=2, causal=True).eval()
    x = randn(2, 5, 16)
    causal = torch.full((5, 5), -math.inf).triu(1)
    torch.testing.assert_close(module(x), attention_ref(module, x, softpick_ref, causal), rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_multimax_at_init_is_softmax_and_mask_goes_after_sigma():
    module = sdnn.MultiMaxAttention(16, 2, causal=True).eval()
    x = randn(2, 6, 16)
    causal = torch.full((6, 6), -math.inf).triu(1)
    torch.testing.assert_close(
        module(x), attention_ref(module, x, lambda s: torch.softmax(s, -1), causal), rtol=1e-4, atol=1e-5
    )
    mm = sdnn.MultiMax()
    mm.ranges.copy_(torch.tensor([-1.0, 1.0, -2.0, 2.0]))
    mm.ts.copy_(torch.tensor([0.5, 0.3, 0.1, 0.05]))
    s, mask = randn(3, 7) * 3, torch.zeros(3, 7)
    mask[:, 0] = -math.inf
    r, t = mm.ranges, mm.ts
    sigma = s + t[0] * (r[0] - s).relu() + t[1] * (s - r[1]).relu() + t[2] * (r[2] - s).relu() ** 2
    sigma = sigma + t[3] * (s - r[3]).relu() ** 2
    got = mm(s, mask)
    torch.testing.assert_close(got, torch.softmax(sigma + mask, -1), rtol=1e-5, atol=1e-6)
    assert not torch.isnan(got).any() and (got[:, 0] == 0).all()


@torch.no_grad()
def test_adaptive_temperature_head_equation():
    head = sdnn.AdaptiveTemperatureHead(8, 50).eval()
    x = randn(4, 8) * 0.05  # near-uniform logits: high entropy, beta > 1
    torch.testing.assert_close(head(x), adaptive_ref(head.proj(x)), rtol=1e-4, atol=1e-6)


@torch.no_grad()
def test_softpick_head_zero_where_logit_nonpositive():
    head = sdnn.SoftpickHead(8, 20).eval()
    x = randn(3, 8)
    y, logits = head(x), head.proj(x)
    torch.testing.assert_close(y, softpick_ref(logits), rtol=1e-4, atol=1e-6)
    assert (y[logits <= 0] == 0).all()


@torch.no_grad()
def test_softmax_topk_head_equals_softmax_then_topk():
    head = sdnn.SoftmaxTopKHead(8, 100, k=5, temperature=0.7).eval()
    x = randn(4, 8)
    values, indices = head(x)
    want_v, want_i = torch.softmax(head.proj(x) / 0.7, -1).topk(5, -1)
    torch.testing.assert_close(values, want_v, rtol=1e-5, atol=1e-7)
    assert torch.equal(indices, want_i)
    with pytest.raises(ValueError, match="k=0"):
        sdnn.SoftmaxTopKHead(8, 10, k=0)


@torch.no_grad()
def test_maxsim_scorer_equation_with_masks():
    q, d = randn(2, 5, 16), randn(3, 7, 16)
    qm = torch.ones(2, 5, dtype=torch.bool)
    qm[0, 3:] = False
    dm = torch.ones(3, 7, dtype=torch.bool)
    dm[1, 2:] = False
    dm[2, :] = False  # an empty document scores 0
    sim = torch.einsum("bid,njd->bnij", q, d).masked_fill(~dm[None, :, None, :], -math.inf)
    best = torch.where(dm.any(-1)[None, :, None], sim.amax(-1), torch.zeros(()))
    want = (best * qm[:, None, :]).sum(-1)
    torch.testing.assert_close(sdnn.MaxSimScorer()(q, d, qm, dm), want, rtol=1e-5, atol=1e-5)


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
    q, d = randn(2, 5, 16), randn(3, 7, 16)
    qm, dm = torch.ones(2, 5, dtype=torch.bool), torch.ones(3, 7, dtype=torch.bool)
    qm[1, 3:] = False
    dm[0, 4:] = False
    dm[2, :] = False
    return [
        (
            "softpick_attention",
            sdnn.SoftpickAttention(16, 4, num_kv_heads=2, causal=True),
            (randn(2, 6, 16),),
            "SoftpickAttention",
        ),
        ("multimax_attention", sdnn.MultiMaxAttention(16, 2, causal=True), (randn(2, 6, 16),), "MultiMax"),
        (
            "adaptive_attention",
            sdnn.AdaptiveTemperatureAttention(16, 2),
            (randn(2, 6, 16),),
            "AdaptiveTemperatureSoftmax",
        ),
        ("softpick_head", sdnn.SoftpickHead(16, 30), (randn(4, 16),), "Softpick"),
        ("multimax_head", sdnn.MultiMaxHead(16, 30), (randn(4, 16),), "MultiMax"),
        ("adaptive_head", sdnn.AdaptiveTemperatureHead(16, 30), (randn(4, 16) * 0.1,), "AdaptiveTemperatureSoftmax"),
        ("softmax_topk_head", sdnn.SoftmaxTopKHead(16, 1000, k=5), (randn(4, 16),), "SoftmaxTopK"),
        ("maxsim", sdnn.MaxSimScorer(normalize=True), (q, d), "MaxSim"),  # masks omitted: filled in the body
        ("maxsim_masked", sdnn.MaxSimScorer(), (q, d, qm, dm), "MaxSim"),
        (
            "signed_maxsim",
            sdnn.SignedMaxSimScorer(),
            (q, torch.sign(randn(2, 5)), d, torch.sign(randn(3, 7))),
            "SignedMaxSim",
        ),
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


@torch.no_grad()
def test_softpick_attention_exports_to_one_fused_node_with_mask_and_grouped_heads():
    """softdeploy.nn.SoftpickAttention is one SoftpickAttention node (not Softpick between MatMuls):
    grouped K/V heads go in unrepeated, the padding mask as the op's Mask, causal as its attribute."""
    module = sdnn.SoftpickAttention(32, 4, num_kv_heads=2, causal=True).eval()
    x = randn(2, 9, 32)
    pad = torch.zeros(2, 1, 1, 9)
    pad[1, ..., 6:] = -math.inf  # batch 1: 6 real tokens
    causal = torch.full((9, 9), -math.inf).triu(1)
    want = attention_ref(module, x, softpick_ref, pad + causal)
    torch.testing.assert_close(module(x, pad), want, rtol=1e-4, atol=1e-5)
    result = softdeploy.export(module, (x, pad))
    assert result.custom_ops == ["SoftpickAttention"]
    nodes = [n for n in result.model.graph.node if n.domain == "com.softdeploy"]
    assert [n.op_type for n in nodes] == ["SoftpickAttention"]
    attrs = {a.name: a for a in nodes[0].attribute}
    assert attrs["causal"].i == 1
    assert result.validation is not None and result.validation.ok, result.validation


def test_softpick_attention_exports_with_dynamic_batch_and_sequence():
    module = sdnn.SoftpickAttention(16, 4, num_kv_heads=2, causal=True).eval()
    batch, seq = torch.export.Dim("batch", max=16), torch.export.Dim("seq", min=2, max=512)
    result = softdeploy.export(module, (randn(2, 6, 16),), dynamic_shapes=({0: batch, 1: seq},))
    from softdeploy.runtime import Session

    x = randn(3, 200, 16)  # two key blocks of the kernel
    (y,) = Session(result.model, kernels="native").run({result.model.graph.input[0].name: x.numpy()})
    np.testing.assert_allclose(y, module(x).detach().numpy(), rtol=1e-4, atol=1e-5)
