"""TwoPassSoftmax as one TIR PrimFunc (equation: softdeploy/ops/two_pass_softmax.py).

    m = max_j x_j;  s = sum_j exp(x_j - m);  y_i = exp(x_i - m) / s     along ``axis``

Three loops over the row inside one kernel, with the same two exps per element as the C++ kernel
(whose (mantissa, exponent) accumulation saves the max loop; here the max loop is a vector max over
a row that is then re-read from cache). When ``axis`` is the last one and its length is a multiple
of :data:`LANES`, the two reductions are written lane-split -- ``part[r, l] = reduce_k x[r, k*LANES + l]``
then ``reduce_l part[r, l]`` -- so that :func:`schedule` can vectorise them without rfactor, and
MetaSchedule's search starts from reductions that vectorise.

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
from softdeploy.tvm.ops._te import as_f32, exp_f32, f32, row_reduce, without_axis

LANES = 16  # float32 lanes of an AVX-512 register
BLOCKS = ("row_max_part", "row_max", "row_sum_part", "row_sum", "softmax")


def _lane_split_reduce(rows: list[Any], n: Any, body: Any, reducer: Any, name: str) -> te.Tensor:
    """``out[r] = reducer_l reducer_k body(r, k * LANES + l)`` over rows ``r`` of a contiguous last axis."""
    k = te.reduce_axis((0, n // LANES), name=f"{name}_k")
    part = te.compute((*rows, LANES), lambda *i: reducer(body(i[:-1], k * LANES + i[-1]), axis=k), name=f"{name}_part")
    lane = te.reduce_axis((0, LANES), name=f"{name}_lane")
    return te.compute(tuple(rows), lambda *r: reducer(part(*r, lane), axis=lane), name=name)


def compute(x: te.Tensor, axis: int) -> te.Tensor:
    shape = list(x.shape)
    xf = as_f32(x)
    last = axis == len(shape) - 1
    n = shape[axis]
    if last and isinstance(n, tirx.IntImm) and int(n) > 0 and int(n) % LANES == 0:
        rows = shape[:-1]
        row_max = _lane_split_reduce(rows, n, lambda r, j: xf(*r, j), te.max, "row_max")
        row_sum = _lane_split_reduce(rows, n, lambda r, j: exp_f32(xf(*r, j) - row_max(*r)), te.sum, "row_sum")
    else:
        row_max = row_reduce(shape, axis, lambda i: xf(*i), te.max, "row_max")
        row_sum = row_reduce(
            shape, axis, lambda i: exp_f32(xf(*i) - row_max(*without_axis(i, axis))), te.sum, "row_sum"
        )

    def scale(*i: Any) -> Any:
        r = without_axis(i, axis)
        # times the reciprocal: 1 / s is loop-invariant, so LLVM hoists it out of the row (a / s is not)
        y = exp_f32(xf(*i) - row_max(*r)) * (f32(1.0) / row_sum(*r))
        y = tirx.Select(row_max(*r) == f32(float("inf")), f32(float("nan")), y)
        return y.astype(x.dtype)

    return te.compute(shape, scale, name="softmax")


def schedule(sch: Any) -> bool:
    """Rows in parallel, the lane loops vectorised, both reductions computed per row. Applies to
    the lane-split form only (returns False, leaving ``sch`` untouched, otherwise)."""
    try:
        blocks = {name: sch.get_sblock(name) for name in BLOCKS}
    except Exception:  # not the lane-split form (or not this op)
        return False
    out = blocks["softmax"]
    loops = sch.get_loops(out)
    rows = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    if len(loops) == 1:
        return False
    sch.parallel(rows)
    _, lanes = sch.split(sch.get_loops(out)[-1], [None, LANES])
    sch.vectorize(lanes)
    for name in ("row_sum", "row_max"):  # consumers before producers
        sch.compute_at(blocks[name], rows)
        part = blocks[f"{name}_part"]
        sch.compute_at(part, rows)
        lane, k = sch.get_loops(part)[-2:]
        sch.reorder(k, lane)
        # vectorise, then hoist the init out of the k loop (in the other order vectorize refuses the
        # loop; with the init left inside, the vector body carries a k == 0 branch)
        sch.vectorize(lane)
        sch.decompose_reduction(part, k)
    return True


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    x = inputs[0]
    rank = len(x.ty.shape)
    if rank == 0:
        raise OpContractError(f"{op.NAME}: input must have rank >= 1, got a scalar")
    axis = normalize_axis(op.NAME, int(attrs["axis"]), rank)
    return bb.emit_te(compute, x, axis, primfunc_name_hint="two_pass_softmax")
