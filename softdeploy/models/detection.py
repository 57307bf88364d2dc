"""Detector post-processing: candidate boxes through Soft-NMS.

Runs the com.softdeploy ``SoftNMS`` ONNX op (docs/ops/SoftNMS.md) through :class:`softdeploy.runtime.Session`
(native kernel, or its function body for "stock onnxruntime"). Where the op is not in this build's
registry, :func:`soft_nms_reference` -- the same rules in NumPy -- stands in, and
:attr:`SoftNMSRunner.backend` says so.

Gaussian Soft-NMS (Bodla et al. 2017): repeatedly select the highest-scoring remaining box and decay
every other remaining box ``s_b <- s_b * exp(-IoU^2 / sigma)``; boxes whose score falls below
``score_threshold`` are dropped. Boxes are ``[y1, x1, y2, x2]`` (center_point_box = 0).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Backend = Literal["native", "portable", "torch"]


def iou_one_to_many(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of ``box`` (y1, x1, y2, x2) with each of ``boxes [n, 4]``; 0 where the union is empty."""
    y1 = np.maximum(box[0], boxes[:, 0])
    x1 = np.maximum(box[1], boxes[:, 1])
    y2 = np.minimum(box[2], boxes[:, 2])
    x2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(y2 - y1, 0, None) * np.clip(x2 - x1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def soft_nms_reference(
    boxes: np.ndarray, scores: np.ndarray, *, sigma: float = 0.5, score_threshold: float = 0.001
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian Soft-NMS of one image and class: (selected box indices, their decayed scores), in
    selection order. Ties go to the box earlier in the working order; the selected box is swapped
    into the next output slot and a dropped box is replaced by the last working box (docs/ops/SoftNMS.md)."""
    work = [i for i in range(len(scores)) if scores[i] >= score_threshold]
    s = scores.astype(np.float64).copy()
    b = boxes.astype(np.float64)
    out_idx, out_score = [], []
    pos = 0
    while pos < len(work):
        best = max(range(pos, len(work)), key=lambda k: (s[work[k]], -k))
        work[pos], work[best] = work[best], work[pos]
        sel = work[pos]
        out_idx.append(sel)
        out_score.append(s[sel])
        pos += 1
        k = pos
        rest = np.array(work[pos:], dtype=np.int64)
        if len(rest):
            s[rest] *= np.exp(-(iou_one_to_many(b[sel], b[rest]) ** 2) / sigma)
        while k < len(work):
            if s[work[k]] < score_threshold:
                work[k] = work[-1]
                work.pop()
            else:
                k += 1
    return np.array(out_idx, np.int64), np.array(out_score, np.float32)


def soft_nms_op_available() -> bool:
    """Whether the registry has the SoftNMS op (the detection case then runs it; otherwise its NumPy loop)."""
    from softdeploy.ops import REGISTRY

    return "SoftNMS" in REGISTRY


def _soft_nms_model(sigma: float) -> object:
    from onnx import TensorProto, helper

    from softdeploy.domain import DOMAIN, OPSET_VERSION
    from softdeploy.ops.functions import attach_function_bodies

    node = helper.make_node(
        "SoftNMS",
        ["Boxes", "Scores", "", "", "ScoreThreshold"],
        ["SelectedIndices", "SelectedScores"],
        domain=DOMAIN,
        method="gaussian",
        sigma=sigma,
        name="soft_nms",
    )
    graph = helper.make_graph(
        [node],
        "soft_nms",
        [
            helper.make_tensor_value_info("Boxes", TensorProto.FLOAT, [1, "N", 4]),
            helper.make_tensor_value_info("Scores", TensorProto.FLOAT, [1, 1, "N"]),
            helper.make_tensor_value_info("ScoreThreshold", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("SelectedIndices", TensorProto.INT64, ["M", 3]),
            helper.make_tensor_value_info("SelectedScores", TensorProto.FLOAT, ["M"]),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)], ir_version=10
    )
    return attach_function_bodies(model)


class SoftNMSRunner:
    """Gaussian Soft-NMS of one image's candidates with the SoftNMS op (or its stand-in)."""

    def __init__(self, backend: Backend, *, sigma: float = 0.5, score_threshold: float = 0.001, threads: int = 1):
        self.sigma = sigma
        self.score_threshold = score_threshold
        self._session = None
        self._torch = None
        if not soft_nms_op_available():
            self.backend = "numpy (SoftNMS op not in this build)"
        elif backend == "torch":
            from softdeploy.ops import REGISTRY

            self._torch = REGISTRY["SoftNMS"].torch_impl
            self.backend = "SoftNMS op (torch eager)"
        else:
            from softdeploy.runtime import Session

            self._session = Session(_soft_nms_model(sigma), kernels=backend, threads=threads)
            kind = "native kernel" if self._session.kernels == "native" else "function body"
            self.backend = f"SoftNMS op ({kind})"

    def __call__(self, boxes: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(scores) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        threshold = np.array(self.score_threshold, np.float32)
        b = np.ascontiguousarray(boxes[None], np.float32)
        s = np.ascontiguousarray(scores[None, None], np.float32)
        if self._session is not None:
            sel, sc = self._session.run({"Boxes": b, "Scores": s, "ScoreThreshold": threshold})
            return sel[:, 2], sc
        if self._torch is not None:
            import torch

            with torch.inference_mode():
                sel, sc = self._torch(
                    torch.from_numpy(b), torch.from_numpy(s), None, None, torch.from_numpy(threshold),
                    method="gaussian", sigma=self.sigma,
                )  # fmt: skip
            return sel.numpy()[:, 2], sc.numpy()
        return soft_nms_reference(boxes, scores, sigma=self.sigma, score_threshold=self.score_threshold)
