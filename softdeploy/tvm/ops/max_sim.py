"""MaxSim and SignedMaxSim as one TIR PrimFunc each (equations: softdeploy/ops/max_sim.py,
softdeploy/ops/signed_max_sim.py).

    MaxSim:        Scores[b, n] = sum_{valid i} max_{valid j} <Q[b, i], D[n, j]>
    SignedMaxSim:  Scores[b, n] = sum_{valid i} QSign[b, i] * DSign[n, j*] * <Q[b, i], D[n, j*]>,
                   j* = the first valid j reaching that max

A GEMM-like reduction followed by a row max (or argmax) and a sum. Blocks: ``d_packed`` (one
document transposed to [dim, Ld], so the similarity loop reads Ld-contiguous vectors), ``sim``
(<Q[b, i], D[n, j]>: float32 accumulation, int32 for int8 times the two scales), ``best`` (masked max
over j; for SignedMaxSim an argmax with ties to the lower j), ``score`` (masked sum over i; a
document without valid tokens gives 0). The hand schedule (:func:`schedule`) runs documents in
parallel, packs each document once, and computes the similarity row of one query token as
``Ld``-wide vectors (16 lanes) accumulated over dim, so the [Lq, Ld] matrix is never stored.
"""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from softdeploy.ops import max_sim as max_sim_op
from softdeploy.ops import signed_max_sim as signed_op
from softdeploy.tvm.ops._te import LANES, f32, is_nan, shape_proxy

BLOCKS = ("d_packed", "sim", "best", "score")
_NEG_INF = float("-inf")


def _similarity(q: te.Tensor, d: te.Tensor, q_scale: te.Tensor | None, d_scale: te.Tensor | None) -> te.Tensor:
    b, lq, dim = q.shape
    n, ld, _ = d.shape
    integer = q.dtype == "int8"
    acc = "int32" if integer else "float32"
    packed = te.compute((n, dim, ld), lambda nn, kk, j: d[nn, j, kk].astype(acc), name="d_packed")
    if int(dim) == 0:  # an empty reduction would leave its output unwritten (its init runs inside the loop)
        sim = te.compute((b, n, lq, ld), lambda *_: tirx.const(0, acc), name="sim")
    else:
        k = te.reduce_axis((0, dim), name="k")
        sim = te.compute(
            (b, n, lq, ld), lambda bb, nn, i, j: te.sum(q[bb, i, k].astype(acc) * packed[nn, k, j], axis=k), name="sim"
        )

    def scaled(bb: Any, nn: Any, i: Any, j: Any) -> Any:
        v = sim[bb, nn, i, j].astype("float32")
        if q_scale is not None:
            v = v * q_scale[bb, i]
        if d_scale is not None:
            v = v * d_scale[nn, j]
        return v

    return scaled


def _valid(mask: te.Tensor | None, *i: Any) -> Any:
    return tirx.const(True, "bool") if mask is None else mask(*i).astype("bool")


def _doc_has_token(d_mask: te.Tensor | None, n: Any, ld: Any) -> Any:
    """1 where document n has a valid token (as a tensor over n), or a constant."""
    if d_mask is None:
        return lambda nn: tirx.const(int(ld) > 0, "bool")
    j = te.reduce_axis((0, ld), name="doc_j")
    any_valid = te.compute((n,), lambda nn: te.max(d_mask[nn, j].astype("int32"), axis=j), name="doc_valid")
    return lambda nn: any_valid[nn] > 0


def _nan_max_combine(a: Any, c: Any) -> Any:
    return tirx.Select(is_nan(c) | (c > a), c, a)  # a NaN, once in, stays (numpy's max)


_nan_max = te.comm_reducer(_nan_max_combine, lambda t: tirx.const(_NEG_INF, t), name="nan_max")


def _zeros(b: Any, n: Any) -> te.Tensor:
    """Scores of an empty query (Lq = 0): an empty reduction would leave them unwritten."""
    return te.compute((b, n), lambda *_: f32(0.0), name="score")


def max_sim(q: Any, d: Any, q_mask: Any, d_mask: Any, q_scale: Any, d_scale: Any) -> te.Tensor:
    b, lq, _ = q.shape
    n, ld, _ = d.shape
    if int(lq) == 0 or int(ld) == 0:
        return _zeros(b, n)
    sim = _similarity(q, d, q_scale, d_scale)
    j = te.reduce_axis((0, ld), name="j")
    best = te.compute(
        (b, n, lq),
        lambda bb, nn, i: _nan_max(tirx.Select(_valid(d_mask, nn, j), sim(bb, nn, i, j), f32(_NEG_INF)), axis=j),
        name="best",
    )
    doc = _doc_has_token(d_mask, n, ld)
    i = te.reduce_axis((0, lq), name="i")
    return te.compute(
        (b, n),
        lambda bb, nn: te.sum(tirx.Select(_valid(q_mask, bb, i) & doc(nn), best[bb, nn, i], f32(0.0)), axis=i),
        name="score",
    )


def _argmax_combine(a: tuple[Any, Any], c: tuple[Any, Any]) -> tuple[Any, Any]:
    """(value, j) pairs: the larger value, ties to the lower j; NaN wins (it poisons the token)."""
    va, ja = a
    vc, jc = c
    take_c = is_nan(vc) | (~is_nan(va) & ((vc > va) | ((vc == va) & (jc < ja))))
    return tirx.Select(take_c, vc, va), tirx.Select(take_c, jc, ja)


def _argmax_identity(t0: str, t1: str) -> tuple[Any, Any]:
    return tirx.const(_NEG_INF, t0), tirx.const(-1, t1)


_argmax = te.comm_reducer(_argmax_combine, _argmax_identity, name="first_argmax")


def signed_max_sim(q: Any, q_sign: Any, d: Any, d_sign: Any, q_mask: Any, d_mask: Any) -> te.Tensor:
    b, lq, _ = q.shape
    n, ld, _ = d.shape
    if int(lq) == 0 or int(ld) == 0:
        return _zeros(b, n)
    sim = _similarity(q, d, None, None)
    j = te.reduce_axis((0, ld), name="j")
    # masked j never win: they compete as (-inf, ld) and an all -inf row picks its first VALID token
    best_v, best_j = te.compute(
        (b, n, lq),
        lambda bb, nn, i: _argmax(
            (
                tirx.Select(_valid(d_mask, nn, j), sim(bb, nn, i, j), f32(_NEG_INF)),
                tirx.Select(_valid(d_mask, nn, j), j.var.astype("int32"), tirx.const(int(ld), "int32")),
            ),
            axis=j,
        ),
        name="best",
    )
    doc = _doc_has_token(d_mask, n, ld)
    i = te.reduce_axis((0, lq), name="i")

    def contribution(bb: Any, nn: Any, ii: Any) -> Any:
        js = tirx.max(tirx.min(best_j[bb, nn, ii], int(ld) - 1), 0)
        v = best_v[bb, nn, ii]
        c = q_sign[bb, ii].astype("float32") * d_sign[nn, js].astype("float32") * v
        return tirx.Select(is_nan(v), v, c)

    return te.compute(
        (b, n),
        lambda bb, nn: te.sum(tirx.Select(_valid(q_mask, bb, i) & doc(nn), contribution(bb, nn, i), f32(0.0)), axis=i),
        name="score",
    )


def schedule(sch: Any) -> bool:
    """Documents (and batches) in parallel; per document: pack D[n] to [dim, Ld]; per query token:
    the similarity row as LANES-wide vectors over j accumulated along dim, its max, the sum."""
    try:
        blocks = {name: sch.get_sblock(name) for name in BLOCKS}
    except Exception:  # not a MaxSim kernel
        return False
    score = blocks["score"]
    loops = sch.get_loops(score)
    if len(loops) != 3:
        return False
    bb, nn, _ = loops
    sch.reorder(nn, bb)  # packing D[n] once serves every batch row
    par = sch.fuse(nn, bb)
    sch.parallel(par)
    # inits hoisted out of the reduction loops (no per-iteration "first?" branch)
    sch.decompose_reduction(score, sch.get_loops(score)[-1])
    sch.compute_at(blocks["best"], par)
    i_loop, j_loop = sch.get_loops(blocks["best"])[-2:]
    sch.decompose_reduction(blocks["best"], j_loop)
    sch.compute_at(blocks["sim"], i_loop)
    sch.compute_at(blocks["d_packed"], par)
    sim = blocks["sim"]
    if len(sch.get_loops(sim)) < 4:  # dim = 0: a constant block, nothing to vectorise
        return True
    j_loop, k_loop = sch.get_loops(sim)[-2:]
    ld = sch.get(j_loop).extent
    if isinstance(ld, tirx.IntImm) and int(ld) % LANES == 0:
        jo, ji = sch.split(j_loop, [None, LANES])
        sch.reorder(jo, k_loop, ji)
        sch.vectorize(ji)
    sch.decompose_reduction(sim, k_loop)
    return True


def convert_max_sim(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    args = (list(inputs) + [None] * 6)[:6]
    max_sim_op.validate(*(shape_proxy(a) for a in args))
    return bb.emit_te(max_sim, *args, primfunc_name_hint="max_sim")


def convert_signed_max_sim(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    args = (list(inputs) + [None] * 6)[:6]
    signed_op.validate(*(shape_proxy(a) for a in args), values=False)
    return bb.emit_te(signed_max_sim, *args, primfunc_name_hint="signed_max_sim")
