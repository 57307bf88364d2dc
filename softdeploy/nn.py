"""PyTorch modules built on softdeploy's soft operators.

Every module calls ``torch.ops.softdeploy.<stem>`` (the registry's torch ops), so
:func:`softdeploy.export` turns each call into one ``com.softdeploy`` node with its portable function
body. The semantics of each op (special values, ties, masks) are those of /OPS.md, restated here
only as far as a module adds to them.

Normalizers (``[..., n] -> [..., n]`` along ``dim``):
    TwoPassSoftmax              y = softmax(x + mask)

Attention (self-attention over ``x [B, T, E]``; ``H`` query heads, ``Hk`` key/value heads):
    S = Q K^T * scale + mask,  O = normalize(S) V,  out = O W_o
Heads: ``Linear -> normalizer``.
Detection: :class:`SoftNMS` (Bodla et al. 2017), a drop-in for NonMaxSuppression with decayed scores.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from softdeploy.ops import get as _get_op
from softdeploy.ops._torch import torch_op


def _op(name: str) -> Any:
    """The torch op of registry op ``name`` (registered on first use; clear error if unknown)."""
    return torch_op(_get_op(name))


# ---- normalizers ---------------------------------------------------------------------------------


class TwoPassSoftmax(nn.Module):
    """``y = softmax(x + mask, dim)`` through the two-pass kernel (no max pass, no overflow)."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is not None:
            x = x + mask
        return _op("TwoPassSoftmax")(x, axis=self.dim)


# ---- attention -----------------------------------------------------------------------------------


class SoftAttention(nn.Module):
    """Multi-head self-attention whose weights come from ``normalizer`` instead of softmax.

    ``x [B, T, E] -> Q [B, H, T, D], K, V [B, Hk, T, D]`` (grouped-query heads when ``Hk < H``),
    ``S = Q K^T / sqrt(D)``, ``A = normalizer(S, mask)`` along the key axis, ``out = (A V) W_o``.
    ``attn_mask`` is additive (0 or ``-inf``) and broadcastable to ``[B, H, T, T]``; ``causal=True``
    adds the lower-triangular mask. The normalizer decides where the mask goes.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        normalizer: nn.Module,
        *,
        num_kv_heads: int | None = None,
        causal: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if num_heads % kv_heads != 0:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {kv_heads}")
        self.num_heads = num_heads
        self.num_kv_heads = kv_heads
        self.head_dim = embed_dim // num_heads
        self.causal = causal
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.normalizer = normalizer

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        b, t, e = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.num_kv_heads != self.num_heads:
            groups = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        mask = attn_mask
        if self.causal:
            causal = torch.full((t, t), float("-inf"), dtype=scores.dtype, device=x.device).triu(1)
            mask = causal if mask is None else mask + causal
        weights = self.normalizer(scores, mask)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(b, t, e)
        return self.out_proj(out)


# ---- heads ---------------------------------------------------------------------------------------


class NormalizedHead(nn.Module):
    """``y = normalizer(x W^T + b)`` over the class axis: a classifier / LM head."""

    def __init__(self, in_features: int, num_classes: int, normalizer: nn.Module, *, bias: bool = True) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, num_classes, bias=bias)
        self.normalizer = normalizer

    def forward(self, x: Tensor) -> Tensor:
        return self.normalizer(self.proj(x))


# ---- detection -----------------------------------------------------------------------------------


class SoftNMS(nn.Module):
    """Soft non-maximum suppression (Bodla et al. 2017), a drop-in for ``NonMaxSuppression``.

    Per (batch, class): repeatedly select the box with the highest current score and decay the
    others by their IoU with it -- ``linear``: ``s <- s (1 - IoU)`` if ``IoU > iou_threshold``;
    ``gaussian``: ``s <- s exp(-IoU^2 / sigma)``; ``hard``: ``s <- 0`` if ``IoU > iou_threshold``
    (classic NMS). Boxes whose score falls below ``score_threshold`` are dropped.
    ``boxes [B, N, 4]``, ``scores [B, C, N]`` ->
    ``(selected [M, 3] int64 rows (batch, class, box), selected_scores [M])`` in selection order.
    ``max_output_boxes_per_class <= 0`` means no limit.
    """

    def __init__(
        self,
        method: str = "linear",
        *,
        sigma: float = 0.5,
        iou_threshold: float = 0.3,
        score_threshold: float = 0.001,
        max_output_boxes_per_class: int = 0,
        center_point_box: int = 0,
        coordinate_offset: int = 0,
    ) -> None:
        super().__init__()
        if method not in ("linear", "gaussian", "hard"):
            raise ValueError(f"SoftNMS: method {method!r} is not one of 'linear', 'gaussian', 'hard'")
        self.method = method
        self.sigma = sigma
        self.center_point_box = center_point_box
        self.coordinate_offset = coordinate_offset
        # Buffers, so export turns them into initializers of the node's optional scalar inputs.
        self.register_buffer("max_output_boxes_per_class", torch.tensor([max_output_boxes_per_class]))
        self.register_buffer("iou_threshold", torch.tensor([iou_threshold], dtype=torch.float32))
        self.register_buffer("score_threshold", torch.tensor([score_threshold], dtype=torch.float32))

    def forward(self, boxes: Tensor, scores: Tensor) -> tuple[Tensor, Tensor]:
        selected, selected_scores = _op("SoftNMS")(
            boxes,
            scores,
            self.max_output_boxes_per_class,
            self.iou_threshold,
            self.score_threshold,
            method=self.method,
            sigma=self.sigma,
            center_point_box=self.center_point_box,
            coordinate_offset=self.coordinate_offset,
        )
        return selected, selected_scores


__all__ = ["NormalizedHead", "SoftAttention", "SoftNMS", "TwoPassSoftmax"]
