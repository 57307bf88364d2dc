"""SoftpickAttention: attention whose weights are Softpick instead of softmax (Zuhri, Fuadi & Aji 2025).

    S = Q Kᵀ · scale + Mask                     [B, H, Tq, Tk]   (key/value head of query head h: h // (H / Hk))
    S_ij = -inf where causal and j > i + Tk - Tq                   (causal aligned bottom-right)
    W = Softpick(S, axis=-1, eps)                (docs/ops/Softpick.md: m = max of the finite S_ij,
                                                  e_j = exp(S_j - m) - exp(-m), W_i = max(e_i, 0) / (sum |e_j| + eps))
    O = W · V                                    [B, H, Tq, Dv]

Inputs (docs/ops/SoftpickAttention.md): Q ``[B, H, Tq, D]``, K ``[B, Hk, Tk, D]``, V ``[B, Hk, Tk, Dv]`` with
``H % Hk == 0`` (grouped query heads: query head ``h`` uses key/value head ``h // (H / Hk)``), optional
additive Mask broadcastable (numpy rules, rank <= 4) to ``[B, H, Tq, Tk]`` (0 or -inf typically; any
float is added as it is). Attributes: ``scale`` (0, the default, means ``1/sqrt(D)``; the value used is
rounded to float32 like any FLOAT attribute), ``causal`` (0 or 1), ``eps`` (finite, >= 0).

Rules, all following from the composition above (so the four forms agree on every input):

* A query row that sees no key (fully masked, or causal with ``i + Tk - Tq < 0``) has all-zero
  weights, so its output is ``0 · V``: zeros. Rows whose scores are all <= 0 output zeros too.
* NaN and inf follow Softpick's rules and then IEEE arithmetic of ``W · V``: a NaN score (from a NaN in
  Q or K, or in the Mask) gives a NaN weight, hence a NaN output row -- unless the row has no finite
  score at all (e.g. a NaN query row), whose weights are all 0. A non-finite V row poisons every output
  column it meets, also through a weight of exactly 0 (``0 · NaN = NaN``, ``0 · inf = NaN``), also
  where causal masking hides the key.
* ``Tk = 0`` or ``Dv = 0`` or an empty batch gives zeros / an empty output of shape ``[B, H, Tq, Dv]``.
* Errors: ranks other than 4, mismatched B / Hk / Tk / D between Q, K and V, ``Hk = 0``, ``D = 0``,
  ``H % Hk != 0``, a Mask that does not broadcast, a non-finite scale, causal not in {0, 1}, a
  negative or non-finite eps.

Forms: the float64 reference below; the function body (standard ONNX, computed in float64 like the
reference -- it materialises ``[B, H, Tq, Tk]``); the torch op (float64 too); the kernel
(ops/softpick_attention.cc), flash-style: one pass over key blocks per query block, never the
``[Tq, Tk]`` matrix, with the online rescaling worked out for softpick there (running max, terms
``expm1(s) · 2^-R``, rescale by ``2^(R_old - R_new)``, ``eps`` joined at the end as ``eps·e^(m - R ln2)``).
Rows with special values (non-finite Q row, K, V or Mask entries, or scores beyond ``2^16``) take
the kernel's exact float64 path, which evaluates the composition literally.

Accuracy: O is linear in V, so the absolute tolerance (atol below) is per unit of V: multiplied by
``max(1, max|V|)`` over the keys, per head and column.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from softdeploy.errors import OpContractError
from softdeploy.ops._body import function_body
from softdeploy.ops._schema import Attr, ErrorCase, OpDef, Port, Sample

if TYPE_CHECKING:  # bound when the body is compiled (softdeploy/ops/_body.py)
    from onnxscript import BOOL, DOUBLE, FLOAT
    from onnxscript import opset18 as op

NAME = "SoftpickAttention"
_LAYOUT = "rule: Q [B, H, Tq, D], K [B, Hk, Tk, D], V [B, Hk, Tk, Dv]"


def _shape_str(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def validate(q: Any, k: Any, v: Any, mask: Any, scale: float, causal: int, eps: float) -> float:
    """Checks shapes and attributes (messages word for word as the kernel's); returns the scale used
    (float32-rounded; 0 -> 1/sqrt(D))."""
    for port, x in (("Q", q), ("K", k), ("V", v)):
        if np.ndim(x) != 4:
            raise OpContractError(f"{NAME}: {port} must have rank 4, got rank {np.ndim(x)} ({_LAYOUT})")
    # the dims as they are (no int(): under torch.export they are symbols, and int() would fix them)
    qs, ks, vs = (tuple(np.shape(x)) for x in (q, k, v))
    if ks[0] != qs[0] or vs[0] != qs[0]:
        raise OpContractError(f"{NAME}: batch sizes differ: Q {qs[0]}, K {ks[0]}, V {vs[0]} ({_LAYOUT})")
    if ks[3] != qs[3]:
        raise OpContractError(f"{NAME}: K has head size D={ks[3]} but Q has D={qs[3]} ({_LAYOUT})")
    if vs[1] != ks[1] or vs[2] != ks[2]:
        raise OpContractError(f"{NAME}: V has Hk={vs[1]}, Tk={vs[2]} but K has Hk={ks[1]}, Tk={ks[2]} ({_LAYOUT})")
    if qs[3] == 0:
        raise OpContractError(f"{NAME}: head size D=0 (rule: D >= 1)")
    if ks[1] == 0:
        raise OpContractError(f"{NAME}: Hk=0 key/value heads (rule: Hk >= 1)")
    if qs[1] % ks[1] != 0:
        raise OpContractError(
            f"{NAME}: H={qs[1]} query heads is not a multiple of Hk={ks[1]} key/value heads (rule: H % Hk == 0)"
        )
    if mask is not None:
        target = (qs[0], qs[1], qs[2], ks[2])
        ms = tuple(np.shape(mask))
        ok = len(ms) <= 4 and all(md in (1, td) for md, td in zip(reversed(ms), reversed(target), strict=False))
        if not ok:
            raise OpContractError(
                f"{NAME}: Mask of shape {_shape_str(ms)} is not broadcastable to [B, H, Tq, Tk] = "
                f"{_shape_str(target)} (rule: Mask rank <= 4 and each Mask dim equals the target's or is 1)"
            )
    if not math.isfinite(scale):
        raise OpContractError(f"{NAME}: scale {scale:g} is not a finite number (rule: finite; 0 means 1/sqrt(D))")
    if causal not in (0, 1):
        raise OpContractError(f"{NAME}: causal {causal} is not 0 or 1 (rule: causal in {{0, 1}})")
    if not (math.isfinite(eps) and eps >= 0):
        raise OpContractError(f"{NAME}: eps {eps:g} is not a finite number >= 0 (rule: 0 <= eps < inf)")
    return float(np.float32(1.0 / math.sqrt(qs[3]) if scale == 0 else scale))


def _softpick64(s: np.ndarray, eps: float) -> np.ndarray:
    """Softpick (docs/ops/Softpick.md) along the last axis, float64 (the Softpick op's reference rules)."""
    finite = np.isfinite(s)
    z = np.where(finite, s, 0.0)
    m = np.max(np.where(finite, s, -np.inf), axis=-1, keepdims=True)
    has_finite = m > -np.inf
    with np.errstate(over="ignore", invalid="ignore"):
        mag = np.where(finite, np.exp(np.maximum(z, 0.0) - np.where(has_finite, m, 0.0)) * -np.expm1(-np.abs(z)), 0.0)
        d = np.sum(mag, axis=-1, keepdims=True) + eps
        y = np.where(z > 0, mag / d, 0.0)
    y = np.where(np.isnan(s) | (s == np.inf), s, y)
    return np.where(has_finite, y, 0.0)


def reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    scale: float = 0.0,
    causal: int = 0,
    eps: float = 1e-6,
) -> tuple[np.ndarray]:
    """The float64 NumPy oracle of SoftpickAttention (scores, mask, causal bottom-right, Softpick, weighted sum in float64); every backend is held to it within the op's tolerance."""
    sc = validate(q, k, v, mask, scale, causal, eps)
    b, h, tq, _ = np.shape(q)
    hk, tk, dv = np.shape(k)[1], np.shape(k)[2], np.shape(v)[3]
    if b * h * tq * tk * dv == 0:
        return (np.zeros((b, h, tq, dv)),)
    g = h // hk
    q64 = np.asarray(q, np.float64)
    k64 = np.repeat(np.asarray(k, np.float64), g, axis=1)
    v64 = np.repeat(np.asarray(v, np.float64), g, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        # einsum without BLAS: IEEE 0 * NaN = NaN in every term (a BLAS may skip zero weights)
        s = np.einsum("bhqd,bhkd->bhqk", q64, k64, optimize=False) * sc
        if mask is not None:
            s = s + np.asarray(mask, np.float64)
        if causal:
            visible = np.arange(tk)[None, :] <= np.arange(tq)[:, None] + (tk - tq)
            s = np.where(visible, s, -np.inf)
        w = _softpick64(s, eps)
        o = np.einsum("bhqk,bhkd->bhqd", w, v64, optimize=False)
    return (o,)


@function_body
def SoftpickAttention(Q, K, V, Mask, scale: float = 0.0, causal: int = 0, eps: float = 1e-6):
    b = op.Shape(Q, start=0, end=1)
    h = op.Shape(Q, start=1, end=2)
    tq = op.Shape(Q, start=2, end=3)
    d = op.Shape(Q, start=3, end=4)
    hk = op.Shape(K, start=1, end=2)
    tk = op.Shape(K, start=2, end=3)
    dv = op.Shape(V, start=3, end=4)
    out_shape = op.Concat(b, h, tq, dv, axis=0)
    zero_i = op.Constant(value_int=0)
    empty = op.Or(op.Equal(op.Size(Q), zero_i), op.Or(op.Equal(op.Size(K), zero_i), op.Equal(op.Size(V), zero_i)))
    if empty:
        # nothing to attend to (Tk = 0) or nothing to compute: zeros of [B, H, Tq, Dv]
        out = op.Expand(op.CastLike(op.Constant(value_float=0.0), Q), out_shape)
    else:
        # float64 throughout, like the reference: O = W V sums terms of both signs
        qd = op.Cast(Q, to=DOUBLE.dtype)
        kd = op.Cast(K, to=DOUBLE.dtype)
        vd = op.Cast(V, to=DOUBLE.dtype)
        g = op.Div(h, hk)
        q5 = op.Reshape(qd, op.Concat(b, hk, g, tq, d, axis=0), allowzero=1)
        k5 = op.Unsqueeze(op.Transpose(kd, perm=[0, 1, 3, 2]), op.Constant(value_ints=[2]))
        s5 = op.MatMul(q5, k5)  # [B, Hk, G, Tq, Tk]
        s = op.Reshape(s5, op.Concat(b, h, tq, tk, axis=0), allowzero=1)
        sc_attr = op.Cast(op.CastLike(scale, op.Constant(value_float=0.0)), to=DOUBLE.dtype)
        # scale 0 -> 1/sqrt(D), rounded to float32 as the kernel and the reference use it
        default_sc = op.Cast(
            op.Cast(op.Reciprocal(op.Sqrt(op.Cast(d, to=DOUBLE.dtype))), to=FLOAT.dtype), to=DOUBLE.dtype
        )
        zero = op.CastLike(op.Constant(value_float=0.0), qd)
        sc = op.Where(op.Equal(sc_attr, zero), default_sc, sc_attr)
        neg_inf = op.CastLike(op.Constant(value_float=float("-inf")), qd)
        s = op.Add(op.Mul(s, sc), op.Cast(Mask, to=DOUBLE.dtype))  # an omitted Mask arrives as 0 (body_fill)
        # causal, bottom-right: query i sees keys j <= i + Tk - Tq
        rows = op.Range(zero_i, op.Squeeze(tq), op.Constant(value_int=1))
        cols = op.Range(zero_i, op.Squeeze(tk), op.Constant(value_int=1))
        limit = op.Add(op.Unsqueeze(rows, op.Constant(value_ints=[1])), op.Sub(tk, tq))
        visible = op.LessOrEqual(op.Unsqueeze(cols, op.Constant(value_ints=[0])), limit)
        keep = op.Or(visible, op.Not(op.Cast(causal, to=BOOL.dtype)))
        s = op.Where(keep, s, neg_inf)
        # Softpick along the keys (the Softpick op's body, in float64)
        axes = op.Constant(value_ints=[-1])
        one = op.CastLike(op.Constant(value_float=1.0), qd)
        nan_or_pos_inf = op.Or(op.IsNaN(s), op.IsInf(s, detect_negative=0))
        finite = op.Not(op.Or(op.IsNaN(s), op.IsInf(s)))
        z = op.Where(finite, s, zero)
        m = op.ReduceMax(op.Where(finite, s, neg_inf), axes, keepdims=1)
        # any finite entry, counted (not m > -inf: TVM's ReduceMax starts from the lowest finite double)
        has_finite = op.Greater(op.ReduceMax(op.Cast(finite, to=DOUBLE.dtype), axes, keepdims=1), zero)
        m_safe = op.Where(has_finite, m, zero)
        a = op.Abs(z)
        gfac = op.Mul(op.Tanh(op.Mul(a, op.CastLike(op.Constant(value_float=0.5), qd))), op.Add(one, op.Exp(op.Neg(a))))
        mag = op.Mul(op.Exp(op.Sub(op.Max(z, zero), m_safe)), gfac)
        den = op.Add(
            op.ReduceSum(mag, axes, keepdims=1),
            op.Cast(op.CastLike(eps, op.Constant(value_float=0.0)), to=DOUBLE.dtype),
        )
        w = op.Where(op.Greater(z, zero), op.Div(mag, den), zero)
        w = op.Where(op.And(nan_or_pos_inf, has_finite), s, w)
        w = op.Where(has_finite, w, zero)
        w5 = op.Reshape(w, op.Concat(b, hk, g, tq, tk, axis=0), allowzero=1)
        o5 = op.MatMul(w5, op.Unsqueeze(vd, op.Constant(value_ints=[2])))  # [B, Hk, G, Tq, Dv]
        out = op.CastLike(op.Reshape(o5, out_shape, allowzero=1), Q)
    return out


def value_scale(q: Any, k: Any, v: Any, mask: Any = None, **_: Any) -> np.ndarray:
    """The magnitude O's absolute error is proportional to: O = W V with weights summing to <= 1, so an
    error in the weights moves O by at most that error times max|V| over the keys; max(1, max_k |V|) over
    the finite entries, per query head and column, ``[B, H, 1, Dv]`` (OpDef.atol_scale)."""
    a = np.abs(np.asarray(v, np.float64))
    s = np.maximum(1.0, np.max(np.where(np.isfinite(a), a, 0.0), axis=2, keepdims=True, initial=0.0))
    return np.repeat(s, np.shape(q)[1] // max(1, np.shape(v)[1]), axis=1)


def _softpick_torch64(s: Any, eps: float) -> Any:
    import torch

    finite = torch.isfinite(s)
    z = torch.where(finite, s, 0.0)
    m = torch.where(finite, s, float("-inf")).amax(dim=-1, keepdim=True)
    has_finite = m > float("-inf")
    mag = torch.exp(z.clamp_min(0.0) - torch.where(has_finite, m, 0.0)) * -torch.expm1(-z.abs())
    d = mag.sum(dim=-1, keepdim=True) + eps
    y = torch.where(z > 0, mag / d, 0.0)
    y = torch.where((torch.isnan(s) | torch.isposinf(s)) & has_finite, s, y)
    return torch.where(has_finite, y, 0.0)


def torch_impl(q: Any, k: Any, v: Any, mask: Any = None, scale: float = 0.0, causal: int = 0, eps: float = 1e-6) -> Any:
    """Eager torch SoftpickAttention (computed in float64 like the reference, returned in Q's type), registered as ``torch.ops.softdeploy.softpick_attention``."""
    import torch

    sc = validate(q, k, v, mask, scale, causal, eps)
    b, h, tq, _ = q.shape
    hk, tk, dv = k.shape[1], k.shape[2], v.shape[3]
    if tk == 0:  # no key: zeros (amax below needs a non-empty axis); other empty dims flow through
        return q.new_zeros((b, h, tq, dv))
    g = h // hk
    # float64 like the reference (O = W V sums terms of both signs); the result in Q's type
    qd, kd, vd = q.double(), k.double(), v.double()
    if g > 1:
        kd = kd.repeat_interleave(g, dim=1)
        vd = vd.repeat_interleave(g, dim=1)
    s = torch.matmul(qd, kd.transpose(-1, -2)) * sc
    if mask is not None:
        s = s + mask.double()
    if causal:
        visible = torch.arange(tk, device=q.device)[None, :] <= torch.arange(tq, device=q.device)[:, None] + (tk - tq)
        s = s.masked_fill(~visible, float("-inf"))
    return torch.matmul(_softpick_torch64(s, eps), vd).to(q.dtype)


def torch_fake(q: Any, k: Any, v: Any, mask: Any = None, scale: float = 0.0, causal: int = 0, eps: float = 1e-6) -> Any:
    """Shape-only torch SoftpickAttention for tracing and export: checks the contract, returns an empty ``[B, H, Tq, Dv]`` tensor."""
    validate(q, k, v, mask, scale, causal, eps)
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


def infer_shapes(ctx: Any) -> None:
    """O: Q's element type, shape [B, H, Tq, Dv] (Q's first three dims, V's last) where both are known."""
    out = type(ctx.get_input_type(0))()
    out.CopyFrom(ctx.get_input_type(0))
    q_shape = out.tensor_type.shape
    v_type = ctx.get_input_type(2)
    if len(q_shape.dim) == 4 and v_type is not None and len(v_type.tensor_type.shape.dim) == 4:
        q_shape.dim[3].CopyFrom(v_type.tensor_type.shape.dim[3])
    else:
        out.tensor_type.ClearField("shape")
    ctx.set_output_type(0, out)


# ---- samples -----------------------------------------------------------------------------------
#
# Tolerance (kernel, float32 inputs), from the conditioning: a score carries an absolute error up to
# ~D·u·sum_d |q_d k_d|·|scale| (u = 2^-24; typically sqrt(D)·u·... with the kernel's FMA chains); a
# score error ds moves each weight by about ds·(w_j + e^(s_j - m)/den), so the output moves by at most
# ~2·ds·max|V| -- an ABSOLUTE error (O = W V sums terms of both signs, so outputs near 0 have no
# relative accuracy to give) that grows with |V|: atol is per unit of V, multiplied by max(1, max|V|) of
# the head and column (value_scale, OpDef.atol_scale); a fixed atol was missed by any float32 kernel once
# |V| reached ~30 (a plain float32 evaluation -- float32 scores, float64 Softpick and W V -- errs 1.6e-7 per
# unit of V on b2_h4_t33_d16; the kernel 4e-7). The expm1 polynomial adds ~1e-7 relative per weight, the float32 output
# rounding u·|O|. The samples keep sum_d |q_d k_d|·|scale| <= ~12 (scores up to ~10, the range
# attention produces; "large_scores" goes to ~100 on the fast path) and |V| <= ~4: D = 64 gives
# ds <= 64·6e-8·12 = 4.6e-5 worst case, ~2e-6 typical. Measured max |err| over the samples:
# 1.5e-6 typical, 4.2e-6 on large_scores (all three ISA variants); per unit of V (value_scale), with V
# scaled by 1 ... 1e5: 5.2e-7 typical, 2.3e-6 on large_scores. atol = rtol = 1e-5 leaves 2.4x on
# the worst measured case and stays ~100x below what one lost key's weight (~1e-3 at Tk = 100) costs.
# Rows on the exact float64 path (special values) are within one float32 rounding. A Mask adds one
# more float32 rounding to each score, u·|s + Mask|: negligible for masks of 0 / -inf or O(1); a finite
# Mask in the hundreds moves e^s by up to ~2e-5 relative, so O by up to ~2e-5 per unit of V where those
# roundings align (~2e-6 measured with 90 keys and |V| ~ 4e14: they do not align); the reliability fuzz
# counts the cases whose bound exceeds the tolerance as beyond float32's conditioning (its ds includes
# that term) rather than widening the tolerance.
# float16 inputs are the float16-rounded values computed in float32: the same bound plus the float16
# output rounding (rtol 1e-3, 4.9e-4 per rounding).

_TOLERANCE = {"float32": (1e-5, 1e-5), "float16": (1e-3, 1e-5)}


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of SoftpickAttention, drawn from ``rng``: grouped heads, masks of every broadcast shape, causal, Tq != Tk, T = 1, empty batch and the special values of the contract."""

    def t(*shape: int, s: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    def qkv(b: int, h: int, hk: int, tq: int, tk: int, d: int, dv: int | None = None, s: float = 1.0):
        return t(b, h, tq, d, s=s), t(b, hk, tk, d, s=s), t(b, hk, tk, d if dv is None else dv)

    yield Sample("b2_h4_t33_d16", qkv(2, 4, 4, 33, 33, 16, s=1.5))
    yield Sample("b1_h2_t200_d64", qkv(1, 2, 2, 200, 200, 64))
    q, k, v = qkv(2, 8, 2, 17, 70, 32, 24, s=1.3)
    pad = np.zeros((2, 1, 1, 70), np.float32)
    pad[0, ..., 50:] = -np.inf  # padding mask: batch 0 has 50 real keys
    yield Sample("grouped_h8_hk2_padding_mask", (q, k, v, pad))
    yield Sample("causal_square_t130_d64", qkv(1, 2, 2, 130, 130, 64), {"causal": 1})
    yield Sample("causal_bottom_right_tq5_tk70", qkv(2, 4, 2, 5, 70, 16, s=1.5), {"causal": 1})
    # Tq > Tk: the first Tq - Tk query rows see no key at all -> zeros
    yield Sample("causal_tq40_tk9_rows_see_nothing", qkv(1, 2, 1, 40, 9, 8, s=1.5), {"causal": 1})
    q, k, v = qkv(2, 3, 3, 20, 45, 16, s=1.5)
    full = np.where(rng.random((2, 3, 20, 45)) < 0.3, -np.inf, rng.standard_normal((2, 3, 20, 45))).astype(np.float32)
    full[0, 1, 4] = -np.inf  # fully masked query rows -> zeros
    full[1, :, 7] = -np.inf
    full[1, 2, 9, :] = -1e9  # "-inf" written as -1e9: finite, so each key adds e^-m to the denominator
    full[1, 2, 9, 3] = 0.0
    yield Sample("full_mask_with_fully_masked_rows", (q, k, v, full), {"causal": 1})
    q, k, v = qkv(1, 4, 2, 12, 31, 8, s=1.5)
    yield Sample("mask_rank2_broadcast", (q, k, v, t(12, 31)))
    yield Sample("mask_scalar_like", (q, k, v, np.zeros((1,), np.float32)))
    yield Sample("scale_explicit", qkv(1, 2, 2, 9, 50, 16), {"scale": 0.7})
    yield Sample("scale_negative_eps_zero", qkv(1, 2, 2, 9, 50, 16), {"scale": -0.3, "eps": 0.0})
    yield Sample("eps_large", qkv(1, 2, 2, 9, 50, 16, s=1.5), {"eps": 10.0})
    # ---- edges: T = 1, empty batch, Tk = 0, Dv = 1, block boundaries of the kernel (query block 48,
    # key block 64; microtile rows 6 (AVX-512) / 4 (AVX2))
    yield Sample("t1", qkv(2, 4, 2, 1, 1, 16), kind="edge")
    yield Sample("t1_causal", qkv(1, 2, 2, 1, 1, 8), {"causal": 1}, kind="edge")
    yield Sample("decode_tq1_tk100_causal", qkv(1, 8, 2, 1, 100, 32, s=1.5), {"causal": 1}, kind="edge")
    yield Sample("empty_batch", qkv(0, 4, 2, 7, 9, 16), kind="edge")
    yield Sample("empty_keys_tk0", qkv(2, 2, 1, 5, 0, 8), kind="edge")
    yield Sample("empty_queries_tq0", qkv(1, 2, 2, 0, 6, 8), {"causal": 1}, kind="edge")
    yield Sample("dv1_d1", qkv(1, 2, 1, 6, 13, 1, 1, s=2.0), kind="edge")
    yield Sample("dv_odd_37_d_odd_19", qkv(1, 2, 2, 11, 29, 19, 37, s=1.2), kind="edge")
    yield Sample("dv_wide_130", qkv(1, 1, 1, 7, 20, 16, 130, s=1.3), kind="edge")
    for tq, tk in ((47, 63), (48, 64), (49, 65), (97, 129), (13, 192)):
        yield Sample(f"blocks_tq{tq}_tk{tk}_causal", qkv(1, 2, 1, tq, tk, 16, s=1.5), {"causal": 1}, kind="edge")
    yield Sample("blocks_tq49_tk65", qkv(1, 1, 1, 49, 65, 64), kind="edge")
    # ---- special values
    q, k, v = qkv(1, 4, 2, 10, 40, 8, s=1.5)
    q[0, 0, 3, 2] = np.nan  # NaN query row: every score NaN -> no finite score -> zeros
    q[0, 1, 5, 0] = np.inf  # +-inf scores in that row: no finite score... or +inf weights
    k[0, 1, 17, 4] = np.nan  # NaN key (heads 2, 3): NaN weight in every row -> NaN outputs
    yield Sample("nan_inf_in_q_and_k", (q, k, v), kind="special")
    q, k, v = qkv(1, 2, 2, 12, 30, 8, s=1.5)
    v[0, 0, 25, 3] = np.nan  # NaN value, hidden by the causal mask from rows < 7: still 0 * NaN = NaN
    v[0, 1, 2, 1] = np.inf  # +inf value: +inf or NaN (0 * inf) in column 1
    yield Sample("nan_inf_in_v", (q, k, v), {"causal": 1}, kind="special")
    q, k, v = qkv(1, 2, 2, 8, 30, 8, s=1.5)
    mk = np.zeros((1, 2, 8, 30), np.float32)
    mk[0, 0, 2, 5] = np.nan  # NaN mask entry -> NaN weight -> NaN row
    mk[0, 1, 4, 7] = np.inf  # +inf mask entry -> +inf weight -> inf/NaN row
    mk[0, 1, 6, :] = -np.inf
    mk[0, 1, 6, 11] = np.inf  # only +inf and -inf: no finite score -> zeros
    yield Sample("nan_inf_in_mask", (q, k, v, mk), kind="special")
    q, k, v = qkv(1, 2, 2, 8, 70, 8, s=1.5)
    mk = np.zeros((1, 1, 8, 70), np.float32)
    mk[0, 0, :, 3] = -np.finfo(np.float32).max  # finite: x log2 e overflows float32 (the fast path clamps)
    mk[0, 0, 5, 10] = 1e30  # a huge finite boost: that row takes the exact path
    yield Sample("mask_huge_finite", (q, k, v, mk), kind="special")
    q, k, v = qkv(1, 2, 1, 16, 80, 16)
    q[0, 0] *= 40.0  # scores ~ +-100: the kernel's running scale 2^-R moves, terms stay <= 1
    q[0, 1, :8] *= 2000.0  # scores ~ 1e4: e^m far beyond float range
    q[0, 1, 8:] *= 1e5  # scores beyond 2^16: the exact path
    yield Sample("large_scores", (q, k, v), kind="special")
    q, k, v = qkv(1, 2, 2, 9, 40, 8)
    q[0, 0] = -np.abs(q[0, 0]) * 50.0  # with K >= 0: all scores <= 0 -> zeros
    k = np.abs(k)
    q[0, 1, :3] = 0.0  # all scores exactly 0 -> zeros
    q[0, 1, 3] *= 1e-20  # scores ~ 1e-20: expm1 without cancellation
    q[0, 1, 4] = -q[0, 1, 4] * 200.0  # m ~ -1e3: exp(-m) would overflow
    yield Sample("nonpositive_and_tiny_scores", (q, k, v), kind="special")
    # large |V|: O scales with V, and so does the tolerance (value_scale), per head and column
    q, k, v = qkv(2, 4, 2, 33, 33, 16, s=1.5)
    v[0, 0] *= 30.0
    v[0, 1] *= 1e4
    v[1, 0, :, :3] *= 1e-3  # small columns beside large ones: their tolerance stays absolute
    v[1, 0, :, 3:] *= 1e3
    yield Sample("large_v_per_head_x30_x1e4", (q, k, v), kind="special")
    q, k, _ = qkv(1, 2, 1, 40, 70, 16, 8, s=1.5)
    yield Sample("large_v_1e6_causal", (q, k, t(1, 1, 70, 8, s=1e6)), {"causal": 1}, kind="special")
    q, k, v = qkv(1, 2, 2, 6, 20, 8)
    k[:] = k[:, :, :1]  # every key equal: ties
    yield Sample("tied_keys", (q, k, v), kind="special")


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of SoftpickAttention; every backend must refuse them with a message containing ``match``."""
    q, k, v = np.zeros((2, 4, 3, 8), np.float32), np.zeros((2, 2, 5, 8), np.float32), np.zeros((2, 2, 5, 6), np.float32)
    yield ErrorCase("q_rank3", (q[0], k, v), {}, "Q must have rank 4, got rank 3")
    yield ErrorCase("v_rank5", (q, k, v[None]), {}, "V must have rank 4, got rank 5")
    yield ErrorCase(
        "heads_not_multiple",
        (np.zeros((2, 3, 3, 8), np.float32), k, v),
        {},
        "H=3 query heads is not a multiple of Hk=2 key/value heads (rule: H % Hk == 0)",
    )
    yield ErrorCase("d_mismatch", (q, np.zeros((2, 2, 5, 7), np.float32), v), {}, "K has head size D=7 but Q has D=8")
    yield ErrorCase("batch_mismatch", (q, k[:1], v[:1]), {}, "batch sizes differ: Q 2, K 1, V 1")
    yield ErrorCase("v_tk_mismatch", (q, k, v[:, :, :4]), {}, "V has Hk=2, Tk=4 but K has Hk=2, Tk=5")
    yield ErrorCase(
        "hk_zero", (np.zeros((2, 0, 3, 8), np.float32), k[:, :0], v[:, :0]), {}, "Hk=0 key/value heads (rule: Hk >= 1)"
    )
    yield ErrorCase("d_zero", (q[..., :0], k[..., :0], v), {}, "head size D=0 (rule: D >= 1)")
    yield ErrorCase(
        "mask_bad_dim",
        (q, k, v, np.zeros((2, 5), np.float32)),
        {},
        "Mask of shape [2, 5] is not broadcastable to [B, H, Tq, Tk] = [2, 4, 3, 5]",
    )
    yield ErrorCase(
        "mask_rank5",
        (q, k, v, np.zeros((1, 1, 1, 1, 5), np.float32)),
        {},
        "Mask of shape [1, 1, 1, 1, 5] is not broadcastable",
    )
    yield ErrorCase(
        "mask_heads_hk_not_h",
        (q, k, v, np.zeros((1, 2, 1, 5), np.float32)),
        {},
        "Mask of shape [1, 2, 1, 5] is not broadcastable",
    )
    yield ErrorCase("scale_nan", (q, k, v), {"scale": float("nan")}, "scale nan is not a finite number")
    yield ErrorCase("causal_2", (q, k, v), {"causal": 2}, "causal 2 is not 0 or 1")
    yield ErrorCase("eps_negative", (q, k, v), {"eps": -1.0}, "eps -1 is not a finite number >= 0")


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(
        Port("Q", doc="queries [B, H, Tq, D]"),
        Port("K", doc="keys [B, Hk, Tk, D], H % Hk == 0"),
        Port("V", doc="values [B, Hk, Tk, Dv]"),
        Port("Mask", optional=True, doc="additive mask broadcastable to [B, H, Tq, Tk]", body_fill=0.0),
    ),
    outputs=(Port("O", doc="[B, H, Tq, Dv]"),),
    attrs=(
        Attr("scale", float, 0.0, "score scale; 0 means 1/sqrt(D)"),
        Attr("causal", int, 0, "1: query i sees keys j <= i + Tk - Tq (bottom-right)"),
        Attr("eps", float, 1e-6, "Softpick's eps: finite and >= 0"),
    ),
    reference=reference,
    function=SoftpickAttention,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    torch_fake=torch_fake,
    infer_shapes=infer_shapes,
    tolerance=_TOLERANCE,
    atol_scale=value_scale,
    linear_in="V",
    source="Zuhri, Fuadi & Aji 2025, arXiv 2504.20966; zaydzuhri/softpick-attention (naive_softpick_attn.py, "
    "flash_softpick_attn.py); Dao 2023 (FlashAttention-2) for the blocking",
)
