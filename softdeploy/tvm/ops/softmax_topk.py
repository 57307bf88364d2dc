"""SoftmaxTopK on TVM (equation, ranking rule and special values: softdeploy/ops/softmax_topk.py).

    z = x / T;  m = max z;  d = sum_j exp(z_j - m)
    Indices = the k positions of the largest x (NaN, +inf, finite descending, -inf; ties: lower index)
    Values_i = exp(z_Indices_i - m) / d;   LogSumExp = m + log d        along ``axis``

Three kernels, not one: the ranking key (TIR), TVM's TopK (an extern sort) and the values with the
log-sum-exp (TIR). The key is the float's order as an int32 -- NaN above +inf above every finite
value above -inf, -0 equal to +0 -- because TVM's float TopK ranks -inf above finite values (which is
why the function body cannot be used), while its int32 TopK orders exactly and keeps lower indices
first among equal keys. A size-k selection fused into the normaliser pass (the C++ kernel's one read
per row) is not written as TIR: a data-dependent insertion per element does not vectorise there.
"""

from __future__ import annotations

from typing import Any

from tvm import relax, te, tirx
from tvm.script import tirx as T

from softdeploy.ops import softmax_topk as op
from softdeploy.tvm.ops._te import (
    REDUCTION,
    as_f32,
    exp_f32,
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
        bits = tirx.reinterpret("int32", tirx.Select(v == f32(0.0), f32(0.0), v))  # -0 -> +0
        ordered = tirx.Select(
            bits < 0, bits ^ tirx.const(_INT32_MAX, "int32"), bits
        )  # negatives: larger magnitude, smaller key
        return tirx.Select(not_nan(v), ordered, tirx.const(_INT32_MAX, "int32"))

    return te.compute(x.shape, key, name="rank_key")


# per-row statistics of row_stats, in this order along its last axis
_MAX, _SUM = range(2)
STAGES = [("d", REDUCTION), ("m", REDUCTION)]  # consumers first (schedule_rows)


def row_stats(x: te.Tensor, axis: int, temperature: float) -> te.Tensor:
    """float64 ``[rows..., 2]``: per row of z = x / T the max m over non-NaN entries and
    d = sum exp(z - m') with m' = m where finite, else 0 (the reference's shift). The special rows
    need no pass of their own: a +inf makes m = +inf, only -inf makes m = -inf, and a NaN makes d
    NaN (the exp passes NaN through). Lane-split reductions (``_te.lane_reduce``), vectorised by
    :func:`schedule`."""
    shape = list(x.shape)
    xf = as_f32(x)
    t = f32(float(temperature))  # divided, not multiplied by 1 / T: the reference's z = x / T

    def z(i: tuple[Any, ...]) -> Any:
        return xf(*i) / t

    m = lane_reduce(shape, axis, lambda i: tirx.Select(not_nan(z(i)), z(i), f32(float("-inf"))), max_from_neg_inf, "m")

    def finite_m(r: tuple[Any, ...]) -> Any:
        return tirx.Select(is_finite(m(*r)), m(*r), f32(0.0))

    d = lane_reduce(
        shape, axis, lambda i: exp_f32(z(i) - finite_m(without_axis(i, axis))), te.sum, "d", dtype="float64"
    )

    def stat(*i: Any) -> Any:
        r, c = i[:-1], i[-1]
        return tirx.Select(c == _MAX, m(*r).astype("float64"), d(*r))

    return te.compute((*reduced_shape(shape, axis), 2), stat, name="row_stats")


def schedule(sch: Any) -> bool:
    """Rows in parallel, the two reductions lane-vectorised per row (vector form only)."""
    return schedule_rows(sch, "row_stats", STAGES, vector_out=False)


def values_and_lse(
    x: te.Tensor, indices: te.Tensor, stats: te.Tensor, axis: int, temperature: float
) -> list[te.Tensor]:
    """Values (the probabilities at ``indices``) and LogSumExp (axis kept as size 1), with the
    reference's special rows: a NaN anywhere makes the values and the log-sum-exp NaN; else a +inf
    makes the values NaN and the log-sum-exp +inf; only -inf: NaN values, log-sum-exp -inf."""
    shape = list(x.shape)
    xf = as_f32(x)
    t = f32(float(temperature))

    def m(*r: Any) -> Any:
        return stats(*r, _MAX).astype("float32")

    def d(*r: Any) -> Any:
        return stats(*r, _SUM)

    def finite_m(*r: Any) -> Any:
        return tirx.Select(is_finite(m(*r)), m(*r), f32(0.0))

    def value(*i: Any) -> Any:
        r = without_axis(i, axis)
        src = (*i[:axis], indices(*i).astype("int32"), *i[axis + 1 :])
        p = exp_f32(xf(*src) / t - finite_m(*r)) / d(*r).astype("float32")
        special = tirx.Or(tirx.Select(not_nan(d(*r)), False, True), tirx.abs(m(*r)) == f32(float("inf")))
        return tirx.Select(special, f32(float("nan")), p).astype(x.dtype)

    k = indices.shape[axis]
    values = te.compute([*shape[:axis], k, *shape[axis + 1 :]], value, name="values")

    def lse(*i: Any) -> Any:
        r = without_axis(i, axis)
        y = finite_m(*r) + tirx.log(d(*r)).astype("float32")
        y = tirx.Select(tirx.abs(m(*r)) == f32(float("inf")), m(*r), y)
        return tirx.Select(not_nan(d(*r)), y, f32(float("nan"))).astype(x.dtype)

    return [values, te.compute([*shape[:axis], 1, *shape[axis + 1 :]], lse, name="log_sum_exp")]


def select_top_k(shape: list[int], k: int, dtype: str) -> Any:
    """PrimFunc ``(x[..., n], indices[..., k])``: per row of the last axis, the positions of the k largest x under
    the ranking rule, by one scan that keeps a sorted list of the k best keys (an arriving key
    enters only if it beats the k-th: after the first rows of a vocabulary that is rare, so the scan
    is one compare per element, ~1 ns scalar). Equal keys keep index order: a key is inserted after
    every kept key >= it."""
    int32_max = 2147483647
    n, rows = shape[-1], 1
    for d in shape[:-1]:
        rows *= d
    x_shape, out_shape = tuple(shape), (*shape[:-1], k)

    @T.prim_func(private=True, s_tir=True)
    def softmax_topk_select(x_nd: T.Buffer(x_shape, dtype), out_nd: T.Buffer(out_shape, "int64")):
        # written scheduled (one opaque block per row): no schedule rule or tuning applies to it
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        x = T.decl_buffer((rows, n), dtype, data=x_nd.data)  # the rows, flattened in place
        indices = T.decl_buffer((rows, k), "int64", data=out_nd.data)
        with T.sblock("root"):
            for r in T.parallel(rows):
                with T.sblock("select"):
                    T.reads(x[r, 0:n])
                    T.writes(indices[r, 0:k])
                    kept = T.alloc_buffer((k,), "int32", scope="local")
                    count = T.alloc_buffer((1,), "int32", scope="local")
                    pos = T.alloc_buffer((1,), "int32", scope="local")
                    count[0] = 0
                    for j in range(n):
                        v = T.Cast("float32", x[r, j])
                        bits = T.reinterpret("int32", T.Select(v == T.float32(0), T.float32(0), v))  # -0 -> +0
                        ordered = T.Select(bits < 0, T.bitwise_xor(bits, int32_max), bits)
                        key = T.Select(T.isnan(v), int32_max, ordered)
                        if count[0] < k or key > kept[k - 1]:
                            pos[0] = T.min(count[0], k - 1)
                            while pos[0] > 0 and kept[pos[0] - 1] < key:
                                kept[pos[0]] = kept[pos[0] - 1]
                                indices[r, pos[0]] = indices[r, pos[0] - 1]
                                pos[0] = pos[0] - 1
                            kept[pos[0]] = key
                            indices[r, pos[0]] = T.int64(j)
                            count[0] = T.min(count[0] + 1, k)

    return softmax_topk_select


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    x = inputs[0]
    k, temperature = int(attrs["k"]), float(attrs["temperature"])
    axis = op.validate(shape_proxy(x), k, int(attrs["axis"]), temperature)
    shape = [int(d) for d in x.ty.shape]
    if axis == len(shape) - 1:  # rows along the contiguous axis: the one-scan selection
        func = bb.add_func(select_top_k(shape, k, str(x.ty.dtype)), "softmax_topk_select")
        out_type = relax.TensorType([*shape[:-1], k], "int64")
        indices = bb.emit(relax.call_tir(func, relax.Tuple([x]), out_type))
    else:  # TVM's TopK on the int32 key (its float TopK misranks -inf)
        key = bb.emit_te(rank_key, x, primfunc_name_hint="softmax_topk_key")
        top = bb.emit(relax.op.topk(key, k, axis=axis, ret_type="both", largest=True, dtype="int64"))
        indices = bb.emit(relax.TupleGetItem(top, 1))
    stats = bb.emit_te(row_stats, x, axis, temperature, primfunc_name_hint="softmax_topk_stats")
    out = bb.emit_te(values_and_lse, x, indices, stats, axis, temperature, primfunc_name_hint="softmax_topk_values")
    return relax.Tuple([bb.emit(relax.TupleGetItem(out, 0)), indices, bb.emit(relax.TupleGetItem(out, 1))])
