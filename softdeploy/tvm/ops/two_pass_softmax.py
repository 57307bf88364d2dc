"""TwoPassSoftmax as one TIR PrimFunc (equation: softdeploy/ops/two_pass_softmax.py).

    m = max_j x_j;  s = sum_j exp(x_j - m);  y_i = exp(x_i - m) / s     along ``axis``

Three loops over the row inside one kernel: MetaSchedule can rfactor and vectorise the two
reductions and fuse the scale loop. The C++ kernel's (mantissa, exponent) accumulation avoids the
max loop; here the max loop is a plain vector max over a row that is then re-read from cache, with
the same two exps per element. Special values follow ai.onnx.Softmax: a row holding +inf is NaN
(checked explicitly: exp(inf - inf) alone would leave the other entries at 0), NaN and all -inf
rows come out NaN from the arithmetic, -inf entries give exactly 0.
"""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from softdeploy.ops import two_pass_softmax as op
from softdeploy.ops._common import normalize_axis
from softdeploy.errors import OpContractError
from softdeploy.tvm.ops._te import as_f32, exp_f32, f32, row_reduce, without_axis


def compute(x: te.Tensor, axis: int) -> te.Tensor:
    shape = list(x.shape)
    xf = as_f32(x)
    row_max = row_reduce(shape, axis, lambda i: xf(*i), te.max, "row_max")
    row_sum = row_reduce(
        shape, axis, lambda i: exp_f32(xf(*i) - row_max(*without_axis(i, axis))), te.sum, "row_sum"
    )

    def scale(*i: Any) -> Any:
        r = without_axis(i, axis)
        y = exp_f32(xf(*i) - row_max(*r)) / row_sum(*r)
        y = tirx.Select(row_max(*r) == f32(float("inf")), f32(float("nan")), y)
        return y.astype(x.dtype)

    return te.compute(shape, scale, name="softmax")


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    x = inputs[0]
    rank = len(x.ty.shape)
    if rank == 0:
        raise OpContractError(f"{op.NAME}: input must have rank >= 1, got a scalar")
    axis = normalize_axis(op.NAME, int(attrs["axis"]), rank)
    return bb.emit_te(compute, x, axis, primfunc_name_hint="two_pass_softmax")
