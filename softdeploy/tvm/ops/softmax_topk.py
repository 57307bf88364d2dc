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

from softdeploy.ops import softmax_topk as op
from softdeploy.tvm.ops._te import as_f32, exp_f32, f32, is_finite, max_from_neg_inf, not_nan, row_reduce, shape_proxy

_INT32_MAX = 2147483647


def rank_key(x: te.Tensor) -> te.Tensor:
    """int32 keys whose order is the ranking rule's (see the module docstring)."""
    xf = as_f32(x)

    def key(*i: Any) -> Any:
        v = xf(*i)
        bits = tirx.reinterpret("int32", tirx.Select(v == f32(0.0), f32(0.0), v))  # -0 -> +0
        ordered = tirx.Select(bits < 0, bits ^ tirx.const(_INT32_MAX, "int32"), bits)  # negatives: larger magnitude, smaller key
        return tirx.Select(not_nan(v), ordered, tirx.const(_INT32_MAX, "int32"))

    return te.compute(x.shape, key, name="rank_key")


def values_and_lse(x: te.Tensor, indices: te.Tensor, axis: int, temperature: float) -> list[te.Tensor]:
    """Values (the probabilities at ``indices``) and LogSumExp (axis kept as size 1), with the
    reference's special rows: a NaN or +inf anywhere, or only -inf, makes the values NaN and the
    log-sum-exp NaN, +inf or -inf."""
    shape = list(x.shape)
    xf = as_f32(x)
    t = f32(float(temperature))  # divided, not multiplied by 1 / T: the reference's z = x / T

    def z(i: tuple[Any, ...]) -> Any:
        return xf(*i) / t

    def flag(test: Any) -> Any:
        return tirx.Select(test, f32(1.0), f32(0.0))

    m = row_reduce(shape, axis, lambda i: tirx.Select(not_nan(z(i)), z(i), f32(float("-inf"))), max_from_neg_inf, "m")
    has_nan = row_reduce(
        shape, axis, lambda i: tirx.Select(not_nan(z(i)), f32(0.0), f32(1.0)), te.max, "has_nan"
    )
    has_posinf = row_reduce(shape, axis, lambda i: flag(z(i) == f32(float("inf"))), te.max, "has_posinf")

    def finite_m(*r: Any) -> Any:
        return tirx.Select(is_finite(m(*r)), m(*r), f32(0.0))

    d = row_reduce(
        shape,
        axis,
        lambda i: exp_f32(z(i) - finite_m(*(i[:axis] + i[axis + 1 :]))).astype("float64"),
        te.sum,
        "d",
    )

    def special(*r: Any) -> Any:
        return tirx.Or(
            tirx.Or(has_nan(*r) > f32(0.0), has_posinf(*r) > f32(0.0)), m(*r) == f32(float("-inf"))
        )

    def value(*i: Any) -> Any:
        r = i[:axis] + i[axis + 1 :]
        src = (*i[:axis], indices(*i).astype("int32"), *i[axis + 1 :])
        p = exp_f32(z(src) - finite_m(*r)) / d(*r).astype("float32")
        return tirx.Select(special(*r), f32(float("nan")), p).astype(x.dtype)

    k = indices.shape[axis]
    out_shape = [*shape[:axis], k, *shape[axis + 1 :]]
    values = te.compute(out_shape, value, name="values")

    def lse(*i: Any) -> Any:
        r = i[:axis] + i[axis + 1 :]
        finite = finite_m(*r) + tirx.log(d(*r)).astype("float32")
        y = tirx.Select(m(*r) == f32(float("-inf")), f32(float("-inf")), finite)
        y = tirx.Select(has_posinf(*r) > f32(0.0), f32(float("inf")), y)
        y = tirx.Select(has_nan(*r) > f32(0.0), f32(float("nan")), y)
        return y.astype(x.dtype)

    lse_shape = [*shape[:axis], 1, *shape[axis + 1 :]]
    return [values, te.compute(lse_shape, lse, name="log_sum_exp")]


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    x = inputs[0]
    k, temperature = int(attrs["k"]), float(attrs["temperature"])
    axis = op.validate(shape_proxy(x), k, int(attrs["axis"]), temperature)
    key = bb.emit_te(rank_key, x, primfunc_name_hint="softmax_topk_key")
    top = bb.emit(relax.op.topk(key, k, axis=axis, ret_type="both", largest=True, dtype="int64"))
    indices = bb.emit(relax.TupleGetItem(top, 1))
    out = bb.emit_te(values_and_lse, x, indices, axis, temperature, primfunc_name_hint="softmax_topk_values")
    return relax.Tuple([bb.emit(relax.TupleGetItem(out, 0)), indices, bb.emit(relax.TupleGetItem(out, 1))])
