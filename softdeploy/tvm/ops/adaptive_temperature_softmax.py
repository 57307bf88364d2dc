"""AdaptiveTemperatureSoftmax as one TIR PrimFunc (equation: softdeploy/ops/adaptive_temperature_softmax.py).

    p = softmax(x);  H = -sum p log(p + 1e-9);  beta = max(poly(H), 1) if H > 0.5 else 1
    Y = softmax(beta * x) = exp(beta (x - m)) / sum exp(beta (x - m))     along ``axis``

Five loops over the row inside one kernel: max; exp(x - m) into a row buffer and its sum; the
entropy sum; exp(beta (x - m)) into a second row buffer and its sum; the output (buffer times
1 / sum). The sums are accumulated in float64 (float32 over long rows moves H by ~1e-6, which beta's
slope and |x - m| turn into 1e-4 output error); beta (x - m) <= 0 needs no second max. Two exps and
one log per element (the vectorisable polynomials of ``_te``); beta is computed once per row. The
row buffers exist in the vector form only (``_te.row_stage``); otherwise each loop recomputes.
"""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from softdeploy.ops import adaptive_temperature_softmax as op
from softdeploy.tvm.ops._te import (
    REDUCTION,
    ROW,
    ROW_REDUCTION,
    SCALAR,
    as_f32,
    exp_nonpositive_f32,
    f32,
    lane_reduce,
    log_f32,
    row_stage,
    schedule_rows,
    shape_proxy,
    without_axis,
)

# per-row stages, consumers first (schedule_rows)
STAGES = [
    ("scaled_sum", ROW_REDUCTION),
    ("scaled_exp", ROW),
    ("beta", SCALAR),
    ("entropy", REDUCTION),
    ("row_sum", ROW_REDUCTION),
    ("row_exp", ROW),
    ("row_max", REDUCTION),
]
# Kept stored when the neighbours are inlined (softdeploy.tvm.ops.inline_neighbours): the per-row scalar
# (inlined, recomputed per element) and the row stages (stored once per row, so that later passes need
# not recompute an exp).
KEEP_BLOCKS = ("beta", "row_exp", "scaled_exp")


def compute(x: te.Tensor, axis: int) -> te.Tensor:
    """AdaptiveTemperatureSoftmax as a TE compute along ``axis``: row max, entropy of softmax(x), beta(H), then
    softmax(beta x), in float32."""
    shape = list(x.shape)
    xf = as_f32(x)

    def row(i: tuple[Any, ...]) -> tuple[Any, ...]:
        return without_axis(i, axis)

    m = lane_reduce(shape, axis, lambda i: xf(*i), te.max, "row_max")
    # the sums in float64 too: a lane adds n / 16 terms (16000 for a 256000 vocabulary), whose float32
    # rounding (~1e-5) would reach the output directly and, amplified by beta's slope, through H
    e = row_stage(shape, axis, lambda i: exp_nonpositive_f32(xf(*i) - m(*row(i))), "row_exp")
    s = lane_reduce(shape, axis, lambda i: e(*i), te.sum, "row_sum", dtype="float64")

    def plogp(i: tuple[Any, ...]) -> Any:
        p = e(*i) * (f32(1.0) / s(*row(i)).astype("float32"))
        return p * log_f32(p + f32(op.EPS))

    h_sum = lane_reduce(shape, axis, plogp, te.sum, "entropy", dtype="float64")

    def beta(*r: Any) -> Any:
        # in float64 (once per row): the polynomial's terms reach ~30 around H = 4 and cancel to
        # beta ~ 2, so float32 loses ~4e-6 of beta, which |x - m| ~ 40 turns into 1.6e-4 output error
        h = -h_sum(*r)
        poly = tirx.const(op.POLY[0], "float64")
        for c in op.POLY[1:]:
            poly = poly * h + tirx.const(c, "float64")
        one = tirx.const(1.0, "float64")
        return tirx.Select(h > tirx.const(op.ENTROPY_GATE, "float64"), tirx.max(poly, one), one).astype("float32")

    b = te.compute(m.shape, beta, name="beta")

    scaled = row_stage(shape, axis, lambda i: exp_nonpositive_f32(b(*row(i)) * (xf(*i) - m(*row(i)))), "scaled_exp")
    s2 = lane_reduce(shape, axis, lambda i: scaled(*i), te.sum, "scaled_sum", dtype="float64")

    def out(*i: Any) -> Any:
        r = row(i)
        y = scaled(*i) * (f32(1.0) / s2(*r).astype("float32"))
        return tirx.Select(m(*r) == f32(float("inf")), f32(float("nan")), y).astype(x.dtype)

    return te.compute(shape, out, name="adaptive_softmax")


def schedule(sch: Any) -> bool:
    """The hand schedule of the compute's row stages; False when ``sch`` is not this kernel."""
    return schedule_rows(sch, "adaptive_softmax", STAGES)


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Relax converter: checks the contract on the node's static shapes and emits the TE compute as one PrimFunc."""
    x = inputs[0]
    axis = op.validate(shape_proxy(x), int(attrs["axis"]))
    return bb.emit_te(compute, x, axis, primfunc_name_hint="adaptive_temperature_softmax")
