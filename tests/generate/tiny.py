"""Tiny transformers causal LMs with random weights (seeded) for the decoder-export and generation tests."""

from __future__ import annotations

from typing import Any

VOCAB = 96
HIDDEN = 32


def tiny_causal_lm(kind: str, seed: int = 0) -> Any:
    """A 2-layer ``kind`` ("llama", "qwen2", "gpt2") causal LM with a 96-token vocabulary, random weights (seeded),
    eval mode."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = {"vocab_size": VOCAB, "eos_token_id": VOCAB - 1, "bos_token_id": 0}
    if kind == "llama":
        cfg = LlamaConfig(
            hidden_size=HIDDEN,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            **common,
        )
        model = LlamaForCausalLM(cfg)
    elif kind == "qwen2":
        cfg = Qwen2Config(
            hidden_size=HIDDEN,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            **common,
        )
        model = Qwen2ForCausalLM(cfg)
    elif kind == "gpt2":
        cfg = GPT2Config(n_embd=HIDDEN, n_layer=2, n_head=4, n_positions=256, **common)
        model = GPT2LMHeadModel(cfg)
    else:
        raise ValueError(kind)
    # random init gives near-uniform logits; sharpen them so greedy/top-k decisions are not near-ties
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model.eval()
