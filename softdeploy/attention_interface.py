"""softdeploy's attention implementations for transformers models: ``attn_implementation="softpick"``.

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

transformers does not record the implementation in config.json, so a folder fine-tuned this way is exported with
``softdeploy export FOLDER OUT --attention softpick`` (or ``model: {hf: FOLDER, attention: softpick}``).
The op has no attention dropout: in training mode a module with attention dropout > 0 is refused.
"""

from __future__ import annotations

import functools
from typing import Any

from softdeploy.errors import ArgumentError

SOFTPICK = "softpick"
EPS = 1e-6  # Softpick's eps, the op's default (the authors' value)
IMPLEMENTATIONS = (SOFTPICK,)


@functools.cache
def register() -> tuple[str, ...]:
    """Registers softdeploy's attention implementations with transformers (idempotent); returns their names."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(SOFTPICK, softpick_attention_forward)
    AttentionMaskInterface.register(SOFTPICK, sdpa_mask)  # a boolean mask, or None where nothing is masked
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
