"""RowwiseInt8MatMul as TIR PrimFuncs (equation and rules: softdeploy/ops/rowwise_int8_matmul.py).

    lo, hi = min(0, min_k A[m, k]), max(0, max_k A[m, k]);   s = (hi - lo) / L  (1 below 2^-126)
    z = round(clip(-lo / s, 0, L));   q[m, k] = clip(round(A[m, k] * (1 / s)) + z, 0, L)
    Y[m, n] = float32(sum_k q[m, k] B[k, n] - z colsum[n]) * (s BScale[n]) + Bias[n]
    then act(Y) + Residual in the same block (activation "gelu": h + h erf(Y / sqrt(2)), TVM's erf)

The same float32 steps as the kernel and the function body (round half to even), so every backend quantizes to the
same integers; the sums are exact in int32 (``K <= 65536``), ``colsum[n] = sum_k B[k, n]`` taking the zero point out
of the integer loop, as the C++ kernel does. Outputs equal the C++ kernel's bit for bit on every sample
(tests/tvm_backend/test_rowwise_int8_tir.py).

Two kernels: ``rowwise_int8_matmul_quantize`` (blocks ``rowq_min`` / ``rowq_max``, lane-split by
``_te.lane_reduce`` where K allows, the per-row scalars ``rowq_scale`` / ``rowq_inv`` / ``rowq_zero``, the uint8 rows
``rowq_q`` padded with zeros to whole tiles, and ``rowq_params`` = (s, z) per row) and ``rowwise_int8_matmul`` (the
int32 sums ``rowq_acc`` and the float32 epilogue ``rowq_out``). They are two PrimFuncs because the epilogue reads the
per-row scalars: in one PrimFunc those blocks are producers of the epilogue outside its tile loop, which TVM's
``reverse_compute_at`` refuses.

B is used packed, ``[N / T, K / G, T, G]`` (zero-padded), in the operand layout of the target's integer dot product
(:class:`Layout`): ``vpdpbusd`` takes G = 4 consecutive k of 16 (zmm) or 8 (ymm) columns as int8; without VNNI the
exact ``vpmaddwd`` takes G = 2 k of 16 (AVX-512 BW) or 8 (AVX2) columns widened to int16, and for lane-bounded
weights (:data:`LANE_LAYOUTS`) ``vpmaddubsw`` takes S sets of G = 4 k as int8, their int16 sums added before one
``vpmaddwd`` widens them (the C++ kernel's AVX2 tile). A weight initializer is packed once, in NumPy, at import
(:func:`pack_weights`, with its column sums), for the target that the import runs under
(``softdeploy.tvm.frontend.import_model``); a B that is a graph input is packed by a third kernel,
``rowwise_int8_matmul_pack``.

The hand schedule (:func:`schedule`) runs the row ranges and the quantization with rows in parallel and vectorised,
then the integer GEMM in register tiles of ``rows`` x ``tiles * T`` columns over k blocks of 16 KiB of B, column
panels in parallel, each ``lanes``-column step of the tile one tensor intrinsic call. On a target without the
layout's instruction the tile is vectorised over columns in int32 (exact, slow). Measured (bench/tvm_rowwise_int8.py,
bench/results/tvm_minilm.md, Zen 4): with vpdpbusd 2.8-3.6x TVM's float32 GEMM and 0.88-0.97x the C++ kernel at
MiniLM's shapes; on an AVX2 target 0.89-1.14x float32 with vpmaddwd, 2.3-2.5x with vpmaddubsw on lane-bounded
weights.

TVM's own ``dot_16x4_vnni`` (tvm/s_tir/tensor_intrin/x86.py) passes ``<16 x i32>`` operands to
``llvm.x86.avx512.vpdpbusd.512``, which this TVM's LLVM declares with ``<64 x i8>`` ones: the module fails LLVM's
verifier ("Call parameter type does not match function signature"). Ours are registered below with byte operands.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from tvm import te, tirx

from softdeploy.errors import OpContractError
from softdeploy.ops import rowwise_int8_matmul as op
from softdeploy.tvm.ops._te import f32, lane_reduce, shape_proxy
from softdeploy.tvm.target import target_has

MIN_NORMAL = 2.0**-126
# Per-row scalars kept stored (softdeploy.tvm.ops.KEEP_BLOCKS): inlined, they would be recomputed per entry (a division).
ROW_BLOCKS = ("rowq_scale", "rowq_inv", "rowq_zero")
KEEP_BLOCKS = ROW_BLOCKS
KC_BYTES = 16384  # bytes of a panel's B per k block: stays in L1 while every row tile of the panel passes over it


@dataclass(frozen=True)
class Layout:
    """How B is packed and the GEMM tiled for one kind of target."""

    tile: int  # T: columns per packed tile
    group: int  # G: consecutive k per packed column
    dtype: str  # the packed weights' type
    rows: int  # rows per register tile
    tiles: int  # packed tiles per register tile
    intrin: str | None  # the tensor intrinsic of one step (None: vectorised int32)
    lanes: int  # columns per intrinsic call
    features: tuple[str, ...]  # the LLVM CPU features the intrinsic needs
    sets: int = 1  # S: packed groups of G k summed in int16 before widening (lane layouts)
    # Exact only for lane-bounded weights. Such a packing is always 5-D, [N / T, K / (S G), S, T, G], so that no build
    # takes weights packed for another layout (a VNNI one has the same T, G and type) for lane-bounded ones.
    lane_bounded: bool = False

    @property
    def k_step(self) -> int:
        """k per intrinsic call (and K's padding): S x G."""
        return self.sets * self.group


# 8 rows x 32 columns: 16 zmm accumulators (of 32), as the C++ kernel's AVX-512 VNNI tile
AVX512_VNNI = Layout(16, 4, "int8", 8, 2, "softdeploy_dot_16x4_u8i8i32_avx512vnni", 16, ("avx512vnni", "avx512bw"))
# 6 rows x 16 columns: 12 ymm accumulators (of 16), as the C++ kernel's AVX-VNNI tile
AVX_VNNI = Layout(16, 4, "int8", 6, 1, "softdeploy_dot_8x4_u8i8i32_avxvnni", 8, ("avxvnni",))
# Without VNNI: vpmaddwd on B widened to int16, exact, as many products per op as float32's FMAs (2 per lane)
AVX512_BW = Layout(16, 2, "int16", 8, 2, "softdeploy_madd_16x2_u8i16i32_avx512bw", 16, ("avx512bw",))
AVX2 = Layout(8, 2, "int16", 6, 2, "softdeploy_madd_8x2_u8i16i32_avx2", 8, ("avx2",))
GENERIC = Layout(16, 4, "int8", 8, 1, None, 16, ())
LAYOUTS = (AVX512_VNNI, AVX_VNNI, AVX512_BW, AVX2, GENERIC)  # the target's first supported one is used
# Without VNNI, for lane-bounded weights (softdeploy.ops.rowwise_int8_matmul.lane_groups(B, levels) >= S, what
# `softdeploy quantize --weights lane-bounded` makes): vpmaddubsw of 4 k x T columns, S of them summed in int16 (exact
# under the bound: no pair and no int16 sum can saturate), then one vpmaddwd into int32 -- the C++ kernel's AVX2 tile.
LANE_LAYOUTS = {
    base: {
        sets: Layout(
            lanes,
            4,
            "int8",
            base.rows,
            2,
            f"softdeploy_maddubs_{lanes}x4x{sets}_{isa}",
            lanes,
            base.features,
            sets,
            True,
        )
        for sets in (4, 2, 1)
    }
    for base, lanes, isa in ((AVX512_BW, 16, "avx512bw"), (AVX2, 8, "avx2"))
}


def target_layout() -> Layout:
    """The layout for the current TVM target (GENERIC outside a target context or off x86)."""
    return next(layout for layout in LAYOUTS if target_has(layout.features))


def _padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def rows_padded(m: int, layout: Layout) -> int:
    """The GEMM's rows: ``m`` padded to whole register tiles (one tile when ``m`` is at most one)."""
    return m if m <= layout.rows else _padded(m, layout.rows)


def packed_shape(k: int, n: int, layout: Layout) -> tuple[int, ...]:
    """[N / T, K / G, T, G], or [N / T, K / (S G), S, T, G] for a lane layout (K, N padded to whole steps and tiles)."""
    t, g, sets = layout.tile, layout.group, layout.sets
    tiles, steps = _padded(n, t) // t, _padded(k, layout.k_step) // layout.k_step
    return (tiles, steps, sets, t, g) if layout.lane_bounded else (tiles, steps, t, g)


def packed_index(c: Any, kk: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """Where B[kk, c] lies in a packed B of ``shape`` (:func:`packed_shape`)."""
    t, g = shape[-2], shape[-1]
    if len(shape) == 4:
        return (c // t, kk // g, c % t, kk % g)
    step = shape[2] * g
    return (c // t, kk // step, kk % step // g, c % t, kk % g)


def pack_weights(b: np.ndarray, layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """(B packed in the layout's shape (:func:`packed_shape`) and type, zero-padded; the int32 column sums
    ``sum_k B[k, n]``) -- what the GEMM reads, made once for a weight initializer."""
    k, n = b.shape
    shape = packed_shape(k, n, layout)
    t, g, sets = layout.tile, layout.group, layout.sets
    full = np.zeros((shape[1] * layout.k_step, shape[0] * t), layout.dtype)
    full[:k, :n] = b
    # full[step, set, k in group, tile, column in tile] -> [tile, step, (set,) column, k]
    packed = full.reshape(shape[1], sets, g, shape[0], t).transpose(3, 0, 1, 4, 2).reshape(shape)
    return np.ascontiguousarray(packed), b.astype(np.int32).sum(axis=0, dtype=np.int32)


def round_half_even(x: Any) -> Any:
    """x rounded to the nearest integer, ties to even, for float32 |x| <= 2^22: floor(x + 0.5) (x + 0.5 is exact
    there), one less where that rounded a tie up to an odd integer. TVM's ``nearbyint`` gives the same values but is not
    vectorised (its loop came out as scalar byte stores and gathers: 190 us for 128 x 1536 on Zen 4, 11 us with this).

    x is clamped to +-2^22 first (a no-op for the values rounded here, |x| <= levels + 1), and that is what keeps the
    rounding exact: TVM compiles with LLVM's FP contraction on, which fuses ``a * inv + 0.5`` into one FMA -- the
    product no longer rounded to float32 before it is rounded to an integer, so that products just below a half
    (in float64) rounded the other way (special_rows: 57 of 152 outputs off). Nothing fuses through the clamp."""
    x = tirx.min(tirx.max(x, f32(-(2.0**22))), f32(2.0**22))
    r = tirx.floor(x + f32(0.5))
    odd_tie = tirx.all(r - x == f32(0.5), tirx.floor(r * f32(0.5)) != r * f32(0.5))
    return tirx.Select(odd_tie, r - f32(1.0), r)


def pack(b: te.Tensor, layout: Layout) -> list[te.Tensor]:
    """:func:`pack_weights` as a TE compute, for a B that is not a constant: [packed, colsum]."""
    k, n = (int(d) for d in b.shape)
    shape = packed_shape(k, n, layout)
    t, g = layout.tile, layout.group

    def packed_at(*i: Any) -> Any:
        no, step, ni, ki = i[0], i[1], i[-2], i[-1]
        kk = step * layout.k_step + (i[2] * g if len(i) == 5 else 0) + ki
        nn = no * t + ni
        value = b[tirx.min(kk, k - 1), tirx.min(nn, n - 1)].astype(layout.dtype)
        return tirx.Select(tirx.all(kk < k, nn < n), value, tirx.const(0, layout.dtype))

    packed = te.compute(shape, packed_at, name="b_packed")
    r = te.reduce_axis((0, k), name="b_k")
    colsum = te.compute((n,), lambda nn: te.sum(b[r, nn].astype("int32"), axis=r), name="b_colsum")
    return [packed, colsum]


def quantize(a: te.Tensor, levels: int, kp: int, mp: int) -> list[te.Tensor]:
    """The rows ``a`` [M, K] quantized: [q [mp, kp] uint8, zero-padded beyond M and K so that the GEMM's tiles are
    whole; params [M, 2] float32: the step s and the zero point z of each row]."""
    m, k = (int(d) for d in a.shape)
    top = f32(float(levels))
    shape = list(a.shape)  # IntImm extents: lane_reduce lane-splits rows of a multiple of 16
    lo = lane_reduce(shape, 1, lambda i: a(*i), te.min, "rowq_min")
    hi = lane_reduce(shape, 1, lambda i: a(*i), te.max, "rowq_max")

    def step(r: Any) -> Any:
        s = (tirx.max(hi[r], f32(0.0)) - tirx.min(lo[r], f32(0.0))) / top
        return tirx.Select(s >= f32(MIN_NORMAL), s, f32(1.0))

    scale = te.compute((m,), step, name="rowq_scale")
    inv = te.compute((m,), lambda r: f32(1.0) / scale[r], name="rowq_inv")

    def clip(x: Any) -> Any:
        return tirx.min(tirx.max(x, f32(0.0)), top)

    zero = te.compute((m,), lambda r: round_half_even(clip(-tirx.min(lo[r], f32(0.0)) / scale[r])), name="rowq_zero")

    def quantized(r: Any, kk: Any) -> Any:
        if mp == m and kp == k:  # no padding: a plain elementwise loop, which vectorises
            return clip(round_half_even(a[r, kk] * inv[r]) + zero[r]).astype("uint8")
        rr, kc = tirx.min(r, m - 1), tirx.min(kk, k - 1)
        q = clip(round_half_even(a[rr, kc] * inv[rr]) + zero[rr]).astype("uint8")
        return tirx.Select(tirx.all(r < m, kk < k), q, tirx.const(0, "uint8"))

    q = te.compute((mp, kp), quantized, name="rowq_q")
    params = te.compute((m, 2), lambda r, j: tirx.Select(j == 0, scale[r], zero[r]), name="rowq_params")
    return [q, params]


def _activate(y: Any, r: Any, c: Any, residual: te.Tensor | None, gelu: bool) -> Any:
    """act(y) + Residual[r, c] (a Residual of one element: Residual[0]) in the epilogue's expression; GELU's erf
    form as h + h erf(v / sqrt(2)), the C++ kernel's order (TVM's own erf)."""
    if gelu:
        half = y * f32(0.5)
        y = half + half * tirx.erf(y * f32(0.7071067811865476))
    if residual is not None:
        y = y + (residual[r, c] if len(residual.shape) == 2 else residual[0])
    return y


def gemm(
    q: te.Tensor,
    params: te.Tensor,
    packed: te.Tensor,
    colsum: te.Tensor,
    b_scale: te.Tensor,
    bias: te.Tensor | None,
    residual: te.Tensor | None = None,
    gelu: bool = False,
) -> te.Tensor:
    """Y [M, N] from the quantized rows and B packed (:func:`pack_weights`): the exact int32 sums ``rowq_acc``, then
    the float32 epilogue ``rowq_out`` (with the activation and the residual, ``[M, N]`` or one element, in it: one
    block, which the hand schedule places per column panel)."""
    mp, kp = (int(d) for d in q.shape)
    m, n = int(params.shape[0]), int(b_scale.shape[0])
    shape = tuple(int(d) for d in packed.shape)
    kk = te.reduce_axis((0, kp), name="rowq_k")
    acc = te.compute(
        (mp, shape[0] * shape[-2]),
        lambda r, c: te.sum(q[r, kk].astype("int32") * packed[packed_index(c, kk, shape)].astype("int32"), axis=kk),
        name="rowq_acc",
    )

    def out(r: Any, c: Any) -> Any:
        sums = acc[r, c] - params[r, 1].astype("int32") * colsum[c]
        y = sums.astype("float32") * (params[r, 0] * b_scale[c])
        return _activate(y if bias is None else y + bias[c], r, c, residual, gelu)

    return te.compute((m, n), out, name="rowq_out")


def _empty(
    a: te.Tensor,
    shape: list[int],
    bias: te.Tensor | None,
    residual: te.Tensor | None = None,
    gelu: bool = False,
) -> te.Tensor:
    """Y [M, N] where the product has no terms or no entries: act(Bias) (K = 0) or zeros, + Residual. ``a`` (A, never
    read) is a parameter so that constant folding cannot turn the call into a constant: one of size 0 does not
    survive TVM's executable serialisation ("Invalid DLTensor file format" when the VM loads it)."""
    del a

    def out(r: Any, c: Any) -> Any:
        return _activate(f32(0.0) if bias is None else bias[c], r, c, residual, gelu)

    return te.compute(shape, out, name="rowq_empty")


def schedule(sch: Any) -> bool:
    """The schedules of the module docstring, of the quantization kernel or of the GEMM; False for any other."""
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    if "rowq_q" in names:
        return _schedule_quantize(sch)
    if "b_packed" in names:  # B a graph input: packed per call, column tiles in parallel
        for name in ("b_packed", "b_colsum"):
            sch.parallel(sch.get_loops(sch.get_sblock(name))[0])
        return True
    if {"rowq_acc", "rowq_out"} <= names:
        return _schedule_gemm(sch)
    return False


def _schedule_quantize(sch: Any) -> bool:
    # The row ranges: rows in parallel, the lane-split partial min / max vectorised per row (where K allows). The
    # per-row scalars are loops of their own (the quantized rows and the params read them).
    for name in ("rowq_min", "rowq_max"):
        row = sch.get_loops(sch.get_sblock(name))[0]
        sch.parallel(row)
        try:
            part = sch.get_sblock(f"{name}_part")
        except Exception:  # not lane-split (K not a multiple of 16): a plain row reduction
            continue
        sch.compute_at(part, row)
        lane, k = sch.get_loops(part)[-2:]
        sch.reorder(k, lane)
        sch.vectorize(lane)
        sch.decompose_reduction(part, k)
    rows, cols = sch.get_loops(sch.get_sblock("rowq_q"))
    sch.parallel(rows)
    sch.vectorize(sch.split(cols, [None, 16])[1])
    return True


def _layout_of(sch: Any, block: Any) -> Layout | None:
    """The layout whose packing the GEMM reads (from the packed buffer's shape and type; of two with the same packing,
    the one the target supports), None if none is."""
    packed = [r.source for r in sch.get(block).reads if len(r.source.shape) in (4, 5)]
    if len(packed) != 1:
        return None
    shape = [int(d) for d in packed[0].shape]
    key = (shape[-2], shape[-1], shape[2] if len(shape) == 5 else 1, str(packed[0].dtype), len(shape) == 5)
    every = [*LAYOUTS, *(x for by_sets in LANE_LAYOUTS.values() for x in by_sets.values())]
    # (VNNI and AVX-VNNI share one packing; a lane layout's is 5-D, so never taken for another's)
    matching = [x for x in every if (x.tile, x.group, x.sets, x.dtype, x.lane_bounded) == key]
    return next((x for x in matching if x.intrin and target_has(x.features)), matching[0] if matching else None)


def _schedule_gemm(sch: Any) -> bool:
    acc_block, out_block = sch.get_sblock("rowq_acc"), sch.get_sblock("rowq_out")
    layout = _layout_of(sch, acc_block)
    if layout is None:
        return False
    # the layout's instruction where the target has it (a model imported for another target: vectorised int32)
    intrin, lanes = (layout.intrin, layout.lanes) if target_has(layout.features) else (None, layout.tile)
    m_loop, c_loop, k_loop = sch.get_loops(acc_block)
    mp, columns = int(sch.get(m_loop).extent), int(sch.get(c_loop).extent)
    tiles = layout.tiles if columns % (layout.tiles * layout.tile) == 0 else 1
    mo, mi = sch.split(m_loop, [None, min(layout.rows, mp)])  # whole tiles: q's rows are padded (rows_padded)
    co, ct, ci = sch.split(c_loop, [None, tiles * layout.tile // lanes, lanes])
    steps = int(sch.get(k_loop).extent) // layout.k_step
    bytes_per_step = tiles * layout.tile * layout.k_step * np.dtype(layout.dtype).itemsize
    kc = max(d for d in range(1, min(steps, max(1, KC_BYTES // bytes_per_step)) + 1) if steps % d == 0)
    kb, ko, ki = sch.split(k_loop, [None, kc, layout.k_step])
    sch.reorder(co, kb, mo, ko, mi, ct, ci, ki)
    # the panel's sums (mp x tiles * T int32) in a buffer of their own: tensor intrinsics take global buffers
    panel = sch.cache_write(acc_block, 0, "global")
    sch.reverse_compute_at(panel, co)
    sch.reverse_compute_at(out_block, co)
    sch.parallel(co)
    if intrin is None:  # columns as int32 vector lanes (vectorised before the init is hoisted: see matmul.py)
        sch.reorder(ki, ci)
        sch.vectorize(ci)
    sch.decompose_reduction(acc_block, kb)
    sch.vectorize(sch.get_loops(sch.get_sblock("rowq_acc_init"))[-1])
    sch.vectorize(sch.get_loops(panel)[-1])
    if intrin is not None:
        _register_intrinsics()
        sch.tensorize(ci, intrin)
    sch.unroll(mi)
    sch.unroll(ct)
    return True


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Relax converter: the op's own rule checks on the static shapes, A flattened to rows, B packed once for the
    current target when it is a constant, then the quantization and GEMM kernels (for empty dimensions one fill:
    zeros, or Bias when K = 0), the activation and the residual add in the GEMM's epilogue."""
    from tvm import relax
    from tvm.ir.expr import Constant

    a, b, b_scale = inputs[:3]
    bias = inputs[3] if len(inputs) > 3 else None
    residual = inputs[4] if len(inputs) > 4 else None
    levels = int(attrs["levels"])
    activation = str(attrs.get("activation", "none"))
    op.validate(
        *(shape_proxy(x) for x in (a, b, b_scale, bias)),
        levels,
        residual=None if residual is None else shape_proxy(residual),
        activation=activation,
        values=False,
    )
    if str(a.ty.dtype) != "float32":
        raise OpContractError(f"{op.NAME}: A must be float32, got {a.ty.dtype}")
    lead = [int(d) for d in a.ty.shape][:-1]
    k, n = (int(d) for d in b.ty.shape)
    m = math.prod(lead)
    flat = len(lead) == 1  # already [M, K] and [M, N]: no reshapes
    if m == 0 or n == 0:  # no entries: nothing to activate or add to
        y = bb.emit_te(_empty, a, [m, n], None, primfunc_name_hint="rowwise_int8_matmul")
        return y if flat else bb.emit(relax.op.reshape(y, relax.ShapeExpr([*lead, n])))
    residual = _residual_rows(bb, residual, m, n)
    gelu = activation == "gelu"
    if k == 0:
        y = bb.emit_te(_empty, a, [m, n], bias, residual, gelu, primfunc_name_hint="rowwise_int8_matmul")
        return y if flat else bb.emit(relax.op.reshape(y, relax.ShapeExpr([*lead, n])))
    weights = b.value.numpy() if isinstance(b, Constant) else None  # an initializer: packed once, here
    layout = target_layout()
    if weights is not None and layout in LANE_LAYOUTS:  # lane-bounded weights: vpmaddubsw sums, see LANE_LAYOUTS
        layout = LANE_LAYOUTS[layout].get(op.lane_groups(weights, levels), layout)
    rows = a if flat else bb.emit(relax.op.reshape(a, relax.ShapeExpr([m, k])))
    if weights is not None:
        packed_np, sums = pack_weights(weights, layout)
        packed, colsum = relax.const(packed_np, layout.dtype), relax.const(sums, "int32")
    else:
        pair = bb.emit_te(functools.partial(pack, layout=layout), b, primfunc_name_hint="rowwise_int8_matmul_pack")
        packed, colsum = bb.emit(relax.TupleGetItem(pair, 0)), bb.emit(relax.TupleGetItem(pair, 1))
    kp, mp = _padded(k, layout.k_step), rows_padded(m, layout)
    quantized = bb.emit_te(quantize, rows, levels, kp, mp, primfunc_name_hint="rowwise_int8_matmul_quantize")
    q, params = bb.emit(relax.TupleGetItem(quantized, 0)), bb.emit(relax.TupleGetItem(quantized, 1))
    y = bb.emit_te(
        gemm, q, params, packed, colsum, b_scale, bias, residual, gelu, primfunc_name_hint="rowwise_int8_matmul"
    )
    return y if flat else bb.emit(relax.op.reshape(y, relax.ShapeExpr([*lead, n])))


def _residual_rows(bb: Any, residual: Any, m: int, n: int) -> Any:
    """The Residual as the epilogue reads it: None when omitted or the omitted input's fill (one -0.0, which adds
    nothing), ``[1]`` when it is one element, else ``[M, N]``."""
    from tvm import relax
    from tvm.ir.expr import Constant

    if residual is None:
        return None
    shape = [int(d) for d in residual.ty.shape]
    if math.prod(shape) == 1:
        if isinstance(residual, Constant):
            value = residual.value.numpy().reshape(-1)[0]
            if value == 0 and np.signbit(value):
                return None
        return bb.emit(relax.op.reshape(residual, relax.ShapeExpr([1])))
    return residual if len(shape) == 2 else bb.emit(relax.op.reshape(residual, relax.ShapeExpr([m, n])))


@functools.cache
def _register_intrinsics() -> None:
    """Registers the tensor intrinsics of LAYOUTS and LANE_LAYOUTS (C[i] += sum_k int32(A[k]) * int32(B[i, k]) over one
    packed step), once per process, when a GEMM is first tensorized: parsing their TVMScript took 2.5 s, which every
    import of softdeploy.tvm.ops paid, fp32 models included."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    def make(lanes: int, group: int, sets: int, b_dtype: str, body: Any) -> tuple[Any, Any]:
        # one packed step of S sets of G k (S = 1 but for lane layouts): C[i] += sum_k A[k] * B[k / G, i, k % G]
        @T.prim_func(s_tir=True)
        def desc(
            A: T.Buffer((sets * group,), "uint8", offset_factor=1),
            B: T.Buffer((sets, lanes, group), b_dtype, offset_factor=1),
            C: T.Buffer((lanes,), "int32", offset_factor=1),
        ) -> None:
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0 : sets * group], B[0:sets, 0:lanes, 0:group])
                T.writes(C[0:lanes])
                for i in T.serial(0, lanes):
                    for k in T.serial(0, sets * group):
                        with T.sblock("update"):
                            vi, vk = T.axis.remap("SR", [i, k])
                            C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vk // group, vi, vk % group], "int32")

        @T.prim_func(s_tir=True)
        def impl(
            A: T.Buffer((sets * group,), "uint8", offset_factor=1),
            B: T.Buffer((sets, lanes, group), b_dtype, offset_factor=1),
            C: T.Buffer((lanes,), "int32", offset_factor=1),
        ) -> None:
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0 : sets * group], B[0:sets, 0:lanes, 0:group])
                T.writes(C[0:lanes])
                C[T.ramp(T.int32(0), 1, lanes)] = body(A, B, C)

        return desc, impl

    def vpmaddubsw(lanes: int, sets: int, isa: str) -> Any:
        # per set: each int16 lane = a[2p] B[i, 2p] + a[2p + 1] B[i, 2p + 1] (unsigned x signed); the S results added
        # in int16, then vpmaddwd by ones adds each column's two lanes into int32. Exact only for lane-bounded B.
        ubsw, wd = {
            "avx2": ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
            "avx512bw": ("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
        }[isa]

        def body(A: Any, B: Any, C: Any) -> Any:
            pairs = None
            for s in range(sets):
                four = T.reinterpret(A.vload([4 * s], "uint8x4"), dtype="int32")
                b = B.vload([s, 0, 0], dtype=f"int8x{lanes * 4}")
                p = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(ubsw),
                    T.reinterpret(T.broadcast(four, lanes), dtype=f"int8x{lanes * 4}"),
                    b,
                    dtype=f"int16x{lanes * 2}",
                )
                pairs = p if pairs is None else pairs + p
            return C.vload([0], dtype=f"int32x{lanes}") + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(wd), pairs, T.broadcast(T.int16(1), lanes * 2), dtype=f"int32x{lanes}"
            )

        return body

    def vpdpbusd(lanes: int, llvm_name: str) -> Any:
        # C += per lane the dot product of the 4 bytes of A (unsigned) with the lane's 4 bytes of B (signed)
        def body(A: Any, B: Any, C: Any) -> Any:
            four = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
            return T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(llvm_name),
                C.vload([0], dtype=f"int32x{lanes}"),
                T.reinterpret(T.broadcast(four, lanes), dtype=f"int8x{lanes * 4}"),
                B.vload([0, 0, 0], dtype=f"int8x{lanes * 4}"),
                dtype=f"int32x{lanes}",
            )

        return body

    def vpmaddwd(lanes: int, llvm_name: str) -> Any:
        # C += per lane a0 * B[i, 0] + a1 * B[i, 1]: A's two bytes widened to int16, one int32 broadcast to every lane
        def body(A: Any, B: Any, C: Any) -> Any:
            two = T.reinterpret(T.Cast("int16x2", A.vload([0], "uint8x2")), dtype="int32")
            return C.vload([0], dtype=f"int32x{lanes}") + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(llvm_name),
                B.vload([0, 0, 0], dtype=f"int16x{lanes * 2}"),
                T.reinterpret(T.broadcast(two, lanes), dtype=f"int16x{lanes * 2}"),
                dtype=f"int32x{lanes}",
            )

        return body

    # vpdpbusd.256 is VEX-encoded on AVX-VNNI targets (EVEX where AVX-512 VNNI + VL is present)
    bodies = {
        AVX512_VNNI.intrin: make(16, 4, 1, "int8", vpdpbusd(16, "llvm.x86.avx512.vpdpbusd.512")),
        AVX_VNNI.intrin: make(8, 4, 1, "int8", vpdpbusd(8, "llvm.x86.avx512.vpdpbusd.256")),
        AVX512_BW.intrin: make(16, 2, 1, "int16", vpmaddwd(16, "llvm.x86.avx512.pmaddw.d.512")),
        AVX2.intrin: make(8, 2, 1, "int16", vpmaddwd(8, "llvm.x86.avx2.pmadd.wd")),
    }
    for by_sets, isa in ((LANE_LAYOUTS[AVX512_BW], "avx512bw"), (LANE_LAYOUTS[AVX2], "avx2")):
        for sets, layout in by_sets.items():
            bodies[layout.intrin] = make(layout.lanes, 4, sets, "int8", vpmaddubsw(layout.lanes, sets, isa))
    for name, (desc, impl) in bodies.items():
        TensorIntrin.register(name, desc, impl)
