from __future__ import annotations

import numpy as np
import pytest

from softdeploy.models.retrieval import MaxSimScorer, TokenBank, maxsim_op_available, maxsim_reference


def _ragged(rng: np.random.Generator, n: int, max_len: int, dim: int = 8) -> list[np.ndarray]:
    return [rng.standard_normal((int(rng.integers(1, max_len + 1)), dim)).astype(np.float32) for _ in range(n)]


def _brute(queries: list[np.ndarray], docs: list[np.ndarray]) -> np.ndarray:
    return np.array([[float((q @ d.T).max(axis=1).sum()) for d in docs] for q in queries])


def test_token_bank_buckets_keep_every_text() -> None:
    rng = np.random.default_rng(0)
    texts = _ragged(rng, 40, 70)
    bank = TokenBank.from_ragged(texts)
    ids = np.concatenate([i for _, _, i in bank.buckets])
    assert sorted(ids.tolist()) == list(range(40))
    for emb, mask, idx in bank.buckets:
        for row, i in enumerate(idx):
            n = len(texts[i])
            assert mask[row].sum() == n
            np.testing.assert_array_equal(emb[row, :n], texts[i])


@pytest.mark.parametrize("backend", ["native", "portable", "torch"])
def test_scorer_matches_brute_force(backend: str) -> None:
    rng = np.random.default_rng(1)
    queries, docs = _ragged(rng, 7, 12), _ragged(rng, 30, 40)
    scorer = MaxSimScorer(backend, threads=1)  # type: ignore[arg-type]
    got = scorer.score(TokenBank.from_ragged(queries), TokenBank.from_ragged(docs))
    np.testing.assert_allclose(got, _brute(queries, docs), rtol=1e-4, atol=1e-4)
    one = scorer.score_one(queries[0], TokenBank.from_ragged(docs))
    np.testing.assert_allclose(one, got[0], rtol=1e-5, atol=1e-5)
    if not maxsim_op_available():
        assert scorer.backend.startswith("numpy")


def test_reference_masks() -> None:
    q = np.ones((1, 2, 3), np.float32)
    d = np.stack([np.ones((2, 3)), -np.ones((2, 3))]).astype(np.float32)
    qmask = np.array([[True, False]])
    dmask = np.array([[True, True], [False, False]])  # doc 1 has no valid token -> contributes 0
    np.testing.assert_allclose(maxsim_reference(q, qmask, d, dmask), [[3.0, 0.0]])
