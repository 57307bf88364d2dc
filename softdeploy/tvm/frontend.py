"""ONNX model -> Relax IRModule, with softdeploy's ops as TIR computes.

TVM's Relax ONNX importer looks ops up by op type only (the domain is ignored), does not read
model-local functions and has no custom-converter hook. So, in order:

1. :func:`check_importable` lists, all at once and before any work, every op the importer cannot
   take and why (a com.softdeploy op without a TIR compute is judged by the ops of its function body;
   control flow inside subgraphs is searched too, which the importer's own check does not do);
2. :func:`prepare` inlines the function bodies of the ops without a TIR compute (and every other
   model-local function), fixes the input shapes (tuning needs static shapes) and constant-folds the
   shape arithmetic of dynamic exports (Shape -> Gather -> Concat -> Reshape), which the importer
   cannot follow;
3. :func:`import_model` runs ``from_onnx`` with one converter per TIR-compute op added to the
   importer's map for the duration of the call (a private API: pinned to TVM 0.27), and the standard
   ``Softmax`` imported as TwoPassSoftmax's TIR compute where that is the same function and its hand
   schedule applies (:func:`_softmax_converter_class`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from softdeploy.domain import DOMAIN
from softdeploy.errors import InputError, OpContractError
from softdeploy.tvm.errors import UnsupportedModelError

# Ops the importer handles outside its converter map.
_DIRECT_OPS = frozenset({"If", "Constant"})
_STANDARD_DOMAINS = ("", "ai.onnx")

# Why an op is missing, where the reason is known (otherwise: "no converter").
_KNOWN_GAPS = {
    "Loop": "control flow Loop is not implemented by TVM's Relax ONNX frontend (apache/tvm#17767)",
    "Scan": "control flow Scan is not implemented by TVM's Relax ONNX frontend",
    "QLinearMatMul": "QOperator quantized ops are not supported; export QDQ for TVM (apache/tvm#20124)",
    "QLinearConv": "QOperator quantized ops are not supported; export QDQ for TVM (apache/tvm#20124)",
    "ConvInteger": "not supported by TVM's Relax ONNX frontend (apache/tvm#20124)",
    "MatMulNBits": "not supported by TVM's Relax ONNX frontend (apache/tvm#20124)",
}


def _convert_map() -> dict[str, Any]:
    from softdeploy.tvm.target import import_tvm

    import_tvm()  # without TVM: TVMNotInstalledError with the pip command, not ModuleNotFoundError
    from tvm.relax.frontend.onnx import onnx_frontend

    return onnx_frontend._get_convert_map()


def _walk(nodes: Sequence[Any]) -> Iterator[Any]:
    """Every node, including those of subgraphs (If branches, Loop bodies)."""
    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _walk(attr.g.node)
            for g in attr.graphs:
                yield from _walk(g.node)


def _why_not(node: Any, convert_map: Mapping[str, Any], functions: Mapping[tuple[str, str], Any]) -> str | None:
    """None when the importer takes ``node``; otherwise the reason it does not."""
    from softdeploy.ops import REGISTRY
    from softdeploy.tvm.ops import NOT_IMPORTABLE, TIR_OPS

    if node.domain == DOMAIN:
        if node.op_type not in REGISTRY:
            return f"not an op of softdeploy's domain {DOMAIN} (known: {sorted(REGISTRY)})"
        if node.op_type in NOT_IMPORTABLE and node.op_type not in TIR_OPS:
            return NOT_IMPORTABLE[node.op_type]
        if node.op_type in TIR_OPS:
            return None
        body = functions.get((DOMAIN, node.op_type))
        if body is None:
            return "it has no TIR compute and no function body"
        bad = {}
        for inner in _walk(body.node):
            why = _why_not(inner, convert_map, functions)
            if why is not None:
                bad[inner.op_type] = why
        if bad:
            parts = "; ".join(f"{op}: {why}" for op, why in sorted(bad.items()))
            return f"it has no TIR compute and its function body uses ops TVM cannot import ({parts})"
        return None
    if (node.domain, node.op_type) in functions:
        return None  # a model-local function: inlined by prepare(); its body is checked there
    if node.domain not in _STANDARD_DOMAINS:
        if node.op_type in convert_map:
            return None  # e.g. com.microsoft FastGelu: the importer's map holds some contrib ops
        return f"custom domain {node.domain!r}: the importer ignores domains and has no converter named {node.op_type}"
    if node.op_type in convert_map or node.op_type in _DIRECT_OPS:
        return None
    return _KNOWN_GAPS.get(node.op_type, "no converter in TVM's Relax ONNX frontend")


def unsupported_ops(model: Any) -> dict[str, str]:
    """Every op of ``model`` the importer cannot take -> why (empty when the model imports)."""
    from softdeploy.ops.functions import attach_function_bodies

    model = attach_function_bodies(copy.deepcopy(model))
    convert_map = _convert_map()
    functions = {(f.domain, f.name): f for f in model.functions}
    found: dict[str, str] = {}
    for node in _walk(model.graph.node):
        why = _why_not(node, convert_map, functions)
        if why is not None:
            key = node.op_type if node.domain in (*_STANDARD_DOMAINS, DOMAIN) else f"{node.domain}.{node.op_type}"
            found[key] = why
    for f in model.functions:  # local functions other than ours are inlined; check their bodies too
        if f.domain == DOMAIN:
            continue
        for node in _walk(f.node):
            why = _why_not(node, convert_map, functions)
            if why is not None:
                found[f"{node.op_type} (in function {f.domain}.{f.name})"] = why
    return found


def check_importable(model: Any) -> None:
    """Raises UnsupportedModelError naming every op the importer cannot take, with the reason."""
    bad = unsupported_ops(model)
    if bad:
        raise UnsupportedModelError(bad)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A model ready for TVM's importer: standard ops plus the com.softdeploy nodes that have a TIR compute (the others
    inlined from their function bodies), static input shapes and dtypes, and which op types took which path."""

    model: Any  # onnx.ModelProto: standard ops + TIR-compute com.softdeploy nodes, static shapes
    shapes: dict[str, list[int]]
    dtypes: dict[str, str]
    tir_ops: tuple[str, ...]  # op types imported through their TIR compute
    inlined: tuple[str, ...]  # com.softdeploy op types imported from their function bodies


def _input_signature(model: Any, shapes: Mapping[str, Sequence[int]]) -> tuple[dict[str, list[int]], dict[str, str]]:
    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}
    out_shapes: dict[str, list[int]] = {}
    dtypes: dict[str, str] = {}
    missing = []
    unknown = sorted(set(shapes) - {i.name for i in model.graph.input})
    if unknown:
        raise InputError(f"shapes given for {unknown}, which are not inputs of the model")
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tt = value.type.tensor_type
        dtypes[value.name] = str(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if value.name in shapes:
            given = [int(d) for d in shapes[value.name]]
            if len(given) != len(tt.shape.dim):
                raise InputError(f"input {value.name} has rank {len(tt.shape.dim)}; the given shape {given} does not")
            for d, g in zip(tt.shape.dim, given, strict=True):
                if d.HasField("dim_value") and d.dim_value != g:
                    raise InputError(f"input {value.name}: dimension {d.dim_value} is fixed, {g} was given")
            out_shapes[value.name] = given
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if any(d is None for d in dims):
            symbolic = [d.dim_param or "?" for d in tt.shape.dim if not d.HasField("dim_value")]
            missing.append(f"{value.name} (symbolic dims {symbolic})")
        else:
            out_shapes[value.name] = [int(d) for d in dims if d is not None]
    if missing:
        raise InputError(
            "TVM builds for static shapes; give a shape for: " + ", ".join(missing) + " (e.g. --shape input_ids=1x128)"
        )
    return out_shapes, dtypes


def _fix_input_shapes(model: Any, shapes: Mapping[str, Sequence[int]]) -> None:
    for value in model.graph.input:
        if value.name in shapes:
            for d, s in zip(value.type.tensor_type.shape.dim, shapes[value.name], strict=True):
                d.Clear()
                d.dim_value = int(s)
    del model.graph.value_info[:]  # stale symbolic shapes from the export


def _fold_constants(model: Any, keep_our_nodes: bool) -> Any:
    """onnxruntime's basic (standard-ops-only) offline optimisation: constant folding, which turns
    the shape arithmetic of a dynamic export into constants once the inputs are static.

    With ``keep_our_nodes``, softdeploy's library is registered so that com.softdeploy nodes stay nodes
    (onnxruntime would otherwise inline their function bodies)."""
    import onnx
    import onnxruntime as ort

    from softdeploy.runtime.library import library_path

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    if keep_our_nodes:
        so.register_custom_ops_library(str(library_path()))
    with tempfile.TemporaryDirectory(prefix="softdeploy-tvm-") as tmp:
        so.optimized_model_filepath = os.path.join(tmp, "folded.onnx")
        # Not a run session: an offline optimisation pass, so softdeploy.runtime.Session (which does
        # not expose optimized_model_filepath) is not the place for it.
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])  # noqa: TID251
        return onnx.load(so.optimized_model_filepath)


def prepare(model: Any, shapes: Mapping[str, Sequence[int]] | None = None, *, use_tir: bool = True) -> Prepared:
    """The model TVM imports: see the module docstring. ``use_tir=False`` inlines every op's function
    body (the decomposition), for comparison."""
    import onnx
    import onnx.inliner

    from softdeploy.ops.functions import attach_function_bodies
    from softdeploy.runtime.library import library_status
    from softdeploy.tvm.ops import TIR_OPS

    if isinstance(model, (str, os.PathLike)):
        from softdeploy.files import load_model

        model = load_model(model)  # ModelLoadError naming the path and the problem
    check_importable(model)
    model = attach_function_bodies(copy.deepcopy(model))
    in_shapes, dtypes = _input_signature(model, shapes or {})
    _spell_out_default_attrs(model)
    used = sorted({n.op_type for n in _walk(model.graph.node) if n.domain == DOMAIN})
    # Folding keeps our nodes only with the library registered; without it they are inlined too.
    keep = [op for op in used if use_tir and op in TIR_OPS and library_status().ok]
    inline = [(f.domain, f.name) for f in model.functions if not (f.domain == DOMAIN and f.name in keep)]
    model = onnx.inliner.inline_selected_functions(model, inline, exclude=False)
    _fix_input_shapes(model, in_shapes)
    model = _fold_constants(model, keep_our_nodes=bool(keep))
    return Prepared(model, in_shapes, dtypes, tuple(keep), tuple(op for op in used if op not in keep))


def _spell_out_default_attrs(model: Any) -> None:
    """Writes each omitted attribute of our nodes with its default value onto the node. onnx's
    inliner leaves a body node that references an attribute the call omits (``Constant(value_int=@axis)``)
    without a value -- "Constant node has no data attributes" downstream -- instead of using the
    function's declared default."""
    from onnx import helper

    from softdeploy.ops import REGISTRY

    for node in _walk(model.graph.node):
        op = REGISTRY.get(node.op_type) if node.domain == DOMAIN else None
        if op is None:
            continue
        have = {a.name for a in node.attribute}
        for attr in op.attrs:
            if not attr.required and attr.name not in have:
                node.attribute.append(helper.make_attribute(attr.name, attr.kind(attr.default)))


@contextlib.contextmanager
def _our_converters() -> Iterator[None]:
    """Adds one converter per TIR-compute op to the importer's map while the import runs."""
    from tvm.relax.frontend.onnx import onnx_frontend

    from softdeploy.tvm.ops import TIR_OPS

    original = onnx_frontend._get_convert_map

    def extended() -> dict[str, Any]:
        table = original()
        clash = sorted(set(TIR_OPS) & set(table))
        if clash:  # docs/ops/index.md: our op names never collide with standard ones; the importer is domain-blind
            raise RuntimeError(f"softdeploy op names {clash} collide with TVM converters")
        table.update({name: _converter_class(name) for name in TIR_OPS})
        table["Softmax"] = _softmax_converter_class(table["Softmax"])
        return table

    onnx_frontend._get_convert_map = extended
    try:
        yield
    finally:
        onnx_frontend._get_convert_map = original


def _converter_class(op_name: str) -> type:
    from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

    from softdeploy.ops import REGISTRY
    from softdeploy.tvm.ops import TIR_OPS

    op = REGISTRY[op_name]

    def _impl_v1(cls: type, bb: Any, inputs: Sequence[Any], attr: dict[str, Any], params: Any) -> Any:
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attr.items() if k != "tvm_custom"}
        return TIR_OPS[op_name](bb, list(inputs), op.resolve_attrs(attrs))

    return type(f"{op_name}Converter", (OnnxOpConverter,), {"_impl_v1": classmethod(_impl_v1)})


def _softmax_converter_class(stock: type) -> type:
    """The standard ``Softmax`` converter, importing a float32 softmax over the last axis whose length is a
    multiple of the vector width (``_te.lane_split_ok``: the attention softmax of every transformer) as
    TwoPassSoftmax's TIR compute instead of Relax's ``nn.softmax``: the same function (ai.onnx.Softmax's
    special values, softdeploy/tvm/ops/two_pass_softmax.py) with a hand schedule that vectorises it, where
    Relax's legalised ``fast_softmax`` kernel, tuned or not, does not (all-MiniLM-L6-v2's [1, 12, 128, 128]
    attention softmax, 1 thread, -mcpu=znver3 on Zen 4: 681 us with its tuning record, 620 us with dlight's
    default, 145 us as TwoPassSoftmax). Other softmaxes keep the stock converter. Opset < 13 flattens the
    axes from ``axis`` on, which is the last-axis softmax exactly when ``axis`` is the last axis."""
    from softdeploy.tvm.ops import two_pass_softmax
    from softdeploy.tvm.ops._te import lane_split_ok

    def ours(bb: Any, x: Any, axis: int) -> Any | None:
        shape = getattr(x.ty, "shape", None)
        if shape is None or str(x.ty.dtype) != "float32" or len(shape) == 0:
            return None
        rank = len(shape)
        if axis not in (-1, rank - 1) or not lane_split_ok(list(shape), rank - 1):
            return None
        return bb.emit_te(two_pass_softmax.compute, x, rank - 1, primfunc_name_hint="softmax")

    def _impl_v1(cls: type, bb: Any, inputs: Sequence[Any], attr: dict[str, Any], params: Any) -> Any:
        out = ours(bb, inputs[0], int(attr.get("axis", 1)))
        return out if out is not None else stock._impl_v1(bb, inputs, attr, params)

    def _impl_v13(cls: type, bb: Any, inputs: Sequence[Any], attr: dict[str, Any], params: Any) -> Any:
        out = ours(bb, inputs[0], int(attr.get("axis", -1)))
        return out if out is not None else stock._impl_v13(bb, inputs, attr, params)

    return type(
        "SoftmaxConverter",
        (stock,),
        {"_impl_v1": classmethod(_impl_v1), "_impl_v11": classmethod(_impl_v1), "_impl_v13": classmethod(_impl_v13)},
    )


def import_model(prepared: Prepared, target: dict[str, Any] | None = None) -> Any:
    """The Relax IRModule of a prepared model (weights folded in as constants), for ``target`` (default: this host).
    The target matters where a converter lays weights out for the CPU's instructions (RowwiseInt8MatMul packs its int8
    weights for VNNI, AVX-VNNI or AVX2): build the module for the same target."""
    from tvm.relax.frontend.onnx import from_onnx

    from softdeploy.tvm.target import host_target, make_target

    with make_target(target or host_target()), _our_converters():
        try:
            return from_onnx(prepared.model, shape_dict=prepared.shapes, dtype_dict=prepared.dtypes)
        except OpContractError:
            raise
        except Exception as e:
            raise UnsupportedModelError({"(import)": f"TVM's importer failed: {type(e).__name__}: {e}"}) from e
