"""AdaptiveTemperatureSoftmax as one TIR PrimFunc (equation: softdeploy/ops/adaptive_temperature_softmax.py).

    p = softmax(x);  H = -sum p log(p + 1e-9);  beta = max(poly(H), 1) if H > 0.5 else 1
    Y = softmax(beta * x) = exp(beta (x - m)) / sum exp(beta (x - m))     along ``axis``

Four loops over the row inside one kernel: max, sum of exp(x - m), the entropy sum (accumulated in
float64: float32 over long rows moves H by ~1e-6, which beta's slope and |x - m| turn into 1e-4
output error), and the output with its own sum; beta (x - m) <= 0 needs no second max. exp and log
are the vectorisable polynomials of ``_te``.
"""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from softdeploy.ops import adaptive_temperature_softmax as op
from softdeploy.tvm.ops._te import as_f32, exp_f32, f32, lane_reduce, log_f32, schedule_rows, shape_proxy, without_axis

REDUCTIONS = ["scaled_sum", "entropy", "row_sum", "row_max"]  # consumers first


def compute(x: te.Tensor, axis: int) -> te.Tensor:
    shape = list(x.shape)
    xf = as_f32(x)

    def row(i: tuple[Any, ...]) -> tuple[Any, ...]:
        return without_axis(i, axis)

    m = lane_reduce(shape, axis, lambda i: xf(*i), te.max, "row_max")
    s = lane_reduce(shape, axis, lambda i: exp_f32(xf(*i) - m(*row(i))), te.sum, "row_sum")

    def plogp(i: tuple[Any, ...]) -> Any:
        p = exp_f32(xf(*i) - m(*row(i))) * (f32(1.0) / s(*row(i)))
        return p * log_f32(p + f32(op.EPS))

    h_sum = lane_reduce(shape, axis, plogp, te.sum, "entropy", dtype="float64")

    def beta(*r: Any) -> Any:
        h = (-h_sum(*r)).astype("float32")
        poly = f32(op.POLY[0])
        for c in op.POLY[1:]:
            poly = poly * h + f32(c)
        return tirx.Select(h > f32(op.ENTROPY_GATE), tirx.max(poly, f32(1.0)), f32(1.0))

    b = te.compute(m.shape, beta, name="beta")

    def scaled(i: tuple[Any, ...]) -> Any:
        return exp_f32(b(*row(i)) * (xf(*i) - m(*row(i))))

    s2 = lane_reduce(shape, axis, scaled, te.sum, "scaled_sum")

    def out(*i: Any) -> Any:
        r = row(i)
        y = scaled(i) * (f32(1.0) / s2(*r))
        return tirx.Select(m(*r) == f32(float("inf")), f32(float("nan")), y).astype(x.dtype)

    return te.compute(shape, out, name="adaptive_softmax")


def schedule(sch: Any) -> bool:
    return schedule_rows(sch, "adaptive_softmax", REDUCTIONS)


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    x = inputs[0]
    axis = op.validate(shape_proxy(x), int(attrs["axis"]))
    return bb.emit_te(compute, x, axis, primfunc_name_hint="adaptive_temperature_softmax")
