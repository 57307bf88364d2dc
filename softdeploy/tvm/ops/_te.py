"""TE helpers shared by the TIR computes: a vectorisable exp, row reductions along any axis.

``tir.exp`` lowers to ``llvm.exp.f32``, which LLVM scalarises into one libm call per lane on x86;
:func:`exp_f32` is Cephes' expf (Cody-Waite range reduction, degree-6 polynomial, 2^n built from the
exponent bits), made only of ops that vectorise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tvm import te, tirx

_LOG2E = 1.44269504088896341
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXPF_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# exp(x) < 2^-126 (the smallest normal float) below this: flushed to 0, as the C++ kernels do
_EXP_MIN = -87.33654475
# 2^n with n <= 127 covers x <= 88.0; above, the result is reported as +inf (the ops only take exp
# of x - max(x) <= 0, so that range is never reached through them)
_EXP_MAX = 88.0


def f32(value: float) -> Any:
    return tirx.const(value, "float32")


def exp_f32(x: Any) -> Any:
    """exp of a float32 TIR expression: relative error <= 2e-7 on [-87.3, 88]; NaN -> NaN,
    -inf -> 0, below -87.3 -> 0, above 88 -> +inf."""
    xc = tirx.max(tirx.min(x, f32(_EXP_MAX)), f32(_EXP_MIN))
    n = tirx.floor(xc * f32(_LOG2E) + f32(0.5))
    r = xc - n * f32(_LN2_HI) - n * f32(_LN2_LO)
    p = f32(_EXPF_POLY[0])
    for c in _EXPF_POLY[1:]:
        p = p * r + f32(c)
    p = p * r * r + r + f32(1.0)
    two_n = tirx.reinterpret("float32", (n.astype("int32") + 127) << 23)
    y = p * two_n
    y = tirx.Select(x < f32(_EXP_MIN), f32(0.0), y)
    y = tirx.Select(x > f32(_EXP_MAX), f32(float("inf")), y)
    return tirx.Select(tirx.isnan(x), x, y)  # NaN stays NaN (x != x would be simplified away)


def reduced_shape(shape: Sequence[Any], axis: int) -> list[Any]:
    return [s for d, s in enumerate(shape) if d != axis]


def with_axis(index: Sequence[Any], axis: int, k: Any) -> tuple[Any, ...]:
    """A full index from an index over the reduced shape and the position ``k`` along ``axis``."""
    return (*index[:axis], k, *index[axis:])


def without_axis(index: Sequence[Any], axis: int) -> tuple[Any, ...]:
    return (*index[:axis], *index[axis + 1 :])


def row_reduce(
    shape: Sequence[Any], axis: int, body: Callable[[tuple[Any, ...]], Any], reducer: Callable[..., Any], name: str
) -> te.Tensor:
    """``out[i] = reducer(body(index with k along axis) for k)`` over the shape without ``axis``."""
    k = te.reduce_axis((0, shape[axis]), name=f"{name}_k")
    return te.compute(reduced_shape(shape, axis), lambda *i: reducer(body(with_axis(i, axis, k)), axis=k), name=name)


def as_f32(x: te.Tensor) -> Callable[..., Any]:
    """Element access computing in float32 (float16 inputs are widened, as the kernels do)."""
    if x.dtype == "float32":
        return lambda *i: x(*i)
    return lambda *i: x(*i).astype("float32")
