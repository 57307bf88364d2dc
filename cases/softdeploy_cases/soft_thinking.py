"""A small causal LM with a ``</think>`` token, trained here on chatterbot-corpus: the model of the soft-thinking case.

No reasoning LLM ships offline, so this model only gives soft thinking a real (trained, non-random) decoder with a
thinking section to run on. Every chatterbot-corpus conversation (2,026 question/answer pairs in 21 topic files)
becomes one sequence::

    <bos> question words <think> #topic key words of the question </think> answer words <eos>

The "thinking" is the question's topic tag (its file) followed by its rarest words: a learned, short, checkable
intermediate step, not reasoning. The vocabulary is word-level (lower-cased words and punctuation of the corpus,
plus ``<pad> <bos> <eos> <think> </think>`` and one ``#topic`` token per file). The model is a transformers
``LlamaForCausalLM`` (3 layers, width 128, 4 heads / 2 KV heads), trained with AdamW for ``steps`` steps; its
weights are cached (:mod:`softdeploy.models.cached`) under a key of the corpus and the settings.

:func:`write_model_folder` writes it as a transformers model folder (config.json, model.safetensors,
tokenizer.json / tokenizer_config.json, generation_config.json) that ``softdeploy generate MODEL_DIR`` reads.

What it cannot show: SofT-GRPO's and Soft Thinking's accuracy claims are about reasoning models on math and code
benchmarks; this model has no reasoning to improve, so the case measures agreement and speed only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

SPECIALS = ("<pad>", "<bos>", "<eos>", "<think>", "</think>")
PAD, BOS, EOS, THINK, THINK_END = range(len(SPECIALS))
_WORD = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")
KEY_WORDS = 4  # rarest question words restated in the thinking section


def words(text: str) -> list[str]:
    """The corpus's word-level tokens of ``text``: lower-cased words (with apostrophes) and single punctuation."""
    return _WORD.findall(text.lower())


@dataclasses.dataclass(frozen=True)
class QAData:
    """The chatterbot-corpus conversations as (topic, question, answer) triples, and the vocabulary over them."""

    triples: list[tuple[str, str, str]]
    vocab: list[str]

    @property
    def ids(self) -> dict[str, int]:
        """Token -> id."""
        return {w: i for i, w in enumerate(self.vocab)}

    def thinking(self, question: str) -> list[str]:
        """The thinking section's words for ``question`` (without its topic tag): its ``KEY_WORDS`` rarest words."""
        counts = self._counts
        ws = [w for w in dict.fromkeys(words(question)) if w.isalnum()]
        return sorted(ws, key=lambda w: (counts[w], w))[:KEY_WORDS]

    @property
    def _counts(self) -> Counter[str]:
        c: Counter[str] = Counter()
        for _, q, a in self.triples:
            c.update(words(q))
            c.update(words(a))
        return c

    def sequences(self) -> list[list[int]]:
        """Every conversation as token ids: ``<bos> q <think> #topic keys </think> a <eos>``."""
        ids = self.ids
        counts = self._counts
        out = []
        for topic, q, a in self.triples:
            keys = sorted((w for w in dict.fromkeys(words(q)) if w.isalnum()), key=lambda w: (counts[w], w))[:KEY_WORDS]
            seq = [BOS, *(ids[w] for w in words(q)), THINK, ids["#" + topic], *(ids[w] for w in keys), THINK_END]
            out.append([*seq, *(ids[w] for w in words(a)), EOS])
        return out

    def prompt(self, question: str) -> list[int]:
        """The ids the model continues for ``question``: ``<bos> q <think>`` (unknown words dropped)."""
        ids = self.ids
        return [BOS, *(ids[w] for w in words(question) if w in ids), THINK]


def load_qa() -> QAData:
    """chatterbot-corpus's English conversations (first utterance the question, second the answer)."""
    import yaml

    from softdeploy_cases.assets import package_dir

    root = package_dir("chatterbot_corpus") / "data" / "english"
    triples = []
    for f in sorted(root.glob("*.yml")):
        with open(f, encoding="utf-8") as fh:
            for conv in yaml.safe_load(fh)["conversations"]:
                if len(conv) >= 2 and str(conv[0]).strip() and str(conv[1]).strip():
                    triples.append((f.stem, str(conv[0]).strip(), str(conv[1]).strip()))
    counts: Counter[str] = Counter()
    for _, q, a in triples:
        counts.update(words(q))
        counts.update(words(a))
    topics = sorted({t for t, _, _ in triples})
    vocab = [*SPECIALS, *("#" + t for t in topics), *sorted(counts, key=lambda w: (-counts[w], w))]
    return QAData(triples, vocab)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Model size and training settings (the cache key includes them)."""

    hidden: int = 128
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    steps: int = 800
    batch_size: int = 16
    lr: float = 3e-3
    max_length: int = 64
    seed: int = 0


def build_model(vocab_size: int, cfg: TrainConfig) -> Any:
    """An untrained LlamaForCausalLM of ``cfg``'s size for ``vocab_size`` tokens."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=256,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def train(model: Any, data: QAData, cfg: TrainConfig, progress: Any = None) -> list[float]:
    """Trains ``model`` in place (next-token cross-entropy over whole sequences, padding ignored); the loss every
    100 steps."""
    import torch

    seqs = [s[: cfg.max_length] for s in data.sequences()]
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.1)
    model.train()
    losses = []
    for step in range(cfg.steps):
        batch = [seqs[i] for i in rng.integers(0, len(seqs), cfg.batch_size)]
        width = max(len(s) for s in batch)
        ids = torch.full((len(batch), width), PAD, dtype=torch.long)
        for b, s in enumerate(batch):
            ids[b, : len(s)] = torch.tensor(s)
        labels = ids.masked_fill(ids == PAD, -100)
        loss = model(input_ids=ids, attention_mask=(ids != PAD).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == cfg.steps - 1:
            losses.append(float(loss.detach()))
        if progress is not None:
            progress(1)
    model.eval()
    return losses


def trained_model(cfg: TrainConfig | None = None, progress: Any = None) -> tuple[Any, QAData, bool]:
    """(the trained model in eval mode, the data, whether it came from the cache). Trains on a cache miss (about a
    few minutes on 2 shared cores)."""
    from softdeploy.cache import cache_root
    from softdeploy.compare.cache import fingerprint
    from softdeploy.models.cached import cached_weights
    from softdeploy.progress import SilentProgress

    cfg = cfg or TrainConfig()
    data = load_qa()
    model = build_model(len(data.vocab), cfg)
    key = fingerprint(data.triples, data.vocab, dataclasses.asdict(cfg), KEY_WORDS)[:24]
    path = cache_root() / "soft_thinking" / f"qa-llama-{key}.safetensors"
    progress = progress or SilentProgress()

    def run() -> None:
        with progress.step(f"train the {cfg.layers}-layer QA model ({cfg.steps} steps)", total=cfg.steps) as advance:
            train(model, data, cfg, advance)

    cached = cached_weights(path, model, run, what="soft-thinking QA model", progress=progress)
    return model.eval(), data, cached


def tokenizer_json(vocab: list[str]) -> str:
    """A ``tokenizers`` WordLevel tokenizer over ``vocab`` (lower-casing, the corpus's word split) as JSON text."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<pad>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(_WORD.pattern), behavior="isolated")
    tok.add_special_tokens(list(SPECIALS))
    return tok.to_str()


def write_model_folder(model: Any, data: QAData, out: str | os.PathLike[str]) -> Path:
    """Writes ``model`` as a transformers model folder with its tokenizer (every file through softdeploy.files);
    returns the folder."""
    from safetensors.torch import save_file

    from softdeploy.files import make_folder, write_text, write_with

    folder = make_folder(out, "model folder")
    config = model.config.to_dict()
    config["architectures"] = ["LlamaForCausalLM"]
    write_text(folder / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n", "model config")
    gen = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}
    write_text(folder / "generation_config.json", json.dumps(gen, indent=2) + "\n", "generation config")
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    write_with(folder / "model.safetensors", lambda p: save_file(state, str(p), metadata={"format": "pt"}), "weights")
    write_text(folder / "tokenizer.json", tokenizer_json(data.vocab), "tokenizer")
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<pad>",
        "think_start": "<think>",
        "think_end": "</think>",
    }
    write_text(folder / "tokenizer_config.json", json.dumps(tok_cfg, indent=2) + "\n", "tokenizer config")
    return folder
