"""The hand schedule of Relax's legalised ``matmul`` kernels (a model's Linear / MatMul layers, with the
bias and residual adds that fusion put after them): a register-tiled GEMM.

    C[..., i, j] = sum_k A[..., i, k] * B[..., k, j]          (block "matmul", then elementwise epilogues)

Per output tile of MR x NR (6 rows x 16 columns: 12 ymm accumulators on AVX2, 6 zmm on AVX-512) the
k loop runs innermost over the whole reduction with the tile in registers (a "local" cache of C,
written back once through the epilogue, which is inlined into that write-back): per k, 6 broadcasts
of A and NR / lanes loads of one row of B, 2 x 6 x 16 flops. This is the shape of MLAS's and
BLIS's AVX2 micro-kernels (6 x 16); the column blocks run in parallel, rows inside them so that a
column panel of B (K x 16 floats, one 64-byte line per k) is reused from L1/L2 by every row tile.

Measured against the shipped MetaSchedule records (AMD Zen 4, TVM's time_evaluator, the record's and
this schedule's kernel alternating 5 times in one process, all-MiniLM-L6-v2 at batch 1, seq 128,
microseconds; bench/results/tvm_minilm.md):

| kernel | -mcpu=znver3 (AVX2) 1 thread | 2 threads | -mcpu=znver4 (AVX-512) 1 thread |
|---|---|---|---|
| 128x384 @ 384x1536 + bias | 2120 -> 1695 | 1345 -> 1063 | 1403 -> 2222 |
| 128x1536 @ 1536x384 + bias | 1923 -> 1955 | 1050 -> 1063 | 1721 -> 2318 |
| 128x384 @ 384x384 + bias | 464 -> 354 | 264 -> 236 | 390 -> 459 |
| the same + residual | 559 -> 422 | 393 -> 230 | 482 -> 462 |
| attention 12x128x128 @ 12x128x32 | 147 -> 122 | 92 -> 72 | 109 -> 118 |
| attention 12x128x32 @ 12x32x128 + mask | 277 -> 157 | 264 -> 87 | 165 -> 141 |

So the avx2 records of these six kernels were dropped (the rule schedules them), and the avx512 ones,
faster there (6 zmm accumulators use half of AVX-512's registers), are kept: a tuning record always wins
over a hand rule. Where no record matches -- a user's own model, an untuned CPU class -- the rule
replaces dlight's CPU default, which ran the 384 -> 1536 projection in 173 ms (80x).

Rows that are not a multiple of MR leave a last, partial tile (a predicated block); the k loop is
never split, so every C element sums its k in order, as the unscheduled kernel does (results equal
bit for bit).
"""

from __future__ import annotations

from typing import Any

MR = 6  # rows per register tile
NR = 16  # columns per register tile (2 ymm / 1 zmm)
VECTOR = 8  # the vectorised width inside a tile (LLVM joins two into a zmm on AVX-512)


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
    if n % NR != 0 or m < 2:
        return False
    root = sch.get_sblock("root")
    others = [b for b in sch.get_child_blocks(root) if sch.get(b).name_hint != "matmul"]
    if any(int(v.iter_type) != 0 for b in others for v in sch.get(b).iter_vars):
        return False  # a second reduction (layer norm after the projection): not ours

    rows = min(MR, m)
    io, ii = sch.split(i, [None, rows])
    jo, ji = sch.split(j, [None, NR])
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
    vo, vi = sch.split(sch.get_loops(block)[-1], [None, VECTOR])
    sch.vectorize(vi)
    sch.unroll(vo)
    sch.unroll(sch.get_loops(block)[-3])
    sch.decompose_reduction(block, sch.get_loops(block)[-4])
    init = sch.get_sblock("matmul_init")
    sch.vectorize(sch.split(sch.get_loops(init)[-1], [None, VECTOR])[1])
    sch.vectorize(sch.split(sch.get_loops(acc)[-1], [None, VECTOR])[1])
    return True
