"""MaxSim: ColBERT-style late interaction between query tokens and document tokens.

    Scores[b, n] = sum_{i: QMask[b, i]} max_{j: DMask[n, j]} <Q[b, i], D[n, j]>        (float32)

Q ``[B, Lq, dim]``, D ``[N, Ld, dim]``; optional QMask ``[B, Lq]`` and DMask ``[N, Ld]`` (bool; omitted
= all valid), optional QScale ``[B, Lq]`` and DScale ``[N, Ld]`` (float32). Rules:

* masked document tokens are excluded from the max (not multiplied by 0, unlike PyLate): a query
  token whose best real match is negative keeps that negative similarity;
* masked query tokens contribute 0; a document with no valid token contributes 0 for every query
  token (an empty document scores 0);
* Q and D are float32, float16 (computed in float32) or int8. For int8, QScale and DScale are
  required and ``<q, d> = QScale[b, i] * DScale[n, j] * sum_k q_k * d_k`` with the integer sum
  accumulated exactly (int32). Scales given with float inputs scale the same way (default 1);
* NaN in a valid (query, document) pair makes that score NaN; -inf similarities are ordinary values;
* a dim mismatch, a Q/D element-type mismatch, wrong mask/scale shapes, int8 inputs without
  both scales, or an int8 dim above 65536 (exact int32 sums) are errors.

The kernel (ops/max_sim.cc; driver ops/max_sim_core.h; micro-kernels written once over the vector
traits of ops/common/vec.h in ops/max_sim_kernels.h, compiled per ISA in ops/max_sim_avx2.cc,
ops/max_sim_avxvnni.cc and ops/max_sim_avx512.cc) never materialises the
``[Lq, N * Ld]`` similarity matrix: it is a tiled GEMM that keeps a running max per (query token,
document) in registers. :func:`quantize_tokens` gives the per-token symmetric int8 encoding
(scale = max|x| / 127) the int8 path is meant for; on a CPU without VNNI, documents quantized with
``bits=7`` (codes in [-63, 63]; :func:`softdeploy.quant.formats.code_bits` says which width fits this CPU) take a faster
AVX2 tile, and queries quantized so too a faster one still, with the same exact integer sums.

The portable function body materialises ``[B, N, Lq, Ld]`` (it is a fallback, not the fast path),
computes int8 products in float32 (exact for dim <= 1024) and handles omitted scales. It cannot read
an omitted bool input (the ops that would consume it fail onnxruntime's type inference even in an
untaken ``If`` branch), so an omitted mask is given as an all-true mask of its shape when the body is
attached (``Port.body_fill``: ``BodyFill(True, shape_of=<Q or D>, end=2)``, see
softdeploy/ops/functions.py); all-true is what "omitted" means, for the kernel too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from softdeploy.errors import OpContractError
from softdeploy.ops._body import function_body
from softdeploy.ops._schema import BodyFill, ErrorCase, OpDef, Port, Sample

if TYPE_CHECKING:  # bound when the body is compiled (softdeploy/ops/_body.py)
    from onnxscript import BOOL, FLOAT
    from onnxscript import opset18 as op

NAME = "MaxSim"
ELEMENT_TYPES = ("float32", "float16", "int8")
# int8 sums are exact in int32 up to this dim (the kernel's biased u8 x s8 sum is <= dim * 255 * 128).
MAX_INT8_DIM = 65536


# ---- validation (messages word for word as in ops/max_sim_core.h) -----------------------------------


def shape_of(x: Any) -> tuple[Any, ...]:
    """The shape as a tuple; symbolic sizes stay symbolic (int() on a traced torch size would fix
    the exported model's dimension to the example's value)."""
    return tuple(x.shape)


def dtype_name(x: Any) -> str:
    """numpy or torch element type as a numpy name ("float32", "int8", "bool", ...)."""
    name = str(x.dtype)
    return name.removeprefix("torch.")


def _shape_str(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def validate_embeddings(op_name: str, q: Any, d: Any) -> tuple[int, int, int, int, int]:
    """Checks Q [B, Lq, dim] and D [N, Ld, dim]; returns (B, Lq, N, Ld, dim)."""
    if len(q.shape) != 3:
        raise OpContractError(f"{op_name}: Q must have rank 3 [B, Lq, dim], got shape {_shape_str(shape_of(q))}")
    if len(d.shape) != 3:
        raise OpContractError(f"{op_name}: D must have rank 3 [N, Ld, dim], got shape {_shape_str(shape_of(d))}")
    tq, td = dtype_name(q), dtype_name(d)
    if tq not in ELEMENT_TYPES:
        raise OpContractError(f"{op_name}: Q has element type {tq} (rule: float32, float16 or int8)")
    if tq != td:
        raise OpContractError(f"{op_name}: Q is {tq} but D is {td} (rule: Q and D have the same element type)")
    b, lq, dim = shape_of(q)
    n, ld, dim_d = shape_of(d)
    if dim != dim_d:
        raise OpContractError(
            f"{op_name}: Q has dim {dim} but D has dim {dim_d} (rule: Q and D share the last dimension)"
        )
    return b, lq, n, ld, dim


def validate_side(op_name: str, port: str, x: Any, rows: int, cols: int, dims: str) -> None:
    """An optional per-token input (mask, scale or sign) must be [rows, cols]."""
    if x is not None and shape_of(x) != (rows, cols):
        raise OpContractError(
            f"{op_name}: {port} has shape {_shape_str(shape_of(x))}, expected {dims} = [{rows}, {cols}]"
        )


def validate(q: Any, d: Any, q_mask: Any, d_mask: Any, q_scale: Any, d_scale: Any) -> None:
    """Checks MaxSim's inputs (ranks, shared dim, element types, mask / scale shapes) and raises OpContractError naming
    the op, the value and the rule (in the kernel's words)."""
    b, lq, n, ld, _ = validate_embeddings(NAME, q, d)
    validate_side(NAME, "QMask", q_mask, b, lq, "[B, Lq]")
    validate_side(NAME, "DMask", d_mask, n, ld, "[N, Ld]")
    validate_side(NAME, "QScale", q_scale, b, lq, "[B, Lq]")
    validate_side(NAME, "DScale", d_scale, n, ld, "[N, Ld]")
    if dtype_name(q) == "int8" and (q_scale is None or d_scale is None):
        raise OpContractError(
            f"{NAME}: int8 inputs need QScale and DScale (rule: <q, d> = QScale[b, i] * DScale[n, j] * sum_k q_k * d_k)"
        )
    dim = shape_of(q)[2]
    if dtype_name(q) == "int8" and dim > MAX_INT8_DIM:
        raise OpContractError(f"{NAME}: int8 dim {dim} exceeds {MAX_INT8_DIM} (rule: exact int32 accumulation)")


# ---- float64 reference --------------------------------------------------------------------------------


def similarities64(q: np.ndarray, d: np.ndarray, q_scale: Any, d_scale: Any) -> np.ndarray:
    """<Q[b, i], D[n, j]> as float64 [B, N, Lq, Ld]; int8 products summed exactly in int64."""
    q, d = np.asarray(q), np.asarray(d)
    if q.dtype == np.int8:
        s = np.einsum("bik,njk->bnij", q.astype(np.int64), d.astype(np.int64)).astype(np.float64)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            s = np.einsum("bik,njk->bnij", q.astype(np.float64), d.astype(np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        if q_scale is not None:
            s = s * np.asarray(q_scale, np.float64)[:, None, :, None]
        if d_scale is not None:
            s = s * np.asarray(d_scale, np.float64)[None, :, None, :]
    return s


def masks(b: int, lq: int, n: int, ld: int, q_mask: Any, d_mask: Any) -> tuple[np.ndarray, np.ndarray]:
    """The query and document masks as bool arrays, all true for an omitted one (what 'omitted' means)."""
    qm = np.ones((b, lq), bool) if q_mask is None else np.asarray(q_mask, bool)
    dm = np.ones((n, ld), bool) if d_mask is None else np.asarray(d_mask, bool)
    return qm, dm


def reference(
    q: np.ndarray,
    d: np.ndarray,
    q_mask: np.ndarray | None = None,
    d_mask: np.ndarray | None = None,
    q_scale: np.ndarray | None = None,
    d_scale: np.ndarray | None = None,
) -> tuple[np.ndarray]:
    """The float64 NumPy oracle of MaxSim: every backend (kernel, function body, torch, TVM) is held to it within
    OpDef.tolerance; it checks the contract first, so a bad input raises the same OpContractError."""
    validate(q, d, q_mask, d_mask, q_scale, d_scale)
    b, lq, _ = np.shape(q)
    n, ld, _ = np.shape(d)
    qm, dm = masks(b, lq, n, ld, q_mask, d_mask)
    s = similarities64(q, d, q_scale, d_scale)
    s = np.where(dm[None, :, None, :], s, -np.inf)
    best = s.max(axis=3) if ld > 0 else np.zeros((b, n, lq))
    best = np.where(dm.any(axis=1)[None, :, None], best, 0.0)  # empty document -> 0
    best = np.where(qm[:, None, :], best, 0.0)
    return (best.sum(axis=2).astype(np.float32),)


def quantize_tokens(x: Any, bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Per-token symmetric int8 quantization of token embeddings ``[..., L, dim]``.

    Returns ``(codes int8 [..., L, dim], scales float32 [..., L])`` with ``r = 2**(bits - 1) - 1`` (127 for
    ``bits=8``, 63 for ``bits=7``), ``scale = max_k |x_k| / r`` and ``codes = round(x / scale)`` in [-r, r], so
    that ``x ~= scale * codes``; an all-zero token gets scale 1 and zero codes. Feed codes and scales to MaxSim
    as Q/QScale or D/DScale.

    ``bits=7`` is for CPUs without VNNI: MaxSim's AVX2 kernel multiplies a document whose codes all lie in [-64, 63]
    with vpmaddubsw, read in place, and sums two products' pairs in int16 when the query's codes lie there too: at N
    = 10,000 documents of 180 x 128 codes on Zen 4 with AVX2 forced, 1.2x (documents) and 1.5x (both) its rate on 8-bit
    codes (bench/results/maxsim.md), at half the resolution per token (still exact integer sums; MiniLM retrieval:
    top-10 agreement with float32 99.7-99.8% either way). Raises :class:`~softdeploy.errors.InputError` for other
    ``bits``.
    """
    from softdeploy.errors import InputError

    if bits not in (7, 8):
        raise InputError(f"quantize_tokens: bits={bits!r} is not supported (rule: 7 or 8)")
    r = np.float32(2 ** (bits - 1) - 1)
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(axis=-1) if x.shape[-1] > 0 else np.zeros(x.shape[:-1], np.float32)
    scale = np.where(amax > 0, amax / r, np.float32(1.0)).astype(np.float32)
    codes = np.clip(np.rint(x / scale[..., None]), -r, r).astype(np.int8)
    return codes, scale


# ---- portable function body -----------------------------------------------------------------------------

# What the body gets for an omitted mask: all true, shaped like Q's [B, Lq] / D's [N, Ld].
Q_ALL = BodyFill(True, shape_of=0, end=2)
D_ALL = BodyFill(True, shape_of=1, end=2)


@function_body
def MaxSim(Q, D, QMask: BOOL, DMask: BOOL, QScale: FLOAT, DScale: FLOAT):
    qf = op.Cast(Q, to=FLOAT.dtype)
    df = op.Cast(D, to=FLOAT.dtype)
    sims = op.MatMul(op.Unsqueeze(qf, [1]), op.Transpose(df, perm=[0, 2, 1]))  # [B, N, Lq, Ld]
    q_rows = op.Shape(Q, start=0, end=2)  # [B, Lq]
    d_rows = op.Shape(D, start=0, end=2)  # [N, Ld]
    # An omitted scale reads as 1. Gemm(0[r, 1], 0[1, c], S) = S is the one op chain that type-checks
    # in onnxruntime while S is absent (its bias input is optional); the If picks it only when S is there.
    if op.OptionalHasElement(QScale):
        q_scale = op.Gemm(
            op.ConstantOfShape(op.Concat(op.Slice(q_rows, [0], [1]), [1], axis=0)),
            op.ConstantOfShape(op.Concat([1], op.Slice(q_rows, [1], [2]), axis=0)),
            QScale,
        )
    else:
        q_scale = op.ConstantOfShape(q_rows, value=[1.0])
    if op.OptionalHasElement(DScale):
        d_scale = op.Gemm(
            op.ConstantOfShape(op.Concat(op.Slice(d_rows, [0], [1]), [1], axis=0)),
            op.ConstantOfShape(op.Concat([1], op.Slice(d_rows, [1], [2]), axis=0)),
            DScale,
        )
    else:
        d_scale = op.ConstantOfShape(d_rows, value=[1.0])
    sims = op.Mul(op.Mul(sims, op.Unsqueeze(q_scale, [1, 3])), op.Unsqueeze(d_scale, [0, 2]))
    minus_inf = op.Constant(value_float=float("-inf"))
    zero = op.Constant(value_float=0.0)
    d_valid = op.Unsqueeze(DMask, [0, 2])  # [1, N, 1, Ld]
    best = op.ReduceMax(op.Where(d_valid, sims, minus_inf), [3], keepdims=0)  # [B, N, Lq]
    # onnxruntime's ReduceMax skips NaN; the contract propagates it from valid pairs.
    row_nan = op.ReduceMax(op.Cast(op.And(d_valid, op.IsNaN(sims)), to=FLOAT.dtype), [3], keepdims=0)
    best = op.Where(op.Greater(row_nan, zero), op.Div(zero, zero), best)
    doc_has_token = op.Greater(op.ReduceMax(op.Cast(DMask, to=FLOAT.dtype), [1], keepdims=0), zero)  # [N]
    best = op.Where(op.Unsqueeze(doc_has_token, [0, 2]), best, zero)
    best = op.Where(op.Unsqueeze(QMask, [1]), best, zero)
    return op.ReduceSum(best, [2], keepdims=0)


# ---- torch ----------------------------------------------------------------------------------------------


def torch_similarities(q: Any, d: Any, q_scale: Any, d_scale: Any) -> Any:
    """[B, N, Lq, Ld] float32; int8 products summed exactly (float64 holds every int32 sum)."""
    import torch

    if q.dtype == torch.int8:
        s = torch.einsum("bik,njk->bnij", q.double(), d.double()).float()
    else:
        s = torch.einsum("bik,njk->bnij", q.float(), d.float())
    if q_scale is not None:
        s = s * q_scale.float()[:, None, :, None]
    if d_scale is not None:
        s = s * d_scale.float()[None, :, None, :]
    return s


def torch_impl(q: Any, d: Any, q_mask: Any = None, d_mask: Any = None, q_scale: Any = None, d_scale: Any = None) -> Any:
    """Eager torch MaxSim (similarities in float32, Scores float32 [B, N]), registered as
    torch.ops.softdeploy.max_sim; it checks the contract first, like every backend."""
    import torch

    validate(q, d, q_mask, d_mask, q_scale, d_scale)
    s = torch_similarities(q, d, q_scale, d_scale)
    b, lq, n, ld = q.shape[0], q.shape[1], d.shape[0], d.shape[1]
    qm = torch.ones(b, lq, dtype=torch.bool) if q_mask is None else q_mask
    dm = torch.ones(n, ld, dtype=torch.bool) if d_mask is None else d_mask
    s = torch.where(dm[None, :, None, :], s, float("-inf"))
    best = s.amax(dim=3) if ld > 0 else s.new_zeros(b, n, lq)
    best = torch.where(dm.any(dim=1)[None, :, None], best, 0.0)
    best = torch.where(qm[:, None, :], best, 0.0)
    return best.sum(dim=2)


def infer_shapes(ctx: Any) -> None:
    """ONNX shape inference for MaxSim: Scores is float32 [B, N] (B from the queries, N from the documents)."""
    from onnx import TensorProto, helper

    q, d = ctx.get_input_type(0), ctx.get_input_type(1)
    dims: list[Any] = [None, None]
    for k, t in ((0, q), (1, d)):
        if t is not None and t.tensor_type.HasField("shape") and len(t.tensor_type.shape.dim) >= 1:
            dim = t.tensor_type.shape.dim[0]
            dims[k] = dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
    ctx.set_output_type(0, helper.make_tensor_type_proto(TensorProto.FLOAT, dims))


# ---- samples and error cases ----------------------------------------------------------------------------


def unit_tokens(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """L2-normalised token vectors, as ColBERT emits them."""
    x = rng.standard_normal(shape).astype(np.float32)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.where(norm > 0, norm, 1)).astype(np.float32)


def random_mask(rng: np.random.Generator, rows: int, cols: int, p_valid: float = 0.8) -> np.ndarray:
    """A random [rows, cols] validity mask, each token valid with probability ``p_valid`` (for samples)."""
    return rng.random((rows, cols)) < p_valid


def all_valid(rows: int, cols: int) -> np.ndarray:
    """An all-true [rows, cols] mask."""
    return np.ones((rows, cols), bool)


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of MaxSim, drawn from ``rng``: typical sizes, edge sizes (empty, one element, the kernels'
    tile edges) and special values (+-inf, NaN, ties) on which every backend must agree."""

    def case(b: int, lq: int, n: int, ld: int, dim: int, p_valid: float = 1.0) -> tuple[np.ndarray, ...]:
        q, d = unit_tokens(rng, b, lq, dim), unit_tokens(rng, n, ld, dim)
        qm = random_mask(rng, b, lq, p_valid) if p_valid < 1 else all_valid(b, lq)
        dm = random_mask(rng, n, ld, p_valid) if p_valid < 1 else all_valid(n, ld)
        return q, d, qm, dm

    yield Sample("colbert_2x32_vs_9x40_d128", case(2, 32, 9, 40, 128))
    yield Sample("padded_3x20_vs_7x33_d64", case(3, 20, 7, 33, 64, p_valid=0.7))
    yield Sample(
        "scaled_float",
        (
            *case(2, 5, 4, 6, 16),
            rng.uniform(0.5, 2, (2, 5)).astype(np.float32),
            rng.uniform(0.5, 2, (4, 6)).astype(np.float32),
        ),
    )
    # register-tile edges: 16 (AVX2) / 32 (AVX-512) query lanes; blocks of 6 (AVX2) / 8 (AVX-512)
    # document tokens and their tails; float32 passes of up to 4 tiles (AVX2 Lq > 64, AVX-512 Lq > 128)
    for lq, ld, dim in (
        (1, 1, 1),
        (15, 7, 3),
        (16, 8, 16),
        (17, 9, 17),
        (31, 5, 32),
        (33, 13, 65),
        (48, 24, 7),
        (16, 6, 2),
        (47, 12, 5),
        (65, 11, 4),
        (129, 13, 3),
    ):
        yield Sample(f"tile_lq{lq}_ld{ld}_dim{dim}", case(2, lq, 3, ld, dim, p_valid=0.9), kind="edge")
    yield Sample("empty_batch", case(0, 4, 3, 5, 8), kind="edge")
    yield Sample("no_documents", case(2, 4, 0, 5, 8), kind="edge")
    yield Sample("no_query_tokens", case(2, 0, 3, 5, 8), kind="edge")
    yield Sample("no_document_tokens", case(2, 4, 3, 0, 8), kind="edge")
    yield Sample("dim0", case(2, 4, 3, 5, 0), kind="edge")
    q, d, qm, dm = case(2, 6, 5, 7, 8)
    dm[1] = False  # a fully padded document scores 0
    dm[2, 1:] = False  # a one-token document
    qm[1, :] = False  # a fully masked query scores 0
    yield Sample("empty_documents_and_queries", (q, d, qm, dm), kind="edge")
    # int8 (per-token symmetric codes) incl. -128, the largest-magnitude products
    q8, qs = quantize_tokens(unit_tokens(rng, 2, 33, 128))
    d8, ds = quantize_tokens(unit_tokens(rng, 5, 19, 128))
    q8[0, 0, :] = -128
    d8[0, 0, :] = -128
    d8[1, 0, :] = 127
    yield Sample("int8_2x33_vs_5x19_d128", (q8, d8, all_valid(2, 33), random_mask(rng, 5, 19), qs, ds))
    # int8 tiles: 16 (AVX2: the sign table for rows without -128, vpmaddwd for rows with it; AVX-VNNI) or 32
    # (AVX-512 VNNI) lanes, 6- or 8-token blocks, dim % 2 (int16 pairs) and dim % 4 (VNNI quads, sign groups) tails
    for lq, ld, dim in ((1, 1, 1), (17, 9, 63), (32, 16, 64), (5, 3, 130), (16, 6, 2), (33, 12, 6), (47, 13, 7)):
        q8, qs = quantize_tokens(unit_tokens(rng, 2, lq, dim))
        d8, ds = quantize_tokens(unit_tokens(rng, 3, ld, dim))
        yield Sample(f"int8_lq{lq}_ld{ld}_dim{dim}", (q8, d8, all_valid(2, lq), all_valid(3, ld), qs, ds), kind="edge")
    # special values: negative best matches with padding (exclusion, not x0), ties, NaN, -inf
    q, d, qm, dm = case(2, 4, 4, 5, 8)
    d[0] = -q[0, 0]  # every token of document 0 is anti-aligned with query token 0: best match < 0
    dm[0, 3:] = False
    d[1, :, :] = d[1, :1, :]  # ties: all tokens of document 1 equal
    d[2, 2, 0] = np.nan  # NaN in a valid token -> NaN scores for document 2
    d[3, 4, 0] = np.nan  # NaN in a masked token -> ignored
    dm[3, 4] = False
    yield Sample("negative_ties_nan", (q, d, qm, dm), kind="special")
    q, d, qm, dm = case(1, 3, 2, 4, 4)
    d[0, 1, :] = [-np.inf, 0, 0, 0]  # -inf * positive / negative / 0 -> +-inf or NaN
    q[0, 2, :] = [np.inf, 1, 1, 1]
    yield Sample("infinities", (q, d, qm, dm), kind="special")
    # Omitted masks mean all valid (the portable body gets all-true masks, Port.body_fill). Last, so
    # that the samples above keep their random draws.
    q, d, qm, dm = case(3, 20, 7, 33, 64, p_valid=0.7)
    yield Sample("masks_omitted", (q, d))
    yield Sample("qmask_omitted", (q, d, None, dm))
    yield Sample("dmask_omitted", (q, d, qm))
    q8, qs = quantize_tokens(unit_tokens(rng, 2, 9, 32))
    d8, ds = quantize_tokens(unit_tokens(rng, 3, 5, 32))
    yield Sample("int8_masks_omitted", (q8, d8, None, None, qs, ds))
    yield Sample("no_document_tokens_masks_omitted", case(2, 4, 3, 0, 8)[:2], kind="edge")
    yield Sample("empty_batch_masks_omitted", case(0, 4, 3, 5, 8)[:2], kind="edge")


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of MaxSim; every backend must refuse them with a message containing ``match`` (the
    operator reference lists them)."""
    q, d = np.zeros((2, 3, 4), np.float32), np.zeros((5, 6, 4), np.float32)
    yield ErrorCase("dim_mismatch", (q, np.zeros((5, 6, 3), np.float32)), {}, "Q has dim 4 but D has dim 3")
    yield ErrorCase(
        "q_rank", (np.zeros((3, 4), np.float32), d), {}, "Q must have rank 3 [B, Lq, dim], got shape [3, 4]"
    )
    yield ErrorCase(
        "d_rank", (q, np.zeros((6, 4), np.float32)), {}, "D must have rank 3 [N, Ld, dim], got shape [6, 4]"
    )
    yield ErrorCase(
        "qmask_shape", (q, d, np.ones((2, 4), bool)), {}, "QMask has shape [2, 4], expected [B, Lq] = [2, 3]"
    )
    yield ErrorCase(
        "dmask_shape", (q, d, None, np.ones((6, 5), bool)), {}, "DMask has shape [6, 5], expected [N, Ld] = [5, 6]"
    )
    yield ErrorCase(
        "qscale_shape",
        (q, d, None, None, np.ones((3,), np.float32)),
        {},
        "QScale has shape [3], expected [B, Lq] = [2, 3]",
    )
    q8, d8 = np.zeros((2, 3, 4), np.int8), np.zeros((5, 6, 4), np.int8)
    need = "int8 inputs need QScale and DScale"
    yield ErrorCase("int8_without_scales", (q8, d8), {}, need)
    yield ErrorCase("int8_without_dscale", (q8, d8, None, None, np.ones((2, 3), np.float32)), {}, need)
    wide = np.zeros((1, 1, MAX_INT8_DIM + 1), np.int8)
    ones = np.ones((1, 1), np.float32)
    yield ErrorCase("int8_dim_too_large", (wide, wide, None, None, ones, ones), {}, "int8 dim 65537 exceeds 65536")


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(
        Port("Q", doc="query token embeddings [B, Lq, dim]"),
        Port("D", doc="document token embeddings [N, Ld, dim]"),
        Port("QMask", "bool", optional=True, doc="valid query tokens [B, Lq]; omitted = all", body_fill=Q_ALL),
        Port("DMask", "bool", optional=True, doc="valid document tokens [N, Ld]; omitted = all", body_fill=D_ALL),
        Port("QScale", "float32", optional=True, doc="per-token query scales [B, Lq] (required for int8)"),
        Port("DScale", "float32", optional=True, doc="per-token document scales [N, Ld] (required for int8)"),
    ),
    outputs=(Port("Scores", "float32", doc="[B, N]"),),
    attrs=(),
    reference=reference,
    function=MaxSim,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    infer_shapes=infer_shapes,
    float_types=ELEMENT_TYPES,
    tolerance={"float32": (1e-5, 1e-5), "float16": (1e-5, 1e-5), "int8": (1e-5, 1e-5)},
    source="Khattab & Zaharia 2020 (ColBERT); Killingback, Ingale, Zamani, Musco 2026, arXiv 2607.05803",
)
