"""Gemm layers in dynamic int8: each ``Gemm`` with a constant weight becomes ``MatMul`` (+ ``Add`` of its bias)
before quantization, so every dynamic format takes it as it takes a torch ``Linear`` on 3-D inputs.

onnxruntime's dynamic quantizer has no integer form of ``Gemm`` (its registry quantizes ``MatMul``), and softdeploy's
own formats rewrite ``MatMul`` into ``RowwiseInt8MatMul``; Hugging Face's GPT-2 (``Conv1D``: ``addmm``) and torch
``Linear`` on 2-D inputs export ``Gemm``. ``Y = alpha * A' B' + beta * C`` with ``A' = A`` (``transA`` 0) is, exactly
in the weights' float values, ``MatMul(A, W) + bias`` with ``W = alpha * B'`` (``B'`` transposed at rewrite time when
``transB`` is 1) and ``bias = beta * C`` (an ``[N]`` or ``[1, N]`` C becomes ``[N]``: the form both quantizers fold
into their int8 op). A non-constant C is added as it is (``beta`` 1 only).

Left as ``Gemm`` (so in float), with the rule in :func:`gemm_as_matmul_rule`: ``transA`` 1, a weight that is not a
2-D float32 initializer, a non-constant C with ``beta`` other than 1.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def gemm_as_matmul_rule(node: Any, inits: dict[str, Any]) -> str:
    """Why ``node`` (a Gemm) cannot become MatMul + Add ("" when it can): the rule it breaks."""
    from onnx import TensorProto

    a = _attrs(node)
    if int(a.get("transA", 0)):
        return "transA = 1 (rule: dynamic int8 takes Gemm with A untransposed, as torch Linear exports it)"
    w = inits.get(node.input[1]) if len(node.input) > 1 else None
    if w is None or len(w.dims) != 2 or w.data_type != TensorProto.FLOAT:
        return "B is not a 2-D float32 initializer (rule: dynamic int8 quantizes constant weights)"
    c = node.input[2] if len(node.input) > 2 else ""
    if c and c not in inits and float(a.get("beta", 1.0)) != 1.0:
        return "C is computed and beta != 1 (rule: a computed C is added as it is)"
    return ""


def gemms_as_matmuls(model: Any, names: Collection[str]) -> list[str]:
    """Rewrites (in place) each Gemm of ``model``'s main graph named in ``names`` that :func:`gemm_as_matmul_rule`
    allows into ``MatMul`` (named as the Gemm was, so reports and exclusions name the same node) and, where it has a
    C, an ``Add`` named ``<name>_bias`` producing the Gemm's output. Returns the names rewritten."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    # value and node names alike: a new name clashes with neither
    taken = set(inits) | {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    taken |= {n.name for n in graph.node}
    done: list[str] = []
    new_nodes: list[Any] = []

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        taken.add(name)
        return name

    for node in graph.node:
        if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or node.name not in names:
            new_nodes.append(node)
            continue
        if gemm_as_matmul_rule(node, inits):
            new_nodes.append(node)
            continue
        a = _attrs(node)
        alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        w = numpy_helper.to_array(inits[node.input[1]])
        weight = node.input[1]
        if int(a.get("transB", 0)) or alpha != 1.0:
            w = w.T if int(a.get("transB", 0)) else w
            if alpha != 1.0:
                w = (w.astype(np.float64) * alpha).astype(np.float32)
            weight = fresh(f"{node.name}_weight")
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w, np.float32), weight))
        n_out = w.shape[1]
        c = node.input[2] if len(node.input) > 2 else ""
        if not c:
            new_nodes.append(helper.make_node("MatMul", [node.input[0], weight], [node.output[0]], name=node.name))
            done.append(node.name)
            continue
        bias = c
        ct = inits.get(c)
        if ct is not None:
            cv = numpy_helper.to_array(ct)
            flat = cv.size == n_out and cv.shape in ((n_out,), (1, n_out))
            if beta != 1.0 or (flat and cv.shape != (n_out,)) or ct.data_type != TensorProto.FLOAT:
                cv = (cv.astype(np.float64) * beta).astype(np.float32)
                bias = fresh(f"{node.name}_bias_value")
                graph.initializer.append(numpy_helper.from_array(cv.reshape(n_out) if flat else cv, bias))
        product = fresh(f"{node.output[0]}_matmul")
        new_nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=node.name))
        new_nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=fresh(f"{node.name}_bias")))
        done.append(node.name)
    del graph.node[:]
    graph.node.extend(new_nodes)
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for t in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(t)  # weights and biases only the rewritten Gemms read
    return done
