"""MaxSim and SignedMaxSim as one TIR PrimFunc each (equations: softdeploy/ops/max_sim.py,
softdeploy/ops/signed_max_sim.py).

    MaxSim:        Scores[b, n] = sum_{valid i} max_{valid j} <Q[b, i], D[n, j]>
    SignedMaxSim:  Scores[b, n] = sum_{valid i} QSign[b, i] * DSign[n, j*] * <Q[b, i], D[n, j*]>,
                   j* = the first valid j reaching that max

A GEMM-like reduction followed by a max over document tokens and a sum over query tokens. Blocks:
``q_packed`` (Q transposed once per call to [b, dim, Lq]), ``sim`` (<Q[b, i], D[n, j]> stored as
[b, n, Ld, Lq], query tokens innermost: float32 accumulation, int32 for int8 times the two scales),
``best`` (masked max over j; NaN propagates), for SignedMaxSim ``best_j`` (the first valid j whose
similarity equals that max), ``score`` (masked sum over i; a document without valid tokens gives 0).

Query tokens are the vector lanes: the similarity loop multiplies a LANES-wide slice of a packed Q
row by one broadcast document value, so D is read as it lies (no per-document transpose), and the
max over document tokens is a lane-wise (vertical) vector max. The hand schedule (:func:`schedule`)
runs documents in parallel and, per document, accumulates a register tile of J_TILE document tokens
x Lq query tokens over dim, then reduces the document's [Ld, Lq] similarities (4 KiB at 32 x 32,
in L1) with vector max / compare.

SignedMaxSim's argmax is two plain reductions (the max, then the first j equal to it) rather than a
(value, index) tuple reduction: TVM 0.27's VectorizeLoop miscompiles tuple reductions (the second
value's update reads the first after its store; see ``_te.lane_reduce``).
"""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from softdeploy.ops import max_sim as max_sim_op
from softdeploy.tvm.ops._te import LANES, f32, not_nan, shape_proxy

BLOCKS = ("q_packed", "sim", "best", "score")
# Kept stored when the neighbours are inlined (softdeploy.tvm.ops.inline_neighbours): the transpose of Q;
# inlined, the kernel would read Q strided again.
KEEP_BLOCKS = ("q_packed",)
J_TILE = 4  # document tokens per register tile: J_TILE x (Lq / LANES) accumulators (8 zmm at Lq = 32)
_NEG_INF = float("-inf")


def _similarity(q: te.Tensor, d: te.Tensor, q_scale: te.Tensor | None, d_scale: te.Tensor | None) -> te.Tensor:
    b, lq, dim = q.shape
    n, ld, _ = d.shape
    integer = q.dtype == "int8"
    acc = "int32" if integer else "float32"
    packed = te.compute((b, dim, lq), lambda bb, kk, i: q[bb, i, kk].astype(acc), name="q_packed")
    if int(dim) == 0:  # an empty reduction would leave its output unwritten (its init runs inside the loop)
        sim = te.compute((b, n, ld, lq), lambda *_: tirx.const(0, acc), name="sim")
    else:
        k = te.reduce_axis((0, dim), name="k")
        sim = te.compute(
            (b, n, ld, lq), lambda bb, nn, j, i: te.sum(packed[bb, k, i] * d[nn, j, k].astype(acc), axis=k), name="sim"
        )

    def scaled(bb: Any, nn: Any, i: Any, j: Any) -> Any:
        v = sim[bb, nn, j, i].astype("float32")
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
    # c if c > a or c is NaN; a NaN a, once in, stays (numpy's max). No negation: see _te.not_nan
    return tirx.Select(c > a, c, tirx.Select(not_nan(c), a, c))


_nan_max = te.comm_reducer(_nan_max_combine, lambda t: tirx.const(_NEG_INF, t), name="nan_max")


def _zeros(b: Any, n: Any) -> te.Tensor:
    """Scores of an empty query (Lq = 0): an empty reduction would leave them unwritten."""
    return te.compute((b, n), lambda *_: f32(0.0), name="score")


def max_sim(q: Any, d: Any, q_mask: Any, d_mask: Any, q_scale: Any, d_scale: Any) -> te.Tensor:
    """MaxSim as a TE compute: similarities (scaled for int8), max over valid document tokens, sum over valid query
    tokens; zeros for empty token axes."""
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


def signed_max_sim(q: Any, q_sign: Any, d: Any, d_sign: Any, q_mask: Any, d_mask: Any) -> te.Tensor:
    """SignedMaxSim as a TE compute: per query token the best document token by similarity (ties to the lowest j),
    signed and summed over valid query tokens."""
    b, lq, _ = q.shape
    n, ld, _ = d.shape
    if int(lq) == 0 or int(ld) == 0:
        return _zeros(b, n)
    sim = _similarity(q, d, None, None)
    j = te.reduce_axis((0, ld), name="j")
    best_v = te.compute(
        (b, n, lq),
        lambda bb, nn, i: _nan_max(tirx.Select(_valid(d_mask, nn, j), sim(bb, nn, i, j), f32(_NEG_INF)), axis=j),
        name="best",
    )
    # j*: the first valid j whose similarity equals the max (an all -inf row: its first valid token;
    # no valid token: ld, clamped below and zeroed by doc()). A NaN max makes the contribution NaN
    # whatever j* is.
    j2 = te.reduce_axis((0, ld), name="j2")
    best_j = te.compute(
        (b, n, lq),
        lambda bb, nn, i: te.min(
            tirx.Select(
                _valid(d_mask, nn, j2) & (sim(bb, nn, i, j2) == best_v[bb, nn, i]),
                j2.var.astype("int32"),
                tirx.const(int(ld), "int32"),
            ),
            axis=j2,
        ),
        name="best_j",
    )
    doc = _doc_has_token(d_mask, n, ld)
    i = te.reduce_axis((0, lq), name="i")

    def contribution(bb: Any, nn: Any, ii: Any) -> Any:
        js = tirx.max(tirx.min(best_j[bb, nn, ii], int(ld) - 1), 0)
        v = best_v(bb, nn, ii)
        c = q_sign[bb, ii].astype("float32") * d_sign[nn, js].astype("float32") * v
        return tirx.Select(not_nan(v), c, v)

    return te.compute(
        (b, n),
        lambda bb, nn: te.sum(tirx.Select(_valid(q_mask, bb, i) & doc(nn), contribution(bb, nn, i), f32(0.0)), axis=i),
        name="score",
    )


def _vectorize_over_tokens(sch: Any, block: Any, lq: Any) -> None:
    """A per-document reduction over j with spatial query tokens i: j outermost, inits hoisted, i
    vectorised by LANES (when Lq is a multiple of LANES)."""
    i_loop, j_loop = sch.get_loops(block)[-2:]
    sch.reorder(j_loop, i_loop)
    if isinstance(lq, tirx.IntImm) and int(lq) % LANES == 0:
        _, lanes = sch.split(i_loop, [None, LANES])
        sch.vectorize(lanes)
    sch.decompose_reduction(block, j_loop)


def schedule(sch: Any) -> bool:
    """Documents (and batches) in parallel; per document: the [Ld, Lq] similarities in register tiles
    of J_TILE document tokens x Lq query tokens (query tokens as vector lanes) accumulated over dim,
    then the max (and first argmax) over j as lane-wise vector ops, then the sum over i."""
    try:
        blocks = {name: sch.get_sblock(name) for name in BLOCKS}
    except Exception:  # not a MaxSim kernel
        return False
    try:
        best_j = sch.get_sblock("best_j")
    except Exception:  # MaxSim (SignedMaxSim has it)
        best_j = None
    extents = {str(iv.var): iv.dom.extent for iv in sch.get(blocks["sim"]).iter_vars}
    sizes = [int(e) if isinstance(e, tirx.IntImm) else 2 for e in extents.values()]  # (B, N, Ld, Lq[, dim])
    if 0 in sizes[:2] or 1 in sizes[2:]:
        # Nothing to compute (B or N = 0), or token/dim loops of extent 1, which compute_at drops
        # below: the loop indexing here raised on them (tile_lq1_ld1_dim1). dlight takes these.
        return False
    score = blocks["score"]
    loops = sch.get_loops(score)
    if len(loops) != 3:
        return False
    bb, nn, _ = loops
    sch.reorder(nn, bb)
    par = sch.fuse(nn, bb)
    sch.parallel(par)
    # inits hoisted out of the reduction loops (no per-iteration "first?" branch)
    sch.decompose_reduction(score, sch.get_loops(score)[-1])
    lq = sch.get(sch.get_loops(blocks["best"])[-2]).extent
    for block in (best_j, blocks["best"]):  # consumers first
        if block is not None:
            sch.compute_at(block, par)
            _vectorize_over_tokens(sch, block, lq)
    sim = blocks["sim"]
    sch.compute_at(sim, par)
    if len(sch.get_loops(sim)) < 4:  # dim = 0: a constant block, nothing to vectorise
        return True
    j_loop, i_loop, k_loop = sch.get_loops(sim)[-3:]
    ld = sch.get(j_loop).extent
    if not (isinstance(lq, tirx.IntImm) and int(lq) % LANES == 0):
        sch.reorder(j_loop, k_loop, i_loop)
        sch.decompose_reduction(sim, k_loop)
        return True
    io, ii = sch.split(i_loop, [None, LANES])
    if isinstance(ld, tirx.IntImm) and int(ld) % J_TILE == 0:
        jo, ji = sch.split(j_loop, [None, J_TILE])
        sch.reorder(jo, k_loop, ji, io, ii)
        sch.unroll(ji)
    else:
        sch.reorder(j_loop, k_loop, io, ii)
    sch.unroll(io)
    sch.vectorize(ii)
    sch.decompose_reduction(sim, k_loop)
    return True


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Relax converter for MaxSim: checks the contract on the static shapes (omitted inputs as None) and emits one
    PrimFunc."""
    args = (list(inputs) + [None] * 6)[:6]
    max_sim_op.validate(*(shape_proxy(a) for a in args))
    return bb.emit_te(max_sim, *args, primfunc_name_hint="max_sim")
