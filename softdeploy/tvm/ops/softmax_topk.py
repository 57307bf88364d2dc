"""SoftmaxTopK on TVM (equation, ranking rule and special values: softdeploy/ops/softmax_topk.py).

    z = x / T;  m = max z;  d = sum_j exp(z_j - m)
    Indices = the k positions of the largest x (NaN, +inf, finite descending, -inf; ties: lower index)
    Values_i = exp(z_Indices_i - m) / d;   LogSumExp = m + log d        along ``axis``

Several kernels, not one. The ranking key is the float's order as an int32 -- NaN above +inf above
every finite value above -inf, -0 equal to +0 -- because TVM's float TopK ranks -inf above finite
values (which is why the function body cannot be used).

Along the last axis (the usual case: vocabulary rows) four kernels:
  1. :func:`block_max` -- per 256-element block, each of the 16 lanes' maximum as a ranking key (a
     vertical int32 max and min of the bits), and per 8 blocks each lane's largest of those;
  2. :func:`select_top_k` -- a written-scheduled scan keeping the k best (key, index) in a heap,
     reading only the lanes whose maximum reaches a floor (the k-th largest of the group maxima);
  3. :func:`row_sums` -- d, with m taken from the selection's top (no max pass), each term from
     ``_te.pow2_sum_term_f32`` (11 vector ops);
  4. :func:`values_and_lse` -- the k probabilities and the log-sum-exp.
Along another axis: the int32 key (:func:`rank_key`) through TVM's TopK (exact: its int32 TopK keeps
lower indices first among equal keys; a full sort), then 3 and 4.

The C++ kernel's single read per row (the selection fused into the normaliser pass) is not written
as TIR: its data-dependent insertion per element does not vectorise there, so the selection reads
lane maxima and the sums are a pass of their own (bench/results/tvm_ops.md). Fusing 1 and 3 (sums
per block against the block's lane maxima, rescaled afterwards) was measured and not kept: the exp
bounds both passes alike, and the rescaling pass cost more than the second read saved.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from tvm import relax, te, tirx
from tvm.script import tirx as T

from softdeploy.ops import softmax_topk as op
from softdeploy.tvm.ops._te import (
    LANES,
    LOG2E,
    REDUCTION,
    SCALAR,
    as_f32,
    exp_nonpositive_f32,
    f32,
    is_finite,
    lane_reduce,
    not_nan,
    pow2_sum_term_f32,
    reduced_shape,
    schedule_rows,
    shape_proxy,
    without_axis,
)

_INT32_MAX = 2147483647


def rank_key(x: te.Tensor) -> te.Tensor:
    """int32 keys whose order is the ranking rule's (see the module docstring)."""
    xf = as_f32(x)
    return te.compute(x.shape, lambda *i: _ranking_key(xf(*i)), name="rank_key")


STAGES = [("d", REDUCTION), ("row_shift", SCALAR)]  # the sums kernel's per-row stages (schedule_rows)
# Kept stored when the neighbours are inlined (softdeploy.tvm.ops.inline_neighbours): the per-row shift and
# sums.
KEEP_BLOCKS = ("row_shift", "row_sums")


def _top(x: Any, indices: te.Tensor, axis: int, r: tuple[Any, ...]) -> Any:
    """x at the row's first index, as float32: the row's top under the ranking rule -- NaN if the row
    has one, else +inf if it has one, else its max (-inf if that is all it holds)."""
    zero = tirx.const(0, indices.dtype)
    return x(*r[:axis], indices(*r[:axis], zero, *r[axis:]).astype("int32"), *r[axis:])


def row_sums(x: te.Tensor, indices: te.Tensor, axis: int, temperature: float) -> te.Tensor:
    """float64 ``[rows...]``: d = sum_j exp(z_j - m) = sum_j 2^((x_j - top) * s), z = x / T,
    s = log2(e) / T, m = top / T with top the row's first index (the max: no pass of its own, the
    selection found it). Only meaningful for the ordinary rows (top finite); the special rows' outputs
    do not read it, so the terms are ``pow2_sum_term_f32``'s (no special values; the term of the top
    itself is 1, so its flush of terms below 2^-125 is harmless). s rounded to float32 scales every
    exponent by the same 1 + 6e-8: the sum moves by about that times its mean |u| * ln2 (~1e-7),
    against the 2e-6 tolerance. Lane-split (``_te.lane_reduce``), vectorised by :func:`schedule`."""
    shape = list(x.shape)
    xf = as_f32(x)
    s = f32(LOG2E / float(temperature))

    def row_shift(*r: Any) -> Any:
        top = _top(xf, indices, axis, r)
        return tirx.Select(is_finite(top), top, f32(0.0))

    shift = te.compute(reduced_shape(shape, axis), row_shift, name="row_shift")  # once per row

    def term(i: tuple[Any, ...]) -> Any:
        return pow2_sum_term_f32((xf(*i) - shift(*without_axis(i, axis))) * s)

    d = lane_reduce(shape, axis, term, te.sum, "d", dtype="float64")
    return te.compute(reduced_shape(shape, axis), lambda *r: d(*r), name="row_sums")


def schedule(sch: Any) -> bool:
    """The sums kernel: rows in parallel, the reduction lane-vectorised per row (vector form only).
    (The block maxima and the selection are written scheduled.)"""
    return schedule_rows(sch, "row_sums", STAGES, vector_out=False)


def values_and_lse(x: te.Tensor, indices: te.Tensor, sums: te.Tensor, axis: int, temperature: float) -> list[te.Tensor]:
    """Values (the probabilities at ``indices``) and LogSumExp (axis kept as size 1), with the
    reference's special rows, told by the row's top: NaN -> values and log-sum-exp NaN; +inf ->
    values NaN, log-sum-exp +inf; -inf (only -inf in the row) -> values NaN, log-sum-exp -inf."""
    shape = list(x.shape)
    xf = as_f32(x)
    t = f32(float(temperature))

    def value(*i: Any) -> Any:
        r = without_axis(i, axis)
        top = _top(xf, indices, axis, r)
        src = (*i[:axis], indices(*i).astype("int32"), *i[axis + 1 :])
        p = exp_nonpositive_f32(tirx.min(xf(*src) / t - top / t, f32(0.0))) / sums(*r).astype("float32")
        return tirx.Select(is_finite(top), p, f32(float("nan"))).astype(x.dtype)

    k = indices.shape[axis]
    values = te.compute([*shape[:axis], k, *shape[axis + 1 :]], value, name="values")

    def lse(*i: Any) -> Any:
        r = without_axis(i, axis)
        top = _top(xf, indices, axis, r)
        y = top / t + tirx.log(sums(*r)).astype("float32")
        return tirx.Select(is_finite(top), y, top).astype(x.dtype)  # NaN, +inf, -inf: themselves

    return [values, te.compute([*shape[:axis], 1, *shape[axis + 1 :]], lse, name="log_sum_exp")]


BLOCK = 256  # elements per block of the selection's pre-filter: LANES lanes x 16 vectors
GROUP = 8  # blocks per group: the floor's first level (the last group may hold fewer)


def _row_layout(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """(rows, n, blocks, groups) of the last-axis kernels: the rows flattened, BLOCK-element blocks,
    GROUP-block groups (the tail past the last whole block belongs to neither)."""
    rows = 1
    for d in shape[:-1]:
        rows *= d
    blocks = shape[-1] // BLOCK
    return rows, shape[-1], blocks, -(-blocks // GROUP)


def _maxima_shapes(shape: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of :func:`block_max`'s two outputs: lane maxima per block, and per group."""
    _, _, blocks, groups = _row_layout(shape)
    return (*shape[:-1], blocks, LANES), (*shape[:-1], groups, LANES)


# The written-scheduled kernels are TVMScript parsed when built, and parsing is slow: each T.macro
# expansion walks the whole Python stack reading source lines (inspect.getouterframes), scanning
# sys.modules for frames without a module file -- seconds per kernel under a deep stack
# (bench/results/test_suite_time.md). So each is parsed once per distinct (shape, k, dtype) and the
# PrimFunc reused: TVM IR nodes are immutable (passes and with_attr return new nodes; copy-on-write
# copies a node the cache still holds), so one PrimFunc can sit in any number of IRModules.
_PARSED_KEYS = 64

_INF_BITS = 0x7F800000  # bits of +inf: the key of +inf, and of NaN in the block maxima
_NEG_INF_KEY = -2139095041  # the ranking key of -inf (its bits 0xFF800000, magnitude bits flipped)
_NEG_INF_BITS = -8388608  # bits of -inf as an int32: sign-bit-set bits above it are NaNs


def _lane_key(hi: Any, lo: Any) -> Any:
    """The ranking key of a lane's largest value from the largest (hi) and smallest (lo) of its bits
    as int32: with a non-negative-signed value, hi's float is the max (a NaN above it: counted as
    +inf); with only sign-bit-set values (negatives, -0, negative NaNs) lo's float is the max -- the
    smallest magnitude -- unless hi is a negative NaN (then +inf)."""
    # (-0's bits are INT32_MIN, whose compares TVM 0.27 miscompiles: always false; tested via key -1)
    negative = T.Select(hi > _NEG_INF_BITS, _INF_BITS, T.Select(lo ^ _INT32_MAX == -1, 0, lo ^ _INT32_MAX))
    return T.Select(hi >= 0, T.min(hi, _INF_BITS), negative)


def block_max(shape: list[int], dtype: str) -> Any:
    """PrimFunc ``(x[..., n], block_max, group_max)``, the selection's pre-filter: ranking keys along
    the last axis of

    * ``block_max[rows..., n // BLOCK, LANES]``: per block of BLOCK elements, each lane's largest
      value (j = b * BLOCK + q * LANES + l, over q), NaN counted as +inf -- from a vertical max and
      min of the elements' bits as int32 (2 vector ops per 16 elements; a float max needs 4, its NaN
      test included, and a max over ranking keys ~10), see :func:`_lane_key`;
    * ``group_max[rows..., ceil(blocks / GROUP), LANES]``: per group of GROUP blocks, each lane's
      largest block maximum.

    A lane holding a NaN or +inf gets the key of +inf (a lower bound of its top key), so the selection
    never skips it. Elements past the last whole block (the tail) are in neither."""
    return _block_max(tuple(int(d) for d in shape), str(dtype))


@functools.lru_cache(maxsize=_PARSED_KEYS)
def _block_max(shape: tuple[int, ...], dtype: str) -> Any:
    """:func:`block_max`, parsed once per (shape, dtype) (see :data:`_PARSED_KEYS`)."""
    rows, n, blocks, groups = _row_layout(shape)
    x_shape, (max_shape, group_shape) = tuple(shape), _maxima_shapes(shape)

    def bits(v: Any) -> Any:
        return T.reinterpret("int32", T.Cast("float32", v))

    @T.prim_func(private=True, s_tir=True)
    def softmax_topk_block_max(
        x_nd: T.Buffer(x_shape, dtype), max_nd: T.Buffer(max_shape, "int32"), group_nd: T.Buffer(group_shape, "int32")
    ):
        # written scheduled: the two accumulators in one loop (as TE reductions, two loops; as one
        # tuple reduction, miscompiled by the vectoriser -- _te.lane_reduce)
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        x = T.decl_buffer((rows, n), dtype, data=x_nd.data)  # the rows, flattened in place
        lane_key = T.decl_buffer((rows, blocks * LANES), "int32", data=max_nd.data)
        group_key = T.decl_buffer((rows, groups * LANES), "int32", data=group_nd.data)
        with T.sblock("root"):
            for r in T.parallel(rows):
                with T.sblock("maxima"):
                    T.reads(x[r, 0 : blocks * BLOCK])
                    T.writes(lane_key[r, 0 : blocks * LANES], group_key[r, 0 : groups * LANES])
                    # default scope: stack allocas that LLVM keeps in registers (select_top_k)
                    hi = T.alloc_buffer((LANES,), "int32")
                    lo = T.alloc_buffer((LANES,), "int32")
                    group = T.alloc_buffer((LANES,), "int32")
                    for b in range(blocks):
                        for lane in T.vectorized(LANES):
                            hi[lane] = bits(x[r, b * BLOCK + lane])
                            lo[lane] = bits(x[r, b * BLOCK + lane])
                        for q in range(1, BLOCK // LANES):
                            for lane in T.vectorized(LANES):
                                hi[lane] = T.max(hi[lane], bits(x[r, b * BLOCK + q * LANES + lane]))
                                lo[lane] = T.min(lo[lane], bits(x[r, b * BLOCK + q * LANES + lane]))
                        for lane in T.vectorized(LANES):
                            lane_key[r, b * LANES + lane] = _lane_key(hi[lane], lo[lane])
                            group[lane] = T.Select(
                                b % GROUP == 0,
                                lane_key[r, b * LANES + lane],
                                T.max(group[lane], lane_key[r, b * LANES + lane]),
                            )
                        if b % GROUP == GROUP - 1 or b == blocks - 1:
                            for lane in T.vectorized(LANES):
                                group_key[r, (b // GROUP) * LANES + lane] = group[lane]

    return softmax_topk_block_max


def _ranking_key(v: Any) -> Any:
    """The int32 ranking key of a float32 expression: :func:`_ordered_bits`, NaN above all."""
    return tirx.Select(not_nan(v), _ordered_bits(v), tirx.const(_INT32_MAX, "int32"))


def _ordered_bits(v: Any) -> Any:
    """The int32 ranking key of a float32 expression that is not NaN: its bits, negatives with the
    magnitude bits flipped (a larger magnitude, a smaller key); -0 as +0."""
    bits = tirx.reinterpret("int32", tirx.Select(v == f32(0.0), f32(0.0), v))
    return tirx.Select(bits < 0, bits ^ tirx.const(_INT32_MAX, "int32"), bits)


def select_top_k(shape: list[int], k: int, dtype: str) -> Any:
    """PrimFunc ``(x[..., n], block_max, group_max, indices[..., k])`` (the keys of :func:`block_max`):
    per row of the last axis, the positions of the k largest x under the ranking rule.

    The k best (key, index) seen are kept in a min-heap whose root is the worst of them (a smaller
    key, or an equal key at a higher index: candidates do not arrive in index order). The first k
    offered fill it (heapified once, in O(k)); after that a candidate enters by replacing the root
    when it ranks above it, in O(log k) -- a sorted list's insertion shifts k/2 entries, which at
    k = 50 cost more than the rest of the scan (select 29 -> 17 us at 4 x 32000). A candidate is
    offered only from a lane (16 elements of a block) whose maximum reaches a floor that at least k
    elements reach, so no element below it is among the k largest:

    1. the floor: the k-th largest group-lane maximum, by the same heap run over the group maxima
       (groups x LANES of them, each over its own elements, so k distinct elements reach it; with
       fewer than k there is none), raised to just above -inf;
    2. the elements of the lanes that reach it (tested as floats first: the key is built only for
       those that reach it) and of the tail past the last block; then, for a row with fewer than k
       entries above -inf, its first -inf entries by index; then the heap sorted in place, best first.

    On random vocabulary rows about k lanes reach the floor (53 of 2000 at k = 50, 4 x 32000), so the
    scan costs one scalar compare per 128 elements plus GROUP per passing group-lane and 16 per
    passing lane. (A second floor, the k-th largest lane maximum, was measured: it offered 4% fewer
    elements and cost 6 us more at k = 50: 17 -> 12 us without it.) Adversarial maxima make it read at
    most GROUP x k lanes."""
    return _select_top_k(tuple(int(d) for d in shape), int(k), str(dtype))


@functools.lru_cache(maxsize=_PARSED_KEYS)
def _select_top_k(shape: tuple[int, ...], k: int, dtype: str) -> Any:
    """:func:`select_top_k`, parsed once per (shape, k, dtype) (see :data:`_PARSED_KEYS`)."""
    rows, n, blocks, groups = _row_layout(shape)
    x_shape, out_shape = tuple(shape), (*shape[:-1], k)
    max_shape, group_shape = _maxima_shapes(shape)
    # below every key (the key of -inf is -2139095041); not INT32_MIN, whose compares TVM 0.27
    # miscompiles (always false)
    sentinel = -2147483647

    # Every temporary lives in a small buffer of the default ("global") scope: LowerTVMBuiltin turns
    # those into stack allocas, which LLVM keeps in registers. A "local" buffer, or a scalar bound in
    # TVMScript (`v: T.int32 = ...`), becomes a TVMBackendAllocWorkspace call per row instead, and
    # every access a memory round trip (the scan ran ~4x slower).

    def block_of(i: Any, g: Any) -> Any:  # the g-th block of group-lane i
        return (i // LANES) * GROUP + g

    def lane_of(i: Any, g: Any) -> Any:  # lane i % LANES of that block, in lane_key's row
        return block_of(i, g) * LANES + i % LANES

    def element_of(i: Any, g: Any, q: Any) -> Any:  # the q-th element of that lane, in x's row
        return block_of(i, g) * BLOCK + q * LANES + i % LANES

    def ranks_below(key_a: Any, index_a: Any, key_b: Any, index_b: Any) -> Any:  # a after b in the top
        return T.Or(key_a < key_b, T.And(key_a == key_b, index_a > index_b))

    @T.macro
    def swap(heap_key: Any, heap_index: Any, tmp: Any, a: Any, b: Any) -> None:
        tmp[0] = heap_key[a]
        tmp[1] = heap_index[a]
        heap_key[a] = heap_key[b]
        heap_index[a] = heap_index[b]
        heap_key[b] = tmp[0]
        heap_index[b] = tmp[1]

    @T.macro
    def sift_down(heap_key: Any, heap_index: Any, tmp: Any, at: Any, size: Any) -> None:
        # restores the heap below at[0]: the worse child moves up while it ranks below the entry
        at[1] = 2 * at[0] + 1
        while at[1] < size:
            if at[1] + 1 < size and ranks_below(
                heap_key[at[1] + 1], heap_index[at[1] + 1], heap_key[at[1]], heap_index[at[1]]
            ):
                at[1] = at[1] + 1
            if ranks_below(heap_key[at[1]], heap_index[at[1]], heap_key[at[0]], heap_index[at[0]]):
                swap(heap_key, heap_index, tmp, at[0], at[1])
                at[0] = at[1]
                at[1] = 2 * at[0] + 1
            else:
                at[1] = size

    @T.macro
    def offer(heap_key: Any, heap_index: Any, tmp: Any, at: Any, key: Any, index: Any) -> None:
        # (key, index) joins the heap: appended while it holds fewer than k (heapified at the k-th,
        # in O(k): cheaper than k sift-downs from the root), else it replaces the root if it ranks above
        if at[2] < k:
            heap_key[at[2]] = key
            heap_index[at[2]] = index
            at[2] = at[2] + 1
            if at[2] == k:
                for i in range(k // 2):
                    at[0] = k // 2 - 1 - i
                    sift_down(heap_key, heap_index, tmp, at, k)
        elif ranks_below(heap_key[0], heap_index[0], key, index):
            heap_key[0] = key
            heap_index[0] = index
            at[0] = 0
            sift_down(heap_key, heap_index, tmp, at, k)

    @T.prim_func(private=True, s_tir=True)
    def softmax_topk_select(
        x_nd: T.Buffer(x_shape, dtype),
        max_nd: T.Buffer(max_shape, "int32"),
        group_nd: T.Buffer(group_shape, "int32"),
        out_nd: T.Buffer(out_shape, "int64"),
    ):
        # written scheduled (one opaque block per row): no schedule rule or tuning applies to it
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        x = T.decl_buffer((rows, n), dtype, data=x_nd.data)  # the rows, flattened in place
        lane_key = T.decl_buffer((rows, blocks * LANES), "int32", data=max_nd.data)
        group_key = T.decl_buffer((rows, groups * LANES), "int32", data=group_nd.data)
        indices = T.decl_buffer((rows, k), "int64", data=out_nd.data)
        with T.sblock("root"):
            for r in T.parallel(rows):
                with T.sblock("select"):
                    T.reads(x[r, 0:n], lane_key[r, 0 : blocks * LANES], group_key[r, 0 : groups * LANES])
                    T.writes(indices[r, 0:k])
                    heap_key = T.alloc_buffer((k,), "int32")
                    heap_index = T.alloc_buffer((k,), "int32")
                    tmp = T.alloc_buffer((2,), "int32")  # a swap's saved entry
                    at = T.alloc_buffer((4,), "int32")  # sift-down position and child; entries held; scan position
                    floor = T.alloc_buffer((1,), "int32")
                    value = T.alloc_buffer((2,), "float32")  # the floor as a float; the element
                    at[2] = 0  # empty
                    for i in range(groups * LANES):
                        offer(heap_key, heap_index, tmp, at, group_key[r, i], i)
                    # The floor, raised to just above -inf: what is at -inf comes in index order after 2.
                    floor[0] = T.max(T.Select(at[2] == k, heap_key[0], sentinel), _NEG_INF_KEY + 1)  # 1.
                    # the floor as a float, to test an element before its key is built (NaN passes)
                    value[0] = T.reinterpret("float32", T.Select(floor[0] < 0, floor[0] ^ _INT32_MAX, floor[0]))
                    at[2] = 0  # empty
                    for i in range(groups * LANES):  # 2. (a lane holding a NaN or +inf reaches any floor)
                        if group_key[r, i] >= floor[0]:
                            for g in range(GROUP):
                                if block_of(i, g) < blocks:
                                    if lane_key[r, lane_of(i, g)] >= floor[0]:
                                        for q in range(BLOCK // LANES):
                                            value[1] = T.Cast("float32", x[r, element_of(i, g, q)])
                                            if value[1] >= value[0] or T.isnan(value[1]):
                                                key = _ranking_key(value[1])
                                                offer(heap_key, heap_index, tmp, at, key, element_of(i, g, q))
                    for j in range(blocks * BLOCK, n):  # the tail
                        value[1] = T.Cast("float32", x[r, j])
                        if value[1] >= value[0] or T.isnan(value[1]):
                            offer(heap_key, heap_index, tmp, at, _ranking_key(value[1]), j)
                    # Fewer than k above -inf (a masked row): the first -inf entries by index complete
                    # the k, scanned only while one can still enter (an O(n) offer of every -inf tie
                    # out of index order cost ~80 us per 32000 entries).
                    at[3] = 0
                    while at[2] < k or (heap_key[0] == _NEG_INF_KEY and at[3] < heap_index[0]):
                        if T.Cast("float32", x[r, at[3]]) == T.float32("-inf"):
                            offer(heap_key, heap_index, tmp, at, _NEG_INF_KEY, at[3])
                        at[3] = at[3] + 1
                    for i in range(k - 1):  # heap sort: the worst left goes to the end, best first remains
                        swap(heap_key, heap_index, tmp, 0, k - 1 - i)
                        at[0] = 0
                        sift_down(heap_key, heap_index, tmp, at, k - 1 - i)
                    for i in range(k):
                        indices[r, i] = T.Cast("int64", heap_index[i])

    return softmax_topk_select


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Relax converter for SoftmaxTopK: the indices from the block-maxima and heap-selection kernels along the
    contiguous last axis (TVM's TopK on an int32 rank key along another axis), then the sums and the values and
    LogSumExp kernels."""
    x = inputs[0]
    k, temperature = int(attrs["k"]), float(attrs["temperature"])
    axis = op.validate(shape_proxy(x), k, int(attrs["axis"]), temperature)
    shape = [int(d) for d in x.ty.shape]
    if axis == len(shape) - 1:  # rows along the contiguous axis: the one-scan selection
        dtype = str(x.ty.dtype)
        maxima_type = [relax.TensorType(list(s), "int32") for s in _maxima_shapes(shape)]
        func = bb.add_func(block_max(shape, dtype), "softmax_topk_block_max")
        maxima = bb.emit(relax.call_tir(func, relax.Tuple([x]), maxima_type))
        lanes, groups = (bb.emit(relax.TupleGetItem(maxima, i)) for i in range(2))
        func = bb.add_func(select_top_k(shape, k, dtype), "softmax_topk_select")
        out_type = relax.TensorType([*shape[:-1], k], "int64")
        indices = bb.emit(relax.call_tir(func, relax.Tuple([x, lanes, groups]), out_type))
    else:  # TVM's TopK on the int32 key (its float TopK misranks -inf)
        key = bb.emit_te(rank_key, x, primfunc_name_hint="softmax_topk_key")
        top = bb.emit(relax.op.topk(key, k, axis=axis, ret_type="both", largest=True, dtype="int64"))
        indices = bb.emit(relax.TupleGetItem(top, 1))
    sums = bb.emit_te(row_sums, x, indices, axis, temperature, primfunc_name_hint="softmax_topk_sums")
    out = bb.emit_te(values_and_lse, x, indices, sums, axis, temperature, primfunc_name_hint="softmax_topk_values")
    return relax.Tuple([bb.emit(relax.TupleGetItem(out, 0)), indices, bb.emit(relax.TupleGetItem(out, 1))])
