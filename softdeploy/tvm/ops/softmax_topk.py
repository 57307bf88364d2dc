"""SoftmaxTopK on TVM (equation, ranking rule and special values: softdeploy/ops/softmax_topk.py).

    z = x / T;  m = max z;  d = sum_j exp(z_j - m)
    Indices = the k positions of the largest x (NaN, +inf, finite descending, -inf; ties: lower index)
    Values_i = exp(z_Indices_i - m) / d;   LogSumExp = m + log d        along ``axis``

Several kernels, not one. The ranking key is the float's order as an int32 -- NaN above +inf above
every finite value above -inf, -0 equal to +0 -- because TVM's float TopK ranks -inf above finite
values (which is why the function body cannot be used).

Along the last axis (the usual case: vocabulary rows) four kernels:
  1. :func:`block_max` -- per 256-element block, each of the 16 lanes' maximum (a vectorised max);
  2. :func:`select_top_k` -- a written-scheduled scan keeping the k best (key, index) in a sorted
     list, reading only the lanes whose maximum reaches a floor (the k-th largest lane maximum);
  3. :func:`row_sums` -- d, with m taken from the selection's top (no max pass);
  4. :func:`values_and_lse` -- the k probabilities and the log-sum-exp.
Along another axis: the int32 key (:func:`rank_key`) through TVM's TopK (exact: its int32 TopK keeps
lower indices first among equal keys; a full sort), then 3 and 4.

The C++ kernel's single read per row (the selection fused into the normaliser pass) is not written
as TIR: its data-dependent insertion per element does not vectorise there, so the selection reads
lane maxima and the sums are a pass of their own (bench/results/tvm_ops.md).
"""

from __future__ import annotations

from typing import Any

from tvm import relax, te, tirx
from tvm.script import tirx as T

from softdeploy.ops import softmax_topk as op
from softdeploy.tvm.ops._te import (
    LANES,
    REDUCTION,
    SCALAR,
    as_f32,
    exp_nonpositive_f32,
    f32,
    is_finite,
    lane_reduce,
    max_from_neg_inf,
    not_nan,
    reduced_shape,
    schedule_rows,
    shape_proxy,
    without_axis,
)

_INT32_MAX = 2147483647


def rank_key(x: te.Tensor) -> te.Tensor:
    """int32 keys whose order is the ranking rule's (see the module docstring)."""
    xf = as_f32(x)

    def key(*i: Any) -> Any:
        v = xf(*i)
        return tirx.Select(not_nan(v), _ordered_bits(v), tirx.const(_INT32_MAX, "int32"))

    return te.compute(x.shape, key, name="rank_key")


STAGES = [("d", REDUCTION), ("row_shift", SCALAR)]  # the sums kernel's per-row stages (schedule_rows)


def _top(x: Any, indices: te.Tensor, axis: int, r: tuple[Any, ...]) -> Any:
    """x at the row's first index, as float32: the row's top under the ranking rule -- NaN if the row
    has one, else +inf if it has one, else its max (-inf if that is all it holds)."""
    zero = tirx.const(0, indices.dtype)
    return x(*r[:axis], indices(*r[:axis], zero, *r[axis:]).astype("int32"), *r[axis:])


def row_sums(x: te.Tensor, indices: te.Tensor, axis: int, temperature: float) -> te.Tensor:
    """float64 ``[rows...]``: d = sum_j exp(z_j - m), z = x / T, m = the row's top / T (the max: no
    pass of its own, the selection found it). Only meaningful for the ordinary rows (top finite);
    the special rows' outputs do not read it, so the exp's argument is clamped to <= 0 and the
    shorter ``exp_nonpositive_f32`` applies. Lane-split (``_te.lane_reduce``), vectorised by
    :func:`schedule`."""
    shape = list(x.shape)
    xf = as_f32(x)
    t = f32(float(temperature))  # divided, not multiplied by 1 / T: the reference's z = x / T

    def row_shift(*r: Any) -> Any:
        top = _top(xf, indices, axis, r)
        return tirx.Select(is_finite(top), top / t, f32(0.0))

    shift = te.compute(reduced_shape(shape, axis), row_shift, name="row_shift")  # once per row

    def shifted(i: tuple[Any, ...]) -> Any:
        return tirx.min(xf(*i) / t - shift(*without_axis(i, axis)), f32(0.0))

    d = lane_reduce(shape, axis, lambda i: exp_nonpositive_f32(shifted(i)), te.sum, "d", dtype="float64")
    return te.compute(reduced_shape(shape, axis), lambda *r: d(*r), name="row_sums")


def schedule(sch: Any) -> bool:
    """The sums kernel: rows in parallel, the reduction lane-vectorised per row (vector form only);
    the block maxima: lanes vectorised."""
    return schedule_rows(sch, "row_sums", STAGES, vector_out=False) or _schedule_block_max(sch)


def values_and_lse(x: te.Tensor, indices: te.Tensor, sums: te.Tensor, axis: int, temperature: float) -> list[te.Tensor]:
    """Values (the probabilities at ``indices``) and LogSumExp (axis kept as size 1), with the
    reference's special rows, told by the row's top: NaN -> values and log-sum-exp NaN; +inf ->
    values NaN, log-sum-exp +inf; -inf (only -inf in the row) -> values NaN, log-sum-exp -inf."""
    shape = list(x.shape)
    xf = as_f32(x)
    t = f32(float(temperature))

    def value(*i: Any) -> Any:
        r = without_axis(i, axis)
        top = _top(xf, indices, axis, r)
        src = (*i[:axis], indices(*i).astype("int32"), *i[axis + 1 :])
        p = exp_nonpositive_f32(tirx.min(xf(*src) / t - top / t, f32(0.0))) / sums(*r).astype("float32")
        return tirx.Select(is_finite(top), p, f32(float("nan"))).astype(x.dtype)

    k = indices.shape[axis]
    values = te.compute([*shape[:axis], k, *shape[axis + 1 :]], value, name="values")

    def lse(*i: Any) -> Any:
        r = without_axis(i, axis)
        top = _top(xf, indices, axis, r)
        y = top / t + tirx.log(sums(*r)).astype("float32")
        return tirx.Select(is_finite(top), y, top).astype(x.dtype)  # NaN, +inf, -inf: themselves

    return [values, te.compute([*shape[:axis], 1, *shape[axis + 1 :]], lse, name="log_sum_exp")]


BLOCK = 256  # elements per block of the selection's pre-filter: LANES lanes x 16 vectors


def block_max(x: te.Tensor) -> te.Tensor:
    """int32 ``[rows..., n // BLOCK, LANES]``: per block of BLOCK elements along the last axis, the
    ranking key of each lane's largest value (j = b * BLOCK + q * LANES + l, max over q), NaN counted
    as +inf: a vertical float max that vectorises (3 vector ops per 16 elements, against ~10 for a
    max over int32 keys), so that the selection can skip a lane with one compare. A lane holding a
    NaN or +inf gets the key of +inf (a lower bound of its top key) and is never skipped."""
    *lead, n = (int(d) for d in x.shape)
    xf = as_f32(x)
    q = te.reduce_axis((0, BLOCK // LANES), name="q")

    def value(*i: Any) -> Any:
        v = xf(*i[:-2], i[-2] * BLOCK + q * LANES + i[-1])
        return max_from_neg_inf(tirx.Select(not_nan(v), v, f32(float("inf"))), axis=q)

    lane_max = te.compute((*lead, n // BLOCK, LANES), value, name="block_max_value")
    return te.compute(lane_max.shape, lambda *i: _ordered_bits(lane_max(*i)), name="block_max")


def _schedule_block_max(sch: Any) -> bool:
    try:
        block, values = sch.get_sblock("block_max"), sch.get_sblock("block_max_value")
    except Exception:  # not this kernel
        return False
    *outer, lane = sch.get_loops(block)
    rows = sch.fuse(*outer[:-1]) if len(outer) > 2 else outer[0]
    sch.parallel(rows)
    sch.vectorize(lane)
    sch.compute_at(values, sch.get_loops(block)[-2])
    lane_v, q = sch.get_loops(values)[-2:]
    sch.reorder(q, lane_v)
    sch.vectorize(lane_v)
    sch.decompose_reduction(values, q)
    return True


def _ordered_bits(v: Any) -> Any:
    """The int32 ranking key of a float32 expression that is not NaN: its bits, negatives with the
    magnitude bits flipped (a larger magnitude, a smaller key); -0 as +0."""
    bits = tirx.reinterpret("int32", tirx.Select(v == f32(0.0), f32(0.0), v))
    return tirx.Select(bits < 0, bits ^ tirx.const(_INT32_MAX, "int32"), bits)


def select_top_k(shape: list[int], k: int, dtype: str) -> Any:
    """PrimFunc ``(x[..., n], block_max[..., n // BLOCK, LANES], indices[..., k])``: per row of the
    last axis, the positions of the k largest x under the ranking rule, by one scan that keeps a
    sorted list of the k best (key, index). A candidate enters only if it ranks above the k-th; a
    lane of a block (16 elements) is read only when its maximum (:func:`block_max`) can -- past the
    first blocks of a vocabulary row that is rare, so the scan costs about one scalar compare per 16
    elements. Lanes visit indices out of order, so ties are ranked by index explicitly."""
    n, rows = shape[-1], 1
    for d in shape[:-1]:
        rows *= d
    blocks = n // BLOCK
    x_shape, max_shape, out_shape = tuple(shape), (*shape[:-1], blocks, LANES), (*shape[:-1], k)

    @T.macro
    def offer(x: Any, kept: Any, indices: Any, count: Any, pos: Any, floor: Any, r: Any, j: Any) -> None:
        # the candidate x[r, j] enters the sorted list if it reaches the floor and ranks above the k-th:
        # a larger key, or an equal key at a lower index (candidates do not arrive in index order)
        v = T.Cast("float32", x[r, j])
        key = T.Select(T.isnan(v), _INT32_MAX, _ordered_bits(v))
        if key >= floor[0] and (
            count[0] < k or key > kept[k - 1] or (key == kept[k - 1] and T.int64(j) < indices[r, k - 1])
        ):
            pos[0] = T.min(count[0], k - 1)
            while pos[0] > 0 and (
                kept[pos[0] - 1] < key or (kept[pos[0] - 1] == key and indices[r, pos[0] - 1] > T.int64(j))
            ):
                kept[pos[0]] = kept[pos[0] - 1]
                indices[r, pos[0]] = indices[r, pos[0] - 1]
                pos[0] = pos[0] - 1
            kept[pos[0]] = key
            indices[r, pos[0]] = T.int64(j)
            count[0] = T.min(count[0] + 1, k)

    @T.prim_func(private=True, s_tir=True)
    def softmax_topk_select(
        x_nd: T.Buffer(x_shape, dtype), max_nd: T.Buffer(max_shape, "int32"), out_nd: T.Buffer(out_shape, "int64")
    ):
        # written scheduled (one opaque block per row): no schedule rule or tuning applies to it
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        x = T.decl_buffer((rows, n), dtype, data=x_nd.data)  # the rows, flattened in place
        lane_key = T.decl_buffer((rows, blocks * LANES), "int32", data=max_nd.data)
        indices = T.decl_buffer((rows, k), "int64", data=out_nd.data)
        with T.sblock("root"):
            for r in T.parallel(rows):
                with T.sblock("select"):
                    T.reads(x[r, 0:n], lane_key[r, 0 : blocks * LANES])
                    T.writes(indices[r, 0:k])
                    kept = T.alloc_buffer((k,), "int32", scope="local")
                    count = T.alloc_buffer((1,), "int32", scope="local")
                    pos = T.alloc_buffer((1,), "int32", scope="local")
                    floor = T.alloc_buffer((1,), "int32", scope="local")
                    # The floor: the k-th largest lane maximum. At least k elements (those maxima) reach
                    # it, so no element below it is among the k largest, nor is any lane whose maximum
                    # is below it. Found by the same sorted-list insertion over the lane maxima.
                    count[0] = 0
                    floor[0] = T.int32(-2147483648)
                    if blocks * LANES >= k:
                        for i in range(blocks * LANES):
                            v = lane_key[r, i]
                            if count[0] < k or v > kept[k - 1]:
                                pos[0] = T.min(count[0], k - 1)
                                while pos[0] > 0 and kept[pos[0] - 1] < v:
                                    kept[pos[0]] = kept[pos[0] - 1]
                                    pos[0] = pos[0] - 1
                                kept[pos[0]] = v
                                count[0] = T.min(count[0] + 1, k)
                        floor[0] = kept[k - 1]
                    count[0] = 0
                    for b in range(blocks):  # lane by lane: only lanes whose maximum reaches the floor
                        for lane in range(LANES):
                            # (a lane holding a NaN or +inf has key(+inf): it reaches any floor but one of
                            # k such lanes, and then equals it)
                            if lane_key[r, b * LANES + lane] >= floor[0]:
                                for q in range(BLOCK // LANES):
                                    offer(x, kept, indices, count, pos, floor, r, b * BLOCK + q * LANES + lane)
                    for j in range(blocks * BLOCK, n):  # the tail
                        offer(x, kept, indices, count, pos, floor, r, j)

    return softmax_topk_select


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    x = inputs[0]
    k, temperature = int(attrs["k"]), float(attrs["temperature"])
    axis = op.validate(shape_proxy(x), k, int(attrs["axis"]), temperature)
    shape = [int(d) for d in x.ty.shape]
    if axis == len(shape) - 1:  # rows along the contiguous axis: the one-scan selection
        maxima = bb.emit_te(block_max, x, primfunc_name_hint="softmax_topk_block_max")
        func = bb.add_func(select_top_k(shape, k, str(x.ty.dtype)), "softmax_topk_select")
        out_type = relax.TensorType([*shape[:-1], k], "int64")
        indices = bb.emit(relax.call_tir(func, relax.Tuple([x, maxima]), out_type))
    else:  # TVM's TopK on the int32 key (its float TopK misranks -inf)
        key = bb.emit_te(rank_key, x, primfunc_name_hint="softmax_topk_key")
        top = bb.emit(relax.op.topk(key, k, axis=axis, ret_type="both", largest=True, dtype="int64"))
        indices = bb.emit(relax.TupleGetItem(top, 1))
    sums = bb.emit_te(row_sums, x, indices, axis, temperature, primfunc_name_hint="softmax_topk_sums")
    out = bb.emit_te(values_and_lse, x, indices, sums, axis, temperature, primfunc_name_hint="softmax_topk_values")
    return relax.Tuple([bb.emit(relax.TupleGetItem(out, 0)), indices, bb.emit(relax.TupleGetItem(out, 1))])
