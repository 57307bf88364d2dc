"""Softpick as one TIR PrimFunc (equation and special values: softdeploy/ops/softpick.py).

    m = max of the finite x_j,   e_j = exp(x_j - m) - exp(-m)
    y_i = max(e_i, 0) / (sum_{finite j} |e_j| + eps)          along ``axis``

Evaluated as the C++ kernel does (ops/softpick.cc), without a cancelling difference: numerator and
denominator times e^(m - S) give

    y_i = [x_i > 0] * t_i / (sum_{finite j} |t_j| + eps * e^(m - S)),   t_j = e^(x_j - S) - c

with a per-row shift S and unit c: S = 0, c = 1 (t_j = expm1(x_j), from one range-reduced
polynomial as 2^n q + (2^n - 1): exact near x = 0) while m <= 72, which keeps every term below
e^72 (no float sum of fewer than 10^7 terms overflows); above, S = m, c = 0 (t_j = exp(x_j - m) <= 1),
dropping exp(-m) < 5.4e-32 of each term: an output it changes moves by less than that (the
denominator is >= 1 there), under the conformance atol of 1e-30. So one
expm1-like polynomial per element, against two exps and a series for exp(x - m) (1 - exp(-|x|)).

Three loops over the row inside one kernel (finite max; the terms into a row buffer and the sum of
their magnitudes; output = buffer times the row's reciprocal denominator), vectorised by
:func:`schedule` in the vector form (elsewhere the output loop recomputes the term:
``_te.row_stage``). Non-finite entries add nothing; -inf outputs 0, NaN and +inf pass through, a
row with no finite entry is all zeros, x <= 0 outputs exactly 0.
"""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from softdeploy.ops import softpick as op
from softdeploy.tvm.ops._te import (
    LN2_HI,
    LN2_LO,
    REDUCTION,
    ROW,
    ROW_REDUCTION,
    SCALAR,
    as_f32,
    exp_f32,
    f32,
    horner,
    is_finite,
    lane_reduce,
    max_from_neg_inf,
    pow2_f32,
    reduce_ln2,
    round_log2,
    row_stage,
    schedule_rows,
    shape_proxy,
    without_axis,
)

STAGES = [  # consumers first (schedule_rows)
    ("row_scale", SCALAR),
    ("row_sum", ROW_REDUCTION),
    ("term", ROW),
    ("row_unit", SCALAR),
    ("row_shift", SCALAR),
    ("row_max", REDUCTION),
]
_NEG_INF = float("-inf")
_SHIFT_ABOVE = 72.0  # m above this: S = m (terms exp(x - m)); at or below: S = 0 (terms expm1(x))
_MIN_ARG = -104.0  # e^(x - S) is 0 in float32 below this (2^n < 2^-150)
# expm1(t) = t + t^2 (q0 + t (q1 + t (q2 + t (q3 + t q4)))) on |t| <= 0.4, relative error 1.0e-7: the
# C++ kernel's coefficients (ops/softpick.cc kQ0..kQ4), fitted for expm1 so that small t stays exact
_EXPM1_Q = tuple(
    float.fromhex(c) for c in ("0x1.6bddfep-10", "0x1.1283d6p-7", "0x1.55575p-5", "0x1.55543p-3", "0x1.fffffep-2")
)
# Kept stored when the neighbours are inlined (softdeploy.tvm.ops.inline_neighbours): the per-row scalars
# and the row stage (stored once per row, so that later passes need not recompute an exp).
KEEP_BLOCKS = ("term", "row_shift", "row_unit", "row_scale")


def _term(w: Any, unit: Any) -> Any:
    """e^w - unit for finite w <= 72 (unit 1: expm1(w), exact near 0; unit 0: e^w)."""
    wc = tirx.max(w, f32(_MIN_ARG))
    n = round_log2(wc)
    t = reduce_ln2(wc, n, LN2_HI, LN2_LO)  # exact split for |n| < 2^15, i.e. |w| < 22000
    q = (t * t) * horner(t, _EXPM1_Q) + t  # e^t - 1
    s = pow2_f32(n)  # 2^n, 0 below 2^-126
    return s * q + (s - unit)  # 2^n e^t - unit


def compute(x: te.Tensor, axis: int, eps: float) -> te.Tensor:
    """Softpick as a TE compute along ``axis``: finite max, the rectified terms and their absolute sum, then the
    quotient, in float32."""
    shape = list(x.shape)
    xf = as_f32(x)

    def row(i: tuple[Any, ...]) -> tuple[Any, ...]:
        return without_axis(i, axis)

    m = lane_reduce(
        shape, axis, lambda i: tirx.Select(is_finite(xf(*i)), xf(*i), f32(_NEG_INF)), max_from_neg_inf, "row_max"
    )

    def shifted(*r: Any) -> Any:
        return m(*r) > f32(_SHIFT_ABOVE)

    shift = te.compute(m.shape, lambda *r: tirx.Select(shifted(*r), m(*r), f32(0.0)), name="row_shift")
    unit = te.compute(m.shape, lambda *r: tirx.Select(shifted(*r), f32(0.0), f32(1.0)), name="row_unit")

    def term_of(i: tuple[Any, ...]) -> Any:
        v = xf(*i)
        finite = is_finite(v)
        w = tirx.Select(finite, v, f32(0.0)) - shift(*row(i))
        return tirx.Select(finite, _term(w, unit(*row(i))), f32(0.0))

    term = row_stage(shape, axis, term_of, "term")
    total = lane_reduce(shape, axis, lambda i: tirx.abs(term(*i)), te.sum, "row_sum")
    # 1 / (T + eps e^(m - S)); m - S <= 72, and e^(m - S) -> 0 for very negative m
    scale = te.compute(
        m.shape, lambda *r: f32(1.0) / (total(*r) + f32(eps) * exp_f32(m(*r) - shift(*r))), name="row_scale"
    )

    def out(*i: Any) -> Any:
        r = row(i)
        v = xf(*i)
        y = tirx.Select(v > f32(0.0), term(*i) * scale(*r), f32(0.0))
        y = tirx.Select(v < f32(float("inf")), y, v)  # NaN and +inf are passed through
        return tirx.Select(m(*r) > f32(_NEG_INF), y, f32(0.0)).astype(x.dtype)

    return te.compute(shape, out, name="softpick")


def schedule(sch: Any) -> bool:
    """The hand schedule of Softpick's row stages; False when ``sch`` is not this kernel."""
    return schedule_rows(sch, "softpick", STAGES)


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Relax converter for Softpick: checks axis and eps and emits one PrimFunc."""
    x = inputs[0]
    eps = float(attrs["eps"])
    axis = op.validate(shape_proxy(x), int(attrs["axis"]), eps)
    return bb.emit_te(compute, x, axis, eps, primfunc_name_hint="softpick")
