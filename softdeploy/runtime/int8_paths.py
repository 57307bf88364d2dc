"""Which kernel path a quantized model's int8 nodes take on this CPU, and the one-line warning when it is a slower
one than on the CPU class the model was quantized for.

Runtime knowledge: it reads the kernel library's selected variant and VNNI (``softdeploy.runtime.library_status``)
and the model's own records (:data:`TARGET_KEY`, :data:`FORMAT_KEY`, written by :mod:`softdeploy.quant`). A session
warns with :func:`mismatch_line` when it loads such a model; ``softdeploy doctor MODEL`` lists the paths.
"""

from __future__ import annotations

from typing import Any

# The model's metadata_props keys that record what it was quantized for, and in which weight format.
TARGET_KEY = "softdeploy.int8_target"
FORMAT_KEY = "softdeploy.int8_format"


def model_int8_metadata(model: Any) -> dict[str, str]:
    """The target and format a quantized model records (:data:`TARGET_KEY`, :data:`FORMAT_KEY`; absent keys left
    out), from a ModelProto."""
    return {p.key: p.value for p in model.metadata_props if p.key in (TARGET_KEY, FORMAT_KEY)}


# How reports name RowwiseInt8MatMul's kernel paths (ops/rowwise_int8_matmul.cc), fastest first.
PATH_VNNI_ZMM = "vpdpbusd zmm tile (AVX-512 VNNI)"
PATH_VNNI_YMM = "vpdpbusd ymm tile (AVX-VNNI)"
PATH_LANE = "vpmaddubsw tile, {g} products summed in int16 per lane"
PATH_WIDE = "widened vpmaddwd tile (weights outside the lane bound; ~0.6x the lane-bounded tile)"
PATH_SCALAR = "scalar portable loop (no AVX2)"
PATH_BODY = "its function body in stock onnxruntime (softdeploy's kernel library does not load)"


def rowwise_path(groups: int, info: Any = None) -> str:
    """The kernel path a RowwiseInt8MatMul whose weights allow ``groups`` (rowwise.weight_groups: 4, 2, 1, 0) runs
    on this CPU under the kernel library's selected variant (``info``: the library's, default this process's)."""
    if info is None:
        from softdeploy.runtime.library import library_status

        info = library_status().info
    if info is None:
        return PATH_BODY
    isa = info.isa_selected
    if isa == "avx512" and info.avx512_vnni:
        return PATH_VNNI_ZMM
    if isa == "avx2" and info.avx_vnni:
        return PATH_VNNI_YMM
    if isa not in ("avx512", "avx2"):
        return PATH_SCALAR
    return PATH_LANE.format(g=2 * groups) if groups else PATH_WIDE


def slow_rowwise_nodes(model: Any, info: Any = None) -> list[str]:
    """RowwiseInt8MatMul nodes of ``model`` (a ModelProto) that take the widened tile on this CPU: weights outside
    the lane bound under a vpmaddubsw variant (AVX2 without AVX-VNNI, AVX-512 without VNNI). Looks at the weights
    only on such a CPU, so a VNNI CPU pays nothing."""
    if not any(n.op_type == "RowwiseInt8MatMul" for n in model.graph.node):
        return []
    if info is None:
        from softdeploy.runtime.library import library_status

        info = library_status().info
    if info is None or rowwise_path(4, info) != PATH_LANE.format(g=8):
        return []  # VNNI tiles, the scalar loop or the function body: no widened tile here
    if model_int8_metadata(model).get(FORMAT_KEY) == "lane-bounded":
        return []  # written inside the bound by quantize(): no scan at every session
    import numpy as np
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if node.op_type != "RowwiseInt8MatMul" or node.input[1] not in inits:
            continue
        levels = next((a.i for a in node.attribute if a.name == "levels"), 255)
        # lane_groups(q, levels) == 0 (the widened tile) exactly when single pairs already break the bound: the
        # same test as softdeploy.ops.rowwise_int8_matmul.lane_set_sums(q, 1), in int16 (|pair| <= 254) -- a
        # session pays milliseconds, not the seconds of every group size in int64
        w = numpy_helper.to_array(inits[node.input[1]])
        if w.ndim != 2 or not w.size:
            continue
        # 64 rows at a time: plain 8-bit weights break the bound in the first block, so the scan stops there
        for start in range(0, w.shape[0], 64):
            q = np.asarray(w[start : start + 64], np.int16)
            if q.shape[0] % 2:
                q = np.concatenate([q, np.zeros((1, q.shape[1]), np.int16)])
            a, b = q[0::2], q[1::2]
            pos = np.maximum(a, 0) + np.maximum(b, 0)
            neg = np.maximum(-a, 0) + np.maximum(-b, 0)
            if int(max(pos.max(), neg.max())) * levels > 32767:
                out.append(node.name or node.output[0])
                break
    return out


def mismatch_line(model: Any, name: str = "the model", info: Any = None) -> str | None:
    """One line when ``model``'s int8 format runs a slower path on this CPU than on its target's class, with what to
    do; None when it does not (or has no RowwiseInt8MatMul whose weights leave the lane bound)."""
    if info is None:
        from softdeploy.runtime.library import library_status

        info = library_status().info
    slow = slow_rowwise_nodes(model, info)
    if not slow:
        return None
    # the kernels' selected variant, which SOFTDEPLOY_ISA or SOFTDEPLOY_TEST_CPU may have lowered below the CPU's
    here = f"the kernels' {info.isa_selected} variant runs without a VNNI tile here"
    if getattr(info, "isa_requested", None):
        here += f" (SOFTDEPLOY_ISA={info.isa_requested})"
    elif getattr(info, "isa_cpu_limit", None):
        here += f" (SOFTDEPLOY_TEST_CPU={info.isa_cpu_limit})"
    meta = model_int8_metadata(model)
    written = (
        f"quantized for target {meta[TARGET_KEY]} ({meta.get(FORMAT_KEY, 'format unrecorded')})"
        if TARGET_KEY in meta
        else "with no int8 target recorded"
    )
    return (
        f"{name}: {len(slow)} RowwiseInt8MatMul node(s) (e.g. {slow[0]!r}) have weights outside the vpmaddubsw lane "
        f"bound, {written}; {here}, so they run the {PATH_WIDE}: re-quantize with "
        "`softdeploy quantize --target portable` (or `--target avx2`) for this CPU's fast path"
    )
