"""Softpick written out -- the paper's formula or the softpick authors' code -- => ``com.softdeploy.Softpick``.

Two forms, as torch.onnx (dynamo) exports them. The paper's formula written plainly
(``softpick(x) = ReLU(exp(x - m) - exp(-m)) / (sum |exp(x - m) - exp(-m)| + eps)``)::

    m = ReduceMax(x, axis, keepdims=1);  e = Exp(x - m) - Exp(-m)
    Div(Relu(e), ReduceSum(Abs(e), axis, keepdims=1) [+ eps])

and the authors' numerically stable code (zaydzuhri/softpick-attention), which leaves non-finite entries out of the
sum with ``torch.where(x.isfinite(), ...)``::

    Div(Relu(e), ReduceSum(Where(IsFinite(x), Abs(e), 0), axis, keepdims=1) [+ eps])

with IsFinite exported as ``And(Not(IsInf(x)), Not(IsNaN(x)))``. The authors' form is Softpick's contract exactly
(docs/ops/Softpick.md: non-finite entries left out of ``m`` and of the denominator). The paper's form differs from it
only where the row holds non-finite entries: a -inf entry (a mask) adds ``|0 - exp(-m)| = exp(-m)`` to its sum, so it
becomes ``Softpick(Where(IsInf(x, detect_positive=0), lowest, x))`` -- a -inf replaced by the dtype's lowest finite
number adds exactly that, ``exp(lowest - m) = 0``, and still outputs 0. Rows the paper's form makes all NaN (a NaN or
+inf entry in ``m``, or no finite entry: ``m = -inf``) come out as Softpick's contract says instead (NaN / +inf at its
own position, an all-masked row all zeros); every row the paper's form gives numbers for is unchanged.

``eps`` is the constant added to the sum (0 when there is none). Checks (each failure is reported): both reductions
over the same single constant axis with ``keepdims=1``; in the authors' form the Where's condition is IsFinite of the
same ``x`` and its other branch the constant 0; ``eps`` a constant finite scalar >= 0; float32/float16; the
denominator's nodes used only in the pattern. Run before ``softpick-attention``, so that attention written the
authors' way (``naive_softpick_attn``) then becomes one fused SoftpickAttention node.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnxscript import ir

from softdeploy.export.rewrites._base import SoftRule, const_floats, const_ints, dtype_name, int_attr, rank


def _std(node: ir.Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _axes(node: ir.Node) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return const_ints(node.inputs[1])
    attr = node.attributes.get("axes")
    return None if attr is None else [int(a) for a in attr.as_ints()]


def _is_finite_of(cond: ir.Value, x: ir.Value) -> bool:
    """Whether ``cond`` is And(Not(IsInf(x)), Not(IsNaN(x))) (either order)."""
    node = cond.producer()
    if not _std(node, "And"):
        return False
    assert node is not None
    kinds = set()
    for side in node.inputs:
        inner = side.producer() if side is not None else None
        if not _std(inner, "Not"):
            return False
        assert inner is not None
        test = inner.inputs[0].producer() if inner.inputs[0] is not None else None
        if test is None or test.op_type not in ("IsInf", "IsNaN") or test.inputs[0] is not x:
            return False
        if test.op_type == "IsInf" and (
            int_attr(test, "detect_positive", 1) != 1 or int_attr(test, "detect_negative", 1) != 1
        ):
            return False
        kinds.add(test.op_type)
    return kinds == {"IsInf", "IsNaN"}


class SoftpickRule(SoftRule):
    """Softpick's expression (max, two Exps, Relu, an Abs sum -- finite-masked in the authors' code, plain in the
    paper's formula -- Div) => Softpick: one node, one pass over each row. Rewritten only when it computes what
    Softpick computes (same axis, a constant eps; see the module docstring for the paper's form) and the
    intermediates are used nowhere else."""

    name_ = "softpick"
    target_op = "Softpick"
    anchor_op = "Div"
    summary = "ReduceMax -> Exp(x - m) - Exp(-m) -> Relu / masked Abs sum => Softpick"
    shared_intermediate = "an intermediate of the softpick expression is also used elsewhere"

    def __init__(self, with_eps: bool = True, masked: bool = True) -> None:
        self.with_eps = with_eps  # the variant: ReduceSum + eps, or the bare ReduceSum
        self.masked = masked  # the authors' Where(IsFinite(x), Abs(e), 0), or the paper's plain Abs(e)
        super().__init__()

    def variants(self) -> list[SoftRule]:
        """Every form of the denominator (with and without the added eps; the authors' masked sum and the paper's
        plain one), one pattern each."""
        return [SoftpickRule(eps, masked) for masked in (True, False) for eps in (True, False)]

    def is_candidate(self, node: ir.Node) -> bool:  # type: ignore[override]
        """A Div of a Relu by this variant's denominator (an Add, or a ReduceSum): only those are reported when not
        rewritten (other Divs are no softpick; each candidate is reported by one variant)."""
        if not _std(node, "Div") or len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
            return False
        den = node.inputs[1].producer()
        if not (_std(node.inputs[0].producer(), "Relu") and _std(den, "Add" if self.with_eps else "ReduceSum")):
            return False
        assert den is not None
        total = den if not self.with_eps else (den.inputs[0].producer() if den.inputs[0] is not None else None)
        summed = total.inputs[0].producer() if total is not None and total.inputs[0] is not None else None
        return _std(summed, "Abs") != self.masked  # the paper's variant reports plain Abs sums, the authors' the rest

    def pattern(
        self, op: Any, x: ir.Value, axes: ir.Value, cond: ir.Value, zero: ir.Value, sum_axes: ir.Value, eps: ir.Value
    ) -> Any:
        """Div(Relu(e), ReduceSum(Where(cond, Abs(e), zero)) [+ eps]) with e = Exp(x - m) - Exp(-m), m = ReduceMax(x)
        (the paper's form: ReduceSum(Abs(e)); cond and zero are then absent); cond, zero, the axes and eps are
        checked by check()."""
        m = op.ReduceMax(x, axes, _outputs=["m"])
        e = op.Sub(op.Exp(op.Sub(x, m)), op.Exp(op.Neg(m)), _outputs=["e"])
        summed = op.Where(cond, op.Abs(e), zero) if self.masked else op.Abs(e)
        den = op.ReduceSum(summed, sum_axes, _outputs=["total"])
        if self.with_eps:
            den = op.Add(den, eps)
        return op.Div(op.Relu(e), den, _outputs=["out"])

    def _parts(
        self,
        x: ir.Value,
        m: ir.Value,
        total: ir.Value,
        cond: ir.Value | None,
        zero: ir.Value | None,
        eps: ir.Value | None,
    ) -> tuple[int, float] | str:
        """(axis, eps), or the reason it is not Softpick."""
        dtype = dtype_name(x)
        if dtype not in ("float32", "float16"):
            return f"dtype {dtype} (Softpick takes float32/float16)"
        r = rank(x)
        if r is None:
            return "the input has unknown rank (run shape inference or give input shapes)"
        max_node, sum_node = m.producer(), total.producer()
        assert max_node is not None and sum_node is not None
        max_axes, sum_axes = _axes(max_node), _axes(sum_node)
        for name, node, ax in (("ReduceMax", max_node, max_axes), ("ReduceSum", sum_node, sum_axes)):
            if ax is None or len(ax) != 1 or int_attr(node, "keepdims", 1) != 1:
                return (
                    f"{name} axes {ax} keepdims={int_attr(node, 'keepdims', 1)} (needs one constant axis, keepdims=1)"
                )
        assert max_axes is not None and sum_axes is not None
        if sum_axes[0] % r != max_axes[0] % r:
            return f"ReduceMax over axis {max_axes[0]} but ReduceSum over axis {sum_axes[0]}"
        if self.masked:
            if cond is None or not _is_finite_of(cond, x):
                return (
                    "the Where's condition is not IsFinite of the softpick's input (And(Not(IsInf(x)), Not(IsNaN(x))))"
                )
            z = const_floats(zero)
            if z is None or len(z) != 1 or z[0] != 0.0:
                return "the Where's other branch is not the constant 0"
        value = 0.0
        if eps is not None:
            c = const_floats(eps)
            if c is None or len(c) != 1:
                return "the Add to the sum is not a constant scalar eps"
            if not (math.isfinite(c[0]) and c[0] >= 0):
                return f"eps {c[0]} is not a finite number >= 0"
            value = c[0]
        return max_axes[0] % r, value

    def check(
        self,
        context: Any,
        x: ir.Value,
        m: ir.Value,
        total: ir.Value,
        cond: ir.Value | None = None,
        zero: ir.Value | None = None,
        eps: ir.Value | None = None,
        **_: Any,
    ) -> Any:
        """Accepts exactly Softpick's contract (see the module docstring); otherwise records why not."""
        parts = self._parts(x, m, total, cond, zero, eps if self.with_eps else None)
        if isinstance(parts, str):
            return self.reject(parts)
        return True

    def rewrite(
        self,
        op: Any,
        x: ir.Value,
        m: ir.Value,
        total: ir.Value,
        cond: ir.Value | None = None,
        zero: ir.Value | None = None,
        eps: ir.Value | None = None,
        **_: Any,
    ) -> Any:
        """One Softpick node with the reductions' axis and the added eps (0 without one); in the paper's form its
        -inf entries first become the dtype's lowest finite number (see the module docstring)."""
        parts = self._parts(x, m, total, cond, zero, eps if self.with_eps else None)
        assert not isinstance(parts, str)
        axis, value = parts
        if not self.masked:
            dtype = np.dtype(dtype_name(x))
            lowest = op.Constant(value=ir.tensor(np.array(np.finfo(dtype).min, dtype)))
            x = op.Where(op.IsInf(x, detect_positive=0, detect_negative=1), lowest, x)
        return op.Softpick(x, axis=axis, eps=float(value), _domain=self.domain())
