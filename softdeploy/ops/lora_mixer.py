"""LoRAMixer: the routed low-rank delta of a LoRA-Mixer projection (arXiv 2507.00029), token by token.

    Delta[, Experts, Gates] = LoRAMixer(X, A, Bm, Router; top_k = 1, scaling = 1.0)

    X [..., in], A [E, r, in], Bm [E, out, r], Router [E, in]; per token x (a row of X):
    l   = Router . x                      (E router logits)
    g   = softmax(l)
    S   = top_k(g)                        (ranked by l; equal logits -> lower expert index first)
    w_e = g_e / sum_{e' in S} g_e'  = exp(l_e - max l) / sum_{e' in S} exp(l_e' - max l),  e in S
    Delta = scaling * sum_{e in S} w_e * Bm_e . (A_e . x)                              [..., out]
    Experts = S in rank order (gate descending, ties -> lower index)       int64      [..., top_k]
    Gates   = w_e in the same order                                        T          [..., top_k]

A routed LoRA-Mixer projection is ``MatMul(X, W^T) + bias + Delta``: the base MatMul stays a standard
op (so onnxruntime's int8 MatMuls quantize it) and the experts stay float in this op. The kernel
(ops/lora_mixer.cc, same equation in its header comment) groups the tokens of a call by selected
expert (SGMV-style) and computes ``A_e . x`` and ``Bm_e . u`` for those tokens only: the unselected
experts are never computed (only the finiteness check below reads them).

Rules (the contract; docs/ops/LoRAMixer.md renders it):

* ``1 <= top_k <= E``; A, Bm and Router must agree on E, A and Bm on r, X, A and Router on in (an
  error names the op, the value and the rule). ``out`` is given by Bm alone; the export pass checks
  it against the base projection it is added to. r = 0 is allowed (Delta = 0).
* Ranking is by the logits ``l`` (the order of the exact probabilities: softmax is strictly
  increasing), so probabilities that underflow to 0 still rank by logit, and exactly equal logits
  rank the lower expert index first. The kernels rank float32 logits, each good to about
  ``(in + 1) * u * sum_i |Router_ei x_i|`` (u = 2^-24): logits closer than that may rank either way
  (identical router rows always give equal logits, so the lower index first).
* Per-token special values: a token whose logits are not all finite (X holds NaN or +-inf, or a
  logit overflows) gets ``Delta`` all NaN and ``Gates`` all NaN, ``Experts`` = 0, 1, ..., top_k-1;
  the other tokens are not affected. The logits are float32 values whatever T is (the kernel, the
  function body and the torch op compute them in float32), so "overflows" means beyond float32's
  range: ``|l_e|`` that rounds to +-inf in float32. The float64 reference rounds its logits to float32
  to decide this (and only this). Where ``sum_i |Router_ei x_i|`` itself exceeds float32's range a
  partial sum may overflow although the logit would not (the order of the sum decides): such tokens
  are beyond float32's range, not covered by this rule.
* ``scaling`` must be finite, and so must A, Bm and Router (trained parameters): a non-finite entry is
  an error naming the input and the entry's index. The kernel checks all E experts although it
  computes only the selected ones: without the check, a NaN in an unselected expert would vanish in
  the kernel but reach every token through the dense function body (0 * NaN). It scans the unselected
  experts and checks the selected ones through its own work (a non-finite entry makes their products
  non-finite; Bm_e is checked as it is transposed), and on any such sign scans all weights as the
  error path, so the error is the same as a scan up front would give.
* An empty batch (X of shape [0, in], or any zero leading dimension) gives empty outputs.

Numerics (tolerances in DEF.tolerance, derived from the conditioning): the kernels compute in float32
with FMA accumulation; the error of a float32 dot product of n terms is ~ sqrt(n) * u * sum |terms|
(u = 2^-24; the worst case is n * u * sum |terms|). For the conformance samples (non-negative A, Bm
and X, so Delta is a sum of non-negative terms and its relative error is that of its terms; router
rows with sum_i |Router_ei x_i| <= 16 and in <= 512), a gate's relative error is at most about
2 * sqrt(in) * u * 16 = 4.3e-5 (through the logits), Delta's at most that plus sqrt(in + r) * u: hence
float32 rtol 5e-5 (measured on the samples, all variants: Delta 6.6e-7, Gates 1.4e-6). float16 outputs add the float16 rounding (2^-11 = 4.9e-4): rtol 1e-3. Signed
factors (cancellation) are tested with an elementwise bound in tests/ops/test_lora_mixer.py.
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
    from onnxscript import BOOL, FLOAT
    from onnxscript import opset18 as op

NAME = "LoRAMixer"


def _shape(s: Any) -> str:
    return "[" + ", ".join(str(int(d)) for d in s) + "]"


def validate(
    x_shape: Any, a_shape: Any, b_shape: Any, r_shape: Any, top_k: int, scaling: float = 1.0
) -> tuple[int, int, int, int]:
    """Checks the contract on the shapes and attributes; returns (E, r, in, out). Messages match
    ops/lora_mixer.cc."""
    # X's leading dims are left as they are (no int()): under torch.export they are symbolic and must stay so.
    x_shape = tuple(x_shape)
    a_shape, b_shape, r_shape = (tuple(int(d) for d in s) for s in (a_shape, b_shape, r_shape))
    if len(x_shape) == 0:
        raise OpContractError(f"{NAME}: X must have rank >= 1 ([..., in]), got a scalar")
    if len(a_shape) != 3:
        raise OpContractError(f"{NAME}: A must have rank 3 ([E, r, in]), got shape {_shape(a_shape)}")
    if len(b_shape) != 3:
        raise OpContractError(f"{NAME}: Bm must have rank 3 ([E, out, r]), got shape {_shape(b_shape)}")
    if len(r_shape) != 2:
        raise OpContractError(f"{NAME}: Router must have rank 2 ([E, in]), got shape {_shape(r_shape)}")
    e, r, n_in = a_shape
    e_rule = "rule: A [E, r, in], Bm [E, out, r] and Router [E, in] agree on E"
    if b_shape[0] != e:
        raise OpContractError(f"{NAME}: Bm has E = {b_shape[0]} experts, A has E = {e} ({e_rule})")
    if r_shape[0] != e:
        raise OpContractError(f"{NAME}: Router has E = {r_shape[0]} experts, A has E = {e} ({e_rule})")
    if b_shape[2] != r:
        raise OpContractError(
            f"{NAME}: Bm has r = {b_shape[2]}, A has r = {r} (rule: A [E, r, in] and Bm [E, out, r] agree on r)"
        )
    in_rule = "rule: X [..., in], A [E, r, in] and Router [E, in] agree on in"
    if x_shape[-1] != n_in:
        raise OpContractError(f"{NAME}: X has in = {x_shape[-1]} features, A has in = {n_in} ({in_rule})")
    if r_shape[1] != n_in:
        raise OpContractError(f"{NAME}: Router has in = {r_shape[1]} features, A has in = {n_in} ({in_rule})")
    if not 1 <= top_k <= e:
        raise OpContractError(f"{NAME}: top_k {top_k} is out of range for E = {e} experts (rule: 1 <= top_k <= E)")
    if not math.isfinite(scaling):
        raise OpContractError(f"{NAME}: scaling {scaling:g} is not finite (rule: scaling is a finite number)")
    return e, r, n_in, b_shape[1]


WEIGHT_RULE = "rule: the experts' factors A, Bm and the Router are finite"


def check_finite(name: str, values: Any) -> None:
    """Raises OpContractError naming the first non-finite entry of a weight input (the kernel's message)."""
    v = np.asarray(values)
    if v.size and not np.isfinite(v).all():
        where = ", ".join(str(int(i)) for i in np.argwhere(~np.isfinite(v))[0])
        raise OpContractError(f"{NAME}: {name} holds a non-finite value (NaN or +-inf) at [{where}] ({WEIGHT_RULE})")


def reference(
    x: np.ndarray, a: np.ndarray, bm: np.ndarray, router: np.ndarray, *, top_k: int = 1, scaling: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The float64 NumPy oracle of LoRAMixer: every backend (kernel, function body, torch, TVM) is held to it
    within OpDef.tolerance; it checks the contract first (shapes, top_k, scaling, finite weights), so a bad input
    raises the same OpContractError as the kernel."""
    _, _, n_in, n_out = validate(np.shape(x), np.shape(a), np.shape(bm), np.shape(router), top_k, scaling)
    for name, w in (("A", a), ("Bm", bm), ("Router", router)):
        check_finite(name, w)
    lead = np.shape(x)[:-1]
    x2 = np.asarray(x).astype(np.float64).reshape(math.prod(lead), n_in)  # not -1: in may be 0
    a64, b64, r64 = (np.asarray(t).astype(np.float64) for t in (a, bm, router))
    s = np.float64(np.float32(scaling))  # ONNX FLOAT attributes are float32
    with np.errstate(invalid="ignore", over="ignore"):
        logits = x2 @ r64.T  # [N, E]
        # the contract's logits are float32: one beyond float32's range makes the token non-finite
        ok = np.isfinite(logits.astype(np.float32)).all(axis=-1)
    safe = np.where(ok[:, None], logits, 0.0)
    order = np.argsort(-safe, axis=-1, kind="stable")[:, :top_k]  # stable: equal logits -> lower index
    chosen = np.take_along_axis(safe, order, axis=-1)
    ex = np.exp(chosen - chosen[:, :1])
    gates = ex / ex.sum(axis=-1, keepdims=True)
    delta = np.zeros((x2.shape[0], n_out))
    with np.errstate(invalid="ignore", over="ignore"):
        for slot in range(top_k):
            e = order[:, slot]
            u = np.einsum("ni,nri->nr", x2, a64[e])
            delta += gates[:, slot, None] * np.einsum("nor,nr->no", b64[e], u)
    delta *= s
    delta[~ok] = np.nan
    gates[~ok] = np.nan
    order[~ok] = np.arange(top_k)
    return (
        delta.reshape(*lead, n_out),
        order.astype(np.int64).reshape(*lead, top_k),
        gates.reshape(*lead, top_k),
    )


@function_body
def LoRAMixer(X, A, Bm, Router, top_k: int = 1, scaling: float = 1.0):
    # Dense over the experts, in two GEMMs: U = X . A_all^T [N, E*r], then (U * gates) . Bm_all [N, out]
    # -- the fastest form stock onnxruntime has (a per-token gather of the selected experts' factors
    # would copy k*r*(in + out) weights per token). Unselected experts get gate 0.
    # allowzero=1 on every Reshape: a 0 in a shape (an empty batch) means 0, not "copy that dim".
    xf = op.Cast(X, to=FLOAT.dtype)
    af = op.Cast(A, to=FLOAT.dtype)
    bf = op.Cast(Bm, to=FLOAT.dtype)
    rf = op.Cast(Router, to=FLOAT.dtype)
    zero = op.Constant(value_float=0.0)
    nan = op.Constant(value_float=float("nan"))
    axis1 = op.Constant(value_ints=[1])
    lead = op.Shape(X, end=-1)
    in_dim = op.Shape(X, start=-1)
    e_dim = op.Shape(A, start=0, end=1)
    r_dim = op.Shape(A, start=1, end=2)
    out_dim = op.Shape(Bm, start=1, end=2)
    e_r = op.Mul(e_dim, r_dim)
    n = op.ReduceProd(lead, keepdims=1)  # product of the leading dims (1 for a rank-1 X)
    x2 = op.Reshape(xf, op.Concat(n, in_dim, axis=0), allowzero=1)
    logits = op.MatMul(x2, op.Transpose(rf, perm=[1, 0]))  # [N, E]
    not_finite = op.Or(op.IsNaN(logits), op.IsInf(logits))
    bad = op.Cast(op.ReduceMax(op.Cast(not_finite, to=FLOAT.dtype), axis1, keepdims=1), to=BOOL.dtype)  # [N, 1]
    safe = op.Where(bad, zero, logits)
    K = op.Reshape(op.Constant(value_int=top_k), op.Constant(value_ints=[1]))
    # TopK keeps the lower index first on equal values: the tie rule.
    top, idx = op.TopK(safe, K, axis=-1, largest=1, sorted=1)
    ex = op.Exp(op.Sub(top, op.ReduceMax(top, axis1, keepdims=1)))
    gates = op.Div(ex, op.ReduceSum(ex, axis1, keepdims=1))  # [N, top_k]
    dense = op.ScatterElements(op.Mul(safe, zero), idx, gates, axis=1)  # [N, E], 0 where unselected
    a_all = op.Transpose(op.Reshape(af, op.Concat(e_r, in_dim, axis=0), allowzero=1), perm=[1, 0])  # [in, E*r]
    u = op.Reshape(op.MatMul(x2, a_all), op.Concat(n, e_dim, r_dim, axis=0), allowzero=1)  # [N, E, r]
    uw = op.Reshape(op.Mul(u, op.Unsqueeze(dense, op.Constant(value_ints=[2]))), op.Concat(n, e_r, axis=0), allowzero=1)
    b_all = op.Reshape(op.Transpose(bf, perm=[0, 2, 1]), op.Concat(e_r, out_dim, axis=0), allowzero=1)  # [E*r, out]
    d = op.Mul(op.MatMul(uw, b_all), op.Constant(value_float=scaling))
    d = op.Where(bad, nan, d)
    Delta = op.CastLike(op.Reshape(d, op.Concat(lead, out_dim, axis=0), allowzero=1), X)
    iota = op.Range(op.Constant(value_int=0), op.Constant(value_int=top_k), op.Constant(value_int=1))
    experts = op.Where(bad, op.Expand(iota, op.Shape(idx)), idx)
    Experts = op.Reshape(experts, op.Concat(lead, K, axis=0), allowzero=1)
    Gates = op.CastLike(op.Reshape(op.Where(bad, nan, gates), op.Concat(lead, K, axis=0), allowzero=1), X)
    return Delta, Experts, Gates


def torch_impl(x: Any, a: Any, bm: Any, router: Any, top_k: int = 1, scaling: float = 1.0) -> Any:
    """Eager torch: the same dense two-GEMM form as the function body (differentiable: the torch op's
    autograd goes through it; gradients reach the selected experts and, through their gates, the
    router)."""
    import torch

    e, r, n_in, n_out = validate(x.shape, a.shape, bm.shape, router.shape, top_k, scaling)
    for name, w in (("A", a), ("Bm", bm), ("Router", router)):
        if w.numel() and not bool(torch.isfinite(w).all()):
            check_finite(name, w.detach().float().numpy())
    lead = tuple(x.shape[:-1])
    x2 = x.float().reshape(math.prod(lead), n_in)  # not -1: in may be 0
    logits = x2 @ router.float().t()
    ok = torch.isfinite(logits).all(dim=-1, keepdim=True)
    safe = torch.where(ok, logits, 0.0)
    # A stable descending sort keeps lower indices first on ties (torch.topk guarantees no tie order).
    order = torch.sort(safe, dim=-1, descending=True, stable=True).indices[:, :top_k]
    gates = torch.softmax(torch.gather(safe, 1, order), dim=-1)
    dense = torch.zeros_like(safe).scatter(1, order, gates)
    u = (x2 @ a.float().reshape(e * r, n_in).t()).reshape(x2.shape[0], e, r)
    uw = (u * dense.unsqueeze(-1)).reshape(x2.shape[0], e * r)
    delta = (uw @ bm.float().transpose(1, 2).reshape(e * r, n_out)) * scaling
    delta = torch.where(ok, delta, float("nan"))
    gates = torch.where(ok, gates, float("nan"))
    order = torch.where(ok, order, torch.arange(top_k, device=order.device))
    return (
        delta.reshape(*lead, n_out).to(x.dtype),
        order.reshape(*lead, top_k),
        gates.reshape(*lead, top_k).to(x.dtype),
    )


def torch_fake(x: Any, a: Any, bm: Any, router: Any, top_k: int = 1, scaling: float = 1.0) -> Any:
    """LoRAMixer on torch's fake tensors (export tracing): the shape checks, then empty Delta [..., out],
    Experts int64 [..., top_k] and Gates [..., top_k]."""
    import torch

    _, _, _, n_out = validate(x.shape, a.shape, bm.shape, router.shape, top_k, scaling)
    lead = list(x.shape[:-1])
    return (
        x.new_empty([*lead, n_out]),
        x.new_empty([*lead, top_k], dtype=torch.int64),
        x.new_empty([*lead, top_k]),
    )


def infer_shapes(ctx: Any) -> None:
    """ONNX shape inference for LoRAMixer: Delta [..., out] of X's type, Experts int64 and Gates of X's type
    [..., top_k]."""
    from onnx import TensorProto, helper

    elem = ctx.get_input_type(0).tensor_type.elem_type
    ctx.set_output_type(0, helper.make_tensor_type_proto(elem, None))
    if ctx.get_num_outputs() > 1:
        ctx.set_output_type(1, helper.make_tensor_type_proto(TensorProto.INT64, None))
    if ctx.get_num_outputs() > 2:
        ctx.set_output_type(2, helper.make_tensor_type_proto(elem, None))


def make_case(
    rng: np.random.Generator,
    lead: tuple[int, ...],
    n_in: int,
    n_out: int,
    e: int,
    r: int,
    *,
    router_sum: float = 4.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """X, A, Bm, Router with non-negative X, A, Bm (Delta is a sum of non-negative terms: its relative
    error is bounded, see the module docstring) and a signed router scaled so that
    sum_i |Router_ei x_i| is about ``router_sum`` (<= 16 keeps the gates within the tolerance)."""
    x = np.abs(rng.standard_normal((*lead, n_in))).astype(np.float32)
    a = (rng.random((e, r, n_in)) / max(n_in, 1)).astype(np.float32)
    bm = (rng.random((e, n_out, r)) / max(r, 1)).astype(np.float32)
    # E|R_i x_i| = E|R_i| * E|x_i| = 0.8 * s * 0.8 per feature: s = router_sum / (0.64 * in)
    router = (rng.standard_normal((e, n_in)) * router_sum / (0.64 * max(n_in, 1))).astype(np.float32)
    return x, a, bm, router


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of LoRAMixer, drawn from ``rng``: the MiniLM benchmark shape, r = 0, empty batches,
    one expert, ties between identical router rows, non-finite and tiny tokens, on which every backend must agree."""

    def case(*args: Any, **kw: Any) -> tuple[np.ndarray, ...]:
        return make_case(rng, *args, **kw)

    yield Sample("tokens_2x16_in64_out48_E4_r8_k2", case((2, 16), 64, 48, 4, 8), {"top_k": 2})
    yield Sample("minilm_128_in384_out384_E8_r8_k1", case((128,), 384, 384, 8, 8), {"top_k": 1})
    yield Sample("minilm_128_in384_out384_E8_r8_k2", case((128,), 384, 384, 8, 8), {"top_k": 2, "scaling": 2.0})
    yield Sample("E6_r16_k3_scaling_0.25", case((1, 9, 40), 96, 32, 6, 16), {"top_k": 3, "scaling": 0.25})
    yield Sample("peaked_router", case((37,), 128, 64, 8, 4, router_sum=16.0), {"top_k": 2})
    # boundaries: one token, rank-1 X, E = 1, top_k = E, r = 1, empty batch, and the kernel's tile edges
    # (8 router / rank rows per tile with padding, 16 / 8 lanes per vector, token pairs).
    yield Sample("one_token", case((1,), 64, 32, 4, 8), {"top_k": 2}, kind="edge")
    yield Sample("rank1_x", case((), 48, 24, 3, 4), {"top_k": 1}, kind="edge")
    yield Sample("E1", case((5,), 32, 16, 1, 8), {"top_k": 1}, kind="edge")
    yield Sample("top_k_equals_E", case((6,), 32, 16, 4, 8), {"top_k": 4}, kind="edge")
    yield Sample("r1", case((7,), 40, 20, 3, 1), {"top_k": 2}, kind="edge")
    yield Sample("empty_batch", case((0,), 32, 16, 4, 8), {"top_k": 2}, kind="edge")
    yield Sample("empty_middle_dim", case((3, 0), 32, 16, 4, 8), {"top_k": 1}, kind="edge")
    yield Sample("in0_all_tied", case((3,), 0, 5, 3, 4), {"top_k": 2}, kind="edge")  # logits 0, Delta 0
    yield Sample("r0", case((3,), 8, 5, 3, 0), {"top_k": 2}, kind="edge")  # Delta 0
    for n_in in (1, 7, 15, 16, 17, 33):
        yield Sample(f"in{n_in}", case((3,), n_in, 19, 3, 5), {"top_k": 2}, kind="edge")
    for n_out in (1, 15, 17, 33):
        yield Sample(f"out{n_out}", case((5,), 24, n_out, 3, 9), {"top_k": 2}, kind="edge")
    for e, r in ((9, 7), (17, 17), (16, 24)):
        yield Sample(f"E{e}_r{r}", case((11,), 40, 24, e, r), {"top_k": 3}, kind="edge")
    yield from _special(rng)


def _special(rng: np.random.Generator) -> Iterator[Sample]:
    # Integer-valued X and Router: the logits are exact integers in float32 and float64 alike, so
    # ties are exact in every backend and the gates come from exact logits.
    n_in, n_out, e, r = 24, 20, 6, 4
    x = rng.integers(0, 3, (10, n_in)).astype(np.float32)
    router = rng.integers(-2, 3, (e, n_in)).astype(np.float32)
    router[2] = router[1]  # experts 1 and 2 always tie: 1 ranks first
    router[5] = router[4]
    router_zero = np.zeros_like(router)  # every expert ties: experts 0..k-1, equal gates
    a = (rng.random((e, r, n_in)) / n_in).astype(np.float32)
    bm = (rng.random((e, n_out, r)) / r).astype(np.float32)
    yield Sample("tied_router_rows", (x, a, bm, router), {"top_k": 3}, kind="special")
    yield Sample("all_experts_tied", (x, a, bm, router_zero), {"top_k": 2}, kind="special")
    big = router * 30.0  # logit gaps of 30+: gates 1 and ~1e-13 (ranking by logit, no underflow ties)
    yield Sample("large_logit_gaps", (x, a, bm, big), {"top_k": 3}, kind="special")
    huge = router * 1e4  # gaps of 1e4: the second gate underflows to exactly 0
    yield Sample("underflowing_gates", (x, a, bm, huge), {"top_k": 2}, kind="special")
    xs = x.copy()
    xs[1, 3] = np.nan  # NaN token -> Delta, Gates NaN, Experts 0..k-1; other tokens unaffected
    xs[4, 0] = np.inf
    xs[6, 5] = -np.inf
    xs[8, :] = np.inf
    yield Sample("nan_inf_tokens", (xs, a, bm, router), {"top_k": 2}, kind="special")
    xz = x.copy()
    xz[2] = 0.0  # a zero token: logits 0 (all tied), Delta exactly 0
    xz[3] = 1e-30  # tiny token: Delta ~1e-31, no underflow to a wrong value
    yield Sample("zero_and_tiny_tokens", (xz, a, bm, router), {"top_k": 2}, kind="special")


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of LoRAMixer (shapes that disagree on E, r or in, top_k out of range, non-finite
    scaling or weights); every backend must refuse them with a message containing ``match``."""
    x = np.zeros((3, 6), np.float32)
    a = np.zeros((4, 2, 6), np.float32)
    bm = np.zeros((4, 5, 2), np.float32)
    router = np.zeros((4, 6), np.float32)
    ok = (x, a, bm, router)
    yield ErrorCase("top_k_zero", ok, {"top_k": 0}, "top_k 0 is out of range for E = 4 experts (rule: 1 <= top_k <= E)")
    yield ErrorCase("top_k_negative", ok, {"top_k": -1}, "top_k -1 is out of range for E = 4 experts")
    yield ErrorCase("top_k_above_E", ok, {"top_k": 5}, "top_k 5 is out of range for E = 4 experts")
    yield ErrorCase("no_experts", (x, a[:0], bm[:0], router[:0]), {}, "top_k 1 is out of range for E = 0 experts")
    yield ErrorCase("scalar_x", (np.float32(1.0).reshape(()), a, bm, router), {}, "X must have rank >= 1")
    yield ErrorCase("a_rank2", (x, a[0], bm, router), {}, "A must have rank 3 ([E, r, in]), got shape [2, 6]")
    yield ErrorCase("bm_rank2", (x, a, bm[0], router), {}, "Bm must have rank 3 ([E, out, r]), got shape [5, 2]")
    yield ErrorCase(
        "router_rank3", (x, a, bm, router[None]), {}, "Router must have rank 2 ([E, in]), got shape [1, 4, 6]"
    )
    yield ErrorCase("bm_E_mismatch", (x, a, bm[:3], router), {}, "Bm has E = 3 experts, A has E = 4 (rule:")
    yield ErrorCase("router_E_mismatch", (x, a, bm, router[:2]), {}, "Router has E = 2 experts, A has E = 4 (rule:")
    yield ErrorCase("r_mismatch", (x, a, bm[:, :, :1], router), {}, "Bm has r = 1, A has r = 2 (rule:")
    yield ErrorCase("x_in_mismatch", (x[:, :5], a, bm, router), {}, "X has in = 5 features, A has in = 6 (rule:")
    yield ErrorCase("scaling_inf", ok, {"scaling": float("inf")}, "scaling inf is not finite (rule: scaling is a")
    yield ErrorCase("scaling_nan", ok, {"scaling": float("nan")}, "scaling nan is not finite")
    a_nan = a.copy()
    a_nan[2, 1, 4] = np.nan
    yield ErrorCase(
        "a_nan", (x, a_nan, bm, router), {}, "A holds a non-finite value (NaN or +-inf) at [2, 1, 4] (rule:"
    )
    bm_inf = bm.copy()
    bm_inf[3, 0, 1] = -np.inf
    yield ErrorCase("bm_inf", (x, a, bm_inf, router), {}, "Bm holds a non-finite value (NaN or +-inf) at [3, 0, 1]")
    r_inf = router.copy()
    r_inf[0, 5] = np.inf
    yield ErrorCase("router_inf", (x, a, bm, r_inf), {}, "Router holds a non-finite value (NaN or +-inf) at [0, 5]")
    yield ErrorCase("router_in_mismatch", (x, a, bm, router[:, :4]), {}, "Router has in = 4 features, A has in = 6")


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(
        Port("X", doc="tokens [..., in]"),
        Port("A", doc="down-projections of the E experts [E, r, in]"),
        Port("Bm", doc="up-projections of the E experts [E, out, r]"),
        Port("Router", doc="router weights [E, in] (logits = Router . x)"),
    ),
    outputs=(
        Port("Delta", doc="scaling * sum over the selected experts of w_e * Bm_e . (A_e . x)  [..., out]"),
        Port("Experts", "int64", optional=True, doc="the selected experts [..., top_k], gate descending"),
        Port("Gates", optional=True, doc="their renormalised gates w_e [..., top_k]"),
    ),
    attrs=(
        Attr("top_k", int, 1, "experts per token; 1 <= top_k <= E"),
        Attr("scaling", float, 1.0, "LoRA scaling (alpha / r) applied to the delta"),
    ),
    reference=reference,
    function=LoRAMixer,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    torch_fake=torch_fake,
    infer_shapes=infer_shapes,
    # Derived in the module docstring (conditioning of the gates through the logits, sums of
    # non-negative terms): float32 5e-5, float16 adds its output rounding.
    tolerance={"float32": (5e-5, 1e-30), "float16": (1e-3, 1e-7)},
    stem_override="lora_mixer",
    source="LoRA-Mixer, arXiv 2507.00029 (ICLR 2026; no code released); SGMV grouping: "
    "Punica (Chen et al. 2023), arXiv 2310.18547",
)
