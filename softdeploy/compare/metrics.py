"""Accuracy metrics: task metrics (retrieval) and agreement with the fp32 reference.

Agreement:
  * ``cosine``: mean cosine between matching rows (e.g. token embeddings) of reference and variant;
  * ``topk_agreement``: mean |top-k(reference) ∩ top-k(variant)| / k over the rows of a score matrix;
  * ``kl``: mean KL(softmax(reference) || softmax(variant)) over the rows of a score/logit matrix.
Retrieval (binary relevance; ``relevant[q]`` is the set of relevant document ids of query q):
  * ``mrr_at_k``: mean of 1/rank of the first relevant document within the top k (0 if none);
  * ``ndcg_at_k``: DCG = Σ_{r<=k} rel_r / log2(r+1), normalised by the ideal DCG;
  * ``recall_at_k``: |relevant ∩ top-k| / |relevant|.
Ties in scores are broken by the lower document id (a stable order), so metrics are deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def cosine_rows(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Cosine of matching rows (last axis); rows that are zero in both count as 1."""
    a = np.asarray(reference, np.float64).reshape(-1, reference.shape[-1])
    b = np.asarray(other, np.float64).reshape(a.shape)
    num = (a * b).sum(1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    zero = den == 0
    return np.where(zero, 1.0, num / np.where(zero, 1.0, den))


def ranking(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k highest scores per row, best first; ties -> lower index first."""
    scores = np.asarray(scores)
    k = min(k, scores.shape[1])
    order = np.argsort(-scores, axis=1, kind="stable")
    return order[:, :k]


def topk_agreement(reference: np.ndarray, other: np.ndarray, k: int) -> float:
    """Mean over rows of |top-k(reference) & top-k(other)| / k: how much of the reference's ranking a variant keeps (1.0
    = the same top k), independent of the scores' scale."""
    ra, rb = ranking(reference, k), ranking(other, k)
    return float(np.mean([len(set(x) & set(y)) / ra.shape[1] for x, y in zip(ra, rb, strict=True)]))


def kl_softmax(reference: np.ndarray, other: np.ndarray) -> float:
    """Mean over rows of KL(softmax(reference) || softmax(other)), in nats."""

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        m = x.max(axis=1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))

    lp, lq = log_softmax(reference), log_softmax(other)
    return float(np.mean((np.exp(lp) * (lp - lq)).sum(axis=1)))


def mrr_at_k(scores: np.ndarray, relevant: Sequence[set[int]], k: int = 10) -> float:
    """Mean reciprocal rank at k: mean over queries of 1 / (rank of the first relevant candidate in the top k), 0 when
    none is."""
    top = ranking(scores, k)
    rr = []
    for row, rel in zip(top, relevant, strict=True):
        hit = next((r for r, d in enumerate(row, 1) if d in rel), None)
        rr.append(0.0 if hit is None else 1.0 / hit)
    return float(np.mean(rr))


def ndcg_at_k(scores: np.ndarray, relevant: Sequence[set[int]], k: int = 10) -> float:
    """Normalised discounted cumulative gain at k with binary relevance: DCG = sum over relevant hits at rank r
    (1-based) of 1 / log2(r + 1), divided by the ideal DCG of min(|relevant|, k) hits."""
    top = ranking(scores, k)
    disc = 1.0 / np.log2(np.arange(2, k + 2))
    out = []
    for row, rel in zip(top, relevant, strict=True):
        dcg = sum(disc[r] for r, d in enumerate(row) if d in rel)
        ideal = disc[: min(len(rel), k)].sum()
        out.append(dcg / ideal if ideal > 0 else 0.0)
    return float(np.mean(out))


def recall_at_k(scores: np.ndarray, relevant: Sequence[set[int]], k: int = 10) -> float:
    """Mean over queries of the fraction of relevant candidates found in the top k (0 for a query with none)."""
    top = ranking(scores, k)
    return float(
        np.mean(
            [len(rel & set(row.tolist())) / len(rel) if rel else 0.0 for row, rel in zip(top, relevant, strict=True)]
        )
    )
