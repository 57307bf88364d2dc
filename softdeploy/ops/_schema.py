"""What an operator is, as data: :class:`OpDef` and its parts.

Each ``softdeploy/ops/<stem>.py`` builds exactly one ``DEF = OpDef(...)``; everything else in
softdeploy (ONNX schemas, function bodies, torch ops, export, runtime, tests, benchmarks, CLI)
iterates :data:`softdeploy.ops.REGISTRY` and never lists ops itself.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from softdeploy.domain import DOMAIN, OPSET_VERSION
from softdeploy.errors import OpContractError
from softdeploy.ops._body import FunctionBody

# The standard-ONNX opset the function bodies are written against; attach_function_bodies() retargets
# them to a model's own default opset (every op the bodies use has the same semantics in 18..23).
BODY_OPSET = 18
SUPPORTED_MODEL_OPSETS = range(18, 24)

# Floating element types an op's "T" ports accept (computed in float32 in the kernels).
FLOAT_TYPES = ("float32", "float16")

_ONNX_TYPE = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "float64": "tensor(double)",
    "int64": "tensor(int64)",
    "int32": "tensor(int32)",
    "int8": "tensor(int8)",
    "uint8": "tensor(uint8)",
    "bool": "tensor(bool)",
}


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclasses.dataclass(frozen=True)
class BodyFill:
    """What ``attach_function_bodies`` feeds in place of an omitted optional input whose function body
    needs a value (onnxruntime cannot type an omitted input inside a model-local function body, not
    even under OptionalHasElement/If). The kernel receives the fill too, so it must mean exactly what
    "omitted" means for the op (an additive mask of 0, an all-true bool mask, ...).

    ``value`` is the element: of the port's dtype, or cast like the node's input 0 for a "T" port. With
    ``shape_of`` it fills the shape ``Shape(input[shape_of])[start:end]`` (ConstantOfShape), e.g. an
    all-true ``[B, Lq]`` mask from ``Q [B, Lq, dim]`` is ``BodyFill(True, shape_of=0, end=2)``; without,
    it is a scalar (enough for inputs that broadcast).
    """

    value: float | bool
    shape_of: int | None = None  # index of the (required) input whose shape gives the fill's shape
    start: int = 0
    end: int | None = None


@dataclasses.dataclass(frozen=True)
class Port:
    """One input or output. ``dtype`` is ``"T"`` (the op's float type) or a fixed numpy dtype name."""

    name: str
    dtype: str = "T"
    optional: bool = False
    doc: str = ""
    # For an optional input whose function body needs a value: what a node that omits it gets instead
    # (see BodyFill; a plain float is a scalar BodyFill, cast like input 0).
    body_fill: BodyFill | float | None = None

    @property
    def fill(self) -> BodyFill | None:
        """``body_fill`` as a BodyFill (None when the port has none)."""
        if self.body_fill is None or isinstance(self.body_fill, BodyFill):
            return self.body_fill
        return BodyFill(float(self.body_fill))


# ONNX AttributeProto type names of the Python kinds an Attr may have (onnx.AttributeProto.AttributeType).
_ATTR_TYPE_NAME = {int: "INT", float: "FLOAT", str: "STRING"}
_ATTR_TYPE_CODE = {int: 2, float: 1, str: 3}  # AttributeProto.INT, FLOAT, STRING


@dataclasses.dataclass(frozen=True)
class Attr:
    """One attribute; ``default=REQUIRED`` makes it mandatory."""

    name: str
    kind: type  # int | float | str
    default: Any = REQUIRED
    doc: str = ""

    @property
    def required(self) -> bool:
        """Whether the attribute has no default (a node must set it)."""
        return self.default is REQUIRED

    @property
    def onnx_type(self) -> str:
        """The ONNX attribute type: ``"INT"``, ``"FLOAT"`` or ``"STRING"``."""
        return _ATTR_TYPE_NAME[self.kind]

    def rule(self, op: str) -> str:
        """The rule an attribute of the wrong type breaks (same words as sd::Attrs in ops/common/kernel.h)."""
        return (
            f"'{self.name}' is declared {self.onnx_type} in docs/ops/{op}.md; write it in that type, "
            f"as REGISTRY['{op}'].make_node does"
        )

    def coerce(self, op: str, value: Any) -> int | float | str:
        """``value`` in this attribute's declared type, converted only when that is exact (2 -> 2.0 for a
        FLOAT, 3.0 -> 3 for an INT); anything else raises OpContractError naming op, value and rule."""
        got = _describe(value)
        if self.kind is str:
            if isinstance(value, str):
                return value
        elif isinstance(value, (bool, np.bool_)):
            pass  # True is no number a user meant for an INT or FLOAT attribute
        elif self.kind is int:
            if isinstance(value, (int, np.integer)):
                return int(value)
            if isinstance(value, (float, np.floating)) and np.isfinite(value) and float(value).is_integer():
                if -(2**63) <= value < 2**63:
                    return int(value)
        elif self.kind is float:
            if isinstance(value, (float, np.floating)):
                return float(value)
            # A FLOAT attribute is float32: an integer converts exactly only when float32 holds it.
            if isinstance(value, (int, np.integer)) and abs(int(value)) < 2**64 and int(np.float32(value)) == value:
                return float(value)
        raise OpContractError(
            f"{op}: attribute '{self.name}' must be {self.onnx_type}, got {got}, which does not convert exactly "
            f"(rule: {self.rule(op)})"
        )


def _describe(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return f"bool {value!r}"
    if isinstance(value, (int, np.integer)):
        return f"INT {int(value)}"
    if isinstance(value, (float, np.floating)):
        return f"FLOAT {float(value):g}"
    if isinstance(value, str):
        return f"STRING {value!r}"
    return f"{type(value).__name__} {value!r}"


def _attribute_value(attr: Any) -> str:
    """``AttributeProto`` as the kernels print it: ``INT 2``, ``FLOAT 0.5``, ``STRING 'x'``, ``INTS``, ..."""
    from onnx import AttributeProto, helper

    kind = AttributeProto.AttributeType.Name(attr.type)
    if attr.ref_attr_name:
        return f"{kind} @{attr.ref_attr_name}"
    if attr.type == AttributeProto.INT:
        return f"INT {attr.i}"
    if attr.type == AttributeProto.FLOAT:
        return f"FLOAT {attr.f:g}"
    if attr.type == AttributeProto.STRING:
        return f"STRING {attr.s.decode(errors='replace')!r}"
    if attr.type in (AttributeProto.INTS, AttributeProto.FLOATS):
        return f"{kind} of {len(helper.get_attribute_value(attr))} values"
    return kind


@dataclasses.dataclass(frozen=True)
class Sample:
    """Inputs (``None`` = an omitted optional input) and attributes on which every backend must agree.

    ``kind`` is ``"typical"``, ``"edge"`` (boundary sizes: empty, one element, k = n, tile edges) or
    ``"special"`` (+-inf, NaN, ties).
    """

    name: str
    inputs: tuple[np.ndarray | None, ...]
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    kind: str = "typical"


@dataclasses.dataclass(frozen=True)
class ErrorCase:
    """Inputs that break a rule of the contract; every backend must refuse them with ``match`` in
    the message (the kernel as an onnxruntime error status, Python as OpContractError)."""

    name: str
    inputs: tuple[np.ndarray | None, ...]
    attrs: Mapping[str, Any]
    match: str


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One operator, as data: its ONNX name (domain com.softdeploy), the equation and rules (``doc``), ports, typed
    attributes, the float64 ``reference``, the standard-ONNX function body, torch implementations, shape inference,
    samples, error cases, per-dtype tolerances and the source paper. Everything else in softdeploy (schemas, bodies,
    torch ops, export, runtime checks, tests, the generated operator reference docs/ops/) is derived from it."""

    name: str  # ONNX op type in domain com.softdeploy
    doc: str  # the equation and the rules (the op module's docstring)
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    attrs: tuple[Attr, ...]
    reference: Callable[..., tuple[np.ndarray, ...]]  # float64 NumPy oracle: (*inputs, **attrs)
    # The portable standard-ONNX body, named like the op: a FunctionBody (softdeploy/ops/_body.py), which
    # compiles its onnxscript function on first use.
    function: FunctionBody
    samples: Callable[[np.random.Generator], Iterable[Sample]]
    errors: Callable[[], Iterable[ErrorCase]]
    torch_impl: Callable[..., Any]  # eager torch version: (*tensors, **attrs) -> tensor | tuple
    infer_shapes: Callable[[Any], None] | None = None  # onnx InferenceContext -> sets output types
    torch_fake: Callable[..., Any] | None = None  # defaults to torch_impl on fake tensors
    float_types: tuple[str, ...] = FLOAT_TYPES
    # (rtol, atol) against the float64 reference, per float type of the inputs
    tolerance: Mapping[str, tuple[float, float]] = dataclasses.field(
        default_factory=lambda: {"float32": (2e-6, 1e-30), "float16": (2e-3, 1e-6)}
    )
    source: str = ""  # paper / reference implementation
    # For outputs whose error grows with an input (attention's O = W V): (*inputs, **attrs) -> the magnitude the
    # absolute error is proportional to, an array broadcastable to each float output (e.g. max(1, max|V|) per head
    # and column); the absolute tolerance is atol times it (error_scale). None: atol as it is.
    atol_scale: Callable[..., Any] | None = None
    # The input the outputs are linear in (O(c V) = c O(V), attention's V), if any: the reliability fuzz
    # scales it over many magnitudes, which the tolerance must follow (atol_scale).
    linear_in: str | None = None
    # The snake_case stem when the derived one is not wanted (e.g. "SoftmaxTopK" -> "softmax_topk",
    # not "softmax_top_k"); None derives it from the name.
    stem_override: str | None = None

    # ---- derived names ---------------------------------------------------------------------------

    @property
    def stem(self) -> str:
        """snake_case name: module ``softdeploy/ops/<stem>.py``, kernel ``ops/<stem>.cc``, torch op
        ``softdeploy::<stem>``."""
        if self.stem_override is not None:
            return self.stem_override
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", self.name).lower()

    def error_scale(self, inputs: Sequence[Any], attrs: Mapping[str, Any] | None = None) -> Any:
        """What the absolute tolerance is multiplied by on ``inputs`` (and the node's ``attrs``):
        ``atol_scale(*inputs, **attrs)`` (an array broadcastable to the float outputs, > 0), or 1.0 for ops whose
        error does not scale with an input. A float output meets the tolerance where
        ``|got - ref| <= atol * error_scale + rtol * |ref|``."""
        if self.atol_scale is None:
            return 1.0
        with np.errstate(all="ignore"):
            return np.asarray(self.atol_scale(*inputs, **dict(attrs or {})), np.float64)

    def attr_defaults(self) -> dict[str, Any]:
        """The defaults of the optional attributes, by name."""
        return {a.name: a.default for a in self.attrs if not a.required}

    def resolve_attrs(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults filled in, each value in its declared type (:meth:`Attr.coerce`); unknown, wrongly
        typed or missing required attributes raise OpContractError."""
        out = self.attr_defaults()
        out.update(self.coerce_attrs(attrs))
        for a in self.attrs:
            if a.name not in out:
                raise OpContractError(
                    f"{self.name}: attribute '{a.name}' is required (rule: '{a.name}' is an {a.onnx_type} "
                    "attribute without a default)"
                )
        return out

    def coerce_attrs(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """``attrs`` (without defaults) each in its declared type; unknown names raise OpContractError."""
        by_name = {a.name: a for a in self.attrs}
        for name in attrs:
            if name not in by_name:
                raise OpContractError(self._unknown_attribute(name))
        return {name: by_name[name].coerce(self.name, value) for name, value in attrs.items()}

    def _unknown_attribute(self, name: str) -> str:
        import difflib

        known = sorted(a.name for a in self.attrs)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"{self.name}: unknown attribute '{name}'{hint} (rule: {self.name}'s attributes are {known or 'none'})"

    def check_node(self, node: Any) -> None:
        """Raises OpContractError unless the NodeProto ``node`` (of this op) has only declared
        attributes, each of its declared type, and every required one. The kernels cannot see
        undeclared names (the onnxruntime C API lists no attributes), so sessions check here."""
        where = f"node {node.name!r}: " if node.name else ""
        by_name = {a.name: a for a in self.attrs}
        for attr in node.attribute:
            a = by_name.get(attr.name)
            if a is None:
                raise OpContractError(self._unknown_attribute(attr.name).replace(": ", f": {where}", 1))
            if attr.type != _ATTR_TYPE_CODE[a.kind]:
                raise OpContractError(
                    f"{self.name}: {where}attribute '{a.name}' must be {a.onnx_type}, got "
                    f"{_attribute_value(attr)} (rule: {a.rule(self.name)})"
                )
        have = {attr.name for attr in node.attribute}
        for a in self.attrs:
            if a.required and a.name not in have:
                raise OpContractError(
                    f"{self.name}: {where}attribute '{a.name}' is required (rule: '{a.name}' is an "
                    f"{a.onnx_type} attribute without a default)"
                )

    # ---- ONNX ------------------------------------------------------------------------------------

    def onnx_schema(self) -> Any:
        """The onnx.defs.OpSchema of this op (so onnx.checker and shape inference know it)."""
        from onnx import defs, helper

        def formal(p: Port) -> defs.OpSchema.FormalParameter:
            option = (
                defs.OpSchema.FormalParameterOption.Optional
                if p.optional
                else defs.OpSchema.FormalParameterOption.Single
            )
            type_str = "T" if p.dtype == "T" else _ONNX_TYPE[p.dtype]
            return defs.OpSchema.FormalParameter(p.name, type_str, p.doc, param_option=option)

        attr_types = {
            int: defs.OpSchema.AttrType.INT,
            float: defs.OpSchema.AttrType.FLOAT,
            str: defs.OpSchema.AttrType.STRING,
        }
        attributes = [
            defs.OpSchema.Attribute(a.name, attr_types[a.kind], a.doc, required=True)
            if a.required
            else defs.OpSchema.Attribute(a.name, helper.make_attribute(a.name, a.default), a.doc)
            for a in self.attrs
        ]
        schema = defs.OpSchema(
            self.name,
            DOMAIN,
            OPSET_VERSION,
            self.doc,
            inputs=[formal(p) for p in self.inputs],
            outputs=[formal(p) for p in self.outputs],
            type_constraints=[("T", [_ONNX_TYPE[t] for t in self.float_types], "float types")],
            attributes=attributes,
        )
        if self.infer_shapes is not None:
            schema.set_type_and_shape_inference_function(self.infer_shapes)
        return schema

    def register_onnx_schema(self, *, replace: bool = True) -> None:
        """Registers :meth:`onnx_schema` with onnx, replacing an earlier registration of this name (with ``replace``
        false, an earlier one stays)."""
        from onnx import defs

        if defs.has(self.name, OPSET_VERSION, DOMAIN):
            if not replace:
                return
            defs.deregister_schema(self.name, OPSET_VERSION, DOMAIN)
        defs.register_schema(self.onnx_schema())

    def function_proto(self, opset: int = BODY_OPSET) -> Any:
        """The portable body as a FunctionProto for a model whose default opset is ``opset``."""
        from softdeploy.errors import ExportError

        if opset not in SUPPORTED_MODEL_OPSETS:
            raise ExportError(
                f"{self.name}: model opset {opset} is not supported for function bodies "
                f"(rule: {SUPPORTED_MODEL_OPSETS.start} <= opset < {SUPPORTED_MODEL_OPSETS.stop}); "
                "convert the model first with onnx.version_converter.convert_version(model, 18)"
            )
        proto = self.function.to_function_proto()
        for imp in proto.opset_import:
            if imp.domain in ("", "ai.onnx"):
                imp.version = opset
        return proto

    def make_node(self, inputs: Sequence[str], outputs: Sequence[str], *, name: str | None = None, **attrs: Any) -> Any:
        """A NodeProto of this op; each attribute is written in its declared type (``temperature=2``
        becomes FLOAT 2.0), and one that does not convert exactly, or is not declared, raises
        OpContractError."""
        from onnx import helper

        node = helper.make_node(self.name, list(inputs), list(outputs), domain=DOMAIN, name=name)
        by_name = {a.name: a for a in self.attrs}
        for key, value in self.coerce_attrs(attrs).items():
            node.attribute.append(helper.make_attribute(key, value, attr_type=_ATTR_TYPE_CODE[by_name[key].kind]))
        return node

    def make_model(
        self, sample: Sample, *, with_function: bool = True, opset: int = BODY_OPSET, outputs: int | None = None
    ) -> Any:
        """A one-node model running this op on ``sample`` (omitted optional inputs stay omitted)."""
        from onnx import helper

        from softdeploy.ops._attach import attach_bodies

        in_names, graph_inputs = [], []
        for port, value in zip(self.inputs, sample.inputs, strict=False):
            if value is None:
                in_names.append("")
                continue
            elem = helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype)
            dims = [f"{port.name}_{i}" for i in range(np.ndim(value))]
            graph_inputs.append(helper.make_tensor_value_info(port.name, elem, dims))
            in_names.append(port.name)
        while in_names and in_names[-1] == "":
            in_names.pop()
        n_out = len(self.outputs) if outputs is None else outputs
        out_ports = self.outputs[:n_out]
        t_type = next(
            (
                np.asarray(v).dtype
                for p, v in zip(self.inputs, sample.inputs, strict=False)
                if p.dtype == "T" and v is not None
            ),
            np.dtype(np.float32),
        )

        def elem(p: Port) -> int:
            return helper.np_dtype_to_tensor_dtype(t_type if p.dtype == "T" else np.dtype(p.dtype))

        # Output ranks from the oracle (the checker wants a shape; dims stay symbolic). Inputs that
        # break the contract get no output shape: the model must still reach the kernel, whose
        # error is what the error tests check.
        attrs = self.coerce_attrs(sample.attrs)
        try:
            ranks: list[int | None] = [np.ndim(r) for r in self.reference(*sample.inputs, **attrs)]
        except OpContractError:
            ranks = [None] * len(out_ports)
        graph_outputs = [
            helper.make_tensor_value_info(p.name, elem(p), None if r is None else [f"{p.name}_{i}" for i in range(r)])
            for p, r in zip(out_ports, ranks, strict=False)
        ]
        node = self.make_node(in_names, [p.name for p in out_ports], **attrs)
        graph = helper.make_graph([node], f"{self.stem}_one_node", graph_inputs, graph_outputs)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, OPSET_VERSION)],
            ir_version=10,
        )
        if not with_function:
            return model
        self.register_onnx_schema(replace=False)
        return attach_bodies(model, {self.name: self})

    def feeds(self, sample: Sample) -> dict[str, np.ndarray]:
        """The sample's inputs by port name, omitted optional inputs left out (a model made by make_model has no graph
        input for them)."""
        return {p.name: v for p, v in zip(self.inputs, sample.inputs, strict=False) if v is not None}

    # ---- torch -----------------------------------------------------------------------------------

    def torch_schema(self) -> str:
        """``softdeploy::<stem>`` schema derived from the ports and attributes."""
        kinds = {int: "int", float: "float", str: "str"}
        args = [f"Tensor{'?' if p.optional else ''} {p.name}{'=None' if p.optional else ''}" for p in self.inputs]
        for a in self.attrs:
            default = "" if a.required else "=" + (f'"{a.default}"' if a.kind is str else repr(a.default))
            args.append(f"{kinds[a.kind]} {a.name}{default}")
        outs = "Tensor" if len(self.outputs) == 1 else "(" + ", ".join("Tensor" for _ in self.outputs) + ")"
        return f"({', '.join(args)}) -> {outs}"


def check_model(model: Any, registry: Mapping[str, OpDef]) -> set[str]:
    """The com.softdeploy op types the ModelProto ``model`` uses. Raises OpContractError unless every
    com.softdeploy node (graph, subgraphs and model-local functions) is an op of ``registry`` with
    valid attributes (:meth:`OpDef.check_node`), and the model imports com.softdeploy at
    OPSET_VERSION, the one version softdeploy implements (onnxruntime would run the version-1
    kernels or bodies for any other: it cannot tell custom-op versions apart)."""
    rule = f"rule: softdeploy implements {DOMAIN} opset version {OPSET_VERSION} only"
    imports = [("the model", model.opset_import)] + [(f"function {f.name!r}", f.opset_import) for f in model.functions]
    for where, opset_import in imports:
        for imp in opset_import:
            if imp.domain == DOMAIN and imp.version != OPSET_VERSION:
                raise OpContractError(f"{where} imports domain {DOMAIN} at opset version {imp.version} ({rule})")
    used: set[str] = set()
    for node in _nodes(model):
        if node.domain != DOMAIN:
            continue
        op = registry.get(node.op_type)
        if op is None:
            where = f" (node {node.name!r})" if node.name else ""
            raise OpContractError(
                f"{node.op_type}: domain {DOMAIN} has no op {node.op_type!r}{where} "
                f"(rule: softdeploy's ops are {sorted(registry)})"
            )
        op.check_node(node)
        used.add(op.name)
    return used


def _nodes(model: Any) -> Iterable[Any]:
    from onnx import AttributeProto

    def walk(nodes: Iterable[Any]) -> Iterable[Any]:
        for node in nodes:
            yield node
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    yield from walk(attr.g.node)
                elif attr.type == AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        yield from walk(g.node)

    yield from walk(model.graph.node)
    for f in model.functions:
        yield from walk(f.node)
