"""``NonMaxSuppression`` => ``com.softdeploy.SoftNMS(method="hard")`` (only on request).

Hard SoftNMS is classic NMS: a box whose IoU with a selected box is ``> iou_threshold`` (strict, as
in onnxruntime) gets score 0 and, being below the score threshold, is removed. The translation:
- ``max_output_boxes_per_class``: absent or 0 means *no output* in NonMaxSuppression but *no limit*
  in SoftNMS (docs/ops/SoftNMS.md), so 0 becomes an empty ``[0, 3]`` constant; a positive constant passes through.
  A graph input (any non-constant value) is passed as ``max(m, 0)`` and the selection is cut to no
  rows when ``m <= 0`` (onnxruntime's NonMaxSuppression returns nothing for a negative value too).
- ``score_threshold``: NonMaxSuppression keeps ``score > t``, SoftNMS keeps ``score >= T``. A constant
  ``t >= 0`` becomes T = the next float32 above t (a suppressed box's score is 0, which only a positive
  T removes; absent / negative constant thresholds have no exact translation and are reported).
  A graph input t becomes ``If(t >= 0, SoftNMS with T = t keeping the selected boxes whose score is
  > t, the original NonMaxSuppression)``: with T = t the boxes scoring exactly t (and, for t = 0, the
  suppressed ones) are still selected, but only after every box scoring more (hard SoftNMS never
  lowers a score but to 0), so dropping the selections with score <= t leaves NonMaxSuppression's; a
  negative t, where suppressed boxes would survive, runs the original op.
- ``iou_threshold``: absent means 0 (NonMaxSuppression's default), passed explicitly (SoftNMS's
  default is 0.3); a graph input passes through (onnxruntime's NonMaxSuppression refuses values
  outside [0, 1]; SoftNMS takes them as given). ``center_point_box`` is copied.
Equal scores: NonMaxSuppression picks the lower box index; SoftNMS the earlier box in its working
order, which the swap-based loop can permute -- with ties among overlapping boxes the selection order
(not the set) may differ.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
from onnxscript import ir

from softdeploy.export.rewrites._base import SoftRule, const_floats, const_ints, dtype_name, int_attr

_names = itertools.count()
_FALLBACK = "_negative_threshold_fallback"  # the name of the NonMaxSuppression kept in an If's else branch


@dataclasses.dataclass(frozen=True)
class _Settings:
    max_out: int | ir.Value  # a constant >= 0, or the graph value
    iou: float | ir.Value
    score: float | ir.Value  # a constant: already SoftNMS's inclusive threshold (next float32 above t)


class _Builder:
    """Emits nodes either through the rewriter's ``op`` (the main graph) or into a list (a subgraph of
    an If), with one call shape: ``b("Op", *inputs, _domain=..., _outputs=n, **attributes)``."""

    def __init__(self, op: Any = None, prefix: str = "") -> None:
        self.op, self.prefix, self.nodes = op, prefix, []  # type: ignore[var-annotated]

    def __call__(
        self, op_type: str, *inputs: Any, _domain: str = "", _outputs: int = 1, _name: str | None = None, **attrs: Any
    ) -> Any:
        if self.op is not None:
            return getattr(self.op, op_type)(*inputs, _domain=_domain, _outputs=_outputs, **attrs)
        outs = [ir.Value(name=f"{self.prefix}_{next(_names)}") for _ in range(_outputs)]
        self.nodes.append(ir.node(op_type, list(inputs), attrs, domain=_domain, outputs=outs, name=_name))
        return outs[0] if _outputs == 1 else tuple(outs)

    def const(self, array: np.ndarray) -> Any:
        return self("Constant", value=ir.tensor(array))


class NmsToSoftNmsRule(SoftRule):
    """NonMaxSuppression => SoftNMS(method=hard), on request (``--nms-to-softnms``): hard SoftNMS selects the same set
    of boxes (the module docstring says when the order can differ). Thresholds and max-boxes that are graph inputs are
    handled (see the module docstring)."""

    name_ = "nms-to-softnms"
    target_op = "SoftNMS"
    anchor_op = "NonMaxSuppression"
    summary = "NonMaxSuppression => SoftNMS(method=hard) (on request)"

    def pattern(self, op: Any, boxes: ir.Value, scores: ir.Value) -> Any:
        """Any NonMaxSuppression node (its optional inputs included)."""
        return op.NonMaxSuppression(boxes, scores, _allow_other_inputs=True, _outputs=["selected"])

    def _settings(self, selected: ir.Value) -> _Settings | str:
        """The SoftNMS settings, or the reason there are none."""
        node = selected.producer()
        assert node is not None
        extra = list(node.inputs[2:]) + [None] * (5 - len(node.inputs))
        max_value, iou_value, score_value = extra[:3]
        max_out: int | ir.Value
        if max_value is None:
            max_out = 0
        elif (ints := const_ints(max_value)) is not None:
            if len(ints) != 1:
                return "max_output_boxes_per_class is not a scalar"
            if ints[0] < 0:
                return f"max_output_boxes_per_class={ints[0]} is negative (no SoftNMS equivalent)"
            max_out = ints[0]
        else:
            max_out = max_value
        iou: float | ir.Value
        if iou_value is None:
            iou = 0.0
        elif (floats := const_floats(iou_value)) is not None:
            if len(floats) != 1:
                return "iou_threshold is not a scalar"
            iou = floats[0]
        else:
            iou = iou_value
        if score_value is None:
            return "no score_threshold: SoftNMS(hard) can only drop suppressed boxes (score 0) with a threshold > 0"
        score: float | ir.Value
        if (floats := const_floats(score_value)) is not None:
            if len(floats) != 1:
                return "score_threshold is not a scalar"
            if floats[0] < 0:
                return f"score_threshold={floats[0]} < 0: suppressed boxes (score 0) would survive in SoftNMS(hard)"
            score = float(np.nextafter(np.float32(floats[0]), np.float32(np.inf)))
        else:
            score = score_value
        return _Settings(max_out, iou, score)

    def check(self, context: Any, boxes: ir.Value, scores: ir.Value, selected: ir.Value, **_: Any) -> Any:
        """Accepts float32 boxes and scores whose settings SoftNMS can express exactly; otherwise records why not."""
        producer = selected.producer()
        if producer is not None and (producer.name or "").endswith(_FALLBACK):
            return self.reject("the fallback of a rewrite for a negative score_threshold")  # not again
        if dtype_name(boxes) != "float32" or dtype_name(scores) != "float32":
            return self.reject(f"boxes/scores dtypes {dtype_name(boxes)}/{dtype_name(scores)} (float32 only)")
        settings = self._settings(selected)
        if isinstance(settings, str):
            return self.reject(settings)
        return True

    def rewrite(self, op: Any, boxes: ir.Value, scores: ir.Value, selected: ir.Value, **_: Any) -> Any:
        """The SoftNMS node with the NonMaxSuppression's settings (an empty [0, 3] constant when it selects nothing; for
        a graph-input score threshold, SoftNMS where the threshold is >= 0 and the original op otherwise)."""
        settings = self._settings(selected)
        assert not isinstance(settings, str)
        node = selected.producer()
        assert node is not None
        center_point_box = int_attr(node, "center_point_box", 0)
        if settings.max_out == 0:  # NonMaxSuppression selects nothing
            return op.Constant(value=ir.tensor(np.zeros((0, 3), np.int64)))
        if not isinstance(settings.score, ir.Value):
            return self._soft_nms(_Builder(op), boxes, scores, settings, center_point_box)
        # A graph-input score threshold: SoftNMS where it has an exact translation (t >= 0), else the
        # original op (see the module docstring).
        prefix = f"{selected.name or 'nms'}_softnms"
        then = _Builder(prefix=prefix)
        then_out = self._soft_nms(then, boxes, scores, settings, center_point_box)
        other = _Builder(prefix=prefix)
        other_out = other(
            "NonMaxSuppression", *node.inputs, center_point_box=center_point_box, _name=f"{prefix}{_FALLBACK}"
        )
        t = op.Reshape(settings.score, op.Constant(value=ir.tensor(np.zeros(0, np.int64))))  # If wants a scalar
        cond = op.GreaterOrEqual(t, op.Constant(value=ir.tensor(np.array(0.0, np.float32))))
        return op.If(
            cond,
            then_branch=ir.Graph([], [then_out], nodes=then.nodes, name=f"{prefix}_then"),
            else_branch=ir.Graph([], [other_out], nodes=other.nodes, name=f"{prefix}_else"),
        )

    def _soft_nms(self, b: _Builder, boxes: Any, scores: Any, s: _Settings, center_point_box: int) -> Any:
        one: Callable[[Any], Any] = lambda v: b("Reshape", v, b.const(np.array([1], np.int64)))  # noqa: E731
        max_in = (
            b.const(np.array([s.max_out], np.int64))
            if isinstance(s.max_out, int)
            else b("Max", one(s.max_out), b.const(np.array([0], np.int64)))
        )
        iou_in = b.const(np.array([s.iou], np.float32)) if isinstance(s.iou, float) else one(s.iou)
        score_in = b.const(np.array([s.score], np.float32)) if isinstance(s.score, float) else one(s.score)
        indices, selected_scores = b(
            "SoftNMS",
            boxes,
            scores,
            max_in,
            iou_in,
            score_in,
            _domain=self.domain(),
            _outputs=2,
            method="hard",
            center_point_box=center_point_box,
        )
        if isinstance(s.score, ir.Value):  # T = t: drop what NonMaxSuppression's strict "> t" would not keep
            indices = b("Compress", indices, b("Greater", selected_scores, score_in), axis=0)
        if isinstance(s.max_out, ir.Value):  # m <= 0: NonMaxSuppression selects nothing
            rows = b("Shape", indices, start=0, end=1)
            keep = b(
                "Where",
                b("Greater", one(s.max_out), b.const(np.array([0], np.int64))),
                rows,
                b.const(np.array([0], np.int64)),
            )
            indices = b("Slice", indices, b.const(np.array([0], np.int64)), keep, b.const(np.array([0], np.int64)))
        return indices
