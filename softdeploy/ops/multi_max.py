"""MultiMax: softmax of logits passed through a learned piecewise-quadratic modulator sigma.

    sigma(x) = x + t0*relu(r0 - x) + t1*relu(x - r1) + t2*relu(r2 - x)^2 + t3*relu(x - r3)^2
    Y = softmax(sigma(X) + Mask, axis)

``Ranges = (r0, r1, r2, r3)`` and ``Ts = (t0, t1, t2, t3)`` are tensors of shape [4] (same float type
as X); the optional additive ``Mask`` (0 / -inf typically) must be broadcastable to X (rank <= X's
rank, each dim equal to X's or 1, numpy alignment from the right) and is added AFTER sigma (the
fairseq order of Zhou, Fritz & Keuper, ICML 2024, arXiv 2406.01189; sigma(-inf) would be NaN).
Ranges need not be ordered and sigma need not be monotone (learned parameters).

Special values (the same rule in the reference, the kernel ops/multi_max.cc, the function body and
the torch op):
  * sigma(+-inf) is sigma's LIMIT, not IEEE arithmetic on the formula (which gives inf - inf or
    0 * inf = NaN for most parameters, e.g. for t = 0):
      sigma(-inf) = +inf*sign(t2) if t2 != 0, else -inf if t0 < 1, +inf if t0 > 1, r0 if t0 == 1
      sigma(+inf) = +inf*sign(t3) if t3 != 0, else +inf if t1 > -1, -inf if t1 < -1, r1 if t1 == -1
    (for x -> -inf only the r0/r2 terms are active, sigma ~ t2*x^2 + (1 - t0)*x; symmetrically for
    +inf). So with t = 0, sigma(+-inf) = +-inf and MultiMax equals softmax on every input.
  * sigma(NaN) = NaN. A non-finite value in Ranges or Ts makes every output NaN.
  * sigma and the mask are evaluated in float64 by every backend (the float32/float16 inputs are exact
    in float64), so nothing overflows: |sigma(x)| < 1e117 for any float32 x, where float32 relu^2
    overflowed for |x| > ~1.8e19 (NaN rows where the value is finite). The quadratic terms are
    (t*relu)*relu, so that a zero t contributes exactly 0.
  * Then softmax semantics: -inf after masking gives exactly 0; a row that holds NaN or +inf, or only
    -inf, after sigma and the mask is all NaN (ai.onnx.Softmax / torch parity).

Kernel (ops/multi_max.cc): per block of 1024 entries of a row, z = sigma(x) + mask in double into an
L1 buffer, the block max M_b, and exp(z - M_b) staged in Y (range reduction in double, float
polynomial), the block sums folded online in double; then one pass rescales Y in place. X and the
Mask are read once.

Accuracy (float32, relative, against this module's float64 reference; atol 1e-37): 2e-6 at ANY
magnitude of z (hypothesis-tested with random parameters, |z| up to 1e4, and on samples with |z| up
to FLT_MAX and the Hugging Face mask finfo(float32).min). What remains is the float exp polynomial
(1e-7), the float32 staging of exp(z - M_b) and the float block sums (32 terms per lane on AVX-512,
64 on AVX2): measured 4.8e-7 at most (AVX2, AVX-512; fuzzed with special values), 6e-8 (portable:
double throughout). The function body and the torch op work in float64 throughout (measured 6e-8).
Before: with sigma in float32 the error grew as |z| * 2^-24 (the output's relative error is z's
absolute error): up to 4.7e-6 on the nonmonotone_params sample (other seeds), 8.8e-6 at |z| ~ 56,
1.7e-3 at |z| ~ 1e4, against the same 2e-6.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from softdeploy.errors import OpContractError
from softdeploy.ops._body import function_body
from softdeploy.ops._common import as_float64, normalize_axis, require_rank_at_least_one, softmax64
from softdeploy.ops._schema import Attr, ErrorCase, OpDef, Port, Sample

if TYPE_CHECKING:  # bound when the body is compiled (softdeploy/ops/_body.py)
    from onnxscript import opset18 as op

NAME = "MultiMax"


def _shape_str(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def validate(x: Any, ranges: Any, ts: Any, mask: Any, axis: int) -> int:
    """Checks MultiMax's inputs and attributes and raises OpContractError naming the op, the value and the rule (in the
    kernel's words); returns the axis, normalised to [0, rank)."""
    require_rank_at_least_one(NAME, x)
    a = normalize_axis(NAME, axis, np.ndim(x))
    for port, value in (("Ranges", ranges), ("Ts", ts)):
        shape = tuple(np.shape(value))
        if shape != (4,):
            raise OpContractError(f"{NAME}: {port} has shape {_shape_str(shape)} (rule: {port} must have shape [4])")
    if mask is not None:
        x_shape, m_shape = tuple(np.shape(x)), tuple(np.shape(mask))
        ok = len(m_shape) <= len(x_shape) and all(
            md in (1, xd) for md, xd in zip(reversed(m_shape), reversed(x_shape), strict=False)
        )
        if not ok:
            raise OpContractError(
                f"{NAME}: Mask of shape {_shape_str(m_shape)} is not broadcastable to X of shape "
                f"{_shape_str(x_shape)} (rule: Mask rank <= X rank and each Mask dim equals X's or is 1)"
            )
    return a


def sigma_limits(ranges: np.ndarray, ts: np.ndarray) -> tuple[float, float]:
    """(sigma(-inf), sigma(+inf)) as the limits of sigma (see the module docstring)."""
    r0, r1 = float(ranges[0]), float(ranges[1])
    t0, t1, t2, t3 = (float(t) for t in ts)
    if t2 != 0:
        neg = np.inf * np.sign(t2)
    else:
        neg = -np.inf if t0 < 1 else (np.inf if t0 > 1 else r0)
    if t3 != 0:
        pos = np.inf * np.sign(t3)
    else:
        pos = np.inf if t1 > -1 else (-np.inf if t1 < -1 else r1)
    return float(neg), float(pos)


def sigma64(x: np.ndarray, ranges: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """sigma in float64 with the special-value rules of the module docstring."""
    if not (np.all(np.isfinite(ranges)) and np.all(np.isfinite(ts))):
        return np.full_like(x, np.nan)
    r0, r1, r2, r3 = ranges
    t0, t1, t2, t3 = ts
    with np.errstate(invalid="ignore", over="ignore"):
        relu = lambda v: np.maximum(v, 0.0)  # noqa: E731
        s = x + t0 * relu(r0 - x) + t1 * relu(x - r1) + t2 * relu(r2 - x) ** 2 + t3 * relu(x - r3) ** 2
    neg, pos = sigma_limits(ranges, ts)
    s = np.where(x == -np.inf, neg, s)
    s = np.where(x == np.inf, pos, s)
    return np.where(np.isnan(x), np.nan, s)


def reference(
    x: np.ndarray, ranges: np.ndarray, ts: np.ndarray, mask: np.ndarray | None = None, *, axis: int = -1
) -> tuple[np.ndarray]:
    """The float64 NumPy oracle of MultiMax: every backend (kernel, function body, torch, TVM) is held to it within
    OpDef.tolerance; it checks the contract first, so a bad input raises the same OpContractError."""
    a = validate(x, ranges, ts, mask, axis)
    z = sigma64(as_float64(x), as_float64(ranges), as_float64(ts))
    if mask is not None:
        z = z + as_float64(mask)
    return (softmax64(z, a),)


@function_body
def MultiMax(X, Ranges, Ts, Mask, axis: int = -1):
    # float64 throughout, as the reference and the kernel: z's absolute error is the output's relative
    # error, and float32 relu^2 would overflow for |x| > 1.8e19 where the double value is finite.
    x = op.Cast(X, to=11)
    ranges = op.Cast(Ranges, to=11)
    ts = op.Cast(Ts, to=11)
    zero = op.CastLike(0.0, x)
    one = op.CastLike(1.0, x)
    inf = op.CastLike(op.Constant(value_float=float("inf")), x)
    i0 = op.Constant(value_ints=[0])
    i1 = op.Constant(value_ints=[1])
    i2 = op.Constant(value_ints=[2])
    i3 = op.Constant(value_ints=[3])
    r0 = op.Gather(ranges, i0)
    r1 = op.Gather(ranges, i1)
    r2 = op.Gather(ranges, i2)
    r3 = op.Gather(ranges, i3)
    t0 = op.Gather(ts, i0)
    t1 = op.Gather(ts, i1)
    t2 = op.Gather(ts, i2)
    t3 = op.Gather(ts, i3)
    a = op.Relu(r0 - x)
    b = op.Relu(x - r1)
    c = op.Relu(r2 - x)
    d = op.Relu(x - r3)
    s = x + t0 * a + t1 * b + (t2 * c) * c + (t3 * d) * d
    # sigma(+-inf) is sigma's limit (module docstring), not IEEE arithmetic on the formula.
    neg_lin = op.Where(t0 < one, -inf, op.Where(t0 > one, inf, r0))
    neg = op.Where(t2 > zero, inf, op.Where(t2 < zero, -inf, neg_lin))
    pos_lin = op.Where(t1 > -one, inf, op.Where(t1 < -one, -inf, r1))
    pos = op.Where(t3 > zero, inf, op.Where(t3 < zero, -inf, pos_lin))
    s = op.Where(op.Equal(x, -inf), neg, op.Where(op.Equal(x, inf), pos, s))
    # 0 when every parameter is finite, NaN otherwise (x * 0 is NaN exactly for +-inf and NaN).
    poison = op.ReduceSum(ranges * zero, keepdims=0) + op.ReduceSum(ts * zero, keepdims=0)
    s = s + poison
    # An omitted Mask arrives as 0 (Port.body_fill; see softdeploy/ops/functions.py).
    return op.CastLike(op.Softmax(s + op.Cast(Mask, to=11), axis=axis), X)


def torch_impl(x: Any, ranges: Any, ts: Any, mask: Any = None, axis: int = -1) -> Any:
    """Eager torch MultiMax (computed in float32, returned in the input's type), registered as
    torch.ops.softdeploy.multi_max; it checks the contract first, like every backend."""
    import torch

    a = validate(x, ranges, ts, mask, axis)
    xf, r, t = x.double(), ranges.double(), ts.double()  # float64 throughout, as the function body
    r0, r1, r2, r3 = r.unbind()
    t0, t1, t2, t3 = t.unbind()
    a0, b, c, d = torch.relu(r0 - xf), torch.relu(xf - r1), torch.relu(r2 - xf), torch.relu(xf - r3)
    s = xf + t0 * a0 + t1 * b + (t2 * c) * c + (t3 * d) * d
    inf = torch.tensor(float("inf"), dtype=torch.float64)
    neg_lin = torch.where(t0 < 1, -inf, torch.where(t0 > 1, inf, r0))
    neg = torch.where(t2 > 0, inf, torch.where(t2 < 0, -inf, neg_lin))
    pos_lin = torch.where(t1 > -1, inf, torch.where(t1 < -1, -inf, r1))
    pos = torch.where(t3 > 0, inf, torch.where(t3 < 0, -inf, pos_lin))
    s = torch.where(xf == -inf, neg, torch.where(xf == inf, pos, s))
    s = s + (r * 0).sum() + (t * 0).sum()
    if mask is not None:
        s = s + mask.double()
    return torch.softmax(s, dim=a).to(x.dtype)


def infer_shapes(ctx: Any) -> None:
    """ONNX shape inference for MultiMax: the output has the input's type and shape."""
    ctx.set_output_type(0, ctx.get_input_type(0))


def _default_params() -> tuple[np.ndarray, np.ndarray]:
    # Learned-looking parameters with every term active on a N(0, 3) logit row.
    return np.array([-1.0, 1.5, -2.0, 2.5], np.float32), np.array([0.3, 0.2, 0.05, -0.04], np.float32)


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of MultiMax, drawn from ``rng``: typical sizes, edge sizes (empty, one element, the
    kernels' tile edges) and special values (+-inf, NaN, ties) on which every backend must agree."""

    def logits(*shape: int, scale: float = 3.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    ranges, ts = _default_params()
    yield Sample("rows_4x37", (logits(4, 37), ranges, ts))
    yield Sample("vocab_4x32000", (logits(4, 32000), ranges, ts))
    yield Sample("axis0_3d", (logits(7, 3, 5), ranges, ts), {"axis": 0})
    yield Sample("axis1_3d", (logits(2, 33, 3), ranges, ts), {"axis": 1})
    # Attention scores [B, H, Tq, Tk] with a padding mask [B, 1, 1, Tk] (0 / -inf).
    scores = logits(2, 3, 5, 19)
    pad = np.zeros((2, 1, 1, 19), np.float32)
    pad[0, ..., 15:] = -np.inf
    pad[1, ..., 7:] = -np.inf
    yield Sample("attention_padding_mask", (scores, ranges, ts, pad))
    causal = np.triu(np.full((19, 19), -np.inf, np.float32), k=1)
    yield Sample("causal_mask_2d", (logits(2, 2, 19, 19), ranges, ts, causal))
    yield Sample("mask_per_row_scalar", (logits(3, 4, 20), ranges, ts, logits(3, 4, 1)))
    yield Sample("mask_axis0", (logits(6, 5), ranges, ts, logits(6, 1)), {"axis": 0})
    yield Sample("mask_full_shape", (logits(3, 40), ranges, ts, logits(3, 40)))
    yield Sample("identity_params", (logits(3, 50), np.zeros(4, np.float32), np.zeros(4, np.float32)))
    yield Sample(
        "nonmonotone_params",
        (logits(3, 64), np.array([0.5, -0.5, 1.0, -1.0], np.float32), np.array([1.7, -1.6, -0.2, 0.3], np.float32)),
    )
    for n in (1, 7, 8, 15, 16, 17, 47, 48, 49, 1023, 1024, 1025, 3073):
        yield Sample(f"n{n}", (logits(3, n), ranges, ts), kind="edge")
    yield Sample("n17_masked", (logits(3, 17), ranges, ts, logits(17)), kind="edge")
    yield Sample("empty_rows", (np.zeros((0, 5), np.float32), ranges, ts), kind="edge")
    yield Sample("empty_axis", (np.zeros((3, 0), np.float32), ranges, ts), kind="edge")
    yield Sample("empty_axis_huge_rows", (np.zeros((2**40, 0), np.float32), ranges, ts), kind="edge")
    yield Sample("rank1", (logits(100), ranges, ts), kind="edge")
    special = logits(6, 50)
    special[0, 3] = special[0, 20] = -np.inf  # sigma(-inf) = +inf * sign(t2) = +inf here -> NaN row
    special[1, 7] = np.nan  # NaN row
    special[2, 11] = np.inf  # sigma(+inf) = -inf (t3 < 0) -> exactly 0
    special[3, :] = 2.5  # ties -> uniform
    special[4, :] = -np.inf  # sigma(-inf) = +inf for every entry -> NaN
    mask = np.zeros((6, 50), np.float32)
    mask[5, :] = -np.inf  # a fully masked row -> NaN
    mask[0, 30:] = -np.inf
    yield Sample("inf_nan_ties", (special, ranges, ts, mask), kind="special")
    # Identity parameters: sigma(+-inf) = +-inf, so -inf entries are masks (exactly 0).
    masked = logits(3, 40)
    masked[0, ::3] = -np.inf
    masked[1, :39] = -np.inf  # one finite entry -> exactly 1
    masked[2, 5] = np.inf  # +inf -> NaN row
    yield Sample("inf_identity_params", (masked, np.zeros(4, np.float32), np.zeros(4, np.float32)), kind="special")
    # Each limit case of sigma(+-inf): t2 = t3 = 0 and t0 == 1 / t1 == -1 give finite limits r0 / r1.
    edge = logits(4, 30)
    edge[:, 0] = -np.inf
    edge[:, 1] = np.inf
    limits = [
        (np.array([-1, 1, 0, 0], np.float32), np.array([1.0, -1.0, 0, 0], np.float32)),  # finite limits
        (np.array([-1, 1, 0, 0], np.float32), np.array([1.5, -1.5, 0, 0], np.float32)),  # -inf -> +inf, +inf -> -inf
        (np.array([-1, 1, 0, 0], np.float32), np.array([0.5, -0.5, 0, 0], np.float32)),  # -inf -> -inf, +inf -> +inf
        (np.array([-1, 1, 0, 0], np.float32), np.array([1.0, -1.0, -0.1, -0.1], np.float32)),  # quadratic: both -inf
    ]
    for i, (r, t) in enumerate(limits):
        yield Sample(f"sigma_limit_{i}", (edge[i : i + 1], r, t), kind="special")
    yield Sample("nan_parameter", (logits(2, 9), np.array([0, np.nan, 0, 0], np.float32), ts), kind="special")
    yield Sample("inf_parameter", (logits(2, 9), ranges, np.array([0, 0, np.inf, 0], np.float32)), kind="special")
    big = logits(2, 300) * 100.0
    yield Sample("large_magnitude", (big, ranges, np.array([0.3, 0.2, 0.0, 0.0], np.float32)), kind="special")
    # The Hugging Face additive mask finfo(float32).min (not -inf): partly, fully and sparsely masked rows
    # (a fully masked row is uniform: every z is the same -3.4e38). Its z log2(e) overflows float32.
    hf_ranges, hf_ts = np.array([-1, 1, -2, 2], np.float32), np.array([0.1, 0.1, 0.05, 0.05], np.float32)
    hf_mask = np.zeros((3, 16), np.float32)
    hf_mask[0, 10:] = np.finfo(np.float32).min
    hf_mask[1, :] = np.finfo(np.float32).min
    hf_mask[2, ::3] = np.finfo(np.float32).min
    yield Sample("hf_mask_finfo_min", (logits(3, 16, scale=1.0), hf_ranges, hf_ts, hf_mask), kind="special")
    # |z| far beyond 2^24: float32 range reduction has no bits left for t there.
    huge = np.zeros((6, 20), np.float32)
    huge[0] = np.float32(5.6e7) + logits(20, scale=4.0)
    huge[1] = np.float32(-5.6e7) + logits(20, scale=4.0)
    huge[2] = np.float32(1e7) + logits(20, scale=2.0)
    huge[3] = np.float32(3e6) + logits(20, scale=2.0)
    huge[4] = [3.3e38, 3.4e38, np.finfo(np.float32).max, -np.finfo(np.float32).max, 0.0] * 4
    huge[5] = [-3.3e38, -3.4e38, -np.finfo(np.float32).max, -1e30, -1e38] * 4
    zeros = np.zeros(4, np.float32)
    yield Sample("huge_logits", (huge, zeros, zeros), kind="special")
    one = np.array([[2.1e9], [-2.1e9], [3.4e38], [-3.4e38]], np.float32)  # one-element rows: exactly 1
    yield Sample("huge_one_element_rows", (one, zeros, zeros), kind="special")
    # relu^2 beyond float32 (|x| > 1.8e19): sigma is finite in float64, +-5e38 and more.
    far = np.array([[-1e20, 0.0, 1.0], [-2e19, -1e19, 3.0], [1e20, 2e20, -3e20], [-3e38, 3e38, 1.0]], np.float32)
    yield Sample("relu_squared_beyond_float32", (far, hf_ranges, hf_ts), kind="special")
    yield Sample(
        "relu_squared_beyond_float32_negative_t",
        (far, hf_ranges, np.array([0.1, 0.1, -0.05, -0.05], np.float32)),
        kind="special",
    )


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of MultiMax; every backend must refuse them with a message containing ``match`` (the
    operator reference lists them)."""
    x = np.zeros((2, 3), np.float32)
    r, t = _default_params()
    yield ErrorCase("axis_out_of_range", (x, r, t), {"axis": 2}, "axis 2 is out of range for an input of rank 2")
    yield ErrorCase("scalar_input", (np.float32(1.0).reshape(()), r, t), {}, "input must have rank >= 1")
    yield ErrorCase("ranges_shape", (x, r[:3], t), {}, "Ranges has shape [3] (rule: Ranges must have shape [4])")
    yield ErrorCase("ts_shape", (x, r, t.reshape(2, 2)), {}, "Ts has shape [2, 2] (rule: Ts must have shape [4])")
    yield ErrorCase(
        "mask_not_broadcastable",
        (x, r, t, np.zeros((2, 2), np.float32)),
        {},
        "Mask of shape [2, 2] is not broadcastable to X of shape [2, 3]",
    )
    yield ErrorCase(
        "mask_rank_too_high",
        (x, r, t, np.zeros((1, 2, 3), np.float32)),
        {},
        "Mask of shape [1, 2, 3] is not broadcastable to X of shape [2, 3]",
    )


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(
        Port("X"),
        Port("Ranges", doc="(r0, r1, r2, r3), shape [4]"),
        Port("Ts", doc="(t0, t1, t2, t3), shape [4]"),
        Port("Mask", optional=True, doc="additive mask broadcastable to X, added after sigma", body_fill=0.0),
    ),
    outputs=(Port("Y"),),
    attrs=(Attr("axis", int, -1, "axis along which to normalise; negative counts from the back"),),
    reference=reference,
    function=MultiMax,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    infer_shapes=infer_shapes,
    # float32: z in float64 in every kernel variant, so the bound holds at any |z|: the float exp
    # polynomial, float staging and float block sums remain (measured 4.8e-7; module docstring).
    tolerance={"float32": (2e-6, 1e-37), "float16": (2e-3, 1e-7)},
    source="Zhou, Fritz & Keuper, ICML 2024, arXiv 2406.01189; ZhouYuxuanYX/MultiMax (SeLU modulator)",
)
