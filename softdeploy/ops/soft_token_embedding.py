"""SoftTokenEmbedding: the next input embedding of soft thinking -- the probability-weighted mixture of
the most probable tokens' embeddings -- fused with its sampling filters, optional Gumbel noise and the
entropy the loop's cold stop reads.

Per row b of Logits [B, V], with the row's mode m = Mode[b] (0 thinking, 1 after thinking; Mode
omitted = every row thinking) choosing the parameters (T, top_k, top_p, min_p) = (temperature, top_k,
top_p, min_p) for m = 0 and (after_thinking_temperature, after_thinking_top_k, after_thinking_top_p,
after_thinking_min_p) for m = 1:

    p       = softmax(Logits[b] / T)
    Entropy = -sum_j p_j ln p_j                                       (0 ln 0 = 0; natural log)
    rank    : the V entries by logit, larger first, equal logits -> lower id first (the order of p)
    keep    : the rank prefix of length n = min(kk, n_p, n_min), where
              kk    = top_k if 0 < top_k < V else V                     (top_k 0 or >= V: off)
              Z     = sum of p over the first kk ranked entries          (1 when top_k is off)
              n_p   : entry i is kept iff sum_{j<i} p_(j) < top_p * Z   (top_p = 1: off, n_p = V)
              n_min : entry i is kept iff p_(i) >= min_p * p_(0)        (min_p = 0: off)
    K       = max_topk; Ids = the first K ranked ids
    w_i     = p_(i) / sum_{j < min(K, n)} p_(j)  for i < min(K, n), else 0
    noise "gumbel", thinking rows only (needs Noise, uniform in (0, 1)):
              g_i = clip(-ln(-ln Noise[b, Ids_i]), clamp_min, clamp_max)
              w   = softmax((ln(w + 1e-6) + noise_factor * g) / tau)
              then Weights, Ids re-sorted by w descending (stable: ties keep the rank order)
    Weights = w;  Mixed = sum_i w_i Embedding[Ids_i]  (as a product: 0 * inf is NaN)

Outputs: Mixed [B, E], Weights [B, max_topk], Ids [B, max_topk] int64, Entropy [B].

Where each rule comes from (eric-ai-lab/Soft-Thinking sglang_soft_thinking_pkg/.../layers/sampler.py,
zz1358m/SofT-GRPO-master Soft-Thinking+noise+loss-main/.../layers/sampler.py, the same code path):
  * p = softmax(logits / temperature); entropy of that p, before any filter (both samplers). They clamp
    p at 1e-12 inside the log; here 0 ln 0 = 0 exactly (the difference is below 1e-10 nats per row).
  * top_k renormalisation, then top_p on the top_k-renormalised probabilities, then min_p against the
    largest of them (``top_k_renorm_prob`` -> ``top_p_renorm_prob`` -> ``probs < max_prob * min_p``);
    then ``torch.topk(probs, max_topk)`` renormalised. Each filter keeps a prefix of the ranking, so
    the renormalisations compose into the one above. The samplers' flashinfer kernels keep every entry
    tied with the threshold; here ties are ranked by id (one total order, SoftmaxTopK's). Slots past
    the kept prefix have weight 0 and the next ranked ids (torch.topk leaves them unspecified).
  * after-thinking rows use the ``after_thinking_*`` filters (both samplers choose top_p / top_k /
    min_p per row by mode; the temperature per mode is this op's: Soft-Thinking carries
    after_thinking_temperature but its sampler divides by ``temperatures``) and no noise. The samplers
    then draw one token from the after-thinking distribution; this op returns its top max_topk and
    the caller draws (e.g. from Weights / Ids).
  * Gumbel: SofT-GRPO's form -- ln(w + 1e-6), g clamped to [-1.5, 3] (clamp_min / clamp_max),
    ``noise_factor``, softmax over the max_topk slots at temperature tau (SofT-GRPO's
    gumbel_softmax_temperature), re-sorted. g is -ln(-ln U) of the given Noise U instead of
    torch's -ln(Exponential(1)) draw (the same law), so runs are reproducible. Soft-Thinking's
    variant (ln w, no clamp, no factor) is not offered. Dirichlet noise (both repositories,
    "not used in paper") is absent: a Gamma draw needs rejection sampling, not one uniform per slot.

Non-finite logits (SoftmaxTopK's policy): -inf entries have probability 0 and rank last (by id). A
row holding NaN or +inf, or only -inf, has no distribution: its Weights, Mixed and Entropy are NaN and
its Ids follow the ranking rule (NaN first, then +inf; an all -inf row gives 0, 1, ..., K-1); no
noise is read for it. A Noise value read (Noise[b, Ids_i] of a thinking row under "gumbel") must lie
in [0, 1] (0 and 1 give g = clamp_min and clamp_max); NaN or a value outside is an error (the
function body, which cannot raise, gives NaN weights). An Embedding row's inf or NaN reaches Mixed.

Precision: top_p and min_p decisions are threshold tests; an input within a backend's rounding of a
threshold (e.g. a cumulative sum equal to top_p) may be decided differently -- the samples keep away
from such inputs. The reference, the function body and the torch op compute in float64 and round
the outputs to float32; the kernel is held to the tolerance derived beside the samples.

The kernel (ops/soft_token_embedding.cc) reads Logits once per row: SoftmaxTopK's fast row
(ops/softmax_topk_kernels.h) with the entropy's second sum fused in, for the top
max(max_topk, top_k) candidates and the normaliser, then the filters on those candidates in double
and the K x E weighted gather. The CUDA kernel (ops/cuda/soft_token_embedding.cu) follows the same
rules, except that a device kernel cannot raise: a bad Noise or Mode value gives its row NaN outputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from softdeploy.errors import OpContractError
from softdeploy.ops._body import function_body
from softdeploy.ops._schema import Attr, BodyFill, ErrorCase, OpDef, Port, Sample

if TYPE_CHECKING:  # bound when the body is compiled (softdeploy/ops/_body.py)
    from onnxscript import DOUBLE
    from onnxscript import opset18 as op

NAME = "SoftTokenEmbedding"
NOISES = ("none", "gumbel")
LOG_EPS = 1e-6  # SofT-GRPO: log(topk_probs + 1e-6) before the Gumbel noise

DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "max_topk": 10,
    "noise": "none",
    "tau": 1.0,
    "noise_factor": 1.0,
    "clamp_min": -1.5,
    "clamp_max": 3.0,
    "after_thinking_temperature": 1.0,
    "after_thinking_top_k": 0,
    "after_thinking_top_p": 1.0,
    "after_thinking_min_p": 0.0,
}


def _f32(v: float) -> float:
    """ONNX FLOAT attributes are float32: every backend uses float32(v)."""
    return float(np.float32(v))


def _check_filters(prefix: str, temperature: float, top_k: int, top_p: float, min_p: float) -> None:
    if not temperature > 0:
        raise OpContractError(f"{NAME}: {prefix}temperature {temperature:g} is out of range (rule: temperature > 0)")
    if top_k < 0:
        raise OpContractError(f"{NAME}: {prefix}top_k {top_k} is out of range (rule: top_k >= 0, 0 = off)")
    if not 0 < top_p <= 1:
        raise OpContractError(f"{NAME}: {prefix}top_p {top_p:g} is out of range (rule: 0 < top_p <= 1, 1 = off)")
    if not 0 <= min_p < 1:
        raise OpContractError(f"{NAME}: {prefix}min_p {min_p:g} is out of range (rule: 0 <= min_p < 1, 0 = off)")


def validate(
    logits_shape: tuple[int, ...],
    embedding_shape: tuple[int, ...],
    noise_shape: tuple[int, ...] | None,
    mode: np.ndarray | None,
    attrs: dict[str, Any],
) -> None:
    """Checks the contract on the shapes, the Mode values and the attributes (messages match
    ops/soft_token_embedding.cc). A rank-0 Noise is an omitted one (what exported models feed in its
    place, Port.body_fill)."""
    if len(logits_shape) != 2:
        raise OpContractError(f"{NAME}: Logits must have rank 2 [B, V], got shape {list(logits_shape)}")
    if len(embedding_shape) != 2:
        raise OpContractError(f"{NAME}: Embedding must have rank 2 [V, E], got shape {list(embedding_shape)}")
    b, v = logits_shape
    if embedding_shape[0] != v:
        raise OpContractError(
            f"{NAME}: Embedding has {embedding_shape[0]} rows but Logits has V = {v} "
            "(rule: Embedding [V, E] has one row per logit)"
        )
    k = attrs["max_topk"]
    if k < 1:
        raise OpContractError(f"{NAME}: max_topk {k} is out of range (rule: 1 <= max_topk <= V)")
    if k > v:
        raise OpContractError(f"{NAME}: max_topk {k} is larger than V = {v} (rule: 1 <= max_topk <= V)")
    _check_filters("", attrs["temperature"], attrs["top_k"], attrs["top_p"], attrs["min_p"])
    _check_filters(
        "after_thinking_",
        attrs["after_thinking_temperature"],
        attrs["after_thinking_top_k"],
        attrs["after_thinking_top_p"],
        attrs["after_thinking_min_p"],
    )
    if attrs["noise"] not in NOISES:
        raise OpContractError(f"{NAME}: noise '{attrs['noise']}' is not supported (rule: noise is 'none' or 'gumbel')")
    if not attrs["tau"] > 0:
        raise OpContractError(f"{NAME}: tau {attrs['tau']:g} is out of range (rule: tau > 0)")
    if not np.isfinite(attrs["noise_factor"]):
        raise OpContractError(f"{NAME}: noise_factor {attrs['noise_factor']:g} is not finite (rule: finite)")
    if not attrs["clamp_min"] <= attrs["clamp_max"]:
        raise OpContractError(
            f"{NAME}: clamp_min {attrs['clamp_min']:g} is above clamp_max {attrs['clamp_max']:g} "
            "(rule: clamp_min <= clamp_max)"
        )
    has_noise = noise_shape is not None and len(noise_shape) != 0
    if has_noise and tuple(noise_shape or ()) != (b, v):
        raise OpContractError(
            f"{NAME}: Noise has shape {list(noise_shape or ())}, expected [B, V] = [{b}, {v}] (rule: one uniform per logit)"
        )
    if attrs["noise"] == "gumbel" and not has_noise:
        raise OpContractError(f"{NAME}: noise 'gumbel' needs the Noise input (rule: Noise [B, V] uniform in (0, 1))")
    if mode is not None:
        if np.shape(mode) != (b,):
            raise OpContractError(f"{NAME}: Mode has shape {list(np.shape(mode))}, expected [B] = [{b}]")
        bad = np.flatnonzero((np.asarray(mode) != 0) & (np.asarray(mode) != 1))
        if bad.size:
            i = int(bad[0])
            raise OpContractError(
                f"{NAME}: Mode[{i}] = {int(np.asarray(mode)[i])} is not a mode (rule: 0 = thinking, 1 = after thinking)"
            )


def _resolve(attrs: dict[str, Any]) -> dict[str, Any]:
    out = dict(DEFAULTS)
    out.update(attrs)
    return out


def _rank_order(x: np.ndarray) -> np.ndarray:
    """Row-wise rank order of the logits: NaN, +inf, finite descending, -inf; ties by lower id."""
    key = np.where(np.isnan(x), -np.inf, -x)
    nan_first = np.where(np.isnan(x), 0, 1)
    return np.lexsort((key, nan_first), axis=-1)


def _noise_value(u: float, b: int, j: int) -> float:
    if not 0.0 <= u <= 1.0:
        raise OpContractError(f"{NAME}: Noise[{b}, {j}] = {u:g} is outside [0, 1] (rule: Noise is uniform in (0, 1))")
    return u


def _row(
    x: np.ndarray, noise_row: np.ndarray | None, b: int, params: tuple[float, int, float, float], a: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray, float]:
    """Weights (float64), Ids and Entropy of one row (see the module docstring)."""
    t, top_k, top_p, min_p = params
    v = x.shape[0]
    k = a["max_topk"]
    order = _rank_order(x[None, :])[0]
    ids = order[:k].astype(np.int64)
    if np.isnan(x).any() or (x == np.inf).any() or not (x > -np.inf).any():
        return np.full(k, np.nan), ids, float("nan")
    z = x / t
    m = z.max()
    e = np.exp(z - m)
    d = e.sum()
    p = e / d
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = float(-np.sum(np.where(p > 0, p * np.log(p), 0.0)))
    ps = p[order]
    kk = top_k if 0 < top_k < v else v
    keep = np.arange(v) < kk
    if top_p < 1:
        z_k = ps[:kk].sum() if kk < v else 1.0
        before = np.concatenate(([0.0], np.cumsum(ps)[:-1]))
        keep &= before < top_p * z_k
    if min_p > 0:
        keep &= ps >= min_p * ps[0]
    wk = np.where(keep[:k], ps[:k], 0.0)
    w = wk / wk.sum()
    if noise_row is not None:
        u = np.array([_noise_value(float(noise_row[j]), b, int(j)) for j in ids])
        with np.errstate(divide="ignore"):
            g = np.clip(-np.log(-np.log(u)), a["clamp_min"], a["clamp_max"])
        y = (np.log(w + LOG_EPS) + a["noise_factor"] * g) / a["tau"]
        y = np.exp(y - y.max())
        w = y / y.sum()
        resort = np.argsort(-w, kind="stable")
        w, ids = w[resort], ids[resort]
    return w, ids, entropy


def reference(
    logits: np.ndarray,
    embedding: np.ndarray,
    uniform: np.ndarray | None = None,
    mode: np.ndarray | None = None,
    **attrs: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The float64 NumPy oracle of SoftTokenEmbedding (Mixed, Weights, Ids, Entropy): every backend is held to it
    within OpDef.tolerance; it checks the contract first, so a bad input raises the same OpContractError."""
    a = _resolve(attrs)
    noise_shape = None if uniform is None else tuple(np.shape(uniform))
    validate(tuple(np.shape(logits)), tuple(np.shape(embedding)), noise_shape, mode, a)
    for name in ("temperature", "top_p", "min_p", "tau", "noise_factor", "clamp_min", "clamp_max"):
        a[name] = _f32(a[name])
    for name in ("temperature", "top_p", "min_p"):
        a["after_thinking_" + name] = _f32(a["after_thinking_" + name])
    x = np.asarray(logits).astype(np.float64)
    emb = np.asarray(embedding)
    bsz, _ = x.shape
    k = a["max_topk"]
    has_noise = a["noise"] == "gumbel"
    u = None if uniform is None or np.ndim(uniform) == 0 else np.asarray(uniform).astype(np.float64)
    weights = np.zeros((bsz, k))
    ids = np.zeros((bsz, k), np.int64)
    entropy = np.zeros(bsz)
    for b in range(bsz):
        after = mode is not None and int(np.asarray(mode)[b]) == 1
        if after:
            params = (
                a["after_thinking_temperature"],
                a["after_thinking_top_k"],
                a["after_thinking_top_p"],
                a["after_thinking_min_p"],
            )
        else:
            params = (a["temperature"], a["top_k"], a["top_p"], a["min_p"])
        noise_row = u[b] if has_noise and not after and u is not None else None
        weights[b], ids[b], entropy[b] = _row(x[b], noise_row, b, params, a)
    with np.errstate(invalid="ignore", over="ignore"):
        rows = emb[ids].astype(np.float64)
        mixed = np.einsum("bk,bke->be", weights, rows) if bsz else np.zeros((0, emb.shape[1]))
    f32 = np.float32
    return mixed.astype(f32), weights.astype(f32), ids, entropy.astype(f32)


@function_body
def SoftTokenEmbedding(
    Logits,
    Embedding,
    Noise,
    Mode,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    max_topk: int = 10,
    noise: str = "none",
    tau: float = 1.0,
    noise_factor: float = 1.0,
    clamp_min: float = -1.5,
    clamp_max: float = 3.0,
    after_thinking_temperature: float = 1.0,
    after_thinking_top_k: int = 0,
    after_thinking_top_p: float = 1.0,
    after_thinking_min_p: float = 0.0,
):
    # Everything in float64, so that the ranking, the threshold tests and the re-sort agree with the
    # float64 reference (an omitted Noise arrives as a scalar 0.5, an omitted Mode as zeros: body_fill).
    xd = op.Cast(Logits, to=DOUBLE.dtype)
    zero = op.Constant(value_float=0.0)
    zero_d = op.CastLike(zero, xd)
    one_d = op.CastLike(op.Constant(value_float=1.0), xd)
    nan_d = op.CastLike(op.Constant(value_float=float("nan")), xd)
    axis1 = op.Constant(value_ints=[1])
    # Ranking key: NaN -> 4 FLT_MAX, +inf -> 2 FLT_MAX, -inf -> -2 FLT_MAX (SoftmaxTopK's order, all finite),
    # then made distinct with lower ids first: key - id * (|key| 2^-50 + 2^-1000). A float32 value's double
    # has 29 spare bits, so the steps (>= 4 ulps, exact products) never reach the next float32 value for
    # V < 2^20, and no TopK implementation has ties left to order (TVM's does not keep lower ids first).
    flt2 = op.Mul(op.CastLike(op.Constant(value_float=3.4028234663852886e38), xd), op.CastLike(2.0, xd))
    # (Equal against +-inf, not IsInf's detect_* attributes, which TVM's importer ignores)
    is_pos_inf = op.Equal(xd, op.CastLike(op.Constant(value_float=float("inf")), xd))
    is_neg_inf = op.Equal(xd, op.CastLike(op.Constant(value_float=float("-inf")), xd))
    key = op.Where(is_pos_inf, flt2, xd)
    key = op.Where(is_neg_inf, op.Neg(flt2), key)
    key = op.Where(op.IsNaN(xd), op.Add(flt2, flt2), key)
    t200 = op.Mul(
        op.CastLike(op.Constant(value_float=2.0**-100), xd), op.CastLike(op.Constant(value_float=2.0**-100), xd)
    )
    t400 = op.Mul(t200, t200)
    tiny = op.Mul(op.Mul(t400, t400), t200)  # 2^-1000 (not a float32 constant), a normal double
    rel = op.CastLike(op.Constant(value_float=2.0**-50), xd)
    v_s = op.Squeeze(op.Shape(Logits, start=1, end=2))
    id_d = op.Cast(op.Range(op.Constant(value_int=0), v_s, op.Constant(value_int=1)), to=DOUBLE.dtype)
    key = op.Sub(key, op.Mul(id_d, op.Add(op.Mul(op.Abs(key), rel), tiny)))
    # Rows without a distribution: a NaN, a +inf, or no entry above -inf (indicator reductions: no reliance
    # on how a backend's ReduceMax treats NaN or starts its maximum).
    has_nan = op.Greater(op.ReduceMax(op.Cast(op.IsNaN(xd), to=DOUBLE.dtype), axis1, keepdims=1), zero_d)
    has_pos_inf = op.Greater(op.ReduceMax(op.Cast(is_pos_inf, to=DOUBLE.dtype), axis1, keepdims=1), zero_d)
    all_neg_inf = op.Greater(op.ReduceMin(op.Cast(is_neg_inf, to=DOUBLE.dtype), axis1, keepdims=1), zero_d)
    special = op.Or(op.Or(has_nan, has_pos_inf), all_neg_inf)
    x = op.Where(special, zero_d, xd)

    v = op.Shape(Logits, start=1, end=2)  # [1]
    after = op.Unsqueeze(op.Equal(Mode, op.Constant(value_int=1)), axis1)  # [B, 1]
    t = op.Where(after, op.Constant(value_float=after_thinking_temperature), op.Constant(value_float=temperature))
    tk = op.Where(after, op.Constant(value_int=after_thinking_top_k), op.Constant(value_int=top_k))
    tp = op.Where(after, op.Constant(value_float=after_thinking_top_p), op.Constant(value_float=top_p))
    mp = op.Where(after, op.Constant(value_float=after_thinking_min_p), op.Constant(value_float=min_p))
    t = op.Cast(t, to=DOUBLE.dtype)
    tp = op.Cast(tp, to=DOUBLE.dtype)
    mp = op.Cast(mp, to=DOUBLE.dtype)
    k = op.Constant(value_int=max_topk)
    top_k_on = op.And(op.Greater(tk, op.Constant(value_int=0)), op.Less(tk, v))
    kk = op.Where(top_k_on, tk, v)  # [B, 1]
    # Candidates: the first max(max_topk, top_k) ranked entries (top_k's normaliser needs all of them).
    largest_k = op.Max(k, op.Max(op.Constant(value_int=top_k), op.Constant(value_int=after_thinking_top_k)))
    kc = op.Squeeze(op.Min(v, op.Reshape(largest_k, op.Constant(value_ints=[1]))))  # scalar
    _, cand = op.TopK(key, op.Reshape(kc, op.Constant(value_ints=[1])), axis=1, largest=1, sorted=1)

    z = op.Div(x, t)
    m = op.ReduceMax(z, axis1, keepdims=1)
    e = op.Exp(op.Sub(z, m))
    p = op.Div(e, op.ReduceSum(e, axis1, keepdims=1))
    plogp = op.Where(op.Greater(p, zero_d), op.Mul(p, op.Log(p)), zero_d)
    entropy = op.Neg(op.ReduceSum(plogp, axis1, keepdims=0))

    pc = op.GatherElements(p, cand, axis=1)  # [B, kc], non-increasing
    pos = op.Unsqueeze(op.Range(op.Constant(value_int=0), kc, op.Constant(value_int=1)), op.Constant(value_ints=[0]))
    in_k = op.Less(pos, kk)
    z_k = op.Where(top_k_on, op.ReduceSum(op.Where(in_k, pc, zero_d), axis1, keepdims=1), one_d)
    before = op.CumSum(pc, op.Constant(value_int=1), exclusive=1)
    keep_p = op.Or(op.GreaterOrEqual(tp, one_d), op.Less(before, op.Mul(tp, z_k)))
    p0 = op.Slice(pc, op.Constant(value_ints=[0]), op.Constant(value_ints=[1]), axis1)
    keep_min = op.GreaterOrEqual(pc, op.Mul(mp, p0))
    keep = op.And(op.And(in_k, keep_p), keep_min)
    k1 = op.Reshape(k, op.Constant(value_ints=[1]))
    first = op.Constant(value_ints=[0])
    ids = op.Slice(cand, first, k1, axis1)
    wk = op.Where(op.Slice(keep, first, k1, axis1), op.Slice(pc, first, k1, axis1), zero_d)
    w = op.Div(wk, op.ReduceSum(wk, axis1, keepdims=1))

    # Gumbel noise on thinking rows. String equality in opset 18: Unique of [noise, "gumbel"] has one element
    # iff noise == "gumbel" (SoftNMS's body). A Noise of rank != 2 (the omitted fill) gives NaN weights.
    name = op.Unsqueeze(op.Constant(value_string=noise), op.Constant(value_ints=[0]))
    one_i = op.Constant(value_int=1)
    gumbel = op.Equal(op.Size(op.Unique(op.Concat(name, op.Constant(value_strings=["gumbel"]), axis=0))), one_i)
    use_noise = op.And(gumbel, op.Not(after))  # [B, 1]
    noise_ok = op.Equal(op.Size(op.Shape(Noise)), op.Constant(value_int=2))
    u_all = op.Expand(Noise, op.Shape(Logits))
    u = op.Where(noise_ok, op.Cast(op.GatherElements(u_all, ids, axis=1), to=DOUBLE.dtype), nan_d)
    u = op.Where(op.Or(op.Less(u, zero_d), op.Greater(u, one_d)), nan_d, u)
    g = op.Neg(op.Log(op.Neg(op.Log(u))))
    lo = op.Cast(op.Constant(value_float=clamp_min), to=DOUBLE.dtype)
    hi = op.Cast(op.Constant(value_float=clamp_max), to=DOUBLE.dtype)
    g = op.Where(op.IsNaN(g), g, op.Min(op.Max(g, lo), hi))
    eps = op.Cast(op.Constant(value_float=1e-6), to=DOUBLE.dtype)
    nf = op.Cast(op.Constant(value_float=noise_factor), to=DOUBLE.dtype)
    ta = op.Cast(op.Constant(value_float=tau), to=DOUBLE.dtype)
    y = op.Div(op.Add(op.Log(op.Add(w, eps)), op.Mul(nf, g)), ta)
    w_noise = op.Softmax(y, axis=1)
    w2 = op.Where(op.And(use_noise, op.Not(special)), w_noise, w)
    # Re-sort, stable (ties keep the rank order): distinct keys as above, slot instead of id.
    slot = op.Cast(op.Range(op.Constant(value_int=0), k, op.Constant(value_int=1)), to=DOUBLE.dtype)
    w2_key = op.Sub(w2, op.Mul(slot, op.Add(op.Mul(op.Abs(w2), rel), tiny)))
    _, order = op.TopK(w2_key, k1, axis=1, largest=1, sorted=1)
    w3 = op.GatherElements(w2, order, axis=1)
    Ids = op.GatherElements(ids, order, axis=1)
    w3 = op.Where(special, nan_d, w3)
    rows = op.Cast(op.Gather(Embedding, Ids, axis=0), to=DOUBLE.dtype)  # [B, K, E]
    mixed = op.Squeeze(op.MatMul(op.Unsqueeze(w3, axis1), rows), axis1)
    Mixed = op.CastLike(mixed, Logits)
    Weights = op.CastLike(w3, Logits)
    Entropy = op.CastLike(op.Where(op.Squeeze(special, axis1), nan_d, entropy), Logits)
    return Mixed, Weights, Ids, Entropy


def _torch_check(logits: Any, embedding: Any, uniform: Any, mode: Any, a: dict[str, Any]) -> Any:
    """validate() on torch tensors; returns Mode as a NumPy array (or None)."""
    mode_np = None if mode is None else mode.detach().cpu().numpy()
    noise_shape = None if uniform is None else tuple(uniform.shape)
    validate(tuple(logits.shape), tuple(embedding.shape), noise_shape, mode_np, a)
    return mode_np


def _num_candidates(top_k: int, max_topk: int, v: int) -> int:
    """Ranked entries the filters can need: max_topk, or top_k when it is on and larger (its normaliser)."""
    return min(v, max(max_topk, top_k if 0 < top_k < v else 0))


def torch_impl(logits: Any, embedding: Any, uniform: Any = None, mode: Any = None, **attrs: Any) -> Any:
    """Eager torch SoftTokenEmbedding (Mixed, Weights, Ids, Entropy), computed in float64 like the reference and
    returned in Logits' type; registered as torch.ops.softdeploy.soft_token_embedding. It checks the contract
    first, like every backend."""
    import torch

    a = _resolve(attrs)
    _torch_check(logits, embedding, uniform, mode, a)
    bsz, v = logits.shape
    k = a["max_topk"]
    dev = logits.device
    if bsz == 0:
        return (
            logits.new_empty((0, embedding.shape[1])),
            logits.new_empty((0, k)),
            torch.empty((0, k), dtype=torch.int64, device=dev),
            logits.new_empty((0,)),
        )
    x = logits.double()
    # The first kc ranked entries by one topk over distinct keys (the function body's: NaN, +inf, -inf moved to
    # finite stand-ins in the same order, then key - id (|key| 2^-50 + 2^-1000), lower ids first on ties).
    flt2 = 2.0 * float(np.finfo(np.float32).max)
    key = torch.where(x == torch.inf, flt2, torch.where(x == -torch.inf, -flt2, x))
    key = torch.where(torch.isnan(x), 2 * flt2, key)
    idx = torch.arange(v, device=dev, dtype=torch.float64)
    key = key - idx * (key.abs() * 2.0**-50 + 2.0**-1000)
    kc = max(_num_candidates(a["top_k"], k, v), _num_candidates(a["after_thinking_top_k"], k, v))
    order = torch.topk(key, kc, dim=1, largest=True, sorted=True).indices
    special = torch.isnan(x).any(1) | (x == torch.inf).any(1) | ~(x > -torch.inf).any(1)
    after = torch.zeros(bsz, dtype=torch.bool, device=dev) if mode is None else mode == 1

    def per_row(name: str) -> Any:
        thinking, later = a[name], a["after_thinking_" + name]
        if isinstance(thinking, float):
            thinking, later = _f32(thinking), _f32(later)
        dtype = torch.float64 if isinstance(thinking, float) else torch.int64
        return torch.where(
            after, torch.tensor(later, dtype=dtype, device=dev), torch.tensor(thinking, dtype=dtype, device=dev)
        )[:, None]

    t, tk, tp, mp = per_row("temperature"), per_row("top_k"), per_row("top_p"), per_row("min_p")
    xs = torch.where(special[:, None], torch.zeros_like(x), x)
    p = torch.softmax(xs / t, dim=1)
    entropy = -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(1)
    ps = torch.gather(p, 1, order)  # [B, kc]: every filter keeps a prefix within the first kc
    pos = torch.arange(kc, device=dev)[None, :]
    top_k_on = (tk > 0) & (tk < v)
    kk = torch.where(top_k_on, tk, torch.full_like(tk, v))
    in_k = pos < kk
    z_k = torch.where(top_k_on, torch.where(in_k, ps, torch.zeros_like(ps)).sum(1, keepdim=True), torch.ones_like(tp))
    before = torch.cumsum(ps, dim=1) - ps
    before[:, 0] = 0.0
    keep = in_k & ((tp >= 1) | (before < tp * z_k)) & (ps >= mp * ps[:, :1])
    ids = order[:, :k]
    wk = torch.where(keep[:, :k], ps[:, :k], torch.zeros_like(ps[:, :k]))
    w = wk / wk.sum(1, keepdim=True)
    use_noise = (~after) & (~special) if a["noise"] == "gumbel" else torch.zeros_like(after)
    if bool(use_noise.any()):
        u = torch.gather(uniform.double(), 1, ids)
        bad = (~((u >= 0) & (u <= 1))) & use_noise[:, None]
        if bool(bad.any()):
            b, i = (int(c) for c in torch.nonzero(bad)[0])
            _noise_value(float(u[b, i]), b, int(ids[b, i]))
        g = torch.clamp(-torch.log(-torch.log(u)), _f32(a["clamp_min"]), _f32(a["clamp_max"]))
        y = (torch.log(w + LOG_EPS) + _f32(a["noise_factor"]) * g) / _f32(a["tau"])
        w_noise = torch.softmax(y, dim=1)
        w_noise, resort = torch.sort(w_noise, dim=1, descending=True, stable=True)
        w = torch.where(use_noise[:, None], w_noise, w)
        ids = torch.where(use_noise[:, None], torch.gather(ids, 1, resort), ids)
    w = torch.where(special[:, None], torch.full_like(w, torch.nan), w)
    entropy = torch.where(special, torch.full_like(entropy, torch.nan), entropy)
    mixed = torch.einsum("bk,bke->be", w, embedding[ids].double())
    return mixed.to(logits.dtype), w.to(logits.dtype), ids, entropy.to(logits.dtype)


def torch_fake(logits: Any, embedding: Any, uniform: Any = None, mode: Any = None, *attr_values: Any) -> Any:
    """SoftTokenEmbedding on torch's fake tensors (export tracing; torch passes the attributes positionally, in the
    order of DEF.attrs): the shape checks, then empty outputs."""
    import torch

    a = _resolve(dict(zip(DEFAULTS, attr_values, strict=False)))
    validate(tuple(logits.shape), tuple(embedding.shape), None if uniform is None else tuple(uniform.shape), None, a)
    bsz, k = logits.shape[0], a["max_topk"]
    return (
        logits.new_empty((bsz, embedding.shape[1])),
        logits.new_empty((bsz, k)),
        logits.new_empty((bsz, k), dtype=torch.int64),
        logits.new_empty((bsz,)),
    )


def infer_shapes(ctx: Any) -> None:
    """ONNX shape inference for SoftTokenEmbedding: Mixed, Weights and Entropy in Logits' type, Ids int64."""
    from onnx import TensorProto, helper

    elem = ctx.get_input_type(0).tensor_type.elem_type
    for i in (0, 1, 3):
        if i < ctx.get_num_outputs():
            ctx.set_output_type(i, helper.make_tensor_type_proto(elem, None))
    ctx.set_output_type(2, helper.make_tensor_type_proto(TensorProto.INT64, None))


def error_scale(logits: Any, embedding: Any, *rest: Any, **_: Any) -> Any:
    """Mixed's error grows with |Embedding|: max(1, largest finite |Embedding|)."""
    e = np.abs(np.asarray(embedding, np.float64))
    e = e[np.isfinite(e)]
    return max(1.0, float(e.max())) if e.size else 1.0


# Tolerance of the kernel against the float64 reference (the function body and the torch op compute in
# float64 and round once). Weights: w_i = e_i / sum e_j over the kept slots, e_i = exp((x_i - M) / T)
# in double -- the float32 rounding of the output, 6e-8 relative (with noise: the same, in double).
# Mixed: K <= 64 float32 products summed in float -- at most K * 2^-24 * max|E| ~ 4e-6 max|E| absolute,
# plus the Weights' 6e-8 relative. Entropy = ln S0 - ln 2 * S1 / S0 from the fast row's float sums
# (terms 2^u with relative error < 1e-7, float partial sums of <= 512 terms before double): relative
# error of the sums <~ 1e-6, times |u| <= 64 + log2(V) at the row reference -> <~ 1e-5 nats absolute
# (the cold-stop thresholds are ~1e-2). Hence rtol 1e-5 and atol 2e-5 x max(1, max|Embedding|).
TOLERANCE = {"float32": (1e-5, 2e-5)}


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of SoftTokenEmbedding, drawn from ``rng``: typical sizes with every filter, rows in
    both modes, Gumbel noise from a fixed Noise, k edges, V up to 256000, special values and ties."""

    def logits(b: int, v: int, scale: float = 3.0) -> np.ndarray:
        return (rng.standard_normal((b, v)) * scale).astype(np.float32)

    def emb(v: int, e: int) -> np.ndarray:
        return rng.standard_normal((v, e)).astype(np.float32)

    def uniform(b: int, v: int) -> np.ndarray:
        return rng.uniform(1e-6, 1 - 1e-6, (b, v)).astype(np.float32)

    yield Sample("plain_4x1000_e16", (logits(4, 1000), emb(1000, 16)), {})
    yield Sample("top_k_20_k5", (logits(3, 500), emb(500, 8)), {"top_k": 20, "max_topk": 5})
    yield Sample("top_k_3_below_k10", (logits(3, 500), emb(500, 8)), {"top_k": 3})
    yield Sample("top_p_0.8", (logits(4, 300, 1.0), emb(300, 8)), {"top_p": 0.8, "max_topk": 16})
    yield Sample("top_k_top_p", (logits(4, 300, 1.0), emb(300, 8)), {"top_k": 40, "top_p": 0.7, "max_topk": 30})
    yield Sample("min_p_0.05", (logits(4, 400, 2.0), emb(400, 8)), {"min_p": 0.05, "temperature": 0.6})
    yield Sample(
        "all_filters_t0.6",
        (logits(3, 2000), emb(2000, 12)),
        {"temperature": 0.6, "top_k": 30, "top_p": 0.95, "min_p": 0.001, "max_topk": 10},
    )
    mode = np.array([0, 1, 1, 0, 1], np.int64)
    yield Sample(
        "modes_mixed",
        (logits(5, 700), emb(700, 8), None, mode),
        {"temperature": 0.5, "top_p": 0.9, "after_thinking_temperature": 1.3, "after_thinking_top_k": 4},
    )
    x = logits(6, 1000)
    yield Sample(
        "gumbel_fixed_noise",
        (x, emb(1000, 16), uniform(6, 1000)),
        {"noise": "gumbel", "tau": 0.5, "max_topk": 8, "min_p": 0.001},
    )
    yield Sample(
        "gumbel_modes_factor_clamp",
        (logits(4, 600), emb(600, 8), uniform(4, 600), np.array([1, 0, 0, 1], np.int64)),
        {"noise": "gumbel", "tau": 0.1, "noise_factor": 0.7, "clamp_min": -1.0, "clamp_max": 2.0, "top_p": 0.95},
    )
    # k edges: one slot, every entry a slot, one entry, a vocabulary of two
    yield Sample("max_topk_1", (logits(3, 257), emb(257, 4)), {"max_topk": 1}, kind="edge")
    yield Sample("max_topk_equals_v", (logits(2, 33), emb(33, 5)), {"max_topk": 33}, kind="edge")
    yield Sample("v1", (logits(2, 1), emb(1, 3)), {"max_topk": 1}, kind="edge")
    yield Sample("top_k_1_of_k4", (logits(2, 64), emb(64, 4)), {"max_topk": 4, "top_k": 1}, kind="edge")
    yield Sample("top_k_above_v", (logits(2, 50), emb(50, 4)), {"max_topk": 5, "top_k": 80}, kind="edge")
    yield Sample("e1", (logits(3, 100), emb(100, 1)), {"max_topk": 3}, kind="edge")
    yield Sample("one_row", (logits(1, 4099), emb(4099, 8)), {}, kind="edge")
    yield Sample("empty_batch", (np.zeros((0, 40), np.float32), emb(40, 4)), {"max_topk": 3}, kind="edge")
    # no rows and no embedding width: every input stays empty when V grows (the huge-but-empty check's variant)
    yield Sample("empty_batch_e0", (np.zeros((0, 40), np.float32), emb(40, 0)), {"max_topk": 3}, kind="edge")
    # SIMD tile edges of the fast row
    for v in (15, 16, 17, 63, 64, 65, 511, 513):
        yield Sample(f"v{v}", (logits(2, v), emb(v, 4)), {"max_topk": min(v, 10)}, kind="edge")
    # the largest vocabularies of current LMs (Gemma: 256000)
    yield Sample("vocab_2x256000_e8", (logits(2, 256000), emb(256000, 8)), {"temperature": 0.7}, kind="edge")
    yield Sample(
        "vocab_2x151936_gumbel",
        (logits(2, 151936), emb(151936, 8), uniform(2, 151936)),
        {"noise": "gumbel", "tau": 0.5, "max_topk": 10},
        kind="edge",
    )
    # special values and ties
    special = logits(8, 64)
    special[0, [3, 20]] = -np.inf  # masked entries: probability 0
    special[1, :] = -np.inf  # no distribution: NaN outputs, ids 0..K-1
    special[2, 7] = np.nan  # NaN row: NaN outputs, the NaN id first
    special[3, 11] = np.inf  # +inf row: NaN outputs, the +inf id first
    special[4, :] = 2.5  # all tied: ids 0..K-1, equal weights
    special[5, :61] = -np.inf  # three finite entries: then zero weights, the -inf ids by index
    special[6, ::3] = 1.0  # ties among the winners -> lower id first
    special[6, 1::3] = 1.0 - 2**-20
    special[6, 2::3] = -5.0
    special[7, :] = -np.inf  # only -inf and NaN
    special[7, 30] = np.nan
    yield Sample("inf_nan_ties", (special, emb(64, 6)), {"max_topk": 6}, kind="special")
    yield Sample(
        "inf_nan_ties_gumbel",
        (special, emb(64, 6), uniform(8, 64), np.array([0, 0, 0, 0, 0, 0, 1, 0], np.int64)),
        {"max_topk": 6, "noise": "gumbel", "tau": 0.3},
        kind="special",
    )
    big = logits(2, 300)
    big[0] += 1e4
    big[1] *= 1e3  # one entry dominates: Entropy ~ 0, Weights one-hot
    yield Sample("large_magnitude", (big, emb(300, 4)), {}, kind="special")
    yield Sample(
        "tiny_temperature", (logits(2, 100), emb(100, 4)), {"temperature": 1e-3, "max_topk": 3}, kind="special"
    )
    noise_edges = uniform(2, 50)
    noise_edges[:, :] = np.float32(1.0)  # g = clamp_max everywhere ...
    noise_edges[0, ::2] = 0.0  # ... and clamp_min at even ids of row 0
    yield Sample(
        "noise_0_and_1",
        (logits(2, 50), emb(50, 4), noise_edges),
        {"noise": "gumbel", "max_topk": 5, "tau": 0.5},
        kind="special",
    )
    e_special = emb(40, 3)
    e_special[:, 0] = 1e30  # large embedding values: Mixed scales with them
    yield Sample("large_embedding", (logits(2, 40), e_special), {"max_topk": 4}, kind="special")


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of SoftTokenEmbedding; every backend must refuse them with a message containing
    ``match`` (the operator reference lists them)."""
    x = np.zeros((2, 5), np.float32)
    e = np.zeros((5, 3), np.float32)
    u = np.full((2, 5), 0.5, np.float32)
    yield ErrorCase("v_mismatch", (x, np.zeros((4, 3), np.float32)), {}, "Embedding has 4 rows but Logits has V = 5")
    yield ErrorCase("logits_rank_1", (np.zeros(5, np.float32), e), {}, "Logits must have rank 2")
    yield ErrorCase("embedding_rank_3", (x, np.zeros((5, 3, 1), np.float32)), {}, "Embedding must have rank 2")
    yield ErrorCase("max_topk_above_v", (x, e), {"max_topk": 6}, "max_topk 6 is larger than V = 5")
    yield ErrorCase("max_topk_zero", (x, e), {"max_topk": 0}, "max_topk 0 is out of range")
    yield ErrorCase("top_k_negative", (x, e), {"max_topk": 2, "top_k": -1}, "top_k -1 is out of range")
    yield ErrorCase("top_p_zero", (x, e), {"max_topk": 2, "top_p": 0.0}, "top_p 0 is out of range")
    yield ErrorCase("top_p_above_1", (x, e), {"max_topk": 2, "top_p": 1.5}, "top_p 1.5 is out of range")
    yield ErrorCase("min_p_1", (x, e), {"max_topk": 2, "min_p": 1.0}, "min_p 1 is out of range")
    yield ErrorCase("min_p_negative", (x, e), {"max_topk": 2, "min_p": -0.1}, "min_p -0.1 is out of range")
    yield ErrorCase("temperature_zero", (x, e), {"max_topk": 2, "temperature": 0.0}, "temperature 0 is out of range")
    yield ErrorCase(
        "after_temperature_negative",
        (x, e),
        {"max_topk": 2, "after_thinking_temperature": -1.0},
        "after_thinking_temperature -1 is out of range",
    )
    yield ErrorCase(
        "after_top_p_zero",
        (x, e),
        {"max_topk": 2, "after_thinking_top_p": 0.0},
        "after_thinking_top_p 0 is out of range",
    )
    yield ErrorCase("tau_zero", (x, e), {"max_topk": 2, "tau": 0.0}, "tau 0 is out of range")
    yield ErrorCase(
        "clamp_inverted",
        (x, e),
        {"max_topk": 2, "clamp_min": 2.0, "clamp_max": 1.0},
        "clamp_min 2 is above clamp_max 1",
    )
    yield ErrorCase("bad_noise", (x, e), {"max_topk": 2, "noise": "dirichlet"}, "noise 'dirichlet' is not supported")
    yield ErrorCase(
        "gumbel_without_noise", (x, e), {"max_topk": 2, "noise": "gumbel"}, "noise 'gumbel' needs the Noise"
    )
    yield ErrorCase(
        "noise_shape", (x, e, np.full((2, 4), 0.5, np.float32)), {"max_topk": 2}, "Noise has shape [2, 4], expected"
    )
    yield ErrorCase(
        "mode_value", (x, e, None, np.array([0, 2], np.int64)), {"max_topk": 2}, "Mode[1] = 2 is not a mode"
    )
    yield ErrorCase("mode_shape", (x, e, None, np.array([0, 1, 0], np.int64)), {"max_topk": 2}, "Mode has shape [3]")
    bad_u = u.copy()
    bad_u[1, 0] = 1.5
    yield ErrorCase(
        "noise_above_1", (x, e, bad_u), {"max_topk": 5, "noise": "gumbel"}, "Noise[1, 0] = 1.5 is outside [0, 1]"
    )
    nan_u = u.copy()
    nan_u[0, 2] = np.nan
    yield ErrorCase("noise_nan", (x, e, nan_u), {"max_topk": 5, "noise": "gumbel"}, "Noise[0, 2] = nan is outside")


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(
        Port("Logits", doc="[B, V] next-token logits"),
        Port("Embedding", doc="[V, E] input embedding table"),
        Port("Noise", optional=True, doc="[B, V] uniform in (0, 1), read by noise 'gumbel'", body_fill=0.5),
        Port(
            "Mode",
            "int64",
            optional=True,
            doc="[B] 0 = thinking, 1 = after thinking; omitted = all thinking",
            body_fill=BodyFill(0, shape_of=0, end=1),
        ),
    ),
    outputs=(
        Port("Mixed", doc="[B, E] sum_k Weights_k Embedding[Ids_k]"),
        Port("Weights", doc="[B, max_topk] mixture weights, descending, summing to 1"),
        Port("Ids", "int64", doc="[B, max_topk] their token ids"),
        Port("Entropy", doc="[B] entropy (nats) of softmax(Logits / T)"),
    ),
    attrs=(
        Attr("temperature", float, 1.0, "thinking rows: softmax temperature (> 0)"),
        Attr("top_k", int, 0, "thinking rows: keep the top_k most probable (0 = off)"),
        Attr("top_p", float, 1.0, "thinking rows: nucleus mass, 0 < top_p <= 1 (1 = off)"),
        Attr("min_p", float, 0.0, "thinking rows: keep p >= min_p * max p, 0 <= min_p < 1 (0 = off)"),
        Attr("max_topk", int, 10, "slots of the mixture, 1 <= max_topk <= V"),
        Attr("noise", str, "none", "'none' | 'gumbel' (thinking rows; reads Noise)"),
        Attr("tau", float, 1.0, "Gumbel-softmax temperature (> 0)"),
        Attr("noise_factor", float, 1.0, "scale of the Gumbel noise (finite)"),
        Attr("clamp_min", float, -1.5, "lower clamp of the Gumbel noise"),
        Attr("clamp_max", float, 3.0, "upper clamp of the Gumbel noise (>= clamp_min)"),
        Attr("after_thinking_temperature", float, 1.0, "after-thinking rows: softmax temperature (> 0)"),
        Attr("after_thinking_top_k", int, 0, "after-thinking rows: top_k (0 = off)"),
        Attr("after_thinking_top_p", float, 1.0, "after-thinking rows: top_p (1 = off)"),
        Attr("after_thinking_min_p", float, 0.0, "after-thinking rows: min_p (0 = off)"),
    ),
    reference=reference,
    function=SoftTokenEmbedding,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    torch_fake=torch_fake,
    infer_shapes=infer_shapes,
    float_types=("float32",),
    tolerance=TOLERANCE,
    source="Zheng & Lee 2025, SofT-GRPO, arXiv 2511.06411 (zz1358m/SofT-GRPO-master sampler.py); "
    "Zhang et al. 2025, Soft Thinking (eric-ai-lab/Soft-Thinking sampler.py, schedule_batch.py)",
    atol_scale=error_scale,
)
assert tuple(a.name for a in DEF.attrs) == tuple(DEFAULTS), "torch_fake maps positional attributes by DEFAULTS' order"
