from __future__ import annotations

import numpy as np
import pytest

from softdeploy.models.detection import SoftNMSRunner, soft_nms_op_available, soft_nms_reference
from softdeploy_cases.mtcnn_faces import box_f1, roc_auc


def _boxes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    yx = rng.uniform(0, 100, (n, 2))
    hw = rng.uniform(5, 40, (n, 2))
    return np.concatenate([yx, yx + hw], axis=1).astype(np.float32), rng.uniform(0, 1, n).astype(np.float32)


@pytest.mark.parametrize("backend", ["native", "portable", "torch"])
def test_runner_matches_reference(backend: str) -> None:
    rng = np.random.default_rng(0)
    boxes, scores = _boxes(rng, 60)
    runner = SoftNMSRunner(backend, threads=1)  # type: ignore[arg-type]
    idx, sc = runner(boxes, scores)
    ref_idx, ref_sc = soft_nms_reference(boxes, scores)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(sc, ref_sc, rtol=1e-5, atol=1e-6)
    if soft_nms_op_available():
        assert runner.backend.startswith("SoftNMS op")
    empty = runner(np.zeros((0, 4), np.float32), np.zeros(0, np.float32))
    assert len(empty[0]) == 0


def test_reference_decays_overlaps() -> None:
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [50, 50, 60, 60]], np.float32)
    idx, sc = soft_nms_reference(boxes, np.array([0.9, 0.8, 0.7], np.float32), sigma=0.5)
    assert idx.tolist() == [0, 2, 1]  # the duplicate (IoU 1) decays below the distant box
    np.testing.assert_allclose(sc, [0.9, 0.7, 0.8 * np.exp(-1 / 0.5)], rtol=1e-6)


def test_roc_auc_and_box_f1() -> None:
    assert roc_auc(np.array([0.9, 0.8, 0.1, 0.2]), np.array([1, 1, 0, 0])) == 1.0
    assert roc_auc(np.array([0.5, 0.5]), np.array([1, 0])) == 0.5
    ref = [np.array([[0, 0, 10, 10]], np.float32), np.zeros((0, 4), np.float32)]
    assert box_f1(ref, ref) == 1.0
    shifted = [np.array([[0, 5, 10, 15]], np.float32), np.array([[1, 1, 2, 2]], np.float32)]
    assert box_f1(shifted, ref) == 0.0  # IoU 1/3 < 0.5, plus one false positive
