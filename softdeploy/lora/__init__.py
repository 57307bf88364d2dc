"""LoRA-Mixer (arXiv 2507.00029) on softdeploy: routed LoRA experts on a model's projections.

* :func:`wrap` -- turn ``nn.Linear`` layers (by name pattern; :data:`BERT_ATTENTION` = q, k, v, o of a
  Hugging Face BERT) into :class:`LoRAMixerLinear` projections to train, with :func:`routing_loss`;
* :func:`load_experts` -- build the experts from frozen PEFT LoRA adapters (safetensors only);
* export: ``softdeploy.export(model, ...)`` gives the routed model (``MatMul + Add + LoRAMixer`` per
  projection); :func:`merge` gives a plain model for a fixed routing (per task), exported as any model.
"""

from __future__ import annotations

from softdeploy.lora.adapters import Adapter, load_experts, read_adapter
from softdeploy.lora.merge import merge, merged_weight
from softdeploy.lora.mixer import BERT_ATTENTION, LoRAMixerLinear, mixers, routing_loss, wrap

__all__ = [
    "BERT_ATTENTION",
    "Adapter",
    "LoRAMixerLinear",
    "load_experts",
    "merge",
    "merged_weight",
    "mixers",
    "read_adapter",
    "routing_loss",
    "wrap",
]
