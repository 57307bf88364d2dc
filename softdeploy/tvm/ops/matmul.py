"""The hand schedule of Relax's legalised ``matmul`` kernels (a model's Linear / MatMul layers, with the
bias and residual adds that fusion put after them): a register-tiled GEMM.

    C[..., i, j] = sum_k A[..., i, k] * B[..., k, j]          (block "matmul", then elementwise epilogues)

Per output tile of MR x NR the k loop runs innermost over the whole reduction with the tile in registers (a
"local" cache of C, written back once through the epilogue, which is inlined into that write-back): per k, MR
broadcasts of A and NR / lanes loads of one row of B, 2 x MR x NR flops. The tile is the target's (tile_for):
6 x 16 on AVX2 (12 ymm accumulators: MLAS's and BLIS's AVX2 micro-kernel shape), 8 x 32 on AVX-512 (16 zmm of
its 32 registers). The column blocks run in parallel, rows inside them, so that a column panel of B (K x NR
floats) is reused from L1/L2 by every row tile.

Measured against the shipped MetaSchedule records (AMD Zen 4, TVM's time_evaluator, the record's and
this schedule's kernel alternating 5 times in one process, all-MiniLM-L6-v2 at batch 1, seq 128,
microseconds; bench/results/tvm_minilm.md):

| kernel | -mcpu=znver3 (AVX2) 1 thread | 2 threads | -mcpu=znver4 (AVX-512, then the 6 x 16 tile) 1 thread |
|---|---|---|---|
| 128x384 @ 384x1536 + bias | 2120 -> 1695 | 1345 -> 1063 | 1403 -> 2222 |
| 128x1536 @ 1536x384 + bias | 1923 -> 1955 | 1050 -> 1063 | 1721 -> 2318 |
| 128x384 @ 384x384 + bias | 464 -> 354 | 264 -> 236 | 390 -> 459 |
| the same + residual | 559 -> 422 | 393 -> 230 | 482 -> 462 |
| attention 12x128x128 @ 12x128x32 | 147 -> 122 | 92 -> 72 | 109 -> 118 |
| attention 12x128x32 @ 12x32x128 + mask | 277 -> 157 | 264 -> 87 | 165 -> 141 |

So the avx2 records of these six kernels were dropped (the rule schedules them), and the avx512 ones,
faster there than the 6 x 16 tile (6 zmm accumulators used a fifth of AVX-512's registers), are kept: a tuning
record always wins over a hand rule. AVX-512 targets now get an 8 x 32 tile (AVX512_TILE below: 1.1-1.3x the
6 x 16 one on the three projections; bench/tvm_matmul_tiles.py). Where no record matches -- a user's own model, an untuned CPU class -- the rule
replaces dlight's CPU default, which ran the 384 -> 1536 projection in 173 ms (80x).

Rows that are not a multiple of MR leave a last, partial tile (a predicated block); the k loop is
never split, so every C element sums its k in order, as the unscheduled kernel does (results equal
bit for bit).
"""

from __future__ import annotations

from typing import Any

# (rows MR, columns NR, vector width) of the register tile, by the target's ISA (tile_for):
AVX2_TILE = (6, 16, 8)  # 12 ymm accumulators of 16
AVX512_TILE = (8, 32, 16)  # 16 zmm accumulators of 32
AVX512_NARROW_TILE = (14, 16, 16)  # 14 zmm, for n not a multiple of 32
# AVX-512 tiles, measured on AMD Zen 4 (-mcpu=znver4, 1 thread, y = x @ w + b, 7 alternating rounds of 20 calls,
# microseconds; bench/tvm_matmul_tiles.py, bench/results/tvm_minilm.md): 128x384 @ 384x1536, 128x1536 @ 1536x384,
# 128x384 @ 384x384: 6 x 16 x 8 (the AVX2 tile, two ymm joined) 2046-2126 / 1995-2092 / 383-424; 8 x 32
# 1691-1889 / 1538-1616 / 353-363; 14 x 16 1631-1640 / 1580-1626 / 357-368; 6 x 48 and 4 x 64 within those;
# 12 x 32 (24 accumulators: spilled) 2024 / 2085 / 427. 8 x 32 reaches 89-107 GFLOP/s of the core's ~118.


def tile_for(n: int) -> tuple[int, int, int]:
    """(MR, NR, VECTOR) for a kernel of ``n`` output columns under the current TVM target: the AVX-512 tiles where
    LLVM says the target has AVX-512F, else AVX2's (also the answer outside a target context)."""
    from softdeploy.tvm.target import target_has

    if target_has(("avx512f",)):  # (off x86: the AVX2 tile, which any vector ISA lowers)
        return AVX512_TILE if n % AVX512_TILE[1] == 0 else AVX512_NARROW_TILE
    return AVX2_TILE


def _matmul_loops(sch: Any, block: Any) -> tuple[list[Any], Any, Any, Any] | None:
    """(batch loops, i, j, k) of a matmul block in its legalised form: spatial loops then ONE reduction
    loop innermost, C indexed by the spatial loops; None for any other kernel."""
    sblock = sch.get(block)
    iters = list(sblock.iter_vars)
    kinds = [int(v.iter_type) for v in iters]  # 0: data parallel, 2: reduction
    if len(iters) < 3 or kinds[-1] != 2 or any(k != 0 for k in kinds[:-1]):
        return None
    if len(sblock.writes) != 1 or len(sblock.reads) != 2 or sblock.init is None:
        return None
    loops = sch.get_loops(block)
    if len(loops) != len(iters):
        return None
    return list(loops[:-3]), loops[-3], loops[-2], loops[-1]


def _static_extent(sch: Any, loop: Any) -> int | None:
    from tvm import tirx

    extent = sch.get(loop).extent
    return int(extent) if isinstance(extent, tirx.IntImm) else None


def schedule(sch: Any) -> bool:
    """Tiles the kernel's ``matmul`` block as the module docstring says; False when the kernel has no such
    block, its shapes are dynamic or too small to tile, or it holds a block that is not an elementwise
    epilogue of C (then ``sch`` may be partly transformed: callers give each rule a fresh schedule)."""
    try:
        block = sch.get_sblock("matmul")
    except Exception:  # not a matmul kernel
        return False
    found = _matmul_loops(sch, block)
    if found is None:
        return False
    batch, i, j, k = found
    extents = [_static_extent(sch, loop) for loop in (*batch, i, j, k)]
    if None in extents:
        return False
    m, n = extents[-3], extents[-2]
    mr, nr, vector = tile_for(n)
    if n % nr != 0 or m < 2:
        return False
    root = sch.get_sblock("root")
    others = [b for b in sch.get_child_blocks(root) if sch.get(b).name_hint != "matmul"]
    if any(int(v.iter_type) != 0 for b in others for v in sch.get(b).iter_vars):
        return False  # a second reduction (layer norm after the projection): not ours

    io, ii = sch.split(i, [None, min(mr, m)])
    jo, ji = sch.split(j, [None, nr])
    sch.reorder(*batch, jo, io, k, ii, ji)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, io)
    for epilogue in others:  # bias, residual: computed as each tile is written back
        try:
            sch.reverse_compute_inline(epilogue)
        except Exception:  # an epilogue that is not elementwise on C (a layout change): not this rule's kernel
            return False  # (try_schedules gives every rule a fresh schedule, so the steps above are dropped)
    # column panels in parallel (before the init is hoisted: parallel, like vectorize, wants whole blocks)
    sch.parallel(sch.fuse(*batch, jo) if batch else jo)
    # the tile: vector columns, unrolled rows and vectors (vectorise before the init is hoisted out of k:
    # in the other order vectorize refuses a block that is no longer a complete reduction)
    vo, vi = sch.split(sch.get_loops(block)[-1], [None, vector])
    sch.vectorize(vi)
    sch.unroll(vo)
    sch.unroll(sch.get_loops(block)[-3])
    sch.decompose_reduction(block, sch.get_loops(block)[-4])
    init = sch.get_sblock("matmul_init")
    sch.vectorize(sch.split(sch.get_loops(init)[-1], [None, vector])[1])
    sch.vectorize(sch.split(sch.get_loops(acc)[-1], [None, vector])[1])
    return True
