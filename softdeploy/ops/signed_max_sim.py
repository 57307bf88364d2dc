"""SignedMaxSim: MaxSim whose match is chosen on magnitude and then signed.

    j*(b, i, n) = argmax_{j: DMask[n, j]} <Q[b, i], D[n, j]>          (ties -> lowest j)
    Scores[b, n] = sum_{i: QMask[b, i]} QSign[b, i] * DSign[n, j*] * <Q[b, i], D[n, j*]>   (float32)

Q ``[B, Lq, dim]`` and D ``[N, Ld, dim]`` are magnitude embeddings (float32, or float16 computed in
float32); QSign ``[B, Lq]`` and DSign ``[N, Ld]`` are signs in ``[-1, 1]`` of the same float type;
QMask ``[B, Lq]``, DMask ``[N, Ld]`` bool, omitted = all valid. As in MaxSim: masked document tokens
are excluded from the argmax, masked query tokens contribute 0, a document with no valid token
contributes 0; NaN in a valid (query, document) pair (or in a sign that is used) makes that score
NaN. With +-1 signs and the sparse lifting construction of Killingback et al. (see
tests/ops/test_signed_maxsim.py) the score equals any real-valued sparse inner product exactly --
plain MaxSim cannot do that.

Errors: a dim or element-type mismatch, wrong sign/mask shapes, a sign outside [-1, 1].

Kernel: ops/signed_max_sim.cc, sharing the tiled running-max GEMM of MaxSim (ops/max_sim_core.h,
ops/max_sim_kernels.h),
which here also carries the index of the running max. The portable function body gets an omitted
mask as an all-true mask of its shape (``Port.body_fill``, as in softdeploy/ops/max_sim.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from softdeploy.errors import OpContractError
from softdeploy.ops._body import function_body
from softdeploy.ops._schema import BodyFill, ErrorCase, OpDef, Port, Sample
from softdeploy.ops.max_sim import (
    all_valid,
    dtype_name,
    masks,
    random_mask,
    similarities64,
    torch_similarities,
    unit_tokens,
    validate_embeddings,
    validate_side,
)

if TYPE_CHECKING:  # bound when the body is compiled (softdeploy/ops/_body.py)
    from onnxscript import BOOL, FLOAT, INT64
    from onnxscript import opset18 as op

NAME = "SignedMaxSim"
# What the body gets for an omitted mask: all true, shaped like Q's [B, Lq] / D's [N, Ld].
Q_ALL = BodyFill(True, shape_of=0, end=2)
D_ALL = BodyFill(True, shape_of=2, end=2)


def _check_sign_range(port: str, sign: Any) -> None:
    s = np.asarray(sign, np.float64)
    bad = np.argwhere(np.abs(s) > 1)
    if bad.size:
        at = tuple(int(v) for v in bad[0])
        raise OpContractError(
            f"{NAME}: {port}[{at[0]}, {at[1]}] = {float(s[at]):g} is outside [-1, 1] (rule: signs lie in [-1, 1])"
        )


def validate(q: Any, q_sign: Any, d: Any, d_sign: Any, q_mask: Any, d_mask: Any, *, values: bool = True) -> None:
    """Checks SignedMaxSim's inputs (ranks, shared dim, element types, mask / scale shapes) and raises OpContractError
    naming the op, the value and the rule (in the kernel's words). ``values=False`` skips the data-dependent checks
    (fake tensors have no values)."""
    b, lq, n, ld, _ = validate_embeddings(NAME, q, d)
    if dtype_name(q) == "int8":
        raise OpContractError(f"{NAME}: Q has element type int8 (rule: float32 or float16)")
    for port, sign in (("QSign", q_sign), ("DSign", d_sign)):
        if dtype_name(sign) != dtype_name(q):
            raise OpContractError(
                f"{NAME}: {port} is {dtype_name(sign)} but Q is {dtype_name(q)} (rule: signs have the element type of Q)"
            )
    validate_side(NAME, "QSign", q_sign, b, lq, "[B, Lq]")
    validate_side(NAME, "DSign", d_sign, n, ld, "[N, Ld]")
    validate_side(NAME, "QMask", q_mask, b, lq, "[B, Lq]")
    validate_side(NAME, "DMask", d_mask, n, ld, "[N, Ld]")
    if values:  # data-dependent: skipped on fake tensors
        _check_sign_range("QSign", q_sign.float().numpy() if hasattr(q_sign, "numpy") else q_sign)
        _check_sign_range("DSign", d_sign.float().numpy() if hasattr(d_sign, "numpy") else d_sign)


def reference(
    q: np.ndarray,
    q_sign: np.ndarray,
    d: np.ndarray,
    d_sign: np.ndarray,
    q_mask: np.ndarray | None = None,
    d_mask: np.ndarray | None = None,
) -> tuple[np.ndarray]:
    """The float64 NumPy oracle of SignedMaxSim: every backend (kernel, function body, torch, TVM) is held to it within
    OpDef.tolerance; it checks the contract first, so a bad input raises the same OpContractError."""
    validate(q, q_sign, d, d_sign, q_mask, d_mask)
    b, lq, _ = np.shape(q)
    n, ld, _ = np.shape(d)
    qm, dm = masks(b, lq, n, ld, q_mask, d_mask)
    s = similarities64(q, d, None, None)  # [B, N, Lq, Ld]
    valid = np.broadcast_to(dm[None, :, None, :], s.shape)
    masked = np.where(valid, s, -np.inf)
    nan = np.isnan(masked).any(axis=3)
    best = masked.max(axis=3, keepdims=True) if ld > 0 else np.zeros((b, n, lq, 1))
    # first valid j reaching the max (an all -inf row picks its first valid token, never a masked one)
    j_star = np.argmax(valid & (masked == best), axis=3) if ld > 0 else np.zeros((b, n, lq), np.int64)
    value = np.take_along_axis(s, j_star[..., None], axis=3)[..., 0] if ld > 0 else np.zeros((b, n, lq))
    ds = np.asarray(d_sign, np.float64)
    d_sign_star = ds[np.arange(n)[None, :, None], j_star] if ld > 0 else np.zeros((b, n, lq))
    with np.errstate(invalid="ignore"):
        contrib = np.asarray(q_sign, np.float64)[:, None, :] * d_sign_star * value
    contrib = np.where(nan, np.nan, contrib)
    contrib = np.where(dm.any(axis=1)[None, :, None], contrib, 0.0)
    contrib = np.where(qm[:, None, :], contrib, 0.0)
    return (contrib.sum(axis=2).astype(np.float32),)


@function_body
def SignedMaxSim(Q, QSign, D, DSign, QMask: BOOL, DMask: BOOL):
    sims = op.MatMul(
        op.Unsqueeze(op.Cast(Q, to=FLOAT.dtype), [1]), op.Transpose(op.Cast(D, to=FLOAT.dtype), perm=[0, 2, 1])
    )  # [B, N, Lq, Ld]
    # One masked padding token at j = Ld keeps ArgMax defined when Ld = 0 (such documents score 0 below).
    pad = op.Constant(value_ints=[0, 0, 0, 0, 0, 0, 0, 1])
    sims = op.Pad(sims, pad)
    minus_inf = op.Constant(value_float=float("-inf"))
    zero = op.Constant(value_float=0.0)
    d_valid = op.Pad(op.Unsqueeze(DMask, [0, 2]), pad)  # [1, N, 1, Ld + 1]
    masked = op.Where(d_valid, sims, minus_inf)
    # ArgMax keeps the first index of the max (select_last_index=0): ties -> lowest j. A row whose
    # valid entries are all -inf must pick its first VALID token, hence the argmax over is_best.
    best = op.ReduceMax(masked, [3], keepdims=1)
    is_best = op.And(d_valid, op.Equal(masked, best))
    j_star = op.ArgMax(op.Cast(is_best, to=INT64.dtype), axis=3, keepdims=1)  # [B, N, Lq, 1]
    value = op.GatherElements(sims, j_star, axis=3)
    d_sign = op.Expand(op.Pad(op.Unsqueeze(op.Cast(DSign, to=FLOAT.dtype), [0, 2]), pad), op.Shape(sims))
    signed = op.Mul(
        op.Mul(op.GatherElements(d_sign, j_star, axis=3), value), op.Unsqueeze(op.Cast(QSign, to=FLOAT.dtype), [1, 3])
    )
    # NaN anywhere among the valid similarities of a row makes its contribution NaN (ReduceMax and
    # ArgMax of onnxruntime skip NaN).
    row_nan = op.ReduceMax(op.Cast(op.And(d_valid, op.IsNaN(sims)), to=FLOAT.dtype), [3], keepdims=1)
    signed = op.Where(op.Greater(row_nan, zero), op.Div(zero, zero), signed)
    contrib = op.Squeeze(signed, [3])  # [B, N, Lq]
    doc_has_token = op.Greater(op.ReduceMax(op.Cast(DMask, to=FLOAT.dtype), [1], keepdims=0), zero)  # [N]
    contrib = op.Where(op.Unsqueeze(doc_has_token, [0, 2]), contrib, zero)
    contrib = op.Where(op.Unsqueeze(QMask, [1]), contrib, zero)
    return op.ReduceSum(contrib, [2], keepdims=0)


def _torch(q: Any, q_sign: Any, d: Any, d_sign: Any, q_mask: Any, d_mask: Any) -> Any:
    import torch

    s = torch_similarities(q, d, None, None)
    b, lq, n, ld = q.shape[0], q.shape[1], d.shape[0], d.shape[1]
    qm = torch.ones(b, lq, dtype=torch.bool) if q_mask is None else q_mask
    dm = torch.ones(n, ld, dtype=torch.bool) if d_mask is None else d_mask
    if ld == 0:
        return s.new_zeros(b, n)
    valid = dm[None, :, None, :].expand(s.shape)
    masked = torch.where(valid, s, float("-inf"))
    best = masked.amax(dim=3, keepdim=True)
    j_star = (valid & (masked == best)).to(torch.int64).argmax(dim=3, keepdim=True)
    value = s.gather(3, j_star)
    ds = d_sign.float()[None, :, None, :].expand(s.shape).gather(3, j_star)
    contrib = (q_sign.float()[:, None, :, None] * ds * value)[..., 0]
    contrib = torch.where((valid & s.isnan()).any(dim=3), float("nan"), contrib)
    contrib = torch.where(dm.any(dim=1)[None, :, None], contrib, 0.0)
    contrib = torch.where(qm[:, None, :], contrib, 0.0)
    return contrib.sum(dim=2)


def torch_impl(q: Any, q_sign: Any, d: Any, d_sign: Any, q_mask: Any = None, d_mask: Any = None) -> Any:
    """Eager torch SignedMaxSim (similarities in float32, Scores float32 [B, N]), registered as
    torch.ops.softdeploy.signed_max_sim; it checks the contract first, like every backend."""
    validate(q, q_sign, d, d_sign, q_mask, d_mask)
    return _torch(q, q_sign, d, d_sign, q_mask, d_mask)


def torch_fake(q: Any, q_sign: Any, d: Any, d_sign: Any, q_mask: Any = None, d_mask: Any = None) -> Any:
    """SignedMaxSim on torch's fake tensors (export tracing): the shape checks, then an empty float32 [B, N]."""
    validate(q, q_sign, d, d_sign, q_mask, d_mask, values=False)
    return q.new_empty((q.shape[0], d.shape[0]), dtype=__import__("torch").float32)


def infer_shapes(ctx: Any) -> None:
    """ONNX shape inference for SignedMaxSim: Scores is float32 [B, N] (B from the queries, N from the documents)."""
    from onnx import TensorProto, helper

    dims: list[Any] = [None, None]
    for k, index in ((0, 0), (1, 2)):
        t = ctx.get_input_type(index)
        if t is not None and t.tensor_type.HasField("shape") and len(t.tensor_type.shape.dim) >= 1:
            dim = t.tensor_type.shape.dim[0]
            dims[k] = dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
    ctx.set_output_type(0, helper.make_tensor_type_proto(TensorProto.FLOAT, dims))


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of SignedMaxSim, drawn from ``rng``: typical sizes, edge sizes (empty, one element, the
    kernels' tile edges) and special values (+-inf, NaN, ties) on which every backend must agree."""

    def signs(rows: int, cols: int, kind: str = "pm1") -> np.ndarray:
        if kind == "pm1":
            return rng.choice(np.array([-1.0, 1.0], np.float32), size=(rows, cols))
        return rng.uniform(-1, 1, (rows, cols)).astype(np.float32)

    def case(b: int, lq: int, n: int, ld: int, dim: int, p_valid: float = 1.0, kind: str = "pm1") -> tuple:
        q, d = np.abs(unit_tokens(rng, b, lq, dim)), np.abs(unit_tokens(rng, n, ld, dim))
        qm = random_mask(rng, b, lq, p_valid) if p_valid < 1 else all_valid(b, lq)
        dm = random_mask(rng, n, ld, p_valid) if p_valid < 1 else all_valid(n, ld)
        return q, signs(b, lq, kind), d, signs(n, ld, kind), qm, dm

    yield Sample("colbert_2x32_vs_9x40_d128", case(2, 32, 9, 40, 128))
    yield Sample("soft_signs_padded_3x20_vs_7x33_d64", case(3, 20, 7, 33, 64, p_valid=0.7, kind="soft"))
    # tile edges: 16 / 32 query lanes, 6- / 8-token blocks, passes of up to 4 float32 tiles
    for lq, ld, dim in (
        (1, 1, 1),
        (15, 7, 3),
        (16, 8, 16),
        (17, 9, 17),
        (33, 13, 65),
        (16, 6, 2),
        (65, 11, 4),
        (129, 13, 3),
    ):
        yield Sample(f"tile_lq{lq}_ld{ld}_dim{dim}", case(2, lq, 3, ld, dim, p_valid=0.9), kind="edge")
    yield Sample("empty_batch", case(0, 4, 3, 5, 8), kind="edge")
    yield Sample("no_documents", case(2, 4, 0, 5, 8), kind="edge")
    yield Sample("no_document_tokens", case(2, 4, 3, 0, 8), kind="edge")
    q, qs, d, ds, qm, dm = case(2, 6, 5, 7, 8)
    dm[1] = False
    qm[1, :] = False
    yield Sample("empty_documents_and_queries", (q, qs, d, ds, qm, dm), kind="edge")
    q, qs, d, ds, qm, dm = case(2, 4, 4, 5, 8)
    d[0, :, :] = d[0, :1, :]  # ties: every token of document 0 equal -> the first (valid) one's sign
    ds[0] = [-1, 1, 1, 1, 1]
    dm[0, 0] = False  # ... and the first one is masked: j* = 1
    d[1, 2, 0] = np.nan  # NaN in a valid token -> NaN
    d[2, 3, 1] = np.nan  # NaN in a masked token -> ignored
    dm[2, 3] = False
    yield Sample("ties_nan", (q, qs, d, ds, qm, dm), kind="special")
    q, qs, d, ds, qm, dm = case(1, 2, 2, 3, 4)
    d[0, :, :] = -np.inf  # every similarity of document 0 is -inf: j* = first valid token
    q[0, 1, :] = 0.0
    yield Sample("minus_infinity", (q, qs, d, ds, qm, dm), kind="special")
    # Omitted masks mean all valid (the portable body gets all-true masks, Port.body_fill). Last, so
    # that the samples above keep their random draws.
    q, qs, d, ds, qm, dm = case(3, 20, 7, 33, 64, p_valid=0.7, kind="soft")
    yield Sample("masks_omitted", (q, qs, d, ds))
    yield Sample("qmask_omitted", (q, qs, d, ds, None, dm))
    yield Sample("dmask_omitted", (q, qs, d, ds, qm))
    yield Sample("no_document_tokens_masks_omitted", case(2, 4, 3, 0, 8)[:4], kind="edge")


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of SignedMaxSim; every backend must refuse them with a message containing ``match``
    (the operator reference lists them)."""
    q, d = np.ones((2, 3, 4), np.float32), np.ones((5, 6, 4), np.float32)
    qs, ds = np.ones((2, 3), np.float32), np.ones((5, 6), np.float32)
    yield ErrorCase("dim_mismatch", (q, qs, np.ones((5, 6, 3), np.float32), ds), {}, "Q has dim 4 but D has dim 3")
    yield ErrorCase(
        "qsign_shape", (q, np.ones((3, 2), np.float32), d, ds), {}, "QSign has shape [3, 2], expected [B, Lq] = [2, 3]"
    )
    yield ErrorCase(
        "dsign_shape", (q, qs, d, np.ones((5,), np.float32)), {}, "DSign has shape [5], expected [N, Ld] = [5, 6]"
    )
    yield ErrorCase(
        "dmask_shape",
        (q, qs, d, ds, None, np.ones((5, 7), bool)),
        {},
        "DMask has shape [5, 7], expected [N, Ld] = [5, 6]",
    )
    bad = ds.copy()
    bad[4, 2] = 1.5
    yield ErrorCase("sign_out_of_range", (q, qs, d, bad), {}, "DSign[4, 2] = 1.5 is outside [-1, 1]")
    yield ErrorCase(
        "q_rank", (np.ones((3, 4), np.float32), qs, d, ds), {}, "Q must have rank 3 [B, Lq, dim], got shape [3, 4]"
    )


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(
        Port("Q", doc="query magnitude embeddings [B, Lq, dim]"),
        Port("QSign", doc="query token signs in [-1, 1], [B, Lq]"),
        Port("D", doc="document magnitude embeddings [N, Ld, dim]"),
        Port("DSign", doc="document token signs in [-1, 1], [N, Ld]"),
        Port("QMask", "bool", optional=True, doc="valid query tokens [B, Lq]; omitted = all", body_fill=Q_ALL),
        Port("DMask", "bool", optional=True, doc="valid document tokens [N, Ld]; omitted = all", body_fill=D_ALL),
    ),
    outputs=(Port("Scores", "float32", doc="[B, N]"),),
    attrs=(),
    reference=reference,
    function=SignedMaxSim,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    torch_fake=torch_fake,
    infer_shapes=infer_shapes,
    tolerance={"float32": (1e-5, 1e-5), "float16": (1e-5, 1e-5)},
    source="Killingback, Ingale, Zamani, Musco 2026, arXiv 2607.05803 (Signed MaxSim)",
)
