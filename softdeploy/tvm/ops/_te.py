"""TE helpers shared by the TIR computes: a vectorisable exp, row reductions along any axis.

``tir.exp`` lowers to ``llvm.exp.f32``, which LLVM scalarises into one libm call per lane on x86;
:func:`exp_f32` is Cephes' expf (Cody-Waite range reduction, degree-6 polynomial, 2^n built from the
exponent bits), made only of ops that vectorise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tvm import te, tirx

LOG2E = 1.44269504088896341
# ln2 split for Cody-Waite range reduction (Cephes): n * LN2_HI is exact for |n| < 2^15
LN2_HI = 0.693359375
LN2_LO = -2.12194440e-4
_EXPF_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# exp(x) < 2^-126 (the smallest normal float) below this: flushed to 0, as the C++ kernels do
_EXP_MIN = -87.33654475
# 2^n with n <= 127 covers x <= 88.0; above, the result is reported as +inf (the ops only take exp
# of x - max(x) <= 0, so that range is never reached through them)
_EXP_MAX = 88.0


def f32(value: float) -> Any:
    return tirx.const(value, "float32")


def horner(t: Any, coeffs: Sequence[float]) -> Any:
    """coeffs[0] t^(d) + ... + coeffs[-1] (highest degree first) in Horner form, in float32."""
    p = f32(coeffs[0])
    for c in coeffs[1:]:
        p = p * t + f32(c)
    return p


def reduce_ln2(x: Any, n: Any, ln2_hi: float, ln2_lo: float) -> Any:
    """x - n ln2 with ln2 split in two (Cody-Waite): the remainder of exp's range reduction."""
    return x - n * f32(ln2_hi) - n * f32(ln2_lo)


# Float classification by ordered compares. tirx.isnan / isfinite / isinf are intrinsic calls that TVM
# 0.27's VectorizeLoop cannot widen: one of them anywhere in a vectorised loop body makes the pass
# scalarise the WHOLE loop (16 scalar iterations: the cause of the 4-100x gaps of the first TIR
# schedules). Compares vectorise. Only positive forms are safe: TVM's simplifier rewrites
# not(a <= b) to a > b and x != x to false, both wrong for NaN, so callers select on "not NaN" with
# the branches swapped instead of negating. (Integer tests on the bits vectorise too, but Relax's
# int64 index normalisation widens them, and an exp nested in them, to int64: an invalid bitcast.)
_INF = float("inf")


def not_nan(x: Any) -> Any:
    """x is not NaN (a float32 expression), vectorisable: every compare with NaN is false."""
    return tirx.abs(x) <= f32(_INF)


def is_finite(x: Any) -> Any:
    """x is neither +-inf nor NaN (a float32 expression), vectorisable."""
    return tirx.abs(x) < f32(_INF)


def exp_f32(x: Any) -> Any:
    """exp of a float32 TIR expression: relative error <= 2e-7 on [-87.3, 88]; NaN -> NaN,
    -inf -> 0, below -87.3 -> 0, above 88 -> +inf."""
    xc = tirx.max(tirx.min(x, f32(_EXP_MAX)), f32(_EXP_MIN))
    n = round_log2(xc)
    r = reduce_ln2(xc, n, LN2_HI, LN2_LO)
    p = horner(r, _EXPF_POLY)
    p = p * r * r + r + f32(1.0)
    return _scale_with_specials(x, p, n, overflow=True)


def round_log2(xc: Any) -> Any:
    """n = round(xc * log2(e)), as a float (xc is already clamped to the float range)."""
    return tirx.floor(xc * f32(LOG2E) + f32(0.5))


def pow2_f32(n: Any) -> Any:
    """2^n for a float32 expression holding an integer n <= 127, from the exponent bits; 0 for
    n < -126 (no subnormals, as the C++ kernels' exps)."""
    return tirx.reinterpret("float32", tirx.max(n.astype("int32") + 127, 0) << 23)


def _scale_with_specials(x: Any, p: Any, n: Any, *, overflow: bool) -> Any:
    """p * 2^n (2^n from the exponent bits), then exp's special values: 0 below _EXP_MIN (-inf
    included), NaN passed through, and with ``overflow`` +inf above _EXP_MAX."""
    y = p * tirx.reinterpret("float32", (n.astype("int32") + 127) << 23)
    y = tirx.Select(x < f32(_EXP_MIN), f32(0.0), y)
    if overflow:
        y = tirx.Select(x > f32(_EXP_MAX), f32(float("inf")), y)
    return tirx.Select(not_nan(x), y, x)  # NaN stays NaN


# exp on [-ln2/2, ln2/2]: XNNPACK's degree-5 minimax coefficients (relative error 1.2e-7), the ones
# of the C++ kernels (ops/common/simd_math.h); ln2 split for Cody-Waite as there.
_EXP_P5 = tuple(
    float.fromhex(c) for c in ("0x1.0F9F9Cp-7", "0x1.573A1Ap-5", "0x1.555A80p-3", "0x1.FFFDC6p-2", "0x1.FFFFF6p-1")
)
_LN2_HI_P5 = float.fromhex("0x1.62E43p-1")
_LN2_LO_P5 = -float.fromhex("0x1.05C61p-29")


def exp_nonpositive_f32(x: Any) -> Any:
    """exp of a float32 TIR expression that is <= 0 or NaN (x - max(x), softmax's argument): relative
    error <= 2e-7; NaN -> NaN, -inf and anything below -87.3 -> 0. Positive x is NOT supported (2^n is
    built for n <= 0 only). Six ops fewer than :func:`exp_f32` (no upper clamp, a degree-5 polynomial
    in Horner form), which is what bounds the softmax-like kernels' exp pass."""
    xc = tirx.max(x, f32(_EXP_MIN))
    n = round_log2(xc)
    t = reduce_ln2(xc, n, _LN2_HI_P5, _LN2_LO_P5)
    p = horner(t, _EXP_P5) * t + f32(1.0)
    return _scale_with_specials(x, p, n, overflow=False)


# 2^r on [-1/2, 1/2]: _EXP_P5 in the variable r*ln2 with ln2^i folded into its coefficients (the C++
# SoftmaxTopK's kP1..kP5; relative error 1.2e-7), highest degree first, constant term last
_POW2_P5 = (*(float(np.float32(c * math.log(2.0) ** (5 - i))) for i, c in enumerate(_EXP_P5)), 1.0)
_POW2_MAGIC = 12582912.0  # 1.5 * 2^23: the float grid is 1 on [2^23, 2^24)
_POW2_FLOOR = -125.0  # 2^u is built for u >= this only: p * 2^n stays a normal float


def pow2_sum_term_f32(u: Any) -> Any:
    """2^u of a float32 expression u <= 0 (or -inf), as a TERM OF A SUM that holds at least one term
    near 1: below 2^-125 it returns about 2^-125 instead of the exact value (each such term is off by
    < 2^-125 relative to the sum), and NaN or u > 0 give unspecified finite garbage. Relative error
    1.2e-7 otherwise. No clamp above and no special-value selects: 11 ops, against 17 for
    :func:`exp_nonpositive_f32`; it is what bounds a softmax's normaliser pass.

    n = round(u), r = u - n exactly, 2^n added to p's exponent field as the integer n << 23. (The
    magic-number round, (u + 1.5 * 2^23) - 1.5 * 2^23, is folded to u by TVM's simplifier.)"""
    uc = tirx.max(u, f32(_POW2_FLOOR))
    # n = round(uc) by the magic-number add: its integer lands in the low mantissa bits of `rounded`.
    # The round trip through int32 bits keeps TVM's simplifier from folding (uc + M) - M to uc.
    rounded_bits = tirx.reinterpret("int32", uc + f32(_POW2_MAGIC))
    n = tirx.reinterpret("float32", rounded_bits) - f32(_POW2_MAGIC)
    p = horner(uc - n, _POW2_P5)
    return tirx.reinterpret("float32", tirx.reinterpret("int32", p) + (rounded_bits << tirx.const(23, "int32")))


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


_LOGF_POLY = (
    7.0376836292e-2,
    -1.1514610310e-1,
    1.1676998740e-1,
    -1.2420140846e-1,
    1.4249322787e-1,
    -1.6668057665e-1,
    2.0000714765e-1,
    -2.4999993993e-1,
    3.3333331174e-1,
)
_SQRT_HALF = 0.707106781186547524


def log_f32(x: Any) -> Any:
    """Natural log of a POSITIVE NORMAL float32 expression (Cephes' logf: exponent from the bits, a
    degree-8 polynomial on the mantissa), vectorisable; NaN -> NaN. Callers guarantee x >= 1e-9."""
    bits = tirx.reinterpret("int32", x)
    e = ((bits >> 23) & 0xFF) - 126
    m = tirx.reinterpret("float32", (bits & 0x807FFFFF) | 0x3F000000)  # x = m * 2^e, m in [0.5, 1)
    small = m < f32(_SQRT_HALF)
    ef = tirx.Select(small, e - 1, e).astype("float32")
    m = tirx.Select(small, m + m, m) - f32(1.0)
    z = m * m
    p = horner(m, _LOGF_POLY)
    y = p * m * z + ef * f32(LN2_LO) - f32(0.5) * z
    y = m + y + ef * f32(LN2_HI)
    return tirx.Select(not_nan(x), y, x)


LANES = 16  # float32 lanes of an AVX-512 register


def lane_split_ok(shape: Sequence[Any], axis: int) -> bool:
    """The row is the contiguous last axis and a multiple of LANES long, at least two vectors (the
    vector form). One vector is not: its reduction loop has extent 1, which compute_at drops, and
    schedule_rows (which indexes the loops it expects) raised on it (TwoPassSoftmax [3, 16])."""
    n = shape[axis]
    return axis == len(shape) - 1 and isinstance(n, tirx.IntImm) and int(n) >= 2 * LANES and int(n) % LANES == 0


# vectors per float32 block of a float64 lane_reduce (at most): the C++ kernels' kFold is 16
MAX_BLOCK_VECTORS = 32


def lane_reduce(
    shape: Sequence[Any],
    axis: int,
    body: Callable[[tuple[Any, ...]], Any],
    reducer: Callable[..., Any],
    name: str,
    dtype: str = "float32",
) -> te.Tensor:
    """``reducer_j body(index)`` along ``axis``, computed in ``dtype``. In the vector form (see
    :func:`lane_split_ok`) it is lane-split -- ``{name}_part[r, l]`` over ``j = k * LANES + l``, then
    ``{name}`` over ``l`` -- so that :func:`schedule_rows` vectorises it without rfactor (and
    MetaSchedule's search starts from a reduction that vectorises).

    A float64 reduction of float32 values in the vector form is blocked as the C++ kernels' sums
    are: ``{name}_block[r, b, l]`` adds up to MAX_BLOCK_VECTORS vectors in float32, and only the block
    sums are widened and added in float64 (``{name}_part``). Widening every element cost 166 against
    126 us (AdaptiveTemperatureSoftmax 4 x 32000, three such sums); a block's float32 rounding
    (<= 32 terms per lane) stays far below the float64 total's needs.

    One reduction per statistic: the online (max, sum) recurrence as a tuple reduction would save a
    pass, but TVM 0.27's VectorizeLoop miscompiles tuple reductions (the second value's update reads
    the first value AFTER its store: softmax sums came out 13-36% off), so it is not used."""
    if not lane_split_ok(shape, axis):
        return row_reduce(shape, axis, lambda i: body(i).astype(dtype), reducer, name)
    rows, vectors = list(shape[:-1]), int(shape[-1]) // LANES
    # at least two blocks: a single one leaves a block loop of extent 1, which compute_at drops (as
    # above; AdaptiveTemperatureSoftmax [3, 48] and [3, 256], SoftmaxTopK [3, 64] and [3, 512] raised)
    block = max(d for d in range(1, min(vectors // 2, MAX_BLOCK_VECTORS) + 1) if vectors % d == 0)
    if dtype == "float64" and block > 1:
        kk = te.reduce_axis((0, block), name=f"{name}_kk")
        blocks = te.compute(
            (*rows, vectors // block, LANES),
            lambda *i: reducer(body((*i[:-2], (i[-2] * block + kk) * LANES + i[-1])).astype("float32"), axis=kk),
            name=f"{name}_block",
        )
        b = te.reduce_axis((0, vectors // block), name=f"{name}_b")
        part = te.compute(
            (*rows, LANES), lambda *i: reducer(blocks(*i[:-1], b, i[-1]).astype(dtype), axis=b), name=f"{name}_part"
        )
    else:
        k = te.reduce_axis((0, vectors), name=f"{name}_k")
        part = te.compute(
            (*rows, LANES),
            lambda *i: reducer(body((*i[:-1], k * LANES + i[-1])).astype(dtype), axis=k),
            name=f"{name}_part",
        )
    lane = te.reduce_axis((0, LANES), name=f"{name}_lane")
    return te.compute(tuple(rows), lambda *r: reducer(part(*r, lane), axis=lane), name=name)


def row_stage(shape: Sequence[Any], axis: int, body: Callable[[tuple[Any, ...]], Any], name: str) -> Callable[..., Any]:
    """A per-element value that several passes over the row read (an exp): in the vector form a stage
    of its own, which :func:`schedule_rows` computes once per row into a row-sized buffer (vectorised;
    it stays in L1/L2), so the later passes load it instead of recomputing it -- the exp, not memory,
    bounds these rows. Otherwise each reader recomputes it (no full-size intermediate)."""
    if not lane_split_ok(shape, axis):
        return lambda *i: body(i)
    stage = te.compute(shape, lambda *i: body(i), name=name)
    return lambda *i: stage(*i)


REDUCTION, ROW, SCALAR = "reduction", "row", "scalar"  # kinds of per-row stages for schedule_rows
# a REDUCTION of a ROW stage, computed in that stage's loop as it is produced: the values are summed
# from registers instead of being loaded back in another pass over the row buffer
ROW_REDUCTION = "row_reduction"


def schedule_rows(sch: Any, out_block: str, stages: Sequence[tuple[str, str]], *, vector_out: bool = True) -> bool:
    """The hand schedule of a row-wise op: rows of ``out_block`` in parallel, its row loop vectorised
    by LANES, and each of ``stages`` -- (block name, kind), consumers first -- computed per row: a
    REDUCTION of :func:`lane_reduce` with its lane loop vectorised, a ROW stage of :func:`row_stage`
    with its row loop vectorised, a ROW_REDUCTION (a :func:`lane_reduce` of the ROW stage listed right
    after it) inside that stage's loop, a SCALAR per-row block as is. ``vector_out=False``: the out
    block has no row axis (one value per row). Applies to the vector
    form only: returns False, leaving ``sch`` as it was, otherwise."""

    def optional(name: str) -> Any:
        try:
            return sch.get_sblock(name)
        except Exception:  # absent: lane_reduce built no float32 blocks for this reduction
            return None

    try:
        out = sch.get_sblock(out_block)
        reductions = (REDUCTION, ROW_REDUCTION)
        blocks = [
            (
                sch.get_sblock(name),
                sch.get_sblock(f"{name}_part") if kind in reductions else None,
                optional(f"{name}_block") if kind in reductions else None,
                kind,
            )
            for name, kind in stages
        ]
    except Exception:  # not the vector form (no lane-split parts, no row stages), or not this op
        return False
    loops = sch.get_loops(out)
    row_loops = loops[:-1] if vector_out else loops
    if not row_loops:
        return False
    rows = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
    sch.parallel(rows)
    if vector_out:
        _, lanes = sch.split(sch.get_loops(out)[-1], [None, LANES])
        sch.vectorize(lanes)
    pending = None  # (part, float32 blocks or None) of a ROW_REDUCTION, waiting for its ROW stage's loop
    for block, part, blocked, kind in blocks:
        sch.compute_at(block, rows)
        if kind == ROW:
            outer, lane = sch.split(sch.get_loops(block)[-1], [None, LANES])
            if pending is None:
                sch.vectorize(lane)
            else:
                _add_in_stage_loop(sch, outer, lane, *pending)
                pending = None
        if part is None:
            continue
        sch.compute_at(part, rows)
        lane, k = sch.get_loops(part)[-2:]
        sch.reorder(k, lane)
        if kind == ROW_REDUCTION:  # blocks (if any) are placed in the stage's loop (_add_in_stage_loop)
            if blocked is not None:
                _lanes_innermost(sch, blocked, rows)
            pending = (part, blocked)
            continue
        # vectorise, then hoist the init out of the k loop (in the other order vectorize refuses the
        # loop; with the init left inside, the vector body carries a k == 0 branch)
        sch.vectorize(lane)
        if blocked is not None:  # each float32 block summed right before it is added in float64
            sch.vectorize(_lanes_innermost(sch, blocked, k))
            sch.decompose_reduction(blocked, sch.get_loops(blocked)[-2])
        sch.decompose_reduction(part, k)
    return pending is None


def _lanes_innermost(sch: Any, block: Any, loop: Any) -> Any:
    """``block`` (a lane-split reduction) computed under ``loop`` with its lane loop innermost (the
    reduction loop outside it); returns the lane loop."""
    sch.compute_at(block, loop)
    lane, k = sch.get_loops(block)[-2:]
    sch.reorder(k, lane)
    return lane


def _add_in_stage_loop(sch: Any, outer: Any, lane: Any, part: Any, blocked: Any) -> None:
    """A ROW_REDUCTION's part moved into the loop of the ROW stage it reduces: per vector of the stage
    (``outer`` x ``lane``), its lanes are added to the partial sums (the inits hoisted). Blocked (a
    float64 lane_reduce): the float32 block sums per vector, their float64 total per block."""
    if blocked is None:
        sch.reverse_compute_at(part, outer)
        sch.vectorize(sch.get_loops(part)[-1])
        sch.vectorize(lane)
        sch.decompose_reduction(part, outer)
        return
    block_vectors = int(sch.get(sch.get_loops(blocked)[-2]).extent)
    by_block, in_block = sch.split(outer, [None, block_vectors])
    sch.reverse_compute_at(blocked, in_block)
    sch.vectorize(sch.get_loops(blocked)[-1])
    sch.vectorize(lane)
    sch.decompose_reduction(blocked, in_block)
    sch.reverse_compute_at(part, by_block)
    sch.vectorize(sch.get_loops(part)[-1])
    sch.decompose_reduction(part, by_block)


def shape_proxy(expr: Any) -> Any:
    """A zero-copy array of the static shape of a Relax expression (None for None): lets a converter
    run the op's own ``validate`` (which reads shapes and attributes, never values), so that the TVM
    path raises the kernel's exact messages."""
    import numpy as np

    if expr is None:
        return None
    return np.broadcast_to(np.zeros((), str(expr.ty.dtype)), tuple(int(d) for d in expr.ty.shape))


# max with identity -inf (te.max starts from -FLT_MAX, so "no element" would read as a finite max)
max_from_neg_inf = te.comm_reducer(
    lambda a, b: tirx.max(a, b), lambda t: tirx.const(float("-inf"), t), name="max_from_neg_inf"
)
