"""The hand schedule of kernels without a reduction (layout changes, gathers, elementwise chains: a transformer's
head split ``reshape -> transpose -> multiply``, an embedding ``take``): the last loop vectorised, the others fused
and run in parallel.

dlight's CPU rules (GEMV, Reduction) take none of these, so without a tuning record they ran TVM's default loop nest,
one scalar element at a time on one thread. The rule is last in ``SCHEDULES``: every op rule and the MatMul rule
come first, and a tuning record wins over any of them.
"""

from __future__ import annotations

from typing import Any

from softdeploy.tvm.ops._te import LANES  # (LLVM splits the 16-lane vectors for AVX2 targets)


def schedule(sch: Any) -> bool:
    """Schedules a kernel whose blocks are all spatial; False for any other."""
    from tvm import tirx

    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    if not blocks or any(int(v.iter_type) != 0 for b in blocks for v in sch.get(b).iter_vars):
        return False  # a reduction: dlight's rules or ours
    for block in blocks[:-1]:  # producers into their consumers (the output block stays)
        try:
            sch.compute_inline(block)
        except Exception:  # a block that cannot be inlined (read at two points): not this rule's kernel
            return False
    if len(sch.get_child_blocks(root)) != 1:
        return False
    block = sch.get_child_blocks(root)[0]
    loops = sch.get_loops(block)
    extents = [sch.get(loop).extent for loop in loops]
    if not loops or not all(isinstance(e, tirx.IntImm) for e in extents):
        return False
    inner = int(extents[-1])
    if inner >= LANES and inner % LANES == 0:
        *outer, last = loops
        vo, vi = sch.split(last, [None, LANES])
        sch.vectorize(vi)
        outer.append(vo)
    else:
        outer = loops[:-1]  # a short or odd innermost row: left to LLVM
    if outer:  # (a small kernel's parallel loop is made serial at build: softdeploy.tvm.build.PARALLEL_MIN_ELEMENTS)
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    return True
