"""Softpick as one TIR PrimFunc (equation and special values: softdeploy/ops/softpick.py).

    m = max over the finite x_j;  |e_j| = exp(max(z_j, 0) - m) * (1 - exp(-|z_j|))  (z = x where finite, else 0)
    y_i = z_i > 0 ? |e_i| / (sum_{finite j} |e_j| + eps) : 0;   NaN / +inf -> themselves;  no finite entry -> 0

The same cancellation-free |e_j| as the reference and the function body (no exp(-m), which would
overflow for very negative rows; 1 - exp(-a) by its series near 0). Three loops over the row inside
one kernel (finite max; |e_j| into a row buffer and its sum; output = that buffer times
1 / (sum + eps)), vectorised by :func:`schedule` in the vector form (elsewhere the output loop
recomputes |e_j|: ``_te.row_stage``).
"""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from softdeploy.ops import softpick as op
from softdeploy.tvm.ops._te import (
    REDUCTION,
    ROW,
    as_f32,
    exp_f32,
    f32,
    is_finite,
    lane_reduce,
    max_from_neg_inf,
    one_minus_exp_neg,
    row_stage,
    schedule_rows,
    shape_proxy,
    without_axis,
)

STAGES = [("row_sum", REDUCTION), ("magnitude", ROW), ("row_max", REDUCTION)]  # consumers first
_NEG_INF = float("-inf")


def compute(x: te.Tensor, axis: int, eps: float) -> te.Tensor:
    shape = list(x.shape)
    xf = as_f32(x)

    def finite(v: Any) -> Any:
        return is_finite(v)

    def z(*i: Any) -> Any:
        v = xf(*i)
        return tirx.Select(finite(v), v, f32(0.0))

    m = lane_reduce(
        shape, axis, lambda i: tirx.Select(finite(xf(*i)), xf(*i), f32(_NEG_INF)), max_from_neg_inf, "row_max"
    )

    def magnitude_of(i: tuple[Any, ...]) -> Any:
        r = without_axis(i, axis)
        m_safe = tirx.Select(m(*r) > f32(_NEG_INF), m(*r), f32(0.0))
        zi = z(*i)
        mag = exp_f32(tirx.max(zi, f32(0.0)) - m_safe) * one_minus_exp_neg(tirx.abs(zi))
        return tirx.Select(finite(xf(*i)), mag, f32(0.0))

    magnitude = row_stage(shape, axis, magnitude_of, "magnitude")
    d = lane_reduce(shape, axis, lambda i: magnitude(*i), te.sum, "row_sum")

    def out(*i: Any) -> Any:
        r = without_axis(i, axis)
        v = xf(*i)
        has_finite = m(*r) > f32(_NEG_INF)
        y = tirx.Select(z(*i) > f32(0.0), magnitude(*i) * (f32(1.0) / (d(*r) + f32(eps))), f32(0.0))
        y = tirx.Select(v < f32(float("inf")), y, v)  # NaN and +inf are passed through
        return tirx.Select(has_finite, y, f32(0.0)).astype(x.dtype)

    return te.compute(shape, out, name="softpick")


def schedule(sch: Any) -> bool:
    return schedule_rows(sch, "softpick", STAGES)


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    x = inputs[0]
    eps = float(attrs["eps"])
    axis = op.validate(shape_proxy(x), int(attrs["axis"]), eps)
    return bb.emit_te(compute, x, axis, eps, primfunc_name_hint="softpick")
