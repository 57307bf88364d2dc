"""``Softmax(X, axis)`` => ``com.softdeploy.TwoPassSoftmax`` where the benchmark says it is faster.

Same values (TwoPassSoftmax is ai.onnx.Softmax semantics, opset >= 13). The shape rule: rows along
the **last axis** with a static length >= ``min_row_length``; inner axes, unknown lengths and other
dtypes stay ai.onnx.Softmax.

What the benchmark says (bench/softmax_rewrite.py, results and decision in
bench/results/softmax_rewrite.md, re-measured after the kernel's rewrite to ~0.24 ns/element): at
1 thread the kernel is slower than onnxruntime's MLAS Softmax on short rows (16-256: 0.88-0.97x in
every run), mixed from 512 to 8192 (0.87-1.21x, within the noise of the shared machine), and at par
or faster from 16384 on (0.96-1.12x, median 1.04x). So the rule rewrites rows of >= MIN_ROW_LENGTH =
16384 (vocabulary-sized rows). It is on by default in ``softdeploy optimize``;
``--rules`` without ``two-pass-softmax`` turns it off, ``--two-pass-min-row`` moves the threshold.
"""

from __future__ import annotations

from typing import Any, ClassVar

from onnxscript import ir

from softdeploy.export.rewrites._base import SoftRule, dtype_name, int_attr, node_opset, rank

# The crossover measured in bench/results/softmax_rewrite.md (1 thread).
MIN_ROW_LENGTH = 16384


class TwoPassSoftmaxRule(SoftRule):
    """Softmax => TwoPassSoftmax on the last axis of rows of at least ``min_row_length`` (default 16384, the
    measured crossover: below it onnxruntime's own Softmax is as fast or faster, see the module docstring)."""

    name_ = "two-pass-softmax"
    target_op = "TwoPassSoftmax"
    anchor_op = "Softmax"
    summary = "Softmax => TwoPassSoftmax (last axis, long rows)"
    default_min_row_length: ClassVar[int] = MIN_ROW_LENGTH

    def __init__(self, min_row_length: int = MIN_ROW_LENGTH) -> None:
        super().__init__()
        self.min_row_length = min_row_length

    def pattern(self, op: Any, x: ir.Value) -> Any:
        """Any Softmax node."""
        return op.Softmax(x, _outputs=["probs"])

    def check(self, context: Any, x: ir.Value, probs: ir.Value, **_: Any) -> Any:
        """Accepts opset >= 13 Softmax (per-axis semantics) of float32/float16 on the last axis with a known row length
        >= ``min_row_length``; otherwise records why not."""
        softmax = probs.producer()
        assert softmax is not None
        if node_opset(context) < 13:
            return self.reject(f"opset {node_opset(context)} Softmax semantics (flattened axes) differ")
        dtype = dtype_name(x)
        if dtype not in ("float32", "float16"):
            return self.reject(f"input dtype {dtype} (TwoPassSoftmax takes float32/float16)")
        r = rank(x)
        if r is None or x.shape is None:
            return self.reject("unknown input rank (the rule needs the row length)")
        axis = int_attr(softmax, "axis", -1) % r
        if axis != r - 1:
            return self.reject(f"axis {axis} of rank {r} is not the last axis (the benchmark covers last-axis rows)")
        n = x.shape[axis]
        if not isinstance(n, int):
            return self.reject(f"row length {n} is not static")
        if n < self.min_row_length:
            return self.reject(f"row length {n} < min_row_length {self.min_row_length}")
        return True

    def rewrite(self, op: Any, x: ir.Value, probs: ir.Value, **_: Any) -> Any:
        """One TwoPassSoftmax node on the last axis."""
        return op.TwoPassSoftmax(x, axis=-1, _domain=self.domain())
