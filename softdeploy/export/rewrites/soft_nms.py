"""``NonMaxSuppression`` => ``com.softdeploy.SoftNMS(method="hard")`` (only on request).

Hard SoftNMS is classic NMS: a box whose IoU with a selected box is ``> iou_threshold`` (strict, as
in onnxruntime) gets score 0 and, being below the score threshold, is removed. The translation:
- ``max_output_boxes_per_class``: absent or 0 means *no output* in NonMaxSuppression but *no limit*
  in SoftNMS (OPS.md), so 0 becomes an empty ``[0, 3]`` constant; a positive constant passes through.
- ``score_threshold``: NonMaxSuppression keeps ``score > t``, SoftNMS keeps ``score >= T``; T is the
  next float32 above t. It must be a constant ``t >= 0``: a suppressed box's score is 0, which only a
  positive T removes (absent / negative thresholds have no exact translation and are reported).
- ``iou_threshold``: absent means 0 (NonMaxSuppression's default), passed explicitly (SoftNMS's
  default is 0.3). ``center_point_box`` is copied.
Non-constant optional inputs are reported, not guessed. Equal scores: NonMaxSuppression picks the
lower box index; SoftNMS the earlier box in its working order, which the swap-based loop can permute
-- with ties among overlapping boxes the selection order (not the set) may differ.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnxscript import ir

from softdeploy.export.rewrites._base import SoftRule, const_floats, const_ints, dtype_name, int_attr


class NmsToSoftNmsRule(SoftRule):
    name_ = "nms-to-softnms"
    target_op = "SoftNMS"
    anchor_op = "NonMaxSuppression"
    summary = "NonMaxSuppression => SoftNMS(method=hard) (on request)"

    def pattern(self, op: Any, boxes: ir.Value, scores: ir.Value) -> Any:
        return op.NonMaxSuppression(boxes, scores, _allow_other_inputs=True, _outputs=["selected"])

    def _settings(self, selected: ir.Value) -> tuple[int, float, float] | str:
        """(max_output, iou_threshold, score_threshold >= semantic) or the reason there is none."""
        node = selected.producer()
        assert node is not None
        extra = list(node.inputs[2:]) + [None] * (5 - len(node.inputs))
        max_value, iou_value, score_value = extra[:3]
        max_out = [0] if max_value is None else const_ints(max_value)
        if max_out is None or len(max_out) != 1:
            return "max_output_boxes_per_class is not a constant scalar"
        if max_out[0] < 0:
            return f"max_output_boxes_per_class={max_out[0]} is negative (no SoftNMS equivalent)"
        iou = [0.0] if iou_value is None else const_floats(iou_value)
        if iou is None or len(iou) != 1:
            return "iou_threshold is not a constant scalar"
        if score_value is None:
            return "no score_threshold: SoftNMS(hard) can only drop suppressed boxes (score 0) with a threshold > 0"
        score = const_floats(score_value)
        if score is None or len(score) != 1:
            return "score_threshold is not a constant scalar"
        if score[0] < 0:
            return f"score_threshold={score[0]} < 0: suppressed boxes (score 0) would survive in SoftNMS(hard)"
        inclusive = float(np.nextafter(np.float32(score[0]), np.float32(np.inf)))
        return max_out[0], iou[0], inclusive

    def check(self, context: Any, boxes: ir.Value, scores: ir.Value, selected: ir.Value, **_: Any) -> Any:
        if dtype_name(boxes) != "float32" or dtype_name(scores) != "float32":
            return self.reject(f"boxes/scores dtypes {dtype_name(boxes)}/{dtype_name(scores)} (float32 only)")
        settings = self._settings(selected)
        if isinstance(settings, str):
            return self.reject(settings)
        return True

    def rewrite(self, op: Any, boxes: ir.Value, scores: ir.Value, selected: ir.Value, **_: Any) -> Any:
        settings = self._settings(selected)
        assert not isinstance(settings, str)
        max_out, iou, score = settings
        node = selected.producer()
        assert node is not None
        if max_out == 0:  # NonMaxSuppression selects nothing
            return op.Constant(value=ir.tensor(np.zeros((0, 3), np.int64)))
        indices, _ = op.SoftNMS(
            boxes,
            scores,
            op.Constant(value=ir.tensor(np.array([max_out], np.int64))),
            op.Constant(value=ir.tensor(np.array([iou], np.float32))),
            op.Constant(value=ir.tensor(np.array([score], np.float32))),
            method="hard",
            center_point_box=int_attr(node, "center_point_box", 0),
            _domain=self.domain(),
            _outputs=2,
        )
        return indices
