"""Softpick: a rectified, not-sum-to-one replacement of softmax (Zuhri, Fuadi & Aji 2025).

    m   = max_j x_j                 over the FINITE entries of the row (along ``axis``)
    e_j = exp(x_j - m) - exp(-m)    (= exp(-m) * (exp(x_j) - 1))
    y_i = max(e_i, 0) / (sum_{j: x_j finite} |e_j| + eps)

Rules (docs/ops/Softpick.md):

* Outputs are exactly 0 where ``x_i <= 0``; rows do not sum to 1 (``sum_i y_i <= 1``: the
  denominator also counts the negative side, and eps).
* Non-finite entries (-inf used as a mask, +inf, NaN) contribute 0 to the denominator and are left
  out of ``m``; a -inf entry outputs 0.
* A row with no finite entry outputs all zeros (a fully masked row "attends to nothing").
* ``eps`` must be finite and ``>= 0``; anything else is an error (a negative eps can make the
  denominator 0 or negative: silent infinities or sign flips). ``eps = 0`` is allowed: a row whose
  denominator is then 0 has only non-positive entries, so its outputs are 0 by the first rule.

Our reading of +inf and NaN entries (the contract says what they add to the denominator, not what they
output). The general rule "NaN inputs propagate to the outputs of the row they are in" holds unless
an op says otherwise, and Softpick does: ``m`` is taken over the finite entries and non-finite entries
add 0 to the denominator -- rules that differ from "max over all entries" only when +inf or NaN is
present, so they exist precisely to keep the rest of the row well defined. Hence:

* a NaN entry outputs NaN (it propagates to its own output), and does not disturb the other entries;
* a +inf entry outputs +inf: the formula evaluated literally, ``max(exp(+inf - m) - exp(-m), 0) / d``
  with a finite ``d``; the other entries are not disturbed either;
* a row with no finite entry is all zeros even where it holds NaN or +inf (the explicit row rule
  takes precedence over the general NaN rule).

The same semantics hold in the reference, the kernel, the torch op and the function body.

Numerics: ``e_j`` is evaluated without cancellation as
``|e_j| = exp(max(x_j, 0) - m) * (1 - exp(-|x_j|))``, the second factor as ``-expm1(-|x_j|)`` (in
the function body, which has no Expm1, as ``tanh(|x_j|/2) * (1 + exp(-|x_j|))``), so entries near 0
keep their relative precision, a very negative ``m`` (``exp(-m)`` overflows) gives exact zeros
instead of NaN, and a large ``m`` does not overflow. The kernel (ops/softpick.cc) works in the
equivalent unshifted form ``y_i = expm1(x_i) / (sum_j |expm1(x_j)| + eps * exp(m))`` with a running
power-of-two scale, in one statistics pass (which also stages the numerators in Y) and one scaling
pass; rows whose finite max exceeds 2^16 take a float64 path instead. The eps term, eps * e^m at the
row's scale 2^-R, is e^(m - R ln2) with m and R ln2 cancelling, so that exponent is formed in float64
(in float32 its rounding, ~ulp(m)/2, cost 2e-4 relative at eps = 0.388, m = 2.77e4). Kernel: relative
error <= 1e-6 (measured 2.1e-7, every sample and ISA, eps = 0.388 at m = 2.77e4 and 6.5e4 included)
against the float64 reference for float32 inputs. The function body and the torch op compute the
shifted form in float32, where eps is added to a sum of order 1 (no cancellation, at any m); their
float32 row sums make them looser on long rows: measured 4.8e-6 (body in onnxruntime, n = 32000) and
7.1e-7 (torch).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from softdeploy.errors import OpContractError
from softdeploy.ops._body import function_body
from softdeploy.ops._common import as_float64, normalize_axis, require_rank_at_least_one
from softdeploy.ops._schema import Attr, ErrorCase, OpDef, Port, Sample

if TYPE_CHECKING:  # bound when the body is compiled (softdeploy/ops/_body.py)
    from onnxscript import FLOAT
    from onnxscript import opset18 as op

NAME = "Softpick"


def validate(x: Any, axis: int, eps: float) -> int:
    """Checks Softpick's inputs and attributes and raises OpContractError naming the op, the value and the rule (in the
    kernel's words); returns the axis, normalised to [0, rank)."""
    require_rank_at_least_one(NAME, x)
    a = normalize_axis(NAME, axis, np.ndim(x))
    if not (math.isfinite(eps) and eps >= 0):
        # ":g" prints a float like the kernel's ostream (-1, 0.5, nan, inf): the messages are identical.
        raise OpContractError(f"{NAME}: eps {eps:g} is not a finite number >= 0 (rule: 0 <= eps < inf)")
    return a


def reference(x: np.ndarray, *, axis: int = -1, eps: float = 1e-6) -> tuple[np.ndarray]:
    """The float64 NumPy oracle of Softpick: every backend (kernel, function body, torch, TVM) is held to it within
    OpDef.tolerance; it checks the contract first, so a bad input raises the same OpContractError."""
    a = validate(x, axis, eps)
    x64 = np.moveaxis(as_float64(x), a, -1)
    if x64.shape[-1] == 0:
        return (np.moveaxis(np.empty_like(x64), -1, a),)
    finite = np.isfinite(x64)
    z = np.where(finite, x64, 0.0)
    m = np.max(np.where(finite, x64, -np.inf), axis=-1, keepdims=True)
    has_finite = m > -np.inf
    with np.errstate(over="ignore", invalid="ignore"):
        # |e_j| = |exp(z - m) - exp(-m)| = exp(max(z, 0) - m) * (1 - exp(-|z|)), free of cancellation.
        mag = np.where(finite, np.exp(np.maximum(z, 0.0) - np.where(has_finite, m, 0.0)) * -np.expm1(-np.abs(z)), 0.0)
        d = np.sum(mag, axis=-1, keepdims=True) + eps
        y = np.where(z > 0, mag / d, 0.0)  # z > 0 only at finite positive entries, where d >= |e_i| > 0
    y = np.where(np.isnan(x64) | (x64 == np.inf), x64, y)  # NaN -> NaN, +inf -> +inf
    y = np.where(has_finite, y, 0.0)  # no finite entry: all zeros
    return (np.moveaxis(y, -1, a),)


@function_body
def Softpick(X, axis: int = -1, eps: float = 1e-6):
    # An empty X returns at once: the row reductions below would allocate [2^40, 1] for X [2^40, 0].
    if op.Equal(op.Size(X), op.Constant(value_int=0)):
        out = op.Identity(X)
    else:
        xf = op.Cast(X, to=FLOAT.dtype)  # float16 is computed in float32
        axes = op.Reshape(op.Constant(value_int=axis), op.Constant(value_ints=[1]))
        zero = op.Constant(value_float=0.0)
        one = op.Constant(value_float=1.0)
        nan_or_pos_inf = op.Or(op.IsNaN(xf), op.IsInf(xf, detect_negative=0))
        finite = op.Not(op.Or(op.IsNaN(xf), op.IsInf(xf)))
        z = op.Where(finite, xf, zero)
        m = op.ReduceMax(op.Where(finite, xf, op.Constant(value_float=float("-inf"))), axes, keepdims=1)
        has_finite = op.Greater(m, op.Constant(value_float=float("-inf")))
        m_safe = op.Where(has_finite, m, zero)
        a = op.Abs(z)
        # g = 1 - exp(-a) = -expm1(-a), computed as tanh(a/2) * (1 + exp(-a)): 1 - exp(-a) itself would
        # lose ~log10(1/a) digits to cancellation near 0, where tanh keeps its relative precision.
        g = op.Mul(op.Tanh(op.Mul(a, op.Constant(value_float=0.5))), op.Add(one, op.Exp(op.Neg(a))))
        # |e_j| = exp(max(z, 0) - m) * g: no exp(-m) that could overflow when m is very negative.
        mag = op.Mul(op.Exp(op.Sub(op.Max(z, zero), m_safe)), g)
        d = op.Add(op.ReduceSum(mag, axes, keepdims=1), op.CastLike(eps, xf))
        y = op.Where(op.Greater(z, zero), op.Div(mag, d), zero)
        y = op.Where(op.And(nan_or_pos_inf, has_finite), xf, y)
        out = op.CastLike(y, X)
    return out


def torch_impl(x: Any, axis: int = -1, eps: float = 1e-6) -> Any:
    """Eager torch Softpick (computed in float32, returned in the input's type), registered as
    torch.ops.softdeploy.softpick; it checks the contract first, like every backend."""
    import torch

    validate(x, axis, eps)
    if x.numel() == 0:
        return torch.empty_like(x)
    xf = x.float()
    finite = torch.isfinite(xf)
    z = torch.where(finite, xf, 0.0)
    m = torch.where(finite, xf, float("-inf")).amax(dim=axis, keepdim=True)
    has_finite = m > float("-inf")
    mag = torch.exp(z.clamp_min(0.0) - torch.where(has_finite, m, 0.0)) * -torch.expm1(-z.abs())
    d = mag.sum(dim=axis, keepdim=True) + eps
    y = torch.where(z > 0, mag / d, 0.0)
    y = torch.where((torch.isnan(xf) | torch.isposinf(xf)) & has_finite, xf, y)
    return y.to(x.dtype)


def infer_shapes(ctx: Any) -> None:
    """ONNX shape inference for Softpick: the output has the input's type and shape."""
    ctx.set_output_type(0, ctx.get_input_type(0))


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of Softpick, drawn from ``rng``: typical sizes, edge sizes (empty, one element, the
    kernels' tile edges) and special values (+-inf, NaN, ties) on which every backend must agree."""

    def logits(*shape: int, scale: float = 3.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    yield Sample("rows_4x37", (logits(4, 37),))
    yield Sample("vocab_4x32000", (logits(4, 32000),))
    yield Sample("eps_default_of_authors_1e-8", (logits(3, 100),), {"eps": 1e-8})
    yield Sample("axis0_3d", (logits(7, 3, 5),), {"axis": 0})
    yield Sample("axis1_3d", (logits(2, 33, 3),), {"axis": 1})
    yield Sample("axis_minus2", (logits(5, 6, 4),), {"axis": -2})
    # attention scores with a causal -inf mask (the paper's use)
    scores = logits(2, 3, 17, 17, scale=1.5)
    scores[..., np.triu_indices(17, 1)[0], np.triu_indices(17, 1)[1]] = -np.inf
    yield Sample("causal_attention_2x3x17x17", (scores,))
    # tile edges: AVX-512 (16, 64 per unrolled step), AVX2 (8, 16), the 1024-element summation block
    for n in (1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1023, 1024, 1025, 3073):
        yield Sample(f"n{n}", (logits(3, n),), kind="edge")
    yield Sample("empty_rows", (np.zeros((0, 5), np.float32),), kind="edge")
    yield Sample("empty_axis", (np.zeros((3, 0), np.float32),), kind="edge")
    # 2^40 empty rows: no data, so every backend returns at once (the body's row reductions would
    # allocate [2^40, 1]).
    yield Sample("empty_axis_huge_rows", (np.zeros((2**40, 0), np.float32),), kind="edge")
    yield Sample("rank1", (logits(100),), kind="edge")
    yield Sample(
        "eps_zero",
        (np.array([[0.0, 0.0, 0.0], [0.0, -1.0, -2.0], [0.0, 1.0, -1.0]], np.float32),),
        {"eps": 0.0},
        kind="edge",
    )
    yield Sample("eps_large", (logits(2, 40),), {"eps": 1e3}, kind="edge")
    near_zero = logits(3, 200, scale=1e-3)
    near_zero[1] *= 1e-20  # |x| ~ 1e-23: expm1 must not cancel
    near_zero[2, ::2] = np.float32(1e-40)  # subnormal inputs
    yield Sample("near_zero", (near_zero,), kind="special")
    negative = logits(4, 300)
    negative[0] = -np.abs(negative[0])  # all <= 0: all zeros
    negative[1] = negative[1] - 100.0  # m ~ -90: exp(-m) overflows float32
    negative[2] = negative[2] - 1e4
    negative[3] = -np.abs(negative[3]) - 1e30
    yield Sample("very_negative_max", (negative,), kind="special")
    big = logits(4, 3000)
    big[0] += 80.0  # just above the kernel's first rescale threshold (~69)
    big[1] += 1e4
    big[2, 2500] = 300.0  # a large logit late in the row: the staged prefix is rescaled
    big[3, 10] = 1e5  # beyond the float32 fast path's range (2^16): exact double fallback
    big[3, 11] = np.finfo(np.float32).max
    yield Sample("large_magnitude", (big,), kind="special")
    # A significant eps with a large max: the eps term eps * e^m is formed at the row's power-of-two
    # scale, e^(m - R ln2) with m - R ln2 cancelling (m up to 2^16); float32 there cost 2e-4 relative.
    eps_rows = np.concatenate(
        [
            np.full((1, 40), 2.77e4, np.float32),
            logits(1, 40) + np.float32(2.77e4),
            logits(1, 40) + np.float32(6.5e4),
            np.concatenate([[2.77e4], logits(39)]).astype(np.float32)[None],
        ]
    )
    eps_rows[0, 1:] = logits(39)
    yield Sample("eps_significant_large_max", (eps_rows,), {"eps": 0.388}, kind="special")
    yield Sample("wide_range", (np.linspace(-1e4, 1e4, 2 * 99, dtype=np.float32).reshape(2, 99),), kind="special")
    special = logits(9, 50)
    special[0, 3] = special[0, 20] = -np.inf  # masked entries -> exactly 0, left out of the denominator
    special[1, :] = -np.inf  # fully masked row -> all zeros
    special[2, 7] = np.nan  # NaN entry -> NaN there, the rest of the row unaffected
    special[3, 11] = np.inf  # +inf entry -> +inf there, the rest of the row unaffected
    special[4, :] = 2.5  # ties
    special[5, :49] = -np.inf  # one finite entry
    special[6, :] = np.nan  # no finite entry -> all zeros
    special[7, ::2] = np.inf  # no finite entry (+inf and -inf) -> all zeros
    special[7, 1::2] = -np.inf
    special[8, :10] = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e4, 2.0, 3.0])
    yield Sample("inf_nan_ties", (special,), kind="special")


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of Softpick; every backend must refuse them with a message containing ``match`` (the
    operator reference lists them)."""
    x = np.zeros((2, 3), np.float32)
    yield ErrorCase("axis_out_of_range", (x,), {"axis": 2}, "axis 2 is out of range for an input of rank 2")
    yield ErrorCase("axis_too_negative", (x,), {"axis": -3}, "axis -3 is out of range")
    yield ErrorCase("scalar_input", (np.float32(1.0).reshape(()),), {}, "input must have rank >= 1")
    yield ErrorCase("eps_negative", (x,), {"eps": -0.5}, "eps -0.5 is not a finite number >= 0 (rule: 0 <= eps < inf)")
    yield ErrorCase("eps_nan", (x,), {"eps": float("nan")}, "eps nan is not a finite number >= 0")
    yield ErrorCase("eps_inf", (x,), {"eps": float("inf")}, "eps inf is not a finite number >= 0")


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(Port("X"),),
    outputs=(Port("Y"),),
    attrs=(
        Attr("axis", int, -1, "axis along which to normalise; negative counts from the back"),
        Attr("eps", float, 1e-6, "added to the (max-shifted) denominator; finite and >= 0"),
    ),
    reference=reference,
    function=Softpick,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    infer_shapes=infer_shapes,
    tolerance={"float32": (1e-6, 1e-30), "float16": (2e-3, 1e-6)},
    source="Zuhri, Fuadi & Aji 2025, arXiv 2504.20966; zaydzuhri/softpick-attention (naive_softpick_attn.py)",
)
