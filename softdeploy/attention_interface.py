"""softdeploy's attention implementations for transformers models: ``attn_implementation="softpick"`` or ``"soft"``.

:func:`register` adds them to transformers' ``AttentionInterface`` (and its mask interface), so any transformers
model whose attention goes through that interface (BERT, RoBERTa, Llama, Qwen2, GPT-2, ViT, ...) can be built, or
fine-tuned, with them::

    import softdeploy.attention_interface as sdattn

    sdattn.register()
    model = AutoModelForSequenceClassification.from_pretrained(folder, attn_implementation="softpick")

``softpick``: ``O = Softpick(Q K^T scale + mask) V`` through the com.softdeploy ``SoftpickAttention`` op
(docs/ops/SoftpickAttention.md): in torch its own implementation (with autograd), in an export one fused node per
layer whose kernel never materialises the scores; grouped key/value heads are passed as they are. Padding and
causality come as transformers' boolean mask (True: attend), turned into the op's additive ``0 / -inf`` mask; when
transformers leaves the mask out (no padding), a causal module sets the op's ``causal`` attribute.

``soft``: SOFT's softmax-free attention (Lu et al. 2021) through the com.softdeploy ``NystromGaussianAttention`` op
(docs/ops/NystromGaussianAttention.md), one fused node per layer whose kernel is linear in the sequence length; see
:func:`soft_attention_forward` for how a transformers layer's (q, k, v) map onto SOFT (K = Q: the key is not used),
its landmarks and its padding.

transformers does not record the implementation in config.json, so a folder fine-tuned this way is exported with
``softdeploy export FOLDER OUT --attention softpick`` (or ``soft``; in a workflow ``model: {hf: FOLDER, attention:
softpick}``). Neither op has attention dropout: in training mode a module with attention dropout > 0 is refused.
"""

from __future__ import annotations

import functools
from typing import Any

from softdeploy.errors import ArgumentError

SOFTPICK = "softpick"
SOFT = "soft"
EPS = 1e-6  # Softpick's eps, the op's default (the authors' value)
# SOFT's landmarks, Newton-Schulz steps and regulariser: the op's defaults (SOFT's newton_inv: 20 steps); a config
# attribute of the same name (config.json keeps unknown keys) overrides each, so a folder carries its own choice.
SOFT_LANDMARKS = 16
SOFT_NEWTON_ITERS = 20
SOFT_REGULARIZATION = 0.01
# The names ``attn_implementation`` takes (and ``softdeploy export --attention``, with ``eager``); register() adds
# each one's forward. Kept as plain names so that the CLI lists them without importing torch or transformers.
IMPLEMENTATIONS = (SOFTPICK, SOFT)


@functools.cache
def register() -> tuple[str, ...]:
    """Registers softdeploy's attention implementations with transformers (idempotent); returns their names."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    forwards = {SOFTPICK: softpick_attention_forward, SOFT: soft_attention_forward}
    for name in IMPLEMENTATIONS:
        AttentionInterface.register(name, forwards[name])
        AttentionMaskInterface.register(name, sdpa_mask)  # a boolean mask, or None where nothing is masked
    return IMPLEMENTATIONS


def softpick_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention signature: query ``[B, H, Tq, D]``, key / value ``[B, Hk, Tk, D]``, the mask as the
    mask interface made it; returns ``([B, Tq, H, Dv], None)`` (no weights are materialised to return)."""
    import torch

    from softdeploy.nn import _op

    if module.training and dropout > 0:
        raise ArgumentError(
            f"softpick attention: attention dropout {dropout} in training (rule: the SoftpickAttention op has no "
            "dropout; set the config's attention dropout, e.g. attention_probs_dropout_prob, to 0)"
        )
    mask = None
    causal = 0
    if attention_mask is None:
        causal = int(bool(getattr(module, "is_causal", False)))
    elif attention_mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=query.dtype, device=query.device)
        mask = torch.where(attention_mask, zero, torch.full_like(zero, float("-inf")))
    else:
        mask = attention_mask.to(query.dtype)
    scale = float(scaling) if scaling else 0.0  # 0: the op's 1/sqrt(D)
    out = _op("SoftpickAttention")(query, key, value, mask, scale=scale, causal=causal, eps=EPS)
    return out.transpose(1, 2).contiguous(), None


def soft_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, None]:
    """SOFT self-attention (Lu et al. 2021) in transformers' attention signature: query ``[B, H, n, D]``, value
    ``[B, Hk, n, Dv]`` (grouped heads are repeated to H), the mask as the mask interface made it; returns
    ``([B, n, H, Dv], None)``.

    K = Q: SOFT defines the attention with the queries as keys (one shared projection), so ``key`` is not used: the
    layer's key projection gets no gradient and drops out of an export. The kernel is SOFT's Gaussian
    ``exp(-s ‖q_i - q_j‖² / 2)`` with the layer's ``scaling`` s (transformers' 1/sqrt(D) is the op's own
    ``exp(-‖·‖² / (2 sqrt D))``; another s rescales Q), approximated through ``m`` landmarks
    (``config.soft_landmarks``, default 16) with ``soft_newton_iters`` Newton-Schulz steps and ``soft_regularization``
    (the op's defaults). The landmarks are parameter-free: landmark j is the mean of the queries of the j-th of m equal
    runs of a row's unpadded tokens (a run has at least one token: a row shorter than m repeats tokens, which the
    regulariser keeps invertible), so they depend on the text, not on its padding or its batch.

    Padding: the op has no mask input; SOFT's O = K1 V_T (K1ᵀ V) is linear in V, and a key enters only through its
    row of V, so a padded key is removed exactly by zeroing that row (and it is left out of the landmarks). The mask
    must therefore be a key-padding mask (the same for every query); anything else (causal, sliding-window) has no
    SOFT form and is refused, as are causal modules, cross-attention and a KV cache (keys that are not the
    queries). Attention dropout in training is refused (the op has none)."""
    import torch

    from softdeploy.nn import _op

    name = type(module).__name__
    if module.training and dropout > 0:
        raise ArgumentError(
            f"soft attention: attention dropout {dropout} in training (rule: the NystromGaussianAttention op has no "
            "dropout; set the config's attention dropout, e.g. attention_probs_dropout_prob, to 0)"
        )
    if getattr(module, "is_causal", False):
        raise ArgumentError(
            f"soft attention: {name} is causal (rule: SOFT is bidirectional self-attention, K = Q over the whole "
            "sequence; it has no causal form: use it in encoders)"
        )
    b, h, n, d = query.shape
    if value.shape[2] != n:
        raise ArgumentError(
            f"soft attention: {name} has {n} queries but {value.shape[2]} keys/values (rule: SOFT is self-attention, "
            "K = Q: no cross-attention, no KV cache)"
        )
    config = getattr(module, "config", None)
    m = int(getattr(config, "soft_landmarks", SOFT_LANDMARKS))
    iters = int(getattr(config, "soft_newton_iters", SOFT_NEWTON_ITERS))
    reg = float(getattr(config, "soft_regularization", SOFT_REGULARIZATION))
    if m < 1:
        raise ArgumentError(f"soft attention: soft_landmarks {m} (rule: at least 1 landmark)")

    if attention_mask is None:
        valid = torch.ones((b, n), dtype=torch.bool, device=query.device)
    else:
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0  # additive: 0 attends
        allowed = allowed.expand(b, -1, n, n)
        valid = allowed.any(dim=2).all(dim=1)  # [B, n]: keys some query attends to
        if not torch.compiler.is_compiling() and not bool((allowed == valid[:, None, None, :]).all()):
            raise ArgumentError(
                f"soft attention: {name}'s mask is not a key-padding mask (rule: SOFT has no per-query mask, only "
                "padded keys can be left out; causal and sliding-window masks have no SOFT form)"
            )
    if value.shape[1] != h:  # grouped key/value heads: each serves H / Hk query heads
        value = value.repeat_interleave(h // value.shape[1], dim=1)
    value = value * valid[:, None, :, None].to(value.dtype)
    s = float(scaling) if scaling else d**-0.5
    if abs(s * d**0.5 - 1.0) > 1e-12:  # the op's kernel is exp(-‖·‖² / (2 sqrt D)): fold s into Q
        query = query * (s * d**0.5) ** 0.5
    landmarks = _soft_landmarks(query, valid, m)
    out = _op("NystromGaussianAttention")(query, value, landmarks, newton_iters=iters, regularization=reg)
    return out.transpose(1, 2).contiguous(), None


def _soft_landmarks(query: Any, valid: Any, m: int) -> Any:
    """``[B, H, m, D]``: landmark j of row b is the mean of the queries whose rank among the row's unpadded tokens lies
    in ``[floor(j len / m), max(floor((j + 1) len / m), floor(j len / m) + 1))`` (len: the row's unpadded count)."""
    import torch

    rank = torch.cumsum(valid.to(torch.int64), dim=1) - 1  # [B, n]: position among the row's unpadded tokens
    length = valid.to(torch.int64).sum(dim=1, keepdim=True)  # [B, 1]
    j = torch.arange(m, device=query.device)[None, :]  # [1, m]
    start = torch.div(j * length, m, rounding_mode="floor")  # [B, m]
    end = torch.maximum(torch.div((j + 1) * length, m, rounding_mode="floor"), start + 1)
    r = rank[:, None, :]
    member = valid[:, None, :] & (r >= start[:, :, None]) & (r < end[:, :, None])  # [B, m, n]
    weights = member.to(query.dtype)
    weights = weights / weights.sum(dim=2, keepdim=True).clamp_min(1.0)  # an all-padded row: landmarks 0
    return torch.einsum("bjn,bhnd->bhjd", weights, query)
