"""Attaching function bodies to a model, given the op definitions: the registry-free core of
:mod:`softdeploy.ops.functions` (an OpDef's one-node model attaches its own body through it, without the registry)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from softdeploy.domain import DOMAIN, OPSET_VERSION
from softdeploy.errors import ExportError


def _nodes(graph: Any) -> Iterator[Any]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g.node:
                yield from _nodes(attr.g)
            for g in attr.graphs:
                yield from _nodes(g)


def default_opset(model: Any) -> int:
    """The model's default-domain ('' / ai.onnx) opset version; ExportError when it imports none."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise ExportError("model imports no default ('') opset")


def attach_bodies(model: Any, defs: Mapping[str, Any]) -> Any:
    """Appends (in place, and returns) the function body, from ``defs`` (op name -> OpDef), of every com.softdeploy op
    the model uses
    and does not already define, targeted at the model's default opset; adds the domain import.
    Omitted optional inputs with a ``Port.body_fill`` get their fill, missing trailing outputs an
    empty slot (both needed for stock onnxruntime to load the bodies; see _fill_omitted_inputs)."""
    used = {n.op_type for n in _nodes(model.graph) if n.domain == DOMAIN}
    unknown = sorted(used - set(defs))
    if unknown:
        raise ExportError(f"model uses {unknown} in domain {DOMAIN}, which softdeploy does not define")
    _fill_omitted_inputs(model.graph, defs)
    have = {(f.domain, f.name) for f in model.functions}
    opset = default_opset(model)
    for name in sorted(used):
        if (DOMAIN, name) not in have:
            model.functions.append(defs[name].function_proto(opset))
    if used and not any(i.domain == DOMAIN for i in model.opset_import):
        model.opset_import.append(_opsetid(DOMAIN, OPSET_VERSION))
    return model


def _fill_omitted_inputs(graph: Any, registry: Any, counter: Iterator[int] | None = None) -> None:
    """Feeds every omitted optional input that declares a ``Port.body_fill`` its fill (see BodyFill),
    in this graph and its subgraphs, and gives every node all of its output slots: stock onnxruntime
    type-checks a node against its function body's signature and refuses an omitted input, or fewer
    output slots than the body has outputs. Trailing optional outputs become "" (omitted: a kernel
    still skips them, e.g. SoftmaxTopK's LogSumExp), which onnxruntime accepts."""
    counter = itertools.count() if counter is None else counter  # unique names across subgraphs
    nodes = []
    for node in graph.node:
        for attr in node.attribute:
            if attr.g.node:
                _fill_omitted_inputs(attr.g, registry, counter)
            for g in attr.graphs:
                _fill_omitted_inputs(g, registry, counter)
        op = registry.get(node.op_type) if node.domain == DOMAIN else None
        if op is not None:
            for i, port in enumerate(op.inputs):
                fill = port.fill
                if fill is None or (i < len(node.input) and node.input[i]):
                    continue
                base = f"{node.name or node.op_type}_{port.name}_omitted_{next(counter)}"
                nodes.extend(_fill_nodes(fill, port.dtype, node, base))
                while len(node.input) < i:
                    node.input.append("")
                if i < len(node.input):
                    node.input[i] = base
                else:
                    node.input.append(base)
            while len(node.output) < len(op.outputs):
                node.output.append("")
        nodes.append(node)  # edited in place above; rebuilt below only when fill nodes were added
    if len(nodes) != len(graph.node):
        copies = [type(n)() for n in nodes]
        for c, n in zip(copies, nodes, strict=True):
            c.CopyFrom(n)
        del graph.node[:]
        graph.node.extend(copies)


def _fill_nodes(fill: Any, dtype: str, node: Any, name: str) -> list[Any]:
    """Nodes computing ``fill`` for an input of ``dtype`` ("T" = like the node's input 0) as ``name``."""
    import numpy as np
    from onnx import helper, numpy_helper

    elem = np.dtype(np.float32 if dtype == "T" else dtype)
    out = name + "_raw" if dtype == "T" else name
    if fill.shape_of is None:
        nodes = [helper.make_node("Constant", [], [out], value=numpy_helper.from_array(np.asarray(fill.value, elem)))]
    else:
        value = numpy_helper.from_array(np.asarray([fill.value], elem))
        shape_attrs = {"start": fill.start} | ({} if fill.end is None else {"end": fill.end})
        nodes = [
            helper.make_node("Shape", [node.input[fill.shape_of]], [name + "_shape"], **shape_attrs),
            helper.make_node("ConstantOfShape", [name + "_shape"], [out], value=value),
        ]
    if dtype == "T":
        nodes.append(helper.make_node("CastLike", [out, node.input[0]], [name]))
    return nodes


def _opsetid(domain: str, version: int) -> Any:
    from onnx import helper

    return helper.make_opsetid(domain, version)
