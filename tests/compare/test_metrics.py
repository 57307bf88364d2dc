from __future__ import annotations

import numpy as np
import pytest

from softdeploy.compare.metrics import (
    cosine_rows,
    kl_softmax,
    mrr_at_k,
    ndcg_at_k,
    ranking,
    recall_at_k,
    topk_agreement,
)

# 2 queries x 4 documents. Query 0 ranks docs 2,0,3,1; query 1 ranks 1,3,0,2.
SCORES = np.array([[0.5, 0.1, 0.9, 0.3], [0.2, 0.8, 0.1, 0.4]])


def test_ranking_breaks_ties_by_lower_id() -> None:
    assert ranking(np.array([[1.0, 2.0, 2.0, 0.0]]), 3).tolist() == [[1, 2, 0]]


def test_mrr() -> None:
    assert mrr_at_k(SCORES, [{0}, {1}], 10) == pytest.approx((1 / 2 + 1) / 2)
    assert mrr_at_k(SCORES, [{1}, {2}], 2) == 0.0  # both relevant docs are below rank 2


def test_ndcg() -> None:
    # query 0: relevant {0, 1} at ranks 2 and 4; ideal: ranks 1 and 2
    dcg = 1 / np.log2(3) + 1 / np.log2(5)
    ideal = 1 + 1 / np.log2(3)
    assert ndcg_at_k(SCORES[:1], [{0, 1}], 10) == pytest.approx(dcg / ideal)
    assert ndcg_at_k(SCORES[1:], [{1}], 10) == pytest.approx(1.0)


def test_recall() -> None:
    assert recall_at_k(SCORES, [{0, 1}, {3}], 2) == pytest.approx((1 / 2 + 1) / 2)


def test_agreement() -> None:
    assert topk_agreement(SCORES, SCORES, 2) == 1.0
    swapped = SCORES[:, ::-1]
    assert topk_agreement(SCORES, swapped, 2) == pytest.approx(0.0)
    assert kl_softmax(SCORES, SCORES) == pytest.approx(0.0, abs=1e-12)
    assert kl_softmax(SCORES, swapped) > 0
    a = np.array([[1.0, 0.0], [0.0, 0.0], [3.0, 4.0]])
    b = np.array([[2.0, 0.0], [0.0, 0.0], [-3.0, -4.0]])
    np.testing.assert_allclose(cosine_rows(a, b), [1.0, 1.0, -1.0])
