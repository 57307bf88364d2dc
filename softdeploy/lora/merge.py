"""The merge rewrite: LoRA-Mixer projections with a fixed routing become plain Linear layers.

    W' = W + scaling * sum_e w_e * Bm_e A_e          (per projection; bias unchanged)

For routing fixed per task (``w`` one-hot on the task's expert, or any mixture such as the uniform
average) the merged model has exactly the base model's shapes and no custom op. With ``w`` one-hot on
adapter e it equals PEFT's ``merge_and_unload`` of that adapter; with gates summing to 1 it equals
the routed model whose router assigns every token the gates ``w`` (e.g. a zero router with top_k = E
for the uniform average).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from softdeploy.errors import ArgumentError
from softdeploy.lora.mixer import LoRAMixerLinear, _parent, copy_without_routing_statistics, mixers


def merged_weight(m: LoRAMixerLinear, gates: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """``W + scaling * sum_e w_e Bm_e A_e`` of one projection, computed in float64."""
    w = torch.as_tensor(gates, dtype=torch.float64).reshape(-1)
    if w.numel() != m.num_experts:
        raise ArgumentError(
            f"LoRAMixer merge: {w.numel()} gates for {m.num_experts} experts (rule: one gate per expert)"
        )
    delta = torch.einsum("e,eor,eri->oi", w, m.Bm.detach().double(), m.A.detach().double())
    return (m.base.weight.detach().double() + m.scaling * delta).to(m.base.weight.dtype)


def merge(
    model: nn.Module, gates: Sequence[float] | torch.Tensor | Mapping[str, Sequence[float] | torch.Tensor]
) -> nn.Module:
    """A copy of ``model`` with every :class:`LoRAMixerLinear` replaced by the ``nn.Linear`` of its
    merged weight. ``gates``: one weight per expert for every projection, or a mapping from projection
    name to its weights. ``model`` itself is not changed."""
    found = mixers(model)
    if not found:
        raise ArgumentError("merge: the model has no LoRA-Mixer projections (rule: wrap or load_experts first)")
    if isinstance(gates, Mapping):
        missing = sorted(set(found) - set(gates))
        if missing:
            raise ArgumentError(f"merge: no gates for projections {missing} (rule: one entry per projection)")
    out = copy_without_routing_statistics(model)  # merged projections keep no routing
    for name, m in mixers(out).items():
        w = gates[name] if isinstance(gates, Mapping) else gates
        lin = nn.Linear(m.base.in_features, m.base.out_features, bias=m.base.bias is not None)
        lin = lin.to(dtype=m.base.weight.dtype, device=m.base.weight.device)
        with torch.no_grad():
            lin.weight.copy_(merged_weight(m, w))
            if m.base.bias is not None:
                lin.bias.copy_(m.base.bias)
        lin.requires_grad_(False)
        parent, attr = _parent(out, name)
        setattr(parent, attr, lin)
    return out
