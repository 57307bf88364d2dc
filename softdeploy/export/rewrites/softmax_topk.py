"""``TopK(Softmax(X, axis), K, axis, largest=1, sorted=1)`` => ``com.softdeploy.SoftmaxTopK``.

Safe when: both axes are the same axis; ``largest = 1`` and ``sorted = 1`` (SoftmaxTopK returns the
k largest probabilities in descending order); ``K`` is a constant >= 1 (it becomes the ``k``
attribute); the probabilities feed nothing but the TopK (otherwise the Softmax stays and nothing is
saved); X is float32/float16; Softmax has opset >= 13 semantics (before 13 it normalised over the
flattened trailing axes -- the same only for the last axis). The rewritten node also drops TopK's
cost (about 1.7x the softmax in onnxruntime, shared/notes/perf-baselines.md section 2). ``Div(X, T)``
feeding the Softmax is left alone (temperature 1): folding it would change nothing numerically.
"""

from __future__ import annotations

from typing import Any

from onnxscript import ir

from softdeploy.export.rewrites._base import SoftRule, const_ints, dtype_name, int_attr, node_opset, rank


class SoftmaxTopKRule(SoftRule):
    """Softmax -> TopK => SoftmaxTopK: the k largest probabilities without forming the probability row. Rewritten only
    when both act on the same axis, k is a constant, the TopK selects the largest sorted values and the probabilities
    are used nowhere else."""

    name_ = "softmax-topk"
    target_op = "SoftmaxTopK"
    anchor_op = "TopK"
    summary = "Softmax -> TopK => SoftmaxTopK"
    shared_intermediate = "the Softmax output is also used elsewhere (the probabilities would still be needed)"

    def pattern(self, op: Any, x: ir.Value, k: ir.Value) -> Any:
        """Softmax(x) -> TopK(probs, k)."""
        probs = op.Softmax(x, _outputs=["probs"])
        return op.TopK(probs, k, _outputs=["values", "indices"])

    def check(self, context: Any, x: ir.Value, k: ir.Value, probs: ir.Value, values: ir.Value, **_: Any) -> Any:
        """Accepts float32/float16 input with Softmax and TopK on the same axis (opset-aware default axis) and a
        constant k; otherwise records why not."""
        softmax, topk = probs.producer(), values.producer()
        assert softmax is not None and topk is not None
        dtype = dtype_name(x)
        if dtype not in ("float32", "float16"):
            return self.reject(f"input dtype {dtype} (SoftmaxTopK takes float32/float16)")
        r = rank(x)
        opset = node_opset(context)
        sm_axis = int_attr(softmax, "axis", -1 if opset >= 13 else 1)
        tk_axis = int_attr(topk, "axis", -1)
        if r is None:
            if sm_axis != tk_axis:
                return self.reject(f"Softmax axis {sm_axis} vs TopK axis {tk_axis} with unknown rank")
        elif sm_axis % r != tk_axis % r:
            return self.reject(f"Softmax axis {sm_axis} and TopK axis {tk_axis} differ")
        if opset < 13 and (r is None or sm_axis % r != r - 1):
            return self.reject(
                f"opset {opset} Softmax flattens the axes from {sm_axis} on (same only on the last axis)"
            )
        if int_attr(topk, "largest", 1) != 1:
            return self.reject("TopK largest=0 (SoftmaxTopK returns the largest)")
        if int_attr(topk, "sorted", 1) != 1:
            return self.reject("TopK sorted=0 (SoftmaxTopK returns sorted values)")
        kk = const_ints(k)
        if kk is None or len(kk) != 1:
            return self.reject("K is not a constant scalar")
        if kk[0] < 1:
            return self.reject(f"K={kk[0]} (SoftmaxTopK needs k >= 1)")
        if r is not None and x.shape is not None:
            n = x.shape[tk_axis % r]
            if isinstance(n, int) and kk[0] > n:
                return self.reject(f"K={kk[0]} exceeds the axis length {n}")
        return True

    def rewrite(self, op: Any, x: ir.Value, k: ir.Value, probs: ir.Value, values: ir.Value, **_: Any) -> Any:
        """One SoftmaxTopK node (k and axis from the TopK) giving the values and indices."""
        topk = values.producer()
        assert topk is not None
        axis = int_attr(topk, "axis", -1)
        kk = const_ints(k)
        assert kk is not None
        return op.SoftmaxTopK(x, k=kk[0], axis=axis, _domain=self.domain(), _outputs=2)
