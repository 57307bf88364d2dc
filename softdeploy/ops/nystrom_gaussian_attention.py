"""NystromGaussianAttention: SOFT's softmax-free attention (Lu et al., NeurIPS 2021), Nyström form.

    κ(a, b) = exp(-‖a - b‖² / (2·sqrt(d)))
    K1 = κ(Q, L)               [n, m]        (queries and keys share the projection: K = Q)
    K2 = κ(L, L)               [m, m]
    P  = K2 + regularization·I
    α  = 1.8 / (max_i Σ_j K2_ij)²,   V_0 = α·P,   V_{t+1} = 2·V_t - V_t·P·V_t   (newton_iters times)
    O  = K1 · V_T · (K1ᵀ · V)  [n, dv]       evaluated right to left: cost linear in n

Inputs (docs/ops/NystromGaussianAttention.md): Q ``[B, H, n, d]``, V ``[B, H, n, dv]``, Landmarks
``[B, H, m, d]`` in Q's space (average-pooled rows of Q, or a learned projection of them); attributes
``newton_iters`` (0 ... 1000) and ``regularization`` (finite, >= 0). V_T approximates ``(K2 + reg·I)^-1``
(SOFT's ``newton_inv``); the op is the iteration as written, not an exact inverse, so every form runs
exactly ``newton_iters`` steps.

Rules: special values. ``‖a - b‖²`` of vectors with non-finite entries is read as: NaN if either holds
a NaN or both hold an inf, +inf if exactly one holds an inf (so ``κ = 0``: an infinitely far point);
then the arithmetic of the formulas: a NaN in Q row i poisons ``K1ᵀ V`` and so every output row of that
head; an inf query row has ``K1`` row 0 and outputs 0; an inf landmark makes K2's diagonal NaN (both
sides hold its inf), so the head is NaN. ``n = 0`` or ``dv = 0`` gives an empty output. Errors: ranks other than 4, mismatched
B / H / n / d, ``m = 0`` (no landmark), ``d = 0``, ``newton_iters`` outside 0 ... 1000, a negative or non-finite
regularization.

Forms: the float64 reference below (squared distances as differences); the function body (standard
ONNX in float64, an ONNX Loop for the iteration, distances as ``‖a‖² + ‖b‖² - 2a·b`` clamped at 0);
the torch op (float64, the same form); the kernel (ops/nystrom_gaussian_attention.cc, float32):
distances as differences in register tiles, the Newton-Schulz steps but the last and the two n-long
products (``K1ᵀ V``, ``K1 W``) as tiled float32 GEMMs, the last Newton-Schulz step and ``W = V_T (K1ᵀ V)``
in float64, ``K1`` kept ``[n, m]`` (memory O(n m), never ``[n, n]``).

Accuracy: O is linear in V, so the absolute tolerance (atol below) is per unit of V: multiplied by
``max(1, max|V|)`` over the head's n rows, per head and column.
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
    from onnxscript import BOOL, DOUBLE
    from onnxscript import opset18 as op

NAME = "NystromGaussianAttention"
# Newton-Schulz converges quadratically once it converges at all: SOFT uses 20 steps; a count beyond
# this bound is a mistake (2^31 steps would run for hours), so it is refused.
MAX_ITERS = 1000
_LAYOUT = "rule: Q [B, H, n, d], V [B, H, n, dv], Landmarks [B, H, m, d]"


def validate(q: Any, v: Any, landmarks: Any, newton_iters: int, regularization: float) -> None:
    """Checks NystromGaussianAttention's inputs and attributes and raises OpContractError naming the op, the value and the rule."""
    for port, x in (("Q", q), ("V", v), ("Landmarks", landmarks)):
        if np.ndim(x) != 4:
            raise OpContractError(f"{NAME}: {port} must have rank 4, got rank {np.ndim(x)} ({_LAYOUT})")
    qs, vs, ls = (tuple(np.shape(x)) for x in (q, v, landmarks))
    if vs[:3] != qs[:3]:
        raise OpContractError(
            f"{NAME}: V has [B, H, n] = [{vs[0]}, {vs[1]}, {vs[2]}] but Q has [{qs[0]}, {qs[1]}, {qs[2]}] ({_LAYOUT})"
        )
    if ls[:2] != qs[:2]:
        raise OpContractError(
            f"{NAME}: Landmarks have [B, H] = [{ls[0]}, {ls[1]}] but Q has [{qs[0]}, {qs[1]}] ({_LAYOUT})"
        )
    if ls[3] != qs[3]:
        raise OpContractError(f"{NAME}: Landmarks have d={ls[3]} but Q has d={qs[3]} ({_LAYOUT})")
    if qs[3] == 0:
        raise OpContractError(f"{NAME}: d=0 (rule: d >= 1)")
    if ls[2] == 0:
        raise OpContractError(f"{NAME}: m=0 landmarks (rule: m >= 1)")
    if not 0 <= newton_iters <= MAX_ITERS:
        raise OpContractError(
            f"{NAME}: newton_iters {newton_iters} is out of range (rule: 0 <= newton_iters <= {MAX_ITERS})"
        )
    if not (math.isfinite(regularization) and regularization >= 0):
        raise OpContractError(
            f"{NAME}: regularization {regularization:g} is not a finite number >= 0 (rule: 0 <= regularization < inf)"
        )


def _sq_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_k (a_ik - b_jk)^2 [..., p, r] as differences (no cancellation), in row chunks of a so that no
    temporary exceeds ~4M elements."""
    p, r, d = a.shape[-2], b.shape[-2], a.shape[-1]
    lead = int(np.prod(a.shape[:-2]))
    step = max(1, (1 << 22) // max(1, lead * r * d))
    out = np.empty((*a.shape[:-2], p, r))
    for i in range(0, p, step):
        out[..., i : i + step, :] = np.sum((a[..., i : i + step, None, :] - b[..., None, :, :]) ** 2, axis=-1)
    return out


def _fix_nonfinite(d2: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The squared-distance rule for vectors with non-finite entries (module docstring), d2 [..., p, r]
    from a [..., p, d] and b [..., r, d]."""
    an, ai = np.isnan(a).any(-1)[..., :, None], np.isinf(a).any(-1)[..., :, None]
    bn, bi = np.isnan(b).any(-1)[..., None, :], np.isinf(b).any(-1)[..., None, :]
    return np.where(an | bn | (ai & bi), np.nan, np.where(ai | bi, np.inf, d2))


def _newton64(k2: np.ndarray, iters: int, reg: float) -> np.ndarray:
    m = k2.shape[-1]
    p = k2 + reg * np.eye(m)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        alpha = 1.8 / np.max(np.sum(k2, axis=-1), axis=-1)[..., None, None] ** 2
        vt = alpha * p
        for _ in range(iters):
            vt = 2 * vt - vt @ p @ vt
    return vt


def reference(
    q: np.ndarray, v: np.ndarray, landmarks: np.ndarray, *, newton_iters: int = 20, regularization: float = 0.01
) -> tuple[np.ndarray]:
    """The float64 NumPy oracle of NystromGaussianAttention (Gaussian kernel blocks, Newton-Schulz inverse, products right to left); every backend is held to it within the op's tolerance."""
    validate(q, v, landmarks, newton_iters, regularization)
    b, h, n, d = np.shape(q)
    dv = np.shape(v)[3]
    if n * dv * b * h == 0:
        return (np.zeros((b, h, n, dv)),)
    q64, v64, l64 = (np.asarray(x, np.float64) for x in (q, v, landmarks))
    reg = float(np.float32(regularization))  # a FLOAT attribute holds a float32
    with np.errstate(invalid="ignore", over="ignore"):
        scale = 2.0 * math.sqrt(d)
        d1 = _fix_nonfinite(_sq_dist(q64, l64), q64, l64)
        d2 = _fix_nonfinite(_sq_dist(l64, l64), l64, l64)
        k1, k2 = np.exp(-d1 / scale), np.exp(-d2 / scale)
        vt = _newton64(k2, newton_iters, reg)
        o = np.einsum("bhnm,bhmk->bhnk", k1, vt @ np.einsum("bhnm,bhnk->bhmk", k1, v64, optimize=False), optimize=False)
    return (o,)


@function_body
def NystromGaussianAttention(Q, V, Landmarks, newton_iters: int = 20, regularization: float = 0.01):
    zero_i = op.Constant(value_int=0)
    out_shape = op.Concat(op.Shape(Q, start=0, end=3), op.Shape(V, start=3, end=4), axis=0)
    if op.Or(op.Equal(op.Size(Q), zero_i), op.Equal(op.Size(V), zero_i)):
        out = op.Expand(op.CastLike(op.Constant(value_float=0.0), Q), out_shape)
    else:
        q = op.Cast(Q, to=DOUBLE.dtype)
        v = op.Cast(V, to=DOUBLE.dtype)
        lm = op.Cast(Landmarks, to=DOUBLE.dtype)
        d = op.Cast(op.Shape(Q, start=3, end=4), to=DOUBLE.dtype)
        zero = op.CastLike(op.Constant(value_float=0.0), q)
        two = op.CastLike(op.Constant(value_float=2.0), q)
        scale = op.Mul(two, op.Sqrt(d))
        last = op.Constant(value_ints=[-1])
        q2 = op.ReduceSum(op.Mul(q, q), last, keepdims=1)  # [B, H, n, 1]
        l2 = op.ReduceSum(op.Mul(lm, lm), last, keepdims=1)  # [B, H, m, 1]
        lt = op.Transpose(lm, perm=[0, 1, 3, 2])
        l2t = op.Transpose(l2, perm=[0, 1, 3, 2])
        # ‖a - b‖² = ‖a‖² + ‖b‖² - 2 a·b, clamped at 0 (float64: the cancellation costs ~1e-16 ‖a‖²)
        dq = op.Max(op.Sub(op.Add(q2, l2t), op.Mul(two, op.MatMul(q, lt))), zero)
        dl = op.Max(op.Sub(op.Add(l2, l2t), op.Mul(two, op.MatMul(lm, lt))), zero)
        # non-finite rows (module docstring): NaN if either has a NaN or both an inf, else +inf
        nan = op.CastLike(op.Constant(value_float=float("nan")), q)
        inf = op.CastLike(op.Constant(value_float=float("inf")), q)
        q_nan = op.Cast(op.ReduceMax(op.Cast(op.IsNaN(q), to=DOUBLE.dtype), last, keepdims=1), to=BOOL.dtype)
        q_inf = op.Cast(op.ReduceMax(op.Cast(op.IsInf(q), to=DOUBLE.dtype), last, keepdims=1), to=BOOL.dtype)
        l_nan = op.Cast(op.ReduceMax(op.Cast(op.IsNaN(lm), to=DOUBLE.dtype), last, keepdims=1), to=BOOL.dtype)
        l_inf = op.Cast(op.ReduceMax(op.Cast(op.IsInf(lm), to=DOUBLE.dtype), last, keepdims=1), to=BOOL.dtype)
        l_nan_t = op.Transpose(l_nan, perm=[0, 1, 3, 2])
        l_inf_t = op.Transpose(l_inf, perm=[0, 1, 3, 2])
        dq = op.Where(
            op.Or(op.Or(q_nan, l_nan_t), op.And(q_inf, l_inf_t)), nan, op.Where(op.Or(q_inf, l_inf_t), inf, dq)
        )
        dl = op.Where(
            op.Or(op.Or(l_nan, l_nan_t), op.And(l_inf, l_inf_t)), nan, op.Where(op.Or(l_inf, l_inf_t), inf, dl)
        )
        k1 = op.Exp(op.Neg(op.Div(dq, scale)))  # [B, H, n, m]
        k2 = op.Exp(op.Neg(op.Div(dl, scale)))  # [B, H, m, m]
        m = op.Shape(Landmarks, start=2, end=3)
        eye = op.EyeLike(op.ConstantOfShape(op.Concat(m, m, axis=0)))
        reg = op.Cast(op.CastLike(regularization, op.Constant(value_float=0.0)), to=DOUBLE.dtype)
        p = op.Add(k2, op.Mul(reg, op.CastLike(eye, q)))
        row_max = op.ReduceMax(op.ReduceSum(k2, last, keepdims=1), op.Constant(value_ints=[-2]), keepdims=1)
        alpha = op.Div(op.CastLike(op.Constant(value_float=1.8), q), op.Mul(row_max, row_max))
        vt = op.Mul(alpha, p)
        for _ in range(newton_iters):
            vt = op.Sub(op.Mul(two, vt), op.MatMul(op.MatMul(vt, p), vt))
        ktv = op.MatMul(op.Transpose(k1, perm=[0, 1, 3, 2]), v)  # [B, H, m, dv]
        out = op.CastLike(op.MatMul(k1, op.MatMul(vt, ktv)), Q)
    return out


def value_scale(q: Any, v: Any, landmarks: Any, **_: Any) -> np.ndarray:
    """The magnitude O's absolute error is proportional to: O is linear in V (each column of a head's O
    mixes that column of V over all n rows), so max(1, max_n |V|) over the finite entries, per head and
    column, ``[B, H, 1, dv]`` (OpDef.atol_scale)."""
    a = np.abs(np.asarray(v, np.float64))
    return np.maximum(1.0, np.max(np.where(np.isfinite(a), a, 0.0), axis=2, keepdims=True, initial=0.0))


def _fix_nonfinite_torch(d2: Any, a: Any, b: Any) -> Any:
    import torch

    an, ai = torch.isnan(a).any(-1)[..., :, None], torch.isinf(a).any(-1)[..., :, None]
    bn, bi = torch.isnan(b).any(-1)[..., None, :], torch.isinf(b).any(-1)[..., None, :]
    return torch.where(an | bn | (ai & bi), float("nan"), torch.where(ai | bi, float("inf"), d2))


def torch_impl(q: Any, v: Any, landmarks: Any, newton_iters: int = 20, regularization: float = 0.01) -> Any:
    """Eager torch NystromGaussianAttention (computed in float64 like the reference, returned in Q's type), registered as ``torch.ops.softdeploy.nystrom_gaussian_attention``."""
    import torch

    validate(q, v, landmarks, newton_iters, regularization)
    d = q.shape[3]
    qd, vd, ld = q.double(), v.double(), landmarks.double()
    scale = 2.0 * math.sqrt(d)
    q2 = (qd * qd).sum(-1, keepdim=True)
    l2 = (ld * ld).sum(-1, keepdim=True)
    d1 = _fix_nonfinite_torch((q2 + l2.transpose(-1, -2) - 2 * qd @ ld.transpose(-1, -2)).clamp_min(0), qd, ld)
    d2 = _fix_nonfinite_torch((l2 + l2.transpose(-1, -2) - 2 * ld @ ld.transpose(-1, -2)).clamp_min(0), ld, ld)
    k1, k2 = torch.exp(-d1 / scale), torch.exp(-d2 / scale)
    m = landmarks.shape[2]
    reg = float(np.float32(regularization))
    p = k2 + reg * torch.eye(m, dtype=torch.float64, device=q.device)
    alpha = 1.8 / k2.sum(-1).amax(-1)[..., None, None] ** 2
    vt = alpha * p
    for _ in range(newton_iters):
        vt = 2 * vt - vt @ p @ vt
    return (k1 @ (vt @ (k1.transpose(-1, -2) @ vd))).to(q.dtype)


def torch_fake(q: Any, v: Any, landmarks: Any, newton_iters: int = 20, regularization: float = 0.01) -> Any:
    """Shape-only torch NystromGaussianAttention for tracing and export: checks the contract, returns an empty ``[B, H, n, Dv]`` tensor."""
    validate(q, v, landmarks, newton_iters, regularization)
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


def infer_shapes(ctx: Any) -> None:
    """O: Q's element type, shape [B, H, n, dv] (Q's first three dims, V's last)."""
    out = type(ctx.get_input_type(0))()
    out.CopyFrom(ctx.get_input_type(0))
    v_type = ctx.get_input_type(1)
    if len(out.tensor_type.shape.dim) == 4 and v_type is not None and len(v_type.tensor_type.shape.dim) == 4:
        out.tensor_type.shape.dim[3].CopyFrom(v_type.tensor_type.shape.dim[3])
    else:
        out.tensor_type.ClearField("shape")
    ctx.set_output_type(0, out)


# ---- samples -----------------------------------------------------------------------------------
#
# Tolerance (kernel, float32), from the conditioning. O is linear in V, so its absolute error is too:
# atol is per unit of V, multiplied by max(1, max|V|) of the head and column (value_scale, OpDef.atol_scale)
# -- a fixed atol was missed by any float32 kernel once V was scaled by a few (3.7 on n100_d16_m16_dv12).
# K1 and K2 entries carry a relative error of a few u·(1 + ‖a - b‖²/(2 sqrt(d))) (the exp of a rounded
# argument, u = 2^-24); V_T approximates P^-1, whose entries reach ~1/regularization (P's condition number
# ~1e3 at m = 16, reg = 0.01), and O = K1 (V_T (K1ᵀ V)) cancels: an error δ in K moves O by ~cond(P)·δ·|V|.
# The kernel runs the last Newton-Schulz step and V_T (K1ᵀ V) in float64 (ops/nystrom_gaussian_attention.cc:
# in float32 they added ~cond(P)·u·|V|, 1.6e-4 at |V| ~ 4 on that sample), so what remains is the float32
# K1, K2 and the n-long float32 sums K1ᵀ V and K1 W: measured max |err| / max|V| over the samples at V
# scaled by 1 ... 1e5, all three variants, 5.7e-6 (n100_d16_m16_dv12; 1.7e-6 the next). atol = 2e-5 per
# unit of V leaves 3.5x; rtol = 2e-5 (outputs near max|O| are good to ~1e-6 relative). float16 inputs are
# rounded, computed in float32, the output rounded to float16 (rtol 2e-3: 4.9e-4 per rounding).

_TOLERANCE = {"float32": (2e-5, 2e-5), "float16": (2e-3, 2e-4)}


def _pooled(q: np.ndarray, m: int) -> np.ndarray:
    """Average-pooled rows of Q as landmarks (SOFT's parameter-free choice)."""
    b, h, n, d = q.shape
    return q[:, :, : (n // m) * m].reshape(b, h, m, n // m, d).mean(axis=3).astype(np.float32)


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of NystromGaussianAttention, drawn from ``rng``: pooled and random landmarks, m = 1, n = 1, 0 and 40 Newton-Schulz steps, empty batch and sequence, and the special values of the contract."""

    def t(*shape: int, s: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    q = t(2, 2, 48, 8)
    yield Sample("b2_h2_n48_d8_m8_pooled", (q, t(2, 2, 48, 8), _pooled(q, 8)))
    q = t(1, 3, 100, 16, s=0.5)
    yield Sample("n100_d16_m16_dv12", (q, t(1, 3, 100, 12), _pooled(q, 16)))
    q = t(1, 1, 30, 4)
    yield Sample(
        "random_landmarks_iters5_reg0p1", (q, t(1, 1, 30, 6), t(1, 1, 5, 4)), {"newton_iters": 5, "regularization": 0.1}
    )
    yield Sample("iters0", (q, t(1, 1, 30, 6), t(1, 1, 5, 4)), {"newton_iters": 0})
    yield Sample("iters40", (q, t(1, 1, 30, 6), _pooled(q, 6)), {"newton_iters": 40, "regularization": 0.05})
    # ---- edges
    yield Sample("m1", (q, t(1, 1, 30, 3), t(1, 1, 1, 4)), kind="edge")
    yield Sample("n1", (t(1, 2, 1, 8), t(1, 2, 1, 5), t(1, 2, 3, 8)), kind="edge")
    yield Sample("empty_batch", (t(0, 2, 7, 8), t(0, 2, 7, 5), t(0, 2, 3, 8)), kind="edge")
    yield Sample("empty_n", (t(1, 2, 0, 8), t(1, 2, 0, 5), t(1, 2, 3, 8)), kind="edge")
    yield Sample("dv1_d1", (t(1, 1, 20, 1), t(1, 1, 20, 1), t(1, 1, 4, 1)), kind="edge")
    q = t(1, 1, 70, 19)
    yield Sample("tiles_n70_m7_d19_dv33", (q, t(1, 1, 70, 33), _pooled(q, 7)), kind="edge")
    # ---- special values
    q, v = t(1, 2, 20, 4), t(1, 2, 20, 3)
    lm = _pooled(q, 4)
    q[0, 0, 5, 1] = np.nan  # NaN query row: K1^T V of head 0 is NaN -> all of head 0 NaN
    q[0, 1, 7, 0] = np.inf  # inf query row: its K1 row is exp(-inf) = 0 -> output row 0
    yield Sample("nan_inf_in_q", (q, v, lm), kind="special")
    q = t(1, 2, 20, 4)
    lm = _pooled(q, 4)
    lm[0, 1, 2, 3] = -np.inf  # inf landmark: K2's diagonal NaN -> head 1 NaN
    yield Sample("inf_landmark", (q, t(1, 2, 20, 3), lm), kind="special")
    q, v = t(1, 2, 20, 4), t(1, 2, 20, 3)
    v[0, 1, 3, 2] = np.nan  # NaN value: column 2 of head 1 NaN
    yield Sample("nan_in_v", (q, v, _pooled(q, 4)), kind="special")
    q = t(1, 1, 16, 4)
    yield Sample("far_landmarks_k1_underflows", (q, t(1, 1, 16, 3), t(1, 1, 4, 4) + 40.0), kind="special")
    # large |V|: O scales with V, and so does the tolerance (value_scale): heads of very different scales
    q = t(1, 3, 100, 16, s=0.5)
    v = t(1, 3, 100, 12)
    v[0, 0] *= 3.7
    v[0, 1] *= 1e3
    v[0, 2] *= 1e-3  # small beside head 1: its tolerance stays absolute (per head)
    yield Sample("large_v_per_head_x3p7_x1e3_x1e-3", (q, v, _pooled(q, 16)), kind="special")
    q = t(1, 1, 48, 8)
    yield Sample("large_v_1e6_iters40", (q, t(1, 1, 48, 5, s=1e6), _pooled(q, 8)), {"newton_iters": 40}, kind="special")
    q = t(1, 1, 16, 4)
    lm = np.repeat(q[:, :, :1], 4, axis=2)  # identical landmarks: K2 all ones, singular without the regulariser
    yield Sample("duplicate_landmarks", (q, t(1, 1, 16, 3), lm), kind="special")


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of NystromGaussianAttention; every backend must refuse them with a message containing ``match``."""
    q, v, lm = (
        np.zeros((2, 2, 6, 4), np.float32),
        np.zeros((2, 2, 6, 3), np.float32),
        np.zeros((2, 2, 3, 4), np.float32),
    )
    yield ErrorCase("m_zero", (q, v, lm[:, :, :0]), {}, "m=0 landmarks (rule: m >= 1)")
    yield ErrorCase("d_mismatch", (q, v, np.zeros((2, 2, 3, 5), np.float32)), {}, "Landmarks have d=5 but Q has d=4")
    yield ErrorCase("v_n_mismatch", (q, v[:, :, :5], lm), {}, "V has [B, H, n] = [2, 2, 5] but Q has [2, 2, 6]")
    yield ErrorCase("landmark_heads", (q, v, lm[:, :1]), {}, "Landmarks have [B, H] = [2, 1] but Q has [2, 2]")
    yield ErrorCase("q_rank3", (q[0], v, lm), {}, "Q must have rank 4, got rank 3")
    yield ErrorCase("d_zero", (q[..., :0], v, lm[..., :0]), {}, "d=0 (rule: d >= 1)")
    yield ErrorCase("iters_negative", (q, v, lm), {"newton_iters": -1}, "newton_iters -1 is out of range")
    yield ErrorCase(
        "iters_huge", (q, v, lm), {"newton_iters": 2**31 - 1}, "newton_iters 2147483647 is out of range (rule: 0 <="
    )
    yield ErrorCase(
        "reg_negative", (q, v, lm), {"regularization": -0.5}, "regularization -0.5 is not a finite number >= 0"
    )
    yield ErrorCase(
        "reg_nan", (q, v, lm), {"regularization": float("nan")}, "regularization nan is not a finite number"
    )


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(
        Port("Q", doc="queries = keys [B, H, n, d]"),
        Port("V", doc="values [B, H, n, dv]"),
        Port("Landmarks", doc="[B, H, m, d], in Q's space"),
    ),
    outputs=(Port("O", doc="[B, H, n, dv]"),),
    attrs=(
        Attr("newton_iters", int, 20, "Newton-Schulz steps on the m x m landmark matrix (0 ... 1000)"),
        Attr("regularization", float, 0.01, "added to K2's diagonal before the iteration (finite, >= 0)"),
    ),
    reference=reference,
    function=NystromGaussianAttention,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    torch_fake=torch_fake,
    infer_shapes=infer_shapes,
    tolerance=_TOLERANCE,
    atol_scale=value_scale,
    linear_in="V",
    source="Lu et al. 2021, SOFT: Softmax-free Transformer with Linear Complexity, arXiv 2110.11945; "
    "fudan-zvg/SOFT (kernel/inverse.py newton_inv, models/softmax_free_transformer.py)",
)
