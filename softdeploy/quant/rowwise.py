"""softdeploy's own int8 formats, ``lane-bounded`` and ``rowwise-8-bit``: weight MatMuls become com.softdeploy
``RowwiseInt8MatMul`` nodes (:data:`FORMS` gives each format's activation levels and lane groups).

``rowwise-8-bit`` is the form for a CPU with VNNI (AVX-512 VNNI, or AVX-VNNI on AVX2 cores): 8-bit activations per
row, the plain 8-bit per-column weight grid (``groups`` 0: no lane bound; the kernel's VNNI tiles, zmm and ymm, sum
every int8 B exactly). On all-MiniLM-L6-v2 it
encodes as fast as onnxruntime's VNNI int8 (2.52x fp32 against 2.51x) with a sentence cosine to fp32 of 0.9981
against 0.9913 and an MRR@10 drop of 0.0029 against 0.0046: the per-row activation scales are what onnxruntime's
one range per tensor lacks (bench/results/minilm_int8_options.md).

The rest of this docstring is about ``lane-bounded``, the form for a CPU without VNNI (AVX2; AVX-512 runs it on zmm).

onnxruntime's dynamic int8 quantizes a MatMul's activations with one uint8 range per tensor and, on a CPU without
VNNI, multiplies with ``vpmaddubsw`` + ``vpmaddwd`` + ``vpaddd`` per 32 products (3 vector ops). This format instead
rewrites every MatMul whose B is a 2-D float32 initializer into softdeploy's ``RowwiseInt8MatMul``
(softdeploy/ops/rowwise_int8_matmul.py, docs/ops/RowwiseInt8MatMul.md):

* activations quantized per row (per token) inside the op, on 0..127 (``levels``; 7 bits) by default;
* weights symmetric per column on the 8-bit grid, each column's step widened only as far as the AVX2 kernel's
  int16 lanes need to stay exact when ``groups`` (4: 8 products per lane) ``vpmaddubsw`` results are summed
  (``lane_bounded_weights``): 2.25 vector ops per 32 products;
* a bias ``Add`` of a constant ``[N]`` right after the MatMul folds into the op (its epilogue adds it), as does the
  bias of onnxruntime's fused ``BiasGelu``;
* then the op's epilogue takes what follows it (:func:`fuse_epilogues`): a GELU (erf form) becomes its ``activation``
  and a residual ``Add`` of a tensor of its output's shape its ``Residual`` input -- a transformer's FFN GELU and its
  two residual Adds a layer, each of which was a pass of its own over the activations.

Measured on all-MiniLM-L6-v2 (bench/results/minilm_int8_options.md; 653 queries), with an AVX2 CPU's instruction
set: 1.96x float32 encode against onnxruntime's int8 1.61x, sentence cosine to float32 0.9946 against 0.9911, MRR@10
drop 0.0033 (``levels`` 127 / ``groups`` 4; 255 / 2 gives 0.9979 at 1.81x).

onnxruntime's dynamic quantizer then takes the candidates that are not weight MatMuls (embedding Gathers: the
model's size) in its own 8-bit format.

The model then needs softdeploy's kernel library for speed: every rewritten node carries its standard-ONNX
function body (an exact float64 MatMul), so stock onnxruntime still runs it and gives the same values, but slower
than float32.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np

# The default: 7-bit activations with 8-product lanes (the fastest exact form; accuracy above).
LEVELS = 127
GROUPS = 4

# softdeploy's formats (softdeploy.quant.formats.WEIGHTS names them): (activation levels, lane groups).
FORMS: dict[str, tuple[int, int]] = {"lane-bounded": (LEVELS, GROUPS), "rowwise-8-bit": (255, 0)}


def rewrite_matmuls(
    model: Any,
    *,
    levels: int = LEVELS,
    groups: int = GROUPS,
    only: Collection[str] | None = None,
    exclude: Collection[str] = (),
) -> list[str]:
    """Rewrites (in place) each MatMul of ``model``'s main graph whose second input is a 2-D float32 initializer
    into a RowwiseInt8MatMul with lane-bounded weights (``levels``, ``groups``; groups 0: the plain 8-bit grid),
    folding a following bias Add (or com.microsoft BiasGelu) of a constant [N], then the GELU and residual Add after
    it (:func:`fuse_epilogues`); ``only`` / ``exclude`` select nodes by name. Returns the names of the rewritten
    MatMuls. Attaches the function bodies and the com.softdeploy import."""
    from onnx import TensorProto, helper, numpy_helper

    from softdeploy.ops import REGISTRY
    from softdeploy.ops.functions import attach_function_bodies
    from softdeploy.ops.rowwise_int8_matmul import lane_bounded_weights

    op = REGISTRY["RowwiseInt8MatMul"]
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in graph.output}
    done: list[str] = []
    new_nodes: list[Any] = []
    folded: set[int] = set()  # id() of bias Adds folded into a rewritten node
    for node in graph.node:
        if id(node) in folded:
            continue
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") else None
        selected = (only is None or node.name in only) and node.name not in exclude
        if w is None or not selected or len(w.dims) != 2 or w.data_type != TensorProto.FLOAT:
            new_nodes.append(node)
            continue
        q, step = lane_bounded_weights(numpy_helper.to_array(w), levels, groups)
        base = node.name or node.output[0]
        q_name, s_name = f"{base}_rowwise_weight", f"{base}_rowwise_scale"
        graph.initializer.extend([numpy_helper.from_array(q, q_name), numpy_helper.from_array(step, s_name)])
        inputs, output = [node.input[0], q_name, s_name], node.output[0]
        users = consumers.get(output, [])
        gelu = None
        if output not in graph_outputs and len(users) == 1 and users[0].op_type in ("Add", "BiasGelu"):
            user = users[0]
            other = [i for i in user.input if i != output]
            bias = inits.get(other[0]) if len(other) == 1 else None
            if bias is not None and list(bias.dims) == [q.shape[1]] and bias.data_type == TensorProto.FLOAT:
                inputs.append(other[0])
                folded.add(id(user))
                if user.op_type == "Add":
                    output = user.output[0]
                else:  # onnxruntime's fused BiasGelu(x, bias): the bias moves into the op, Gelu stays (then fused)
                    gelu = helper.make_node("Gelu", [output], list(user.output), name=user.name, domain=user.domain)
        new_nodes.append(op.make_node(inputs, [output], name=f"{base}_rowwise", levels=levels))
        if gelu is not None:
            new_nodes.append(gelu)
        done.append(node.name)
    del graph.node[:]
    graph.node.extend(new_nodes)
    used = {i for n in graph.node for i in n.input}
    for t in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(t)  # the float weights (and folded biases) no other node reads
    fuse_epilogues(model)
    attach_function_bodies(model)
    return done


def _is_erf_gelu(node: Any) -> bool:
    """Whether ``node`` is GELU's erf form: com.microsoft ``Gelu``, or ONNX ``Gelu`` (opset 20) without the tanh
    approximation."""
    if node.op_type != "Gelu" or node.domain not in ("", "ai.onnx", "com.microsoft") or len(node.input) != 1:
        return False
    approximate = next((a.s.decode() for a in node.attribute if a.name == "approximate"), "none")
    return node.domain == "com.microsoft" or approximate == "none"


def _known_shape(value_info: Any) -> tuple[int | str, ...] | None:
    """A tensor's shape from its ValueInfoProto, each dimension a number or a name; None if any is unknown."""
    tensor = value_info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    dims: list[int | str] = []
    for d in tensor.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            return None
    return tuple(dims)


def fuse_epilogues(model: Any) -> dict[str, list[str]]:
    """Folds into each RowwiseInt8MatMul of ``model``'s main graph (in place) the nodes its kernel epilogue can run,
    where the op's output has no other reader and is not a graph output: a following GELU (erf form: com.microsoft
    or ONNX ``Gelu``) becomes ``activation="gelu"``, then a following ``Add`` of a tensor whose shape equals the
    output's (both known from the graph's value_info, dimension by dimension) becomes its ``Residual``. Returns
    ``{RowwiseInt8MatMul node: [folded node, ...]}``; the values are unchanged (the same float32 operations, the
    addition commuting), the passes over the activations gone. Shapes that are not known are not guessed: such an
    Add stays."""
    from onnx import helper

    graph = model.graph
    shapes = {v.name: _known_shape(v) for v in [*graph.value_info, *graph.input, *graph.output]}
    inits = {t.name for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def only_reader(name: str) -> Any:
        users = readers.get(name, [])
        # (a node another one has absorbed already is no longer there to take: Y = X W1 + X W2 is one Add)
        return users[0] if name not in outputs and len(users) == 1 and id(users[0]) not in place else None

    folded: dict[str, list[str]] = {}
    # A fused node moves to the place of the last node it absorbed: its inputs (a Residual included) are all
    # produced before that place and its output read only after it, so the node list stays topologically sorted.
    place: dict[int, Any] = {}  # id(absorbed node) -> the fused node that takes its place
    for node in list(graph.node):
        if node.op_type != "RowwiseInt8MatMul":
            continue
        absorbed: list[Any] = []
        user = only_reader(node.output[0])
        residual = len(node.input) > 4 and bool(node.input[4])  # (a body's fill too: what it adds is not known here)
        # act(V) + Residual: an activation after a residual add is not the epilogue's order
        if (
            user is not None
            and not residual
            and all(a.name != "activation" for a in node.attribute)
            and _is_erf_gelu(user)
        ):
            node.attribute.append(helper.make_attribute("activation", "gelu"))
            node.output[0] = user.output[0]
            absorbed.append(user)
            user = only_reader(node.output[0])
        if user is not None and user.op_type == "Add" and user.domain in ("", "ai.onnx") and not residual:
            other = [i for i in user.input if i != node.output[0]]
            shape = shapes.get(user.output[0])
            if len(other) == 1 and other[0] not in inits and shape is not None and shapes.get(other[0]) == shape:
                node.input.extend([""] * (4 - len(node.input)))
                node.input.append(other[0])
                node.output[0] = user.output[0]
                absorbed.append(user)
        if absorbed:
            folded[node.name] = [n.name or n.op_type for n in absorbed]
            for n in absorbed[:-1]:
                place[id(n)] = None
            place[id(absorbed[-1])] = node
            place[id(node)] = None
    if place:
        order = [n for n in (place.get(id(n), n) for n in graph.node) if n is not None]
        copies = [type(n)() for n in order]  # copied out before the repeated field is cleared
        for c, n in zip(copies, order, strict=True):
            c.CopyFrom(n)
        del graph.node[:]
        graph.node.extend(copies)
        produced = {o for n in graph.node for o in n.output} | {i.name for i in graph.input} | inits
        stale = [v for v in graph.value_info if v.name not in produced]  # the folded nodes' former outputs
        for v in stale:
            graph.value_info.remove(v)
    return folded


def weight_groups(model: Any) -> dict[str, int]:
    """Per RowwiseInt8MatMul node of ``model``: the int16 groups its weights allow (``lane_groups``) -- what the
    kernel will run: 4, 2, 1, or 0 for its widened (vpmaddwd) tile on CPUs without VNNI."""
    from onnx import numpy_helper

    from softdeploy.ops.rowwise_int8_matmul import lane_groups

    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type == "RowwiseInt8MatMul" and node.input[1] in inits:
            levels = next((a.i for a in node.attribute if a.name == "levels"), 255)
            out[node.name] = lane_groups(np.asarray(numpy_helper.to_array(inits[node.input[1]])), levels)
    return out
