"""RowwiseInt8MatMul: a float32 MatMul through int8 weights, the activations quantized per row inside the op.

Per row ``m`` of ``A`` (its leading dimensions flattened to ``M`` rows of ``K``), every step in float32 with round
half to even, ``L = levels``:

    lo = min(0, min_k A[m, k])          hi = max(0, max_k A[m, k])
    s  = (hi - lo) / L                  (s = 1 where that is below 2^-126, the smallest normal float32)
    z  = round(clip(-lo / s, 0, L))
    q[m, k] = clip(round(A[m, k] * (1 / s)) + z, 0, L)
    V[m, n] = s * BScale[n] * sum_k (q[m, k] - z) * B[k, n] + Bias[n]
    Y[m, n] = act(V[m, n]) + Residual[m, n]

``B`` is int8 ``[K, N]`` with one positive scale per column (``BScale [N]``, symmetric: no weight zero point);
``Y`` has ``A``'s leading shape and ``N`` columns. This is onnxruntime's DynamicQuantizeLinear rule applied to each
row instead of the whole tensor: one uint8 range per token, which keeps a transformer's outlier tokens ([CLS],
[SEP]) from widening every other token's step (all-MiniLM-L6-v2's sentence cosine to float32 0.9985 against 0.9917
per tensor, bench/results/minilm_int8_options.md). ``levels = 127`` quantizes the activations to 7 bits.

``act`` is the ``activation`` attribute: ``"none"`` (the identity) or ``"gelu"``, GELU's erf form
``gelu(v) = v / 2 * (1 + erf(v / sqrt(2)))`` (ONNX ``Gelu``, ``approximate="none"``; the FFN activation of
BERT-family encoders). ``Residual`` (optional) has ``Y``'s shape, or is one element added to every entry; omitted,
nothing is added (``-0.0``, the exact identity of float addition). Both run in the kernel's epilogue, so a
transformer's FFN GELU and its residual Adds cost no pass of their own over ``Y``; ``softdeploy quantize`` folds them
in (softdeploy.quant.rowwise.fuse_epilogues).

Rules (docs/ops/RowwiseInt8MatMul.md):

* ``A`` float32 of rank >= 1, ``B`` int8 of rank 2 with ``A.shape[-1] == B.shape[0]``, ``BScale`` float32 ``[N]``,
  ``Bias`` float32 ``[N]`` or omitted (0).
* ``K <= 65536``: every integer sum is exact in int32.
* ``levels`` is 255 or 127.
* ``BScale`` is finite and > 0.
* ``activation`` is ``"none"`` or ``"gelu"``.
* ``Residual`` float32 of ``Y``'s shape (``A``'s leading dimensions and ``N``) or of one element.
* ``A`` is finite and each row's ``hi - lo`` is a finite float32 (a row's range sets its scale: a NaN or an infinity
  would make every entry of its row meaningless, so it is an error, naming the entry).

Every backend computes the same integers ``q`` and ``z`` (the float32 steps above, a reciprocal rather than a
division per entry); the sums are exact (int32 in the kernel, float64 in the function body and the torch op, int64
in the reference). The kernel then returns ``V = fma(float32(sum - z colsum), s * BScale[n], Bias[n])``: three float32
roundings, so its error against the float64 reference is at most ~3 * 2^-24 of ``|s BScale[n] sum|`` plus half an
ulp of ``V``. Its GELU is a rational approximation of erf (ops/common/simd_math.h: |erf error| <= 3.4e-7, |gelu error|
<= 2.0e-7 |v|, measured over the float range) whose float32 operations are the same on every kernel variant, and the
residual one float32 add (half an ulp of ``Y``). The tolerance: ``rtol`` 3e-7 plus ``atol`` 6e-7 per unit of
``|s BScale sum| + |Bias| + |Residual|`` (:func:`error_scale`), the magnitudes those errors scale with (GELU's slope
is at most 1.13, so V's error passes through it nearly unchanged), and at least 1e-30 absolute (where float32's
``s * BScale`` falls below the normal range).

The kernel (ops/rowwise_int8_matmul.cc) has three variants, all giving the same bits:

* AVX-512 (ops/rowwise_int8_matmul_zmm.h: 8 rows x 32 columns per tile), in two forms chosen by the CPU:
  with VNNI (ops/rowwise_int8_matmul_avx512vnni.cc) ``vpdpbusd``, exact for every int8 ``B``, 72-81% of the core's
  ``vpdpbusd`` peak at MiniLM's shapes and level with onnxruntime's VNNI int8 (bench/results/rowwise_int8_matmul.md);
  without VNNI (ops/rowwise_int8_matmul_avx512.cc) the AVX2 forms below on zmm, under the same lane bound.
* AVX2 (ops/rowwise_int8_matmul_avx2.cc), no VNNI needed: ``vpmaddubsw`` products summed in int16 over 2 or 4
  groups before one ``vpmaddwd`` + ``vpaddd``, 2.25-2.5 vector ops per 32 products against onnxruntime's 3
  (bench/results/minilm_int8_options.md). That is exact only while no int16 lane can saturate, i.e. for
  "lane-bounded" weights (see :func:`lane_groups`), which :func:`lane_bounded_weights` produces; the kernel checks
  the bound when it packs ``B`` (once per session for an initializer). Weights outside it (the plain 8-bit grid of
  "rowwise-8-bit", written for VNNI CPUs) are packed widened to int16 instead and multiplied with ``vpmaddwd`` into
  int32 (2 vector ops per 16 products), exact for every int8 ``B`` (bench/results/rowwise_int8_wide.md). The bound
  is a speed condition, never a correctness one. On a CPU with AVX-VNNI (AVX2 cores from
  Alder Lake on) the AVX2 variant instead runs ``vpdpbusd`` on ymm (ops/rowwise_int8_matmul_avxvnni.cc), exact for
  every int8 ``B`` like the AVX-512 VNNI tile: 89-92% of the ymm ``vpdpbusd`` peak at MiniLM's shapes, timed through
  its EVEX twin on Zen 4 (bench/micro/rowwise_int8_pieces.cc; the size sweep checks that twin on every AVX-512 VNNI
  CPU).
* portable C++ (CPUs without AVX2).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from softdeploy.errors import OpContractError
from softdeploy.ops._body import function_body
from softdeploy.ops._schema import Attr, BodyFill, ErrorCase, OpDef, Port, Sample

if TYPE_CHECKING:  # bound when the body is compiled (softdeploy/ops/_body.py)
    from onnxscript import DOUBLE, FLOAT
    from onnxscript import opset18 as op

NAME = "RowwiseInt8MatMul"
MAX_K = 65536
LEVELS = (255, 127)
ACTIVATIONS = ("none", "gelu")
# The kernel's tolerance (rtol, atol per unit of error_scale; derived in the docstring) and its absolute floor.
_RTOL, _ATOL, _ABS_FLOOR = 3e-7, 6e-7, 1e-30
_MIN_SCALE = np.float32(2.0**-126)
_RANGE_RULE = "rule: each row's range max(0, max A) - min(0, min A) is a finite float32"


def _shape(v: Any) -> list[int]:
    return [int(d) for d in np.shape(v)]


def validate(
    a: Any,
    b: Any,
    b_scale: Any,
    bias: Any,
    levels: int,
    *,
    residual: Any = None,
    activation: str = "none",
    values: bool = True,
) -> None:
    """Checks RowwiseInt8MatMul's inputs and attributes in the kernel's order and raises OpContractError naming the
    op, the value and the rule (in the kernel's words). ``a`` and friends are numpy arrays or torch tensors;
    ``values=False`` checks shapes only (torch's fake tensors while tracing have no values, and A's leading
    dimensions may be symbolic)."""
    if levels not in LEVELS:
        raise OpContractError(
            f"{NAME}: levels {levels} is neither 255 nor 127 (rule: the activations' top code L is 255 (uint8) or "
            "127 (7 bits))"
        )
    if activation not in ACTIVATIONS:
        raise OpContractError(
            f"{NAME}: activation '{activation}' is not 'none' or 'gelu' (rule: the epilogue applies no activation or "
            "GELU's erf form)"
        )
    if np.ndim(a) == 0:
        raise OpContractError(f"{NAME}: A must have rank >= 1 ([..., K]), got a scalar")
    if np.ndim(b) != 2:
        raise OpContractError(f"{NAME}: B must have rank 2 ([K, N]), got shape {_shape(b)}")
    k, n = _shape(b)
    a_k = int(np.shape(a)[-1])
    if a_k != k:
        raise OpContractError(
            f"{NAME}: A has K = {a_k} features, B has K = {k} rows (rule: A [..., K] and B [K, N] agree on K)"
        )
    if k > MAX_K:
        raise OpContractError(f"{NAME}: K = {k} exceeds {MAX_K} (rule: K <= 65536 keeps the int32 sums exact)")
    if _shape(b_scale) != [n]:
        raise OpContractError(
            f"{NAME}: BScale must have shape [N] = [{n}], got {_shape(b_scale)} (rule: one scale per column of B)"
        )
    if bias is not None and _shape(bias) != [n]:
        raise OpContractError(
            f"{NAME}: Bias must have shape [N] = [{n}], got {_shape(bias)} (rule: one bias per column of B)"
        )
    if residual is not None:
        y_shape = [*_shape(a)[:-1], n]
        r_shape = _shape(residual)
        if r_shape != y_shape and math.prod(r_shape) != 1:
            raise OpContractError(
                f"{NAME}: Residual must have Y's shape {y_shape} or one element, got {r_shape} (rule: the residual "
                "is added element by element, or one value to every entry)"
            )
    if not values:
        return
    scales = np.asarray(b_scale, dtype=np.float32)
    bad = np.flatnonzero(~(np.isfinite(scales) & (scales > 0)))
    if bad.size:
        raise OpContractError(
            f"{NAME}: BScale[{bad[0]}] = {float(scales[bad[0]]):g} is not a finite number > 0 (rule: weight scales "
            "are finite and positive)"
        )
    rows = np.asarray(a, dtype=np.float32).reshape(math.prod(_shape(a)[:-1]), k)
    finite = np.isfinite(rows)
    with np.errstate(over="ignore", invalid="ignore"):
        span = np.maximum(rows.max(axis=1, initial=0), 0) - np.minimum(rows.min(axis=1, initial=0), 0)
    bad_rows = np.flatnonzero(~finite.all(axis=1) | ~np.isfinite(span))
    if bad_rows.size:
        m = int(bad_rows[0])
        if not finite[m].all():
            j = int(np.flatnonzero(~finite[m])[0])
            raise OpContractError(
                f"{NAME}: A[{m}, {j}] = {float(rows[m, j]):g} is not finite (rule: A is finite, each row's range "
                "sets its scale; rows are A's leading dimensions flattened)"
            )
        raise OpContractError(f"{NAME}: A row {m} spans max - min = inf in float32 ({_RANGE_RULE})")


def quantize_rows(rows: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(q, s, z)`` of float32 ``rows [M, K]`` by the contract's float32 steps: q int64 ``[M, K]`` on 0..levels, s
    float32 ``[M]``, z int64 ``[M]`` -- the integers every backend computes."""
    top = np.float32(levels)
    lo = np.minimum(rows.min(axis=1, initial=0), np.float32(0))
    hi = np.maximum(rows.max(axis=1, initial=0), np.float32(0))
    s = (hi - lo) / top
    s = np.where(s >= _MIN_SCALE, s, np.float32(1)).astype(np.float32)
    z = np.round(np.clip(-lo / s, np.float32(0), top))
    inv = (np.float32(1) / s).astype(np.float32)
    q = np.clip(np.round(rows * inv[:, None]) + z[:, None], np.float32(0), top)
    return q.astype(np.int64), s, z.astype(np.int64)


def _gelu64(v: np.ndarray) -> np.ndarray:
    """GELU's erf form in float64 (math.erf per element: NumPy has no erf)."""
    erf = np.vectorize(math.erf, otypes=[np.float64])
    with np.errstate(invalid="ignore"):
        return 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))


def _linear64(a: Any, b: Any, b_scale: Any, levels: int) -> np.ndarray:
    """``s * BScale * sum`` in float64, ``[M, N]`` (the integers of :func:`quantize_rows`, exact int64 sums)."""
    k = _shape(b)[0]
    rows = np.asarray(a, np.float32).reshape(math.prod(_shape(a)[:-1]), k)
    q, s, z = quantize_rows(rows, levels)
    sums = (q - z[:, None]) @ np.asarray(b, np.int64)
    return s.astype(np.float64)[:, None] * np.asarray(b_scale, np.float64) * sums


def reference(
    a: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    bias: np.ndarray | None = None,
    residual: np.ndarray | None = None,
    *,
    levels: int = 255,
    activation: str = "none",
) -> tuple[np.ndarray]:
    """The float64 NumPy oracle of RowwiseInt8MatMul: the integers of :func:`quantize_rows`, their exact int64 sums,
    then ``act(s * BScale * sum + Bias) + Residual`` in float64. It checks the contract first, so a bad input raises
    the same OpContractError as the kernel."""
    validate(a, b, b_scale, bias, levels, residual=residual, activation=activation)
    lead = _shape(a)[:-1]
    n = _shape(b)[1]
    y = _linear64(a, b, b_scale, levels)
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    if activation == "gelu":
        y = _gelu64(y)
    y = y.reshape([*lead, n])
    if residual is not None:
        y = y + np.asarray(residual, np.float64)  # Y's shape, or one element
    return (y,)


def error_scale(
    a: Any,
    b: Any,
    b_scale: Any,
    bias: Any = None,
    residual: Any = None,
    *,
    levels: int = 255,
    **_: Any,
) -> np.ndarray:
    """``|s BScale sum| + |Bias| + |Residual|`` per entry of Y in float64: the magnitudes the kernel's absolute error
    scales with (OpDef.atol_scale; the module docstring derives the tolerance), at least ``1e-30 / atol`` (an
    absolute 1e-30: where float32's ``s * BScale`` is below the normal range its relative precision is gone). Inputs
    that break the contract get 1 (the comparison is of the error, not of a value)."""
    try:
        validate(a, b, b_scale, bias, levels, residual=residual, values=False)
    except OpContractError:
        return np.ones(())
    lead = _shape(a)[:-1]
    n = _shape(b)[1]
    with np.errstate(all="ignore"):
        scale = np.abs(_linear64(a, b, b_scale, levels))
        if bias is not None:
            scale = scale + np.abs(np.asarray(bias, np.float64))
        scale = scale.reshape([*lead, n])
        if residual is not None:
            scale = scale + np.abs(np.asarray(residual, np.float64))
    return np.maximum(np.nan_to_num(scale, nan=1.0, posinf=np.inf), _ABS_FLOOR / _ATOL)


@function_body
def RowwiseInt8MatMul(A, B, BScale, Bias, Residual, levels: int = 255, activation: str = "none"):
    # Rows: A's leading dimensions flattened (ReduceProd of an empty shape is 1: a rank-1 A is one row).
    lead = op.Shape(A, end=-1)
    k = op.Shape(B, start=0, end=1)
    n = op.Shape(B, start=1, end=2)
    m = op.ReduceProd(lead, keepdims=1)
    rows = op.Reshape(A, op.Concat(m, k, axis=0))
    top = op.Cast(op.Constant(value_int=levels), to=FLOAT.dtype)
    zero = op.Constant(value_float=0.0)
    one = op.Constant(value_float=1.0)
    # A column of zeros puts 0 in every row's range (and keeps K = 0 rows from reducing an empty set).
    padded = op.Concat(rows, op.ConstantOfShape(op.Concat(m, op.Constant(value_ints=[1]), axis=0)), axis=1)
    lo = op.ReduceMin(padded, op.Constant(value_ints=[1]), keepdims=1)
    hi = op.ReduceMax(padded, op.Constant(value_ints=[1]), keepdims=1)
    s = op.Div(op.Sub(hi, lo), top)
    s = op.Where(op.GreaterOrEqual(s, op.Constant(value_float=2.0**-126)), s, one)
    z = op.Round(op.Clip(op.Div(op.Neg(lo), s), zero, top))
    # Reciprocal, not Div(1, s): onnxruntime's basic optimizer rewrites Mul(x, Div(1, s)) into Div(x, s), which rounds
    # differently at half a step (measured: the special_rows sample).
    q = op.Clip(op.Add(op.Round(op.Mul(rows, op.Reciprocal(s))), z), zero, top)
    # Integer sums of up to 65536 products of |q - z| <= 255 and |B| <= 128: exact in float64.
    sums = op.MatMul(op.Sub(op.Cast(q, to=DOUBLE.dtype), op.Cast(z, to=DOUBLE.dtype)), op.Cast(B, to=DOUBLE.dtype))
    y = op.Add(op.Mul(op.Cast(sums, to=FLOAT.dtype), op.Mul(s, BScale)), Bias)
    # activation: string equality in opset 18 (Unique of [activation, "gelu"] has one element iff they are equal)
    name = op.Unsqueeze(op.Constant(value_string=activation), op.Constant(value_ints=[0]))
    is_gelu = op.Equal(op.Size(op.Unique(op.Concat(name, op.Constant(value_strings=["gelu"]), axis=0))), 1)
    half = op.Mul(y, op.Constant(value_float=0.5))
    gelu = op.Add(half, op.Mul(half, op.Erf(op.Mul(y, op.Constant(value_float=0.7071067811865476)))))
    y = op.Where(is_gelu, gelu, y)
    # an omitted Residual arrives as -0.0 (Port.body_fill): adding it changes no value, -0.0 included
    return op.Add(op.Reshape(y, op.Concat(lead, n, axis=0)), Residual)


def torch_impl(
    a: Any,
    b: Any,
    b_scale: Any,
    bias: Any = None,
    residual: Any = None,
    levels: int = 255,
    activation: str = "none",
) -> Any:
    """Eager torch RowwiseInt8MatMul (the contract's float32 steps, exact float64 sums, GELU with torch's erf),
    registered as torch.ops.softdeploy.rowwise_int8_matmul; it checks the contract first, like every backend."""
    import torch

    validate(a, b, b_scale, bias, levels, residual=residual, activation=activation)
    lead = list(a.shape[:-1])
    k, n = b.shape
    rows = a.float().reshape(math.prod(lead), k)
    padded = torch.cat([rows, rows.new_zeros(rows.shape[0], 1)], dim=1)
    lo, hi = padded.amin(dim=1), padded.amax(dim=1)
    top = torch.tensor(float(levels), dtype=torch.float32)
    s = (hi - lo) / top
    s = torch.where(s >= float(_MIN_SCALE), s, torch.ones_like(s))
    z = torch.round(torch.clamp(-lo / s, 0.0, float(levels)))
    q = torch.clamp(torch.round(rows * (1.0 / s)[:, None]) + z[:, None], 0.0, float(levels))
    sums = (q.double() - z.double()[:, None]) @ b.double()
    y = sums.float() * (s[:, None] * b_scale.float())
    if bias is not None:
        y = y + bias.float()
    if activation == "gelu":  # as h + h erf(v / sqrt(2)), the kernel's form: no overflow of v (1 + erf) near FLT_MAX
        half = y * 0.5
        y = half + half * torch.erf(y * 0.7071067811865476)
    y = y.reshape([*lead, n])
    return y if residual is None else y + residual.float()


def torch_fake(
    a: Any,
    b: Any,
    b_scale: Any,
    bias: Any = None,
    residual: Any = None,
    levels: int = 255,
    activation: str = "none",
) -> Any:
    """RowwiseInt8MatMul on torch's fake tensors (export tracing): the shape checks, then an empty Y [..., N]."""
    validate(a, b, b_scale, bias, levels, residual=residual, activation=activation, values=False)
    return a.new_empty([*a.shape[:-1], b.shape[1]], dtype=a.dtype)


def infer_shapes(ctx: Any) -> None:
    """ONNX shape inference for RowwiseInt8MatMul: Y has A's type, A's leading dimensions and B's last one."""
    from onnx import TensorShapeProto

    a_type = ctx.get_input_type(0)
    b_type = ctx.get_input_type(1)
    out = type(a_type)()
    out.CopyFrom(a_type)
    if a_type.tensor_type.HasField("shape") and b_type.tensor_type.HasField("shape"):
        a_dims = list(a_type.tensor_type.shape.dim)
        b_dims = list(b_type.tensor_type.shape.dim)
        if a_dims and len(b_dims) == 2:
            dims = TensorShapeProto()
            for d in a_dims[:-1]:
                dims.dim.add().CopyFrom(d)
            dims.dim.add().CopyFrom(b_dims[1])
            out.tensor_type.shape.CopyFrom(dims)
    ctx.set_output_type(0, out)


# ---- weights for the fast path ----------------------------------------------------------------------------------


def lane_set_sums(q: np.ndarray, groups: int) -> np.ndarray:
    """``[K / (4 groups), 2, N]``: per lane set of the AVX2 tile, max(sum of the positive weights, sum of |negative
    weights|). With ``groups`` vpmaddubsw results summed in int16 a lane adds the products of k = 4 G i + 4 g + 2 p +
    j for g < G and j < 2: one set per (i, p) and column (K padded with 0)."""
    k, n = q.shape
    pad = (-k) % (4 * groups)
    dtype = np.float64 if np.issubdtype(np.asarray(q).dtype, np.floating) else np.int64
    w = np.concatenate([np.asarray(q, dtype), np.zeros((pad, n), dtype)]).reshape(-1, groups, 2, 2, n)
    return np.maximum(np.clip(w, 0, None).sum((1, 3)), np.clip(-w, 0, None).sum((1, 3)))


def lane_groups(q: np.ndarray, levels: int) -> int:
    """How many vpmaddubsw results the AVX2 kernel may sum in int16 for int8 weights ``q [K, N]`` and activations on
    0..levels: 4, 2 or 1, or 0 when not even single pairs are exact (the kernel then takes its widened vpmaddwd tile). The
    same rule as the kernel's LaneGroups (ops/rowwise_int8_matmul.cc), with -32767 rather than -32768 as the
    negative limit (never more permissive)."""
    for groups in (4, 2, 1):
        if q.size == 0 or int(lane_set_sums(q, groups).max()) * levels <= 32767:
            return groups
    return 0


def lane_bounded_weights(w: np.ndarray, levels: int, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """``(q int8 [K, N], BScale float32 [N])``: symmetric per-column int8 of float weights ``w [K, N]`` on the 8-bit
    grid, the step of a column widened only as far as the lane bound for ``groups`` and ``levels`` needs, so that
    ``lane_groups(q, levels) >= groups``: step = max(max |w| / 127, largest same-sign lane set sum / (32767 // levels
    - groups)) (rounding 2 G weights adds at most G to a set's sum). ``groups`` 0: no bound, the plain 8-bit grid
    (max |w| / 127; for the VNNI tile, exact for every int8 B). Columns whose step is 0 in float32 get 1."""
    w64 = np.asarray(w, np.float64)
    step = np.abs(w64).max(axis=0, initial=0) / 127
    if groups:
        step = np.maximum(step, lane_set_sums(w64, groups).max(axis=(0, 1), initial=0) / (32767 // levels - groups))
    step = step.astype(np.float32)  # then 1 where it is 0 in float32 (all-zero or ~1e-45 columns: every q is 0)
    step = np.where(step > 0, step, np.float32(1))
    q = np.clip(np.rint(w64 / step.astype(np.float64)), -127, 127).astype(np.int8)
    if lane_groups(q, levels) < groups:  # cannot happen by the rounding argument; checked, not assumed
        raise AssertionError(f"{NAME}: lane-bounded weights exceed the bound for groups={groups}, levels={levels}")
    return q, step


# ---- conformance ----------------------------------------------------------------------------------------------


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of RowwiseInt8MatMul, drawn from ``rng``: typical sizes with weights inside and outside
    the lane bound (so both kernel paths run), the AVX2 tile's edges (6-row tiles, 16-column panels, 16-k blocks),
    empty dimensions, and special rows (ties at half a step, all-zero, one-signed, subnormal, huge) on which every
    backend must agree."""

    def acts(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def weights(k: int, n: int, bound: int) -> np.ndarray:
        return rng.integers(-bound, bound + 1, size=(k, n)).astype(np.int8)

    def scales(n: int) -> np.ndarray:
        return (rng.uniform(0.5, 2.0, n) / 127).astype(np.float32)

    # groups 4 at L = 127 (8 products of |w| <= 20: at most 160 <= 258), 2 at L = 255, widened for full-range weights
    b = weights(384, 96, 20)
    yield Sample("tokens_2x64x384_octet", (acts(2, 64, 384), b, scales(96)), {"levels": 127})
    yield Sample("tokens_2x64x384_u8", (acts(2, 64, 384), b, scales(96)))
    full = weights(200, 70, 128)
    yield Sample("full_range_weights_portable_path", (acts(37, 200), full, scales(70)))
    yield Sample("full_range_weights_7bit", (acts(37, 200), full, scales(70)), {"levels": 127})
    lanes, step = lane_bounded_weights(rng.standard_normal((256, 48)), 255, 2)
    yield Sample("lane_bounded_paired", (acts(40, 256, scale=3.0), lanes, step))
    # A Bias far from the products (no cancellation: see the tolerance in the docstring)
    yield Sample(
        "bias", (acts(3, 11, 64), weights(64, 33, 20), scales(33), rng.uniform(50, 100, 33).astype(np.float32))
    )
    yield Sample("rank1", (acts(100), weights(100, 20, 30), scales(20)), kind="edge")
    # tile edges: rows 1..7 and 12, 13 (6-row tiles), K and N around 16
    for m, k, n in ((1, 16, 16), (2, 1, 1), (5, 17, 15), (6, 15, 17), (7, 33, 31), (12, 48, 48), (13, 31, 65)):
        yield Sample(f"m{m}_k{k}_n{n}", (acts(m, k), weights(k, n, 16), scales(n)), kind="edge")
    yield Sample("empty_rows", (acts(0, 8), weights(8, 5, 10), scales(5)), kind="edge")
    yield Sample("empty_batch_3d", (acts(0, 6, 9), weights(9, 4, 10), scales(4)), kind="edge")
    yield Sample("empty_columns", (acts(4, 8), weights(8, 0, 10), scales(0)), kind="edge")
    bias = rng.uniform(1, 2, 5).astype(np.float32)
    yield Sample("empty_k_gives_bias", (acts(3, 0), weights(0, 5, 10), scales(5), bias), kind="edge")
    # extreme weights: -128 and 127 (single pairs exact only at L = 127)
    extreme = np.where(rng.random((40, 20)) < 0.5, -128, 127).astype(np.int8)
    yield Sample("extreme_weights_7bit", (acts(9, 40), extreme, scales(20)), {"levels": 127}, kind="edge")
    yield Sample("extreme_weights_u8", (acts(9, 40), extreme, scales(20)), kind="edge")
    # special rows
    ties = np.array(
        [
            [0.0, 0.5, 1.5, 2.5, 3.5, 127.5, 253.5, 254.5, 255.0],  # s = 1: x * (1 / s) at exactly half a step
            [-255.0, -254.5, -2.5, -1.5, -0.5, -0.0, 0.0, -3.5, -100.5],  # all <= 0: z = L
            [0.0] * 9,  # all zero: s = 1, z = 0
            [7.0] * 9,  # constant positive: lo = 0
            [-1e-39, 1e-39, 0.0, 3e-40, -2e-40, 0.0, 1e-45, -1e-45, 0.0],  # subnormal range: s = 1, every q = z = 0
            [1e30, -1e30, 5e29, -3e29, 0.0, 1.0, -1.0, 7e29, -7e29],  # huge but finite range
            [1.7e38, -1.7e38, 0.0, 1e38, -1e38, 3.0, -3.0, 1.6e38, 0.0],  # range 3.4e38: finite
            [-0.0, 0.25, -0.25, 0.75, -0.75, 1.25, -1.25, 0.0, 1.0],
        ],
        np.float32,
    )
    yield Sample("special_rows", (ties, weights(9, 19, 20), scales(19)), kind="special")
    yield Sample("special_rows_7bit", (ties, weights(9, 19, 20), scales(19)), {"levels": 127}, kind="special")
    tiny_scales = np.array([1e-30, 1e30, 1.0, 1e-6], np.float32)
    yield Sample("extreme_scales", (acts(5, 24), weights(24, 4, 100), tiny_scales), kind="special")
    # The epilogue: GELU (pre-activations over ~[-6, 6]: its clamp at |v / sqrt(2)| = 4 and the region where
    # 1 + erf cancels), a residual of Y's shape or one element, both, on the vector tiles (full-range and
    # lane-bounded weights) and their edges (partial panels: N = 70, 33; remainder rows: M = 37, 13)
    ffn = (acts(2, 13, 200), full, scales(70) * 1.5, rng.uniform(-1, 1, 70).astype(np.float32))
    yield Sample("gelu_full_range", ffn, {"activation": "gelu"})
    yield Sample(
        "gelu_lane_bounded_7bit", (acts(40, 256, scale=3.0), lanes, step), {"activation": "gelu", "levels": 127}
    )
    res = acts(37, 33, scale=2.0)
    yield Sample("residual", (acts(37, 64), weights(64, 33, 20), scales(33), None, res))
    yield Sample(
        "gelu_bias_residual",
        (acts(37, 64), weights(64, 33, 128), scales(33), rng.uniform(-2, 2, 33).astype(np.float32), res),
        {"activation": "gelu"},
    )
    yield Sample("residual_one_element", (acts(3, 5, 16), weights(16, 7, 30), scales(7), None, np.float32([0.75])))
    yield Sample(
        "gelu_residual_empty_k",
        (acts(4, 0), weights(0, 5, 10), scales(5), bias, acts(4, 5)),
        {"activation": "gelu"},
        kind="edge",
    )
    yield Sample(
        "gelu_rank1", (acts(100), weights(100, 20, 30), scales(20), None, acts(20)), {"activation": "gelu"}, kind="edge"
    )
    # GELU of special pre-activations: 0, -0, huge magnitudes (gelu(v) = v or -0 there), through Bias with K = 0
    special_bias = np.array([0.0, -0.0, 1e30, -1e30, 3e38, -3e38, 5.65, -5.66, -30.0, 1e-40], np.float32)
    yield Sample(
        "gelu_special_bias",
        (acts(2, 0), weights(0, 10, 10), scales(10), special_bias),
        {"activation": "gelu"},
        kind="special",
    )


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of RowwiseInt8MatMul; every backend must refuse them with a message containing
    ``match`` (the operator reference lists them)."""
    a = np.ones((2, 4), np.float32)
    b = np.ones((4, 3), np.int8)
    sb = np.ones(3, np.float32)
    yield ErrorCase("levels", (a, b, sb), {"levels": 100}, "levels 100 is neither 255 nor 127")
    yield ErrorCase("scalar_a", (np.float32(1.0).reshape(()), b, sb), {}, "A must have rank >= 1 ([..., K])")
    yield ErrorCase("b_rank", (a, np.ones((4, 3, 1), np.int8), sb), {}, "B must have rank 2 ([K, N]), got shape")
    yield ErrorCase("k_mismatch", (np.ones((2, 5), np.float32), b, sb), {}, "A has K = 5 features, B has K = 4 rows")
    big_k = MAX_K + 1
    yield ErrorCase(
        "k_too_large",
        (np.ones((1, big_k), np.float32), np.ones((big_k, 1), np.int8), np.ones(1, np.float32)),
        {},
        "K = 65537 exceeds 65536 (rule: K <= 65536 keeps the int32 sums exact)",
    )
    yield ErrorCase("scale_shape", (a, b, np.ones(2, np.float32)), {}, "BScale must have shape [N] = [3], got [2]")
    yield ErrorCase("bias_shape", (a, b, sb, np.ones(4, np.float32)), {}, "Bias must have shape [N] = [3], got [4]")
    yield ErrorCase("activation", (a, b, sb), {"activation": "relu"}, "activation 'relu' is not 'none' or 'gelu'")
    yield ErrorCase(
        "residual_shape",
        (a, b, sb, None, np.ones((2, 4), np.float32)),
        {},
        "Residual must have Y's shape [2, 3] or one element, got [2, 4]",
    )
    for name, value, shown in (("zero", 0.0, "0"), ("negative", -1.0, "-1"), ("nan", np.nan, "nan")):
        bad = sb.copy()
        bad[1] = value
        yield ErrorCase(f"scale_{name}", (a, b, bad), {}, f"BScale[1] = {shown} is not a finite number > 0")
    for name, value, shown in (("nan", np.nan, "nan"), ("inf", np.inf, "inf"), ("minus_inf", -np.inf, "-inf")):
        bad_a = a.copy()
        bad_a[1, 2] = value
        yield ErrorCase(f"a_{name}", (bad_a, b, sb), {}, f"A[1, 2] = {shown} is not finite (rule: A is finite")
    wide = np.array([[1.0, 2.0, 3.0, 4.0], [3e38, -3e38, 0.0, 1.0]], np.float32)
    yield ErrorCase("range_overflow", (wide, b, sb), {}, "A row 1 spans max - min = inf in float32")


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(
        Port("A", doc="float32 [..., K]: the activations, quantized per row inside the op"),
        Port("B", dtype="int8", doc="int8 [K, N]: the weights (symmetric per column)"),
        Port("BScale", dtype="float32", doc="float32 [N]: one positive scale per column of B"),
        Port(
            "Bias",
            dtype="float32",
            optional=True,
            doc="float32 [N]: added to every row; omitted means 0",
            body_fill=BodyFill(0.0, shape_of=1, start=1, end=2),
        ),
        Port(
            "Residual",
            dtype="float32",
            optional=True,
            doc="float32 of Y's shape, or one element: added after the activation; omitted means nothing added",
            body_fill=BodyFill(-0.0),
        ),
    ),
    outputs=(Port("Y", doc="float32 [..., N]"),),
    attrs=(
        Attr("levels", int, 255, "the activations' top code L: 255 (uint8) or 127 (7 bits)"),
        Attr("activation", str, "none", "applied to V in the epilogue: 'none' or 'gelu' (erf form)"),
    ),
    reference=reference,
    function=RowwiseInt8MatMul,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    torch_fake=torch_fake,
    infer_shapes=infer_shapes,
    float_types=("float32",),
    # rtol, and atol per unit of error_scale (|s BScale sum| + |Bias| + |Residual|): derived in the docstring
    tolerance={"float32": (_RTOL, _ATOL)},
    atol_scale=error_scale,
    source="onnxruntime DynamicQuantizeLinear (its rule, per row); MLAS u8s8 GEMM (vpmaddubsw); "
    "bench/results/minilm_int8_options.md (the int16-summing form, measured)",
    stem_override="rowwise_int8_matmul",
)
