"""TwoPassSoftmax as one TIR PrimFunc (equation: softdeploy/ops/two_pass_softmax.py).

    m = max_j x_j;  s = sum_j exp(x_j - m);  y_i = exp(x_i - m) / s     along ``axis``

Three loops over the row inside one kernel: max, exp(x - m) stored in a row buffer while it is
summed, output = that buffer times 1 / sum. One exp per element, as the C++ kernel (the exp, not
memory, bounds rows that stay in cache); the max loop is a cheap vector max. (The online (max, sum)
recurrence would merge the first two loops, but TVM 0.27 miscompiles it vectorised: see
``_te.lane_reduce``.) When ``axis`` is the last one and its length is a multiple of LANES (the
vector form), the reductions are lane-split (``_te.lane_reduce``) and the exps a row stage
(``_te.row_stage``), so that :func:`schedule` vectorises them; otherwise each loop recomputes the exp.

Special values follow ai.onnx.Softmax: a row holding +inf is NaN (checked explicitly: exp(inf - inf)
alone would leave the other entries at 0), NaN and all -inf rows come out NaN from the arithmetic,
-inf entries give exactly 0.
"""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from softdeploy.errors import OpContractError
from softdeploy.ops import two_pass_softmax as op
from softdeploy.ops._common import normalize_axis
from softdeploy.tvm.ops._te import (
    REDUCTION,
    ROW,
    ROW_REDUCTION,
    as_f32,
    exp_nonpositive_f32,
    f32,
    lane_reduce,
    row_stage,
    schedule_rows,
    without_axis,
)

# per-row stages of softmax_of, consumers first (as schedule_rows wants them)
STAGES = [("row_sum", ROW_REDUCTION), ("row_exp", ROW), ("row_max", REDUCTION)]
# Kept stored when the neighbours are inlined (softdeploy.tvm.ops.inline_neighbours): the row stage, and the
# output, which the standard Softmax imports as (softdeploy/tvm/frontend.py): the elementwise ops after it
# (attention's where(isnan(p), 0, p)) are inlined into it, not it into them.
KEEP_BLOCKS = ("row_exp", "softmax")


def softmax_of(shape: list[Any], axis: int, z: Any, out_dtype: str, exp: Any = exp_nonpositive_f32) -> te.Tensor:
    """softmax along ``axis`` of the float32 values ``z(*index)`` (ai.onnx.Softmax special values);
    shared by the ops that are a softmax of transformed logits (block names: STAGES, "softmax")."""
    m = lane_reduce(shape, axis, lambda i: z(*i), te.max, "row_max")
    e = row_stage(shape, axis, lambda i: exp(z(*i) - m(*without_axis(i, axis))), "row_exp")
    s = lane_reduce(shape, axis, lambda i: e(*i), te.sum, "row_sum")

    def out(*i: Any) -> Any:
        r = without_axis(i, axis)
        # times the reciprocal: 1 / s is loop-invariant, so LLVM hoists it out of the row (a / s is not)
        y = e(*i) * (f32(1.0) / s(*r))
        return tirx.Select(m(*r) == f32(float("inf")), f32(float("nan")), y).astype(out_dtype)

    return te.compute(shape, out, name="softmax")


def compute(x: te.Tensor, axis: int) -> te.Tensor:
    """TwoPassSoftmax as a TE compute: softmax along ``axis`` in float32, returned in the input's type."""
    return softmax_of(list(x.shape), axis, as_f32(x), x.dtype)


def schedule(sch: Any) -> bool:
    """Rows in parallel, the reductions lane-vectorised per row, the output loop vectorised (vector
    form only)."""
    return schedule_rows(sch, "softmax", STAGES)


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Relax converter for TwoPassSoftmax: checks the rank and axis and emits one PrimFunc."""
    x = inputs[0]
    rank = len(x.ty.shape)
    if rank == 0:
        raise OpContractError(f"{op.NAME}: input must have rank >= 1, got a scalar")
    axis = normalize_axis(op.NAME, int(attrs["axis"]), rank)
    return bb.emit_te(compute, x, axis, primfunc_name_hint="two_pass_softmax")
