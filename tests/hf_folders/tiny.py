"""Tiny Hugging Face model folders of real architectures (random weights, a few thousand parameters), written with
``save_pretrained`` as safetensors, and matching evaluation inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

VOCAB, HIDDEN, HEADS, FFN, LAYERS, POSITIONS = 128, 32, 2, 64, 2, 64


def _configs() -> dict[str, tuple[Any, Any]]:
    import transformers as t

    common = dict(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
    )
    return {
        "bert": (t.BertConfig(**common), t.BertModel),
        "distilbert": (
            t.DistilBertConfig(
                dim=HIDDEN,
                n_heads=HEADS,
                hidden_dim=FFN,
                n_layers=LAYERS,
                vocab_size=VOCAB,
                max_position_embeddings=POSITIONS,
                num_labels=5,
            ),
            t.DistilBertForTokenClassification,
        ),
        "xlm-roberta": (
            t.XLMRobertaConfig(**common, num_labels=3, type_vocab_size=1),
            t.XLMRobertaForSequenceClassification,
        ),
        "modernbert": (
            t.ModernBertConfig(**common, pad_token_id=0, global_attn_every_n_layers=2, local_attention=16),
            t.ModernBertForMaskedLM,
        ),
        "vit": (
            t.ViTConfig(
                hidden_size=HIDDEN,
                num_attention_heads=HEADS,
                intermediate_size=FFN,
                num_hidden_layers=LAYERS,
                image_size=32,
                patch_size=8,
                num_labels=4,
            ),
            t.ViTForImageClassification,
        ),
        "gpt2": (
            t.GPT2Config(
                n_embd=HIDDEN,
                n_head=HEADS,
                n_layer=LAYERS,
                vocab_size=VOCAB,
                n_positions=POSITIONS,
                bos_token_id=1,
                eos_token_id=2,
            ),
            t.GPT2LMHeadModel,
        ),
        "llama": (
            t.LlamaConfig(
                **{**common, "num_attention_heads": 4}, num_key_value_heads=2, bos_token_id=1, eos_token_id=2
            ),
            t.LlamaForCausalLM,
        ),
    }


ARCHITECTURES = ("bert", "distilbert", "xlm-roberta", "modernbert", "vit", "gpt2", "llama")
# the task each folder's config.json names through its architectures, and the outputs transformers names
EXPECTED = {
    "bert": ("feature-extraction", ("last_hidden_state", "pooler_output")),
    "distilbert": ("token-classification", ("logits",)),
    "xlm-roberta": ("text-classification", ("logits",)),
    "modernbert": ("fill-mask", ("logits",)),
    "vit": ("image-classification", ("logits",)),
    "gpt2": ("causal-lm", ("logits",)),
    "llama": ("causal-lm", ("logits",)),
}


def write_folder(name: str, folder: Path, seed: int = 0) -> Path:
    """A tiny ``name`` model with seeded random weights saved to ``folder`` (config.json + model.safetensors)."""
    import torch

    config, cls = _configs()[name]
    torch.manual_seed(seed)
    model = cls(config).eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def inputs_for(name: str, n: int = 16, seq: int = 12, seed: int = 1) -> dict[str, np.ndarray]:
    """Evaluation inputs the exported model of ``name`` takes: token ids with padded tails, or images."""
    rng = np.random.default_rng(seed)
    if name == "vit":
        return {"pixel_values": rng.standard_normal((n, 3, 32, 32)).astype(np.float32)}
    ids = rng.integers(5, VOCAB, (n, seq)).astype(np.int64)
    mask = np.ones_like(ids)
    lengths = rng.integers(seq // 2, seq + 1, n)
    mask[np.arange(seq)[None, :] >= lengths[:, None]] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    if name == "bert":
        feeds["token_type_ids"] = np.zeros_like(ids)
    return feeds
