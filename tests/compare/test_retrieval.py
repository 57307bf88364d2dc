from __future__ import annotations

import numpy as np
import pytest

from softdeploy.models.retrieval import MaxSimScorer, TokenBank
from softdeploy.ops.max_sim import quantize_tokens


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
    assert scorer.backend.startswith("MaxSim op fp32")
    if backend == "native":
        assert scorer.backend == "MaxSim op fp32 (native kernel)"


def _dequantized(texts: list[np.ndarray]) -> list[np.ndarray]:
    out = []
    for t in texts:
        codes, scale = quantize_tokens(t)
        out.append(codes.astype(np.float64) * scale[:, None])
    return out


@pytest.mark.parametrize("backend", ["native", "portable", "torch"])
def test_int8_scorer_scores_the_dequantized_tokens(backend: str) -> None:
    rng = np.random.default_rng(2)
    queries, docs = _ragged(rng, 5, 12, dim=24), _ragged(rng, 33, 40, dim=24)
    scorer = MaxSimScorer(backend, threads=1, int8=True)  # type: ignore[arg-type]
    assert scorer.backend.startswith("MaxSim op int8")
    bank = TokenBank.from_ragged(docs).to_int8()
    assert bank.int8 and bank.nbytes() < TokenBank.from_ragged(docs).nbytes() / 3
    got = scorer.score(TokenBank.from_ragged(queries), bank)  # float queries are encoded on the way in
    # exactly MaxSim of the dequantized tokens (the int8 sum is exact; float32 rounding of the scales only)
    np.testing.assert_allclose(got, _brute(_dequantized(queries), _dequantized(docs)), rtol=1e-5, atol=1e-4)
    # and close to the float scores: per-token scales keep ~7 bits per component
    np.testing.assert_allclose(got, _brute(queries, docs), rtol=0.02, atol=0.05)
    np.testing.assert_allclose(scorer.score_one(queries[0], bank), got[0], rtol=1e-6, atol=1e-6)


def test_fp32_scorer_refuses_int8_bank() -> None:
    rng = np.random.default_rng(3)
    bank = TokenBank.from_ragged(_ragged(rng, 3, 5)).to_int8()
    with pytest.raises(ValueError, match="int8 TokenBank"):
        MaxSimScorer("native").score(bank, bank)


@pytest.mark.parametrize("backend", ["native", "portable", "torch"])
def test_scorer_masks(backend: str) -> None:
    # the short document is padded (with zeros) to its bucket's width: a padding token must never win
    # the max, although its similarity 0 is larger than the real -3
    q = [np.ones((2, 3), np.float32)]
    d = [-np.ones((1, 3), np.float32), np.ones((3, 3), np.float32)]
    got = MaxSimScorer(backend).score(TokenBank.from_ragged(q), TokenBank.from_ragged(d))  # type: ignore[arg-type]
    np.testing.assert_allclose(got, [[-6.0, 6.0]])


def test_token_bank_seven_bit_documents():
    """to_int8(bits=7): codes within [-63, 63] and the width recorded; the 8-bit bank uses the full range."""
    rng = np.random.default_rng(5)
    bank = TokenBank.from_ragged(_ragged(rng, 6, 5))
    b7, b8 = bank.to_int8(bits=7), bank.to_int8()
    assert (b7.bits, b8.bits) == (7, 8)
    assert all(np.abs(codes).max() <= 63 for codes, _, _ in b7.buckets)
    assert any(np.abs(codes).max() > 63 for codes, _, _ in b8.buckets)


@pytest.mark.parametrize("bits", [7, 8])
def test_reranked_search_returns_the_float_top_k_with_float_scores(bits: int) -> None:
    from softdeploy.models.retrieval import RerankedMaxSim

    rng = np.random.default_rng(3)
    docs, query = _ragged(rng, 300, 40), _ragged(rng, 1, 12)[0]
    exact = _brute([query], docs)[0]
    search = RerankedMaxSim(TokenBank.from_ragged(docs), bits=bits, candidates=60)
    ids, scores = search.search(query, k=10)
    want = np.lexsort((np.arange(len(docs)), -exact))[:10]
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_allclose(scores, exact[want], rtol=1e-5, atol=1e-5)
    assert np.all(np.diff(scores) <= 0)


def test_reranked_search_with_fewer_candidates_than_documents_can_miss_and_says_what_it_needs() -> None:
    """One candidate re-ranked: the result is the int8 stage's best, re-scored -- the float best only where the int8
    stage put it first; k above the candidates is refused."""
    from softdeploy.errors import ArgumentError
    from softdeploy.models.retrieval import MaxSimScorer, RerankedMaxSim

    rng = np.random.default_rng(4)
    docs, query = _ragged(rng, 200, 30), _ragged(rng, 1, 8)[0]
    bank = TokenBank.from_ragged(docs)
    search = RerankedMaxSim(bank, bits=7, candidates=1)
    ids, scores = search.search(query, k=1)
    coarse = MaxSimScorer("native", int8=True).score_one(query, bank.to_int8(bits=7))
    assert ids.tolist() == [int(np.argmax(coarse))]
    np.testing.assert_allclose(scores, _brute([query], [docs[ids[0]]])[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ArgumentError, match=r"k must be within 1\.\.candidates = 1, got 2"):
        search.search(query, k=2)
    with pytest.raises(ArgumentError, match="corpus must be the float32 TokenBank"):
        RerankedMaxSim(bank.to_int8())
    with pytest.raises(ArgumentError, match="bits must be 7 or 8, got 6"):
        RerankedMaxSim(bank, bits=6)


def test_reranked_search_over_a_corpus_smaller_than_the_candidates() -> None:
    from softdeploy.models.retrieval import RerankedMaxSim

    rng = np.random.default_rng(5)
    docs, query = _ragged(rng, 5, 9), _ragged(rng, 1, 4)[0]
    ids, scores = RerankedMaxSim(TokenBank.from_ragged(docs), candidates=100).search(query, k=10)
    exact = _brute([query], docs)[0]
    np.testing.assert_array_equal(ids, np.lexsort((np.arange(5), -exact)))
    np.testing.assert_allclose(scores, exact[ids], rtol=1e-5, atol=1e-5)
