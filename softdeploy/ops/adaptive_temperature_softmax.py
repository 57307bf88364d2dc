"""AdaptiveTemperatureSoftmax: softmax sharpened by an inverse temperature chosen from its entropy.

    p = softmax(x, axis),   H = -sum_j p_j * log(p_j + 1e-9)   (nats)
    beta = max(-0.037 H^4 + 0.481 H^3 - 2.3 H^2 + 4.917 H - 1.791, 1)   if H > 0.5 else 1
    Y = softmax(beta * x, axis)

(Velickovic, Perivolaropoulos, Barbero & Pascanu, "softmax is not enough (for sharp
out-of-distribution)", arXiv 2410.01104; the constants of the paper's JAX listing.) beta >= 1 always,
so Y is never flatter than softmax(x); beta > 1 only for 0.849 < H < 5.944 (the polynomial's
maximum, 2.42, is at H = 4.412), and the H > 0.5 gate never changes beta (the polynomial is below 1
on [0, 0.849]). -inf entries give exactly 0 (p log(p + 1e-9) = 0 for them); a row holding NaN or
+inf, or only -inf entries, is all NaN (its p is NaN, hence beta = 1 and Y = softmax(x) = NaN).

Kernel (ops/adaptive_temperature_softmax.cc), per row, with m = max x, e_j = exp(x_j - m), d = sum e_j:
  pass 1 (one read) accumulates m, d and S = sum e_j (x_j - m) online (per-lane running max with
  rescaling), giving the entropy WITHOUT the epsilon exactly:  H0 = log d - S/d.
  The contract's epsilon is then H = H0 - C with C = sum_j p_j log(1 + 1e-9/p_j) = 1e-9 * sum_j g(v_j),
  g(v) = log(1 + e^v) e^-v in [0, 1], v_j = log(1e-9 d) + m - x_j; so 0 <= C <= 1e-9 * n (2.6e-4 for
  n = 256000: not negligible -- beta moves up to 2.5x that).
  If beta is 1 on the whole interval [H0 - 1e-9 n, H0] (the common case for flat rows), the output
  pass writes softmax(x) from m and d: 2 reads of X in total.
  Otherwise pass 2 (one read) computes C together with the moments W_k = sum_j w_j z_j^k (k = 0..3) of
  w_j = exp(beta_hat z_j), z_j = x_j - m, at beta_hat = beta(H0 - 1e-9 n / 2); the exact beta = beta(H0 - C)
  differs by |delta| <= 2.53 * 1e-9 n / 2, and log sum_j exp(beta z_j) follows from the cumulant expansion
  log W0 + delta k1 + delta^2 k2 / 2 + delta^3 k3 / 6 (truncation error below 1e-10 while
  |delta| <= 4e-4, i.e. for rows up to ~300k entries; longer rows take one more exact pass). The
  output pass writes exp(beta z_j) / sum: 3 reads of X in total.

Conditioning: y_j = exp(beta z_j) / sum_k exp(beta z_k), so d log y_j = d beta * (z_j - E_y[z]) with
d beta = beta'(H) dH, |beta'| <= 2.53: an entropy error dH becomes a relative output error of up to
2.53 * |z_j - E_y z| * dH -- about 75 dH for the ~1e-12 tail entries of a peaked 256000-entry row
(|z| ~ 27). The entropy must therefore be ~100x more accurate than the output.

Accuracy promised for float32 inputs (relative, against the float64 reference; atol 1e-37):
  * kernel: 2e-5 (every ISA; measured 5.8e-6 at most over the samples, on long peaked rows): sums in
    double across blocks, H0 = log d - S/d and beta in double; the float32 exp of z and of beta * z
    (relative error ~1e-7 each, times |z|) is what remains.
  * function body and torch op: 1e-6 (measured 6e-8, the float32 rounding of the output): they work
    in float64 throughout -- z = x - max, the entropy, beta (with float64 constants) and the output
    softmax. Their former float32 form lost 5.2e-5 on this sample set on AVX-512 hosts and 2.0e-4 on
    AVX2 hosts (vocab_peaked_2x256000): a float32 softmax's normalisation error (its float32 row sum,
    ~1e-6 at n = 256000 and dependent on the ISA's exp and summation order) moves H by about that times
    |H - 1|, the float32 polynomial (terms ~37 cancelling to beta ~2.4) adds a few 1e-6 to beta, and
    both are amplified as above.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from softdeploy.ops._body import function_body
from softdeploy.ops._common import as_float64, normalize_axis, require_rank_at_least_one, softmax64
from softdeploy.ops._schema import Attr, ErrorCase, OpDef, Port, Sample

if TYPE_CHECKING:  # bound when the body is compiled (softdeploy/ops/_body.py)
    from onnxscript import opset18 as op

NAME = "AdaptiveTemperatureSoftmax"
EPS = 1e-9
# np.polyval order (highest power first).
POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)
ENTROPY_GATE = 0.5


def validate(x: Any, axis: int) -> int:
    """Checks AdaptiveTemperatureSoftmax's inputs and attributes and raises OpContractError naming the op, the value and
    the rule (in the kernel's words); returns the axis, normalised to [0, rank)."""
    require_rank_at_least_one(NAME, x)
    return normalize_axis(NAME, axis, np.ndim(x))


def entropy64(x: np.ndarray, axis: int) -> np.ndarray:
    """H = -sum p log(p + 1e-9) in float64, keepdims (NaN for rows whose softmax is NaN)."""
    p = softmax64(x, axis)
    with np.errstate(invalid="ignore"):
        return -np.sum(p * np.log(p + EPS), axis=axis, keepdims=True)


def beta64(h: np.ndarray) -> np.ndarray:
    """The inverse temperature beta(H) = max(poly(H), 1) for entropy H > 0.5, else 1 (Velickovic et al.'s fitted
    quartic), in float64."""
    with np.errstate(invalid="ignore"):
        return np.where(h > ENTROPY_GATE, np.maximum(np.polyval(POLY, h), 1.0), 1.0)


def reference(x: np.ndarray, *, axis: int = -1) -> tuple[np.ndarray]:
    """The float64 NumPy oracle of AdaptiveTemperatureSoftmax: every backend (kernel, function body, torch, TVM) is held
    to it within OpDef.tolerance; it checks the contract first, so a bad input raises the same OpContractError."""
    a = validate(x, axis)
    xf = as_float64(x)
    if xf.shape[a] == 0:
        return (np.empty_like(xf),)
    beta = beta64(entropy64(xf, a))
    with np.errstate(invalid="ignore"):
        return (softmax64(beta * xf, a),)


@function_body
def AdaptiveTemperatureSoftmax(X, axis: int = -1):
    # An empty X returns at once: the row reductions below would allocate [2^40, 1] for X [2^40, 0].
    if op.Equal(op.Size(X), op.Constant(value_int=0)):
        out = op.Identity(X)
    else:
        # Everything in float64 (module docstring, "Function body and torch op"): beta's slope (up to 2.5)
        # times |x - max| (~30) turns an entropy error into a 75x larger relative output error, and a
        # float32 softmax's normalisation error alone (its float32 row sum: ~1e-6 at n = 256000, depending
        # on the ISA's exp and summation order) moves H by that much times |H - 1|.
        x = op.Cast(X, to=11)
        axes = op.Reshape(op.Constant(value_int=axis), op.Constant(value_ints=[1]))
        z = x - op.ReduceMax(x, axes, keepdims=1)  # exact in float64; beta * (x - max), not beta * x
        # float64 constants from exact integer ratios (a literal like 2.3 would be float32 in onnxscript:
        # 2.3 - float32(2.3) = 4.8e-8, times H^2 ~ 16, is a beta error of 8e-7, 2e-5 in the output).
        thousand = op.Cast(op.Constant(value_int=1000), to=11)
        c = op.Div(op.Cast(op.Constant(value_ints=[-37, 481, -2300, 4917, -1791]), to=11), thousand)
        eps = op.Div(op.Cast(op.Constant(value_int=1), to=11), op.Cast(op.Constant(value_int=1000000000), to=11))
        p = op.Softmax(z, axis=axis)
        h = op.Neg(op.ReduceSum(p * op.Log(p + eps), axes, keepdims=1))
        poly = op.Gather(c, op.Constant(value_int=0)) * h + op.Gather(c, op.Constant(value_int=1))
        poly = poly * h + op.Gather(c, op.Constant(value_int=2))
        poly = poly * h + op.Gather(c, op.Constant(value_int=3))
        poly = poly * h + op.Gather(c, op.Constant(value_int=4))
        one = op.CastLike(1.0, h)
        beta = op.Where(op.Greater(h, op.CastLike(0.5, h)), op.Max(poly, one), one)
        out = op.CastLike(op.Softmax(beta * z, axis=axis), X)
    return out


def torch_impl(x: Any, axis: int = -1) -> Any:
    """Eager torch AdaptiveTemperatureSoftmax (computed in float32, returned in the input's type), registered as
    torch.ops.softdeploy.adaptive_temperature_softmax; it checks the contract first, like every backend."""
    import torch

    a = validate(x, axis)
    if x.shape[a] == 0:
        return torch.empty_like(x)
    xd = x.double()  # float64 throughout, as the function body (module docstring)
    z = xd - xd.amax(dim=a, keepdim=True)  # beta * (x - max): see the function body
    p = torch.softmax(z, dim=a)
    h = -(p * torch.log(p + EPS)).sum(dim=a, keepdim=True)
    poly = (((POLY[0] * h + POLY[1]) * h + POLY[2]) * h + POLY[3]) * h + POLY[4]
    beta = torch.where(h > ENTROPY_GATE, torch.clamp(poly, min=1.0), torch.ones_like(h))
    return torch.softmax(beta * z, dim=a).to(x.dtype)


def infer_shapes(ctx: Any) -> None:
    """ONNX shape inference for AdaptiveTemperatureSoftmax: the output has the input's type and shape."""
    ctx.set_output_type(0, ctx.get_input_type(0))


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of AdaptiveTemperatureSoftmax, drawn from ``rng``: typical sizes, edge sizes (empty, one
    element, the kernels' tile edges) and special values (+-inf, NaN, ties) on which every backend must agree."""

    def logits(*shape: int, scale: float = 3.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def peaked(rows: int, n: int, entropy_scale: float) -> np.ndarray:
        # A few strong logits over a flat tail: entropies inside beta's active window (0.85 < H < 5.9).
        x = logits(rows, n, scale=1.0)
        for r in range(rows):
            x[r, rng.choice(n, size=min(n, 3), replace=False)] += entropy_scale
        return x

    yield Sample("rows_4x37", (logits(4, 37),))
    yield Sample("sharpened_4x37", (logits(4, 37, scale=1.0),))  # H ~ 3: beta ~ 2.3
    yield Sample("vocab_4x32000", (logits(4, 32000),))  # H ~ 7: beta = 1
    yield Sample("vocab_peaked_4x32000", (peaked(4, 32000, 9.0),))  # beta > 1 on a long row
    yield Sample("vocab_peaked_2x256000", (peaked(2, 256000, 11.0),))  # epsilon term ~ 1e-4 matters
    yield Sample("low_entropy", (peaked(3, 100, 12.0),))  # H < 0.5: the gate
    yield Sample("axis0_3d", (logits(7, 3, 5, scale=1.0),), {"axis": 0})
    yield Sample("axis1_3d", (logits(2, 33, 3, scale=1.0),), {"axis": 1})
    yield Sample("axis_minus2", (logits(5, 6, 4),), {"axis": -2})
    for n in (1, 2, 7, 8, 15, 16, 17, 47, 48, 49, 255, 256, 257, 1023, 1024, 1025, 3073):
        yield Sample(f"n{n}", (logits(3, n, scale=1.0),), kind="edge")
    yield Sample("empty_rows", (np.zeros((0, 5), np.float32),), kind="edge")
    yield Sample("empty_axis", (np.zeros((3, 0), np.float32),), kind="edge")
    # 2^40 empty rows: no data, so every backend returns at once (the body's row reductions would
    # allocate [2^40, 1]).
    yield Sample("empty_axis_huge_rows", (np.zeros((2**40, 0), np.float32),), kind="edge")
    yield Sample("rank1", (logits(100, scale=1.0),), kind="edge")
    big = logits(2, 300)
    big[0] += 1e4
    big[1] -= 1e4
    yield Sample("large_magnitude_1e4", (big,), kind="special")
    special = logits(7, 50, scale=1.0)
    special[0, 3] = special[0, 20] = -np.inf  # masked entries -> exactly 0
    special[1, :] = -np.inf  # fully masked row -> NaN
    special[2, 7] = np.nan  # NaN row
    special[3, 11] = np.inf  # +inf row -> NaN
    special[4, :] = 2.5  # ties: H = log 50, beta = 1 -> uniform
    special[5, :49] = -np.inf  # one finite entry -> exactly 1
    special[6, :40] = -np.inf  # 10 finite entries, beta > 1
    yield Sample("inf_nan_ties", (special,), kind="special")


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of AdaptiveTemperatureSoftmax; every backend must refuse them with a message
    containing ``match`` (the operator reference lists them)."""
    x = np.zeros((2, 3), np.float32)
    yield ErrorCase("axis_out_of_range", (x,), {"axis": 2}, "axis 2 is out of range for an input of rank 2")
    yield ErrorCase("axis_too_negative", (x,), {"axis": -3}, "axis -3 is out of range")
    yield ErrorCase("scalar_input", (np.float32(1.0).reshape(()),), {}, "input must have rank >= 1")


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(Port("X"),),
    outputs=(Port("Y"),),
    attrs=(Attr("axis", int, -1, "axis along which to normalise; negative counts from the back"),),
    reference=reference,
    function=AdaptiveTemperatureSoftmax,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    infer_shapes=infer_shapes,
    tolerance={"float32": (2e-5, 1e-37), "float16": (2e-3, 1e-7)},
    source="Velickovic, Perivolaropoulos, Barbero & Pascanu 2024, arXiv 2410.01104 (JAX listing)",
)
