"""PyTorch modules built on softdeploy's soft operators.

Every module calls ``torch.ops.softdeploy.<stem>`` (the registry's torch ops), so
:func:`softdeploy.export` turns each call into one ``com.softdeploy`` node with its portable function
body. The semantics of each op (special values, ties, masks) are those of docs/ops/, restated here
only as far as a module adds to them.

Normalizers (``[..., n] -> [..., n]`` along ``dim``):
    TwoPassSoftmax              y = softmax(x + mask)
    Softpick                    y_i = relu(e_i) / (sum_j |e_j| + eps),  e_j = exp(x_j - m) - exp(-m)
    MultiMax                    y = softmax(sigma(x) + mask),
                                sigma(x) = x + t0 relu(r0 - x) + t1 relu(x - r1)
                                             + t2 relu(r2 - x)^2 + t3 relu(x - r3)^2
    AdaptiveTemperatureSoftmax  y = softmax(beta(H) x),  H = entropy of softmax(x)

Attention (self-attention over ``x [B, T, E]``; ``H`` query heads, ``Hk`` key/value heads):
    S = Q K^T * scale + mask,  O = normalize(S) V,  out = O W_o
Heads: ``Linear -> normalizer``; :class:`SoftmaxTopKHead` returns the k most probable classes.
Retrieval: :class:`MaxSimScorer` ``score[b, n] = sum_i max_j <Q[b, i], D[n, j]>``.
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
        """softmax(x + mask) along ``dim``; ``mask`` is additive (0 or -inf) and broadcasts to x."""
        if mask is not None:
            x = x + mask
        return _op("TwoPassSoftmax")(x, axis=self.dim)


class Softpick(nn.Module):
    """Softpick (Zuhri et al. 2025): rectified, not-sum-to-one softmax; exact zeros where ``x <= 0``.

    ``y_i = max(e_i, 0) / (sum_{j finite} |e_j| + eps)``, ``e_j = exp(x_j - m) - exp(-m)``,
    ``m`` = the row max over finite entries. ``-inf`` entries (masks) output 0.
    """

    def __init__(self, dim: int = -1, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Softpick(x + mask) along ``dim``; ``mask`` is additive (0 or -inf; -inf entries output 0 and add nothing to
        the denominator)."""
        if mask is not None:
            x = x + mask
        return _op("Softpick")(x, axis=self.dim, eps=self.eps)


class MultiMax(nn.Module):
    """MultiMax (Zhou, Fritz & Keuper, ICML 2024): softmax of a learned piecewise modulator.

    ``sigma(x) = x + t0 relu(r0 - x) + t1 relu(x - r1) + t2 relu(r2 - x)^2 + t3 relu(x - r3)^2``,
    ``y = softmax(sigma(x) + mask, dim)``. The additive mask is applied **after** sigma (sigma of
    ``-inf`` is NaN). ``ranges = (r0, r1, r2, r3)`` and ``ts = (t0, t1, t2, t3)`` are learned; they
    start at zero (sigma = identity, as in the reference code's zero-initialised variant).
    """

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim
        self.ranges = nn.Parameter(torch.zeros(4))
        self.ts = nn.Parameter(torch.zeros(4))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """softmax(sigma(x) + mask) along ``dim``, with this module's learned ranges and slopes; the mask is added after
        the modulator."""
        if mask is not None:
            mask = mask.to(x.dtype).expand_as(x)
        return _op("MultiMax")(x, self.ranges.to(x.dtype), self.ts.to(x.dtype), mask, axis=self.dim)


class AdaptiveTemperatureSoftmax(nn.Module):
    """Adaptive-temperature softmax (Velickovic et al. 2024, "softmax is not enough").

    ``p = softmax(x)``, ``H = -sum p log(p + 1e-9)``;
    ``beta = max(-0.037 H^4 + 0.481 H^3 - 2.3 H^2 + 4.917 H - 1.791, 1)`` if ``H > 0.5`` else 1;
    ``y = softmax(beta x)``: high-entropy rows are sharpened, confident rows left alone.
    """

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """softmax(beta(H) * (x + mask)) along ``dim``, beta chosen from the entropy H of softmax(x + mask)."""
        if mask is not None:
            x = x + mask
        return _op("AdaptiveTemperatureSoftmax")(x, axis=self.dim)


# ---- attention -----------------------------------------------------------------------------------


class SoftAttention(nn.Module):
    """Multi-head self-attention whose weights come from ``normalizer`` instead of softmax.

    ``x [B, T, E] -> Q [B, H, T, D], K, V [B, Hk, T, D]`` (grouped-query heads when ``Hk < H``),
    ``S = Q K^T / sqrt(D)``, ``A = normalizer(S, mask)`` along the key axis, ``out = (A V) W_o``.
    ``attn_mask`` is additive (0 or ``-inf``) and broadcastable to ``[B, H, T, T]``; ``causal=True``
    adds the lower-triangular mask. The normalizer decides where the mask goes (MultiMax adds it
    after its modulator).
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
        """Self-attention of ``x [B, T, E]`` -> ``[B, T, E]``; ``attn_mask`` is additive and broadcastable to [B, H, T,
        T] (with ``causal`` the lower-triangular mask is added)."""
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


class SoftpickAttention(SoftAttention):
    """Self-attention with Softpick weights: ``O = Softpick(Q K^T scale + mask) V`` (rows of the
    weights need not sum to 1; keys with ``score <= 0`` get exactly 0 -- no attention sink).

    One fused ``SoftpickAttention`` op (docs/ops/SoftpickAttention.md): grouped key/value heads are passed as they are (no
    repeat), ``attn_mask`` as the op's additive Mask, ``causal`` as its attribute; the export is one
    com.softdeploy node whose kernel never materialises the ``[T, T]`` scores."""

    def __init__(self, embed_dim: int, num_heads: int, *, eps: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(embed_dim, num_heads, Softpick(-1, eps), **kwargs)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        b, t, e = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        mask = None if attn_mask is None else attn_mask.to(q.dtype)
        out = _op("SoftpickAttention")(
            q, k, v, mask, scale=self.scale, causal=int(self.causal), eps=self.normalizer.eps
        )
        return self.out_proj(out.transpose(1, 2).reshape(b, t, e))


class MultiMaxAttention(SoftAttention):
    """Self-attention with MultiMax weights: ``O = softmax(sigma(Q K^T scale) + mask) V``."""

    def __init__(self, embed_dim: int, num_heads: int, **kwargs: Any) -> None:
        super().__init__(embed_dim, num_heads, MultiMax(-1), **kwargs)


class AdaptiveTemperatureAttention(SoftAttention):
    """Self-attention with adaptive-temperature weights: ``O = softmax(beta(H) S) V``."""

    def __init__(self, embed_dim: int, num_heads: int, **kwargs: Any) -> None:
        super().__init__(embed_dim, num_heads, AdaptiveTemperatureSoftmax(-1), **kwargs)


# ---- heads ---------------------------------------------------------------------------------------


class NormalizedHead(nn.Module):
    """``y = normalizer(x W^T + b)`` over the class axis: a classifier / LM head."""

    def __init__(self, in_features: int, num_classes: int, normalizer: nn.Module, *, bias: bool = True) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, num_classes, bias=bias)
        self.normalizer = normalizer

    def forward(self, x: Tensor) -> Tensor:
        """normalizer(x W^T + b): class weights over the last axis."""
        return self.normalizer(self.proj(x))


class SoftpickHead(NormalizedHead):
    """``Softpick(x W^T + b)``."""

    def __init__(self, in_features: int, num_classes: int, *, eps: float = 1e-6, bias: bool = True) -> None:
        super().__init__(in_features, num_classes, Softpick(-1, eps), bias=bias)


class MultiMaxHead(NormalizedHead):
    """``MultiMax(x W^T + b)`` (the paper's classifier placement: modulator, then softmax)."""

    def __init__(self, in_features: int, num_classes: int, *, bias: bool = True) -> None:
        super().__init__(in_features, num_classes, MultiMax(-1), bias=bias)


class AdaptiveTemperatureHead(NormalizedHead):
    """``AdaptiveTemperatureSoftmax(x W^T + b)``."""

    def __init__(self, in_features: int, num_classes: int, *, bias: bool = True) -> None:
        super().__init__(in_features, num_classes, AdaptiveTemperatureSoftmax(-1), bias=bias)


class SoftmaxTopKHead(nn.Module):
    """The k most probable classes: ``TopK(softmax((x W^T + b) / temperature), k)``.

    Returns ``(values [..., k], indices [..., k] int64)``, probabilities in descending order, ties to
    the lower index. One fused op: the probability row is never materialised.
    """

    def __init__(
        self, in_features: int, num_classes: int, k: int, *, temperature: float = 1.0, bias: bool = True
    ) -> None:
        super().__init__()
        if not 1 <= k <= num_classes:
            raise ValueError(f"k={k} must satisfy 1 <= k <= num_classes={num_classes}")
        self.proj = nn.Linear(in_features, num_classes, bias=bias)
        self.k = k
        self.temperature = temperature

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(values [..., k], indices [..., k] int64) of the k most probable classes of x."""
        values, indices, _ = _op("SoftmaxTopK")(self.proj(x), k=self.k, axis=-1, temperature=self.temperature)
        return values, indices


# ---- retrieval -----------------------------------------------------------------------------------


class MaxSimScorer(nn.Module):
    """Late-interaction (ColBERT) relevance: ``score[b, n] = sum_{i valid} max_{j valid} <q_bi, d_nj>``.

    ``queries [B, Lq, dim]``, ``documents [N, Ld, dim]``; optional bool masks ``[B, Lq]`` /
    ``[N, Ld]`` (True = a real token). Masked document tokens are excluded from the max, masked query
    tokens contribute 0. ``normalize=True`` L2-normalises both sides first (cosine similarity).
    """

    def __init__(self, *, normalize: bool = False) -> None:
        super().__init__()
        self.normalize = normalize

    def forward(
        self,
        queries: Tensor,
        documents: Tensor,
        query_mask: Tensor | None = None,
        document_mask: Tensor | None = None,
    ) -> Tensor:
        """Scores [B, N] of queries [B, Lq, dim] against documents [N, Ld, dim] (masks: True = a real token)."""
        if self.normalize:
            queries = nn.functional.normalize(queries, dim=-1)
            documents = nn.functional.normalize(documents, dim=-1)
        return _op("MaxSim")(queries, documents, query_mask, document_mask)


class SignedMaxSimScorer(nn.Module):
    """Signed late interaction: the match ``j*`` is chosen on magnitude, the sign multiplies in.

    ``score[b, n] = sum_i q_sign[b, i] d_sign[n, j*] <q_bi, d_nj*>``,
    ``j* = argmax_{valid j} <q_bi, d_nj>`` (ties to the lowest j).
    """

    def forward(
        self,
        queries: Tensor,
        query_signs: Tensor,
        documents: Tensor,
        document_signs: Tensor,
        query_mask: Tensor | None = None,
        document_mask: Tensor | None = None,
    ) -> Tensor:
        """Scores [B, N]: queries [B, Lq, dim] with signs [B, Lq] against documents [N, Ld, dim] with signs [N, Ld]
        (masks: True = a real token)."""
        return _op("SignedMaxSim")(queries, query_signs, documents, document_signs, query_mask, document_mask)


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
        """(selected [M, 3] int64 (batch, class, box), selected_scores [M]) for boxes [B, N, 4] and scores [B, C, N], in
        selection order."""
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


__all__ = [
    "AdaptiveTemperatureAttention",
    "AdaptiveTemperatureHead",
    "AdaptiveTemperatureSoftmax",
    "MaxSimScorer",
    "MultiMax",
    "MultiMaxAttention",
    "MultiMaxHead",
    "NormalizedHead",
    "SignedMaxSimScorer",
    "SoftAttention",
    "SoftNMS",
    "SoftmaxTopKHead",
    "Softpick",
    "SoftpickAttention",
    "SoftpickHead",
    "TwoPassSoftmax",
]
