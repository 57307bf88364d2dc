"""Pair-bounded int8 weights: 8-bit weights that cannot saturate onnxruntime's vpmaddubsw kernels.

Without VNNI, MLAS multiplies uint8 activations ``a`` by int8 weights ``b`` with ``vpmaddubsw``, which adds each
pair of products along the reduction axis, ``a[2j] b[2j] + a[2j+1] b[2j+1]``, into a saturated int16
(``MultiplyAccumulateRowU8S8Avx2`` in onnxruntime/core/mlas/lib/amd64/QgemmU8X8KernelAvx2.asm; the packed B
holds 4 consecutive k of a column, so the pairs are the even-aligned ones, k = 2j and 2j + 1). With ``0 <= a <=
255`` the pair is bounded by ``255 (|b1| + |b2|)`` when ``b1`` and ``b2`` have the same sign and by ``255
max(|b1|, |b2|)`` otherwise. So a weight column cannot saturate, for ANY activations, iff every even-aligned
same-sign pair has ``|b1| + |b2| <= 128`` (255 x 128 = 32640 <= 32767) -- and then the int16 sums are exact and
the result is the integer sum a VNNI core computes with ``vpdpbusd``.

onnxruntime's answer is ``reduce_range``: |b| <= 64 for every weight, i.e. 7-bit weights, twice the step of 8-bit
ones. Pair-bounded weights keep the 8-bit grid and enforce only the pair rule: per output channel

    s = max(max_k |w_k|, max over even-aligned same-sign pairs |w_2j| + |w_2j+1|) / 127,
    q = round(w / s)  (|q| <= 127, and |q_2j| + |q_2j+1| <= 127 + 2 x 0.5 = 128 for a same-sign pair),

a step between the 8-bit one (``max |w| / 127``) and the 7-bit one (``max |w| / 64``): the largest weight of a
column rarely sits beside another large weight of its sign, so on all-MiniLM-L6-v2 the step is ~1.3x the 8-bit
one instead of 2x (bench/results/minilm_int8_options.md).

:func:`bound_weight_pairs` rewrites the int8 weights (and their scales) of an onnxruntime-quantized model --
``MatMulInteger`` weights (dynamic, QOperator) and ``DequantizeLinear`` weights feeding a ``MatMul`` (static, QDQ)
-- from the float weights of the model that was quantized; :func:`pair_bounded_int8` is the rule on one matrix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# 255 (uint8 activation) x 128 = 32640 <= 32767: the largest same-sign pair sum |q_2j| + |q_2j+1| that cannot
# saturate vpmaddubsw's int16.
PAIR_LIMIT = 128


def pair_bounded_int8(w: np.ndarray, *, per_column: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(q int8 [K, N], scale float32 [N], or [] per tensor)``: symmetric int8 weights of ``w`` ([K, N], the
    reduction axis first, as a MatMul's B), one scale per column or (``per_column=False``) one for the tensor,
    with every even-aligned same-sign pair ``|q_2j| + |q_2j+1| <= 128`` and ``|q| <= 127`` (the module
    docstring's rule); a zero column (tensor) gets scale 1, and no scale is below the smallest normal float32."""
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"pair_bounded_int8: weight of shape {w.shape} (rule: 2-D, [K, N])")
    k, n = w.shape
    bound = np.abs(w).max(axis=0) if k else np.zeros(n)
    if k >= 2:
        bound = np.maximum(bound, _same_sign_pair_sums(w).max(axis=0))
    if not per_column:
        bound = np.asarray(bound.max() if bound.size else 0.0)
    # float32 scales no smaller than the smallest normal float32: below it bound / 127 would round coarsely (or to
    # 0, dividing by zero), breaking |q| <= 127 and the pair rule; weights that small quantize to 0 or +-1 steps
    tiny = float(np.finfo(np.float32).tiny)
    scale = np.where(bound > 0, np.maximum(bound / 127.0, tiny), 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale.astype(np.float64)), -127, 127).astype(np.int8)
    worst = max_same_sign_pair(q)
    if worst > PAIR_LIMIT:  # cannot happen by the rounding argument; checked because a saturating model is wrong
        raise AssertionError(f"pair_bounded_int8: a same-sign pair sums to {worst} > {PAIR_LIMIT}")
    return q, scale


def _same_sign_pair_sums(w: np.ndarray) -> np.ndarray:
    """``|w_2j| + |w_2j+1|`` where the even-aligned pair of rows has one sign, else 0 (``[K // 2, ...]``)."""
    k = w.shape[0]
    even, odd = w[0 : k - 1 : 2], w[1:k:2]
    return np.where(even * odd > 0, np.abs(even) + np.abs(odd), 0)


def max_same_sign_pair(q: np.ndarray) -> int:
    """The largest ``|q_2j| + |q_2j+1|`` over even-aligned same-sign pairs of the rows of ``q`` ([K, N], int);
    also ``max |q|`` (a lone last row, or any single weight), whichever is larger."""
    q = np.asarray(q, dtype=np.int64)
    worst = int(np.abs(q).max()) if q.size else 0
    if q.shape[0] >= 2:
        pair = _same_sign_pair_sums(q)
        worst = max(worst, int(pair.max()) if pair.size else 0)
    return worst


def _initializers(model: Any) -> dict[str, Any]:
    return {t.name: t for t in model.graph.initializer}


def _consumers(model: Any) -> dict[str, list[Any]]:
    """The nodes reading each value name."""
    out: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for i in node.input:
            out.setdefault(i, []).append(node)
    return out


def bound_weight_pairs(quantized: Any, source: Any) -> list[str]:
    """Rewrites, in place, every int8 MatMul weight of ``quantized`` (an onnxruntime-quantized ModelProto:
    ``MatMulInteger`` B, or a per-column ``DequantizeLinear`` feeding a ``MatMul``'s B) with
    :func:`pair_bounded_int8` of its float weight in ``source`` (the model that was quantized; onnxruntime names
    the int8 weight ``<w>_quantized`` and its scale ``<w>_scale``). Returns the int8 weight names rewritten.
    ValueError when a weight cannot be traced to its float source (an int8 weight left unbounded could saturate)."""
    from onnx import TensorProto, numpy_helper

    inits = _initializers(quantized)
    floats = _initializers(source)
    consumers = _consumers(quantized)
    targets: list[tuple[str, str, str]] = []  # (int8 weight, its scale, the float source)
    for node in quantized.graph.node:
        if node.op_type == "MatMulInteger" and node.input[1] in inits:
            q_name = node.input[1]
            scale_name = q_name.removesuffix("_quantized") + "_scale"
        elif (
            node.op_type == "DequantizeLinear"
            and node.input[0] in inits
            and any(c.op_type == "MatMul" and c.input[1] == node.output[0] for c in consumers.get(node.output[0], []))
        ):
            q_name, scale_name = node.input[0], node.input[1]
        else:
            continue
        if inits[q_name].data_type != TensorProto.INT8:
            continue  # uint8 weights (U8U8 kernels) widen to int16 and cannot saturate
        src = q_name.removesuffix("_quantized")
        if src not in floats or scale_name not in inits:
            raise ValueError(
                f"pair-bounded weights: int8 weight {q_name!r} has no float source {src!r} or scale {scale_name!r} "
                "in the models (onnxruntime's quantizer naming)"
            )
        targets.append((q_name, scale_name, src))
    done: list[str] = []
    for q_name, scale_name, src in dict.fromkeys(targets):  # a weight shared by several MatMuls: once
        w = numpy_helper.to_array(floats[src])
        zp_name = src + "_zero_point"
        if zp_name in inits and np.any(numpy_helper.to_array(inits[zp_name]) != 0):
            raise ValueError(f"pair-bounded weights: {q_name!r} is not symmetric (zero point != 0)")
        scale_shape = numpy_helper.to_array(inits[scale_name]).shape
        if w.ndim != 2 or scale_shape not in ((w.shape[1],), (), (1,)):
            raise ValueError(
                f"pair-bounded weights: {q_name!r} of shape {w.shape} (scale {scale_shape}) is not a per-column or "
                "per-tensor [K, N] MatMul weight"
            )
        q, scale = pair_bounded_int8(w, per_column=scale_shape == (w.shape[1],))
        scale = scale.reshape(scale_shape)
        inits[q_name].CopyFrom(numpy_helper.from_array(q, q_name))
        inits[scale_name].CopyFrom(numpy_helper.from_array(scale, scale_name))
        done.append(q_name)
    return done


# The weight operands of the ops that multiply an int8 weight in a GEMM (MLAS QGEMM: vpmaddubsw without VNNI), as
# onnxruntime's quantizers emit them (integer ops: the weight's input index) or as its runtime fuses a
# DequantizeLinear'd weight into one (float ops: any input fed by a DequantizeLinear of an int8 initializer).
INTEGER_GEMM_WEIGHTS: dict[str, tuple[int, ...]] = {
    "MatMulInteger": (0, 1),
    "ConvInteger": (1,),
    "QLinearMatMul": (0, 3),
    "QLinearConv": (3,),
    "DynamicQuantizeMatMul": (1,),
    "MatMulIntegerToFloat": (0, 1),
    "QGemm": (0, 3),
    "QAttention": (1,),
    "DynamicQuantizeLSTM": (1, 2),
}
FLOAT_GEMM_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Attention", "LSTM", "GRU", "RNN"})


def unbounded_gemm_weights(quantized: Any, bounded: set[str]) -> list[str]:
    """The int8 initializers of ``quantized`` that are a GEMM operand -- the weight input of an integer GEMM op
    (:data:`INTEGER_GEMM_WEIGHTS`), or dequantized into a float GEMM op (:data:`FLOAT_GEMM_OPS`) -- and are not
    among ``bounded`` (names :func:`bound_weight_pairs` rewrote): weights that could still saturate vpmaddubsw.
    Zero points, and an embedding table (an int8 Gather), are not GEMM operands."""
    from onnx import TensorProto

    int8 = {t.name for t in quantized.graph.initializer if t.data_type == TensorProto.INT8}
    consumers = _consumers(quantized)
    found: list[str] = []
    for node in quantized.graph.node:
        if node.op_type in INTEGER_GEMM_WEIGHTS:
            found += [node.input[i] for i in INTEGER_GEMM_WEIGHTS[node.op_type] if i < len(node.input)]
        elif node.op_type == "DequantizeLinear" and any(
            c.op_type in FLOAT_GEMM_OPS for c in consumers.get(node.output[0], [])
        ):
            found.append(node.input[0])
    return [n for n in dict.fromkeys(found) if n in int8 and n not in bounded]
