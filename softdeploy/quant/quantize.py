"""int8 quantization of ONNX models (onnxruntime's quantizer, driven so that our custom ops work).

Two modes:
  * ``dynamic``: weights int8 (per output channel by default), activations quantized at run time
    (``MatMulInteger``/``DynamicQuantizeLinear``); no calibration data needed.
  * ``static``: QDQ format -- ``QuantizeLinear``/``DequantizeLinear`` pairs around the quantized
    nodes with activation ranges from calibration data. Calibration runs through
    :func:`softdeploy.quant.calibration.softdeploy_calibration_sessions`, so com.softdeploy nodes run
    our native kernels (or their function bodies when the library is absent) instead of failing.

com.softdeploy nodes are never quantized themselves: they stay in float between a DequantizeLinear
and a QuantizeLinear (static) or simply in float (dynamic), and keep their function bodies.

Activation type follows onnxruntime's CPU guidance: uint8 activations with int8 weights; on a CPU
without VNNI the weights are pair-bounded (:mod:`softdeploy.quant.pair_bounded`: the 8-bit grid, no
same-sign pair of weights large enough to saturate the vpmaddubsw path) or 7-bit (``reduce_range``). The
per-CPU choice is the decision table of :mod:`softdeploy.quant.formats`, recorded in every report.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np

from softdeploy.errors import SoftdeployError
from softdeploy.files import atomic_output, make_folder, write_text
from softdeploy.quant.calibration import as_calibration_reader, softdeploy_calibration_sessions
from softdeploy.quant.formats import _rowwise_kernel_loads as _rowwise_kernel_loads
from softdeploy.quant.formats import _rowwise_vnni_runs as _rowwise_vnni_runs
from softdeploy.quant.formats import table_weights as table_weights
from softdeploy.quant.gemm import gemms_as_matmuls
from softdeploy.quant.nodes import load_named as load_named
from softdeploy.quant.routing import MAX_FLIP_RATE, ROUTING_SEARCH_EVALUATIONS, GuardSearch, RoutingProbe
from softdeploy.quant.rowwise import FORMS as ROWWISE_FORMS
from softdeploy.runtime.session import Kernels

Mode = Literal["dynamic", "static"]
CalibrationMethod = Literal["minmax", "percentile", "entropy"]

# What static QDQ quantizes by default: the GEMM-like ops, where int8 pays. Quantizing everything
# onnxruntime can (Add, LayerNormalization, Reshape, ...) inserts Q/DQ pairs that cost time and,
# on transformers, accuracy (measured on all-MiniLM-L6-v2: see cases/results/minilm_retrieval/).
STATIC_DEFAULT_OP_TYPES = ("MatMul", "Gemm", "Conv")


class QuantizationError(SoftdeployError):
    """Quantization could not be carried out as asked."""


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """How to quantize: ``mode`` dynamic (int8 weights, activations quantized at run time) or static (QDQ with
    calibrated activation ranges); ``per_channel`` weight scales (default) or one per tensor; ``op_types`` (None:
    onnxruntime's integer-op set for dynamic, MatMul/Gemm/Conv for static); ``calibrate_method`` (minmax, percentile,
    entropy); ``exclude``: nodes kept in float; ``only``: quantize just these (the sensitivity probe); ``weights``
    ("8-bit", "7-bit", "pair-bounded", "lane-bounded", "rowwise-8-bit"; None: this CPU's row of
    softdeploy.quant.formats.TABLE -- pair-bounded on x86-64 without VNNI, where unbounded 8-bit products can
    saturate; "lane-bounded" and "rowwise-8-bit": dynamic mode's weight MatMuls become com.softdeploy
    RowwiseInt8MatMul, see softdeploy.quant.rowwise); ``reduce_range``: onnxruntime's spelling,
    True = "7-bit", False = "8-bit" (give one of the two)."""

    mode: Mode = "dynamic"
    per_channel: bool = True
    # None: dynamic -> onnxruntime's integer-op set (MatMul, Conv, Gather, Attention, LSTM, ...);
    # static -> STATIC_DEFAULT_OP_TYPES.
    op_types: tuple[str, ...] | None = None
    calibrate_method: CalibrationMethod = "minmax"
    exclude: tuple[str, ...] = ()  # node names kept in float
    only: tuple[str, ...] | None = None  # quantize only these nodes (the sensitivity probe)
    reduce_range: bool | None = None  # onnxruntime's spelling of weights "7-bit" (True) / "8-bit" (False)
    weights: str | None = None  # formats.WEIGHTS; None: the CPU's row of formats.TABLE
    # formats.TARGETS: the CPU class the model is for (None: SOFTDEPLOY_INT8_TARGET, else "auto", this CPU's row)
    target: str | None = None
    # a model that routes: keep the routers' input path in float when int8 flips more than max_flip_rate of the
    # probe tokens' experts at any LoRAMixer node (softdeploy.quant.routing)
    routing_guard: bool = True
    max_flip_rate: float = MAX_FLIP_RATE
    # the guard's sensitivity search may take this many quantize + probe runs (softdeploy.quant.routing.search_guard:
    # one per candidate on the routers' input path, then a bisection); a model with more candidates there gets the
    # coarse stages (the nearest residual-stream writers, then everything upstream)
    routing_search_evaluations: int = ROUTING_SEARCH_EVALUATIONS

    def resolved_target(self) -> str:
        """The deployment target (formats.TARGETS): ``target``, else SOFTDEPLOY_INT8_TARGET (how `compare` and Case
        runs, which build their own configs, take one), else "auto"; QuantizationError for an unknown one."""
        from softdeploy.quant.formats import TARGETS

        target = self.target or os.environ.get("SOFTDEPLOY_INT8_TARGET") or "auto"
        if target not in TARGETS:
            source = "target" if self.target else "SOFTDEPLOY_INT8_TARGET"
            raise QuantizationError(f"{source} {target!r} is not one of {list(TARGETS)}")
        return target

    def asked_weights(self) -> str | None:
        """The weight format asked for (``weights``, or ``reduce_range`` translated), None for the table's;
        QuantizationError for an unknown format or a ``reduce_range`` that contradicts ``weights``."""
        from softdeploy.quant.formats import WEIGHTS

        if self.weights is not None and self.weights not in WEIGHTS:
            raise QuantizationError(f"weights {self.weights!r} is not one of {sorted(WEIGHTS)}")
        from_range = None if self.reduce_range is None else ("7-bit" if self.reduce_range else "8-bit")
        if self.weights is not None and from_range is not None and from_range != self.weights:
            raise QuantizationError(
                f"weights {self.weights!r} contradicts reduce_range={self.reduce_range} (rule: give one of the two)"
            )
        return self.weights or from_range

    def describe(self) -> str:
        """One line for reports, e.g. 'int8 static, per-channel, QDQ, minmax calibration, 3 node(s) kept in float'."""
        parts = [
            f"int8 {self.mode}",
            "per-channel" if self.per_channel else "per-tensor",
        ]
        if self.mode == "static":
            parts.append(f"QDQ, {self.calibrate_method} calibration")
        if self.exclude:
            parts.append(f"{len(self.exclude)} node(s) kept in float")
        return ", ".join(parts)

    def with_exclude(self, nodes: Sequence[str]) -> QuantConfig:
        """This config with ``nodes`` kept in float (replacing the exclusions)."""
        return dataclasses.replace(self, exclude=tuple(nodes))

    def resolved_op_types(self) -> tuple[str, ...]:
        """The op types that will be quantized: ``op_types``, or the mode's default set."""
        if self.op_types is not None:
            return self.op_types
        if self.mode == "static":
            return STATIC_DEFAULT_OP_TYPES
        from onnxruntime.quantization.registry import IntegerOpsRegistry

        # Gemm too: quantize() rewrites it as MatMul + Add first (softdeploy.quant.gemm), which onnxruntime's
        # integer ops and softdeploy's formats both take
        return tuple(sorted(set(IntegerOpsRegistry) | {"Gemm"}))


@dataclasses.dataclass
class QuantizedModel:
    """A quantized model written to ``path``: its config, the candidate nodes that run in int8 and those left in float,
    which kernels ran the calibration (static), the weight format (formats.WEIGHTS; ``reduce_range``: 7-bit) and how
    long it took."""

    path: Path
    config: QuantConfig
    quantized_nodes: list[str]  # candidate nodes that now run in int8
    float_nodes: list[str]  # candidate nodes left in float (excluded, or the quantizer declined)
    calibration_kernels: str | None  # static: "native" or "portable" (function bodies)
    seconds: float
    # the int8 format chosen for this CPU and why (formats.Int8Format.line); says so when another was asked
    int8_format: str = ""
    weights: str = "8-bit"  # formats.WEIGHTS: what the int8 weights are
    target: str = ""  # the CPU class the model is for, as its metadata records it (formats.TARGET_KEY)
    # a model that routes (LoRAMixer nodes): routing agreement with fp32 and the nodes kept in float to protect it
    routing: Any = None  # softdeploy.quant.routing.RoutingReport

    @property
    def reduce_range(self) -> bool:
        """Whether the weights are 7-bit (onnxruntime's ``reduce_range``)."""
        return self.weights == "7-bit"

    @property
    def size_bytes(self) -> int:
        """The model file's size in bytes."""
        return self.path.stat().st_size


def cpu_has_vnni() -> bool:
    """Whether this CPU has VNNI (AVX512-VNNI or AVX-VNNI) as softdeploy detects it (SOFTDEPLOY_TEST_CPU emulates a
    CPU without it): without it onnxruntime's u8s8 products can saturate, so weights are quantized to 7 bits."""
    from softdeploy.quant.formats import int8_cpu_class

    return int8_cpu_class() == "vnni"


def check_softdeploy_ops(model: Any) -> None:
    """Refuses a model with a com.softdeploy node whose op type softdeploy does not define (in the graph,
    its subgraphs or its functions): no kernel or schema runs it, so the quantized model could not run
    either. Named by node and op, before any work."""
    from softdeploy.domain import DOMAIN
    from softdeploy.ops import REGISTRY

    def walk(nodes: Any, where: str) -> Any:
        for node in nodes:
            yield node, where
            for attr in node.attribute:
                for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from walk(g.node, f"{where}, subgraph of {node.name or node.op_type!r}")

    ours = {(f.domain, f.name) for f in model.functions if f.domain == DOMAIN}
    nodes = list(walk(model.graph.node, "graph"))
    for f in model.functions:
        if (f.domain, f.name) not in ours:
            nodes += list(walk(f.node, f"function {f.domain}.{f.name}"))
    bad = [
        f"node {n.name or '(unnamed)'!r} ({where}): {DOMAIN}.{n.op_type}"
        for n, where in nodes
        if n.domain == DOMAIN and n.op_type not in REGISTRY
    ]
    if bad:
        raise QuantizationError(
            f"the model uses op(s) softdeploy does not define: {'; '.join(bad)} (softdeploy's ops: {sorted(REGISTRY)})"
        )


def activation_matmuls(model: Any) -> set[str]:
    """MatMul nodes whose second input is not a constant (attention scores, attention x values).
    Both modes keep them in float: dynamic mode does so by onnxruntime's default (MatMulConstBOnly),
    which its QDQ quantizer ignores -- so static mode excludes them explicitly. int8 there costs
    accuracy for little speed at these sizes."""
    constants = _constants(model)
    return {n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] not in constants}


def candidate_nodes(model: Any, config: QuantConfig) -> list[tuple[str, str]]:
    """(name, op_type) of the nodes the quantizer may turn into int8 under ``config``, in graph
    order: nodes of the configured op types that carry a weight (a constant input) -- the ones int8
    makes smaller and faster -- without activation x activation MatMuls."""
    types = set(config.resolved_op_types())
    skip = activation_matmuls(model)
    constants = _constants(model)
    return [
        (n.name, n.op_type)
        for n in model.graph.node
        if n.op_type in types
        and n.domain in ("", "ai.onnx")
        and n.name not in skip
        and any(i in constants for i in n.input)
    ]


def _constants(model: Any) -> set[str]:
    out = {i.name for i in model.graph.initializer}
    return out | {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}


def node_scope(model: Any, name: str) -> str:
    """The torch module a node came from (torch.onnx records it), e.g.
    "m.encoder.layer.0.output.dense"; "" when unknown."""
    import ast

    for node in model.graph.node:
        if node.name == name:
            for prop in node.metadata_props:
                if prop.key == "pkg.torch.onnx.name_scopes":
                    try:
                        scopes = ast.literal_eval(prop.value)
                    except (ValueError, SyntaxError):
                        return ""
                    # the last entry is the op's own name (e.g. "linear_5"), the one before the module
                    return str(scopes[-2]) if len(scopes) >= 2 else ""
    return ""


def _quantized_names(out_model: Any, candidates: Sequence[tuple[str, str]], mode: Mode) -> list[str]:
    nodes = list(out_model.graph.node)
    if mode == "dynamic":
        # onnxruntime replaces a quantized node by integer ops under new names; a candidate that is still there with
        # its op type was not quantized -- unless it now reads an 8-bit integer initializer: an embedding Gather keeps
        # its name and op type and gathers from the uint8 table (a DequantizeLinear follows it).
        from onnx import TensorProto

        int8 = {t.name for t in out_model.graph.initializer if t.data_type in (TensorProto.INT8, TensorProto.UINT8)}
        still_float = {(n.name, n.op_type) for n in nodes if not any(i in int8 for i in n.input)}
        # a Gemm kept in float that onnxruntime rewrote as a float MatMul "<name>_MatMul" (see quantize)
        still_float |= {(name[: -len("_MatMul")], "Gemm") for name, op in still_float if op == "MatMul"}
        return [name for name, op in candidates if (name, op) not in still_float]
    # QDQ: a node runs in int8 when its weight arrives through a DequantizeLinear of an int8
    # initializer (an activation input may come through a DQ even for a float node: the QDQ pair
    # belongs to the producer's output).
    producer = {o: n for n in nodes for o in n.output}
    inits = {i.name for i in out_model.graph.initializer}
    by_name = {n.name: n for n in nodes}
    out = []
    for name, _ in candidates:
        node = by_name.get(name)
        if node is None:
            continue
        for i in node.input:
            p = producer.get(i)
            if p is not None and p.op_type == "DequantizeLinear" and p.input[0] in inits:
                out.append(name)
                break
    return out


class _DropPreprocessHint(logging.Filter):
    """onnxruntime logs "Please consider to run pre-processing before quantization" on every call;
    softdeploy's exports are already shape-inferred and the hint only buries real warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-process" not in record.getMessage()


@contextmanager
def _quiet_quantizer() -> Iterator[None]:
    root = logging.getLogger()
    hint = _DropPreprocessHint()
    root.addFilter(hint)
    try:
        yield
    finally:
        root.removeFilter(hint)


def quantize(
    model: str | os.PathLike[str] | Any,
    output: str | os.PathLike[str],
    config: QuantConfig = QuantConfig(),
    *,
    calibration: Sequence[Mapping[str, np.ndarray]] | None = None,
    calibration_cache: str | os.PathLike[str] | None = None,
    kernels: Kernels = "auto",
    probe: Sequence[Mapping[str, np.ndarray]] | None = None,
    routing_hint: QuantizedModel | None = None,
) -> QuantizedModel:
    """Quantizes ``model`` (path or ModelProto) to ``output`` under ``config``.

    ``calibration`` (static mode): input batches, e.g. a few hundred real samples. With
    ``calibration_cache`` (a JSON path) the activation ranges are computed once and reused by later
    calls (the sensitivity search quantizes the same model many times).

    A model that routes (LoRAMixer nodes) has its routing agreement with fp32 measured per node on ``probe`` (else
    the calibration batches, else synthetic feeds) and, with ``config.routing_guard`` (default) and any node past
    ``config.max_flip_rate``, is quantized again with the fewest candidates on the flipping routers' input path kept
    in float that bring every node within it, found by sensitivity (softdeploy.quant.routing.search_guard; past
    ``config.routing_search_evaluations`` quantize + probe runs, the coarse stages: the nearest residual-stream
    writers, then every candidate upstream); ``QuantizedModel.routing`` reports both measures, the nodes kept and
    their measured effect. ``routing_hint``: a model this call's search may start from (--max-drop's all-int8 model:
    its ranking is reused and its kept set tried first). The sensitivity probe (``config.only``) skips all this."""
    made = _quantize_once(model, output, config, calibration, calibration_cache, kernels)
    if config.only is not None or config.mode not in ("dynamic", "static"):
        return made
    proto = load_named(model)
    from softdeploy.quant import routing

    if not routing.mixer_nodes(proto):
        return made
    t0 = time.perf_counter()
    feeds, described = routing.probe_for(proto, probe, calibration)
    measured = routing.RoutingProbe(proto, feeds)
    before, errors = measured.evaluate(made.path)
    bad = routing.flipping(before, config.max_flip_rate)
    if not bad or not config.routing_guard:
        reason = (
            f"every node within {config.max_flip_rate:.0%} flipped tokens"
            if not bad
            else f"{len(bad)} node(s) past {config.max_flip_rate:.0%} flipped tokens, guard off (routing_guard=False)"
        )
        made.routing = routing.RoutingReport(before, before, [], reason, described, config.max_flip_rate)
        return _with_routing_note(made, t0)
    names = [n for n, _ in candidate_nodes(proto, config)]
    flipped = [r.node for r in bad]
    first_seconds = made.seconds  # the guard's own quantize runs are counted in the routing time (from t0)
    upstream = [n for n in routing.guard_nodes(proto, flipped, names, config.mode) if n not in config.exclude]
    hint = routing_hint.routing.search if routing_hint is not None and routing_hint.routing is not None else None
    if upstream and routing.search_evaluations(len(upstream)) <= config.routing_search_evaluations:
        made, found = _search_routing_guard(
            model, output, config, calibration, calibration_cache, kernels, measured, upstream, flipped, errors, hint
        )
        reason = routing.describe_guard(bad, config.max_flip_rate, "search", found)
        made.seconds = first_seconds
        made.routing = routing.RoutingReport(
            before, found.after, list(found.kept), reason, described, config.max_flip_rate, found
        )
        return _with_routing_note(made, t0)
    # Too many candidates for the search's evaluations: first the residual stream's writers nearest to the routers
    # (fewer nodes in float); where routing still flips past the limit, everything upstream of the routers' input.
    for stage in ("nearest", "upstream"):  # the stage that held is reported after the loop
        guard = [
            n
            for n in routing.guard_nodes(proto, flipped, names, config.mode, nearest=stage == "nearest")
            if n not in config.exclude
        ]
        made = _quantize_keeping_float(model, output, config, guard, calibration, calibration_cache, kernels)
        after, _ = measured.evaluate(made.path)
        if not routing.flipping(after, config.max_flip_rate):
            break
    made.seconds = first_seconds
    made.routing = routing.RoutingReport(
        before,
        after,
        guard,
        routing.describe_guard(bad, config.max_flip_rate, stage),
        described,
        config.max_flip_rate,
    )
    return _with_routing_note(made, t0)


def _search_routing_guard(
    model: str | os.PathLike[str] | Any,
    output: str | os.PathLike[str],
    config: QuantConfig,
    calibration: Sequence[Mapping[str, np.ndarray]] | None,
    calibration_cache: str | os.PathLike[str] | None,
    kernels: Kernels,
    measured: RoutingProbe,
    upstream: Sequence[str],
    flipped: Sequence[str],
    errors: Mapping[str, float],
    hint: GuardSearch | None,
) -> tuple[QuantizedModel, GuardSearch]:
    """The routing guard by sensitivity (softdeploy.quant.routing.search_guard): every model it tries is written to a
    private folder and only the chosen one to ``output``; static mode calibrates once for all of them. Returns the
    chosen model and the search."""
    import shutil

    from softdeploy.files import write_with
    from softdeploy.quant import routing

    make_folder(Path(output).parent)
    with tempfile.TemporaryDirectory(prefix="softdeploy-routing-") as tmp:
        work = Path(tmp)
        cache = calibration_cache
        if cache is None and config.mode == "static":
            cache = work / "calibration.json"

        def alone(node: str) -> Path:
            only = dataclasses.replace(config, only=(node,))
            return _quantize_once(model, work / "alone.onnx", only, calibration, cache, kernels).path

        def with_float(nodes: Sequence[str]) -> tuple[Path, QuantizedModel]:
            made = _quantize_keeping_float(
                model, work / f"keep{len(nodes)}.onnx", config, nodes, calibration, cache, kernels
            )
            return made.path, made

        found = routing.search_guard(
            upstream, flipped, measured, errors, alone, with_float, config.max_flip_rate, hint=hint
        )
        chosen: QuantizedModel = found.model
        write_with(Path(output), lambda t: shutil.copyfile(chosen.path, t), "quantized model")
        chosen.path = Path(output)
    return chosen, found


def _quantize_keeping_float(
    model: str | os.PathLike[str] | Any,
    output: str | os.PathLike[str],
    config: QuantConfig,
    nodes: Sequence[str],
    calibration: Sequence[Mapping[str, np.ndarray]] | None,
    calibration_cache: str | os.PathLike[str] | None,
    kernels: Kernels,
) -> QuantizedModel:
    """One run of the quantizer under ``config`` with ``nodes`` kept in float as well (the routing guard's models),
    reported under the caller's ``config``."""
    kept = dataclasses.replace(config, exclude=tuple(config.exclude) + tuple(nodes))
    made = _quantize_once(model, output, kept, calibration, calibration_cache, kernels)
    made.config = config
    return made


def _with_routing_note(made: QuantizedModel, t0: float) -> QuantizedModel:
    """``made`` with the routing measure's time counted and its line after the format line: the one line that the
    quantize text report and compare's quantization section print for a quantized model."""
    made.seconds += time.perf_counter() - t0
    made.int8_format = "; ".join(p for p in (made.int8_format, made.routing.line()) if p)
    return made


def _quantize_once(
    model: str | os.PathLike[str] | Any,
    output: str | os.PathLike[str],
    config: QuantConfig,
    calibration: Sequence[Mapping[str, np.ndarray]] | None,
    calibration_cache: str | os.PathLike[str] | None,
    kernels: Kernels,
) -> QuantizedModel:
    """One run of the quantizer under ``config`` (see quantize)."""
    from onnxruntime.quantization import CalibrationMethod as OrtCalibrationMethod
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    from softdeploy.ops import register_onnx_schemas

    register_onnx_schemas()  # the quantizer's shape inference must know com.softdeploy ops
    t0 = time.perf_counter()
    if not isinstance(model, str | os.PathLike):
        import onnx

        copy = onnx.ModelProto()  # the rewrites below work in place: the caller's model stays float
        copy.CopyFrom(model)
        model = copy
    proto = load_named(model)
    check_softdeploy_ops(proto)
    candidates = candidate_nodes(proto, config)
    names = {n for n, _ in candidates}
    unknown = sorted((set(config.exclude) | set(config.only or ())) - {n.name for n in proto.graph.node})
    if unknown:
        raise QuantizationError(f"nodes {unknown} are not in the model (node names: see `softdeploy quantize --list`)")
    import onnx

    gemm_matmuls: set[str] = set()
    if config.mode == "dynamic":
        # Dynamic int8 has no Gemm op: the selected Gemms become MatMul (+ Add) under their own names, and from here
        # on are candidates of type MatMul (what the quantizers see, and what _quantized_names checks).
        selected = {
            n
            for n, t in candidates
            if t == "Gemm" and n not in config.exclude and (config.only is None or n in config.only)
        }
        if selected and proto is model:
            proto, caller = onnx.ModelProto(), proto
            proto.CopyFrom(caller)  # the caller's model keeps its Gemms
        gemm_matmuls = set(gemms_as_matmuls(proto, selected))
        candidates = [(n, "MatMul" if n in gemm_matmuls else t) for n, t in candidates]

    from softdeploy.quant.formats import int8_cpu_class, int8_format, target_weights, weights_line, weights_why

    chosen = int8_format()
    asked = config.asked_weights()
    target = config.resolved_target()
    table_weights_row = chosen.weights_for(config.mode)
    weights = asked or table_weights_row
    format_note = chosen.line(config.mode)
    for_target, target_why = target_weights(target, config.mode)
    if asked is not None and asked != (for_target or table_weights_row):
        format_note = weights_line(
            asked,
            config.mode,
            f"as asked, not the {for_target or table_weights_row} weights of target {target}"
            if for_target
            else f"{asked} weights as asked, not the table's {table_weights_row} (this {chosen.cpu_class} CPU's)"
            + (f"; {asked}: {weights_why(asked, config.mode)}" if weights_why(asked, config.mode) else ""),
            per_channel=config.per_channel,
        )
    elif for_target is not None:
        weights = for_target
        format_note = weights_line(
            weights, config.mode, f"for target {target}: {target_why}", per_channel=config.per_channel
        )
    if asked is None and for_target is None:
        weights, why_not = table_weights(config.mode, config.per_channel, chosen)
        if why_not:
            format_note = weights_line(
                weights,
                config.mode,
                f"onnxruntime's format instead of {table_weights_row} (this {chosen.cpu_class} CPU's row): {why_not}",
                per_channel=config.per_channel,
            )
    # what the model records as its target: the class this CPU is for "auto" (the model was written for it)
    recorded_target = int8_cpu_class() if target == "auto" else target
    op_types = list(config.resolved_op_types())
    if gemm_matmuls and "MatMul" not in op_types:
        op_types.append("MatMul")  # the rewritten Gemms only: `only` below keeps the model's own MatMuls out
    exclude = [n for n in config.exclude if n in names]
    if config.mode == "static":
        exclude += sorted(activation_matmuls(proto))
    else:
        # onnxruntime's dynamic quantizer rewrites each Gemm it can into a MatMul "<name>_MatMul" (+ Add) and quantizes
        # that: the Gemms still here were excluded or left out on purpose, so their MatMul is excluded under that name
        exclude += [f"{n.name}_MatMul" for n in proto.graph.node if n.op_type == "Gemm"]
    only = [n for n in config.only if n in names] if config.only is not None else None
    if gemm_matmuls and "MatMul" not in config.resolved_op_types() and only is None:
        only = sorted(names)
    output = Path(output)
    make_folder(output.parent)
    # Everything onnxruntime's quantizer and the rewrites below write goes to a temporary file beside ``output``,
    # renamed onto it once the model is complete: a kill, Ctrl-C or full disk leaves the previous file (or none).
    with atomic_output(output, "quantized model") as target:

        def run_quantizer(reduce_range: bool) -> str | None:
            """onnxruntime's quantizer on ``proto`` into ``target``; the kernels that ran the calibration (static)."""
            with tempfile.TemporaryDirectory(prefix="softdeploy-quant-") as tmp, _quiet_quantizer():
                src = Path(tmp) / "named.onnx"
                onnx.save(proto, src)  # a private temporary folder: never a result
                if config.mode == "dynamic":
                    quantize_dynamic(
                        src,
                        target,
                        weight_type=QuantType.QInt8,
                        per_channel=config.per_channel,
                        reduce_range=reduce_range,
                        op_types_to_quantize=op_types,
                        nodes_to_quantize=only,
                        nodes_to_exclude=exclude,
                    )
                    return None
                if config.mode != "static":
                    raise QuantizationError(f"mode must be 'dynamic' or 'static', not {config.mode!r}")
                cache = Path(calibration_cache) if calibration_cache is not None else None
                if not calibration and not (cache is not None and cache.is_file()):
                    raise QuantizationError("static quantization needs calibration data (input batches)")
                method = {
                    "minmax": OrtCalibrationMethod.MinMax,
                    "percentile": OrtCalibrationMethod.Percentile,
                    "entropy": OrtCalibrationMethod.Entropy,
                }[config.calibrate_method]
                with softdeploy_calibration_sessions(kernels=kernels) as record:
                    quantize_static(
                        src,
                        target,
                        as_calibration_reader(calibration) if calibration else None,
                        quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=op_types,
                        per_channel=config.per_channel,
                        reduce_range=reduce_range,
                        activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8,
                        nodes_to_quantize=only,
                        nodes_to_exclude=exclude,
                        calibrate_method=method,
                        calibration_cache_path=cache,
                    )
                if record.kernels is None:
                    return calibration_kernels_from_cache(cache)
                if cache is not None:
                    write_text(cache.with_suffix(".kernels"), record.kernels, "calibration kernels note")
                return record.kernels

        if weights in ROWWISE_FORMS:
            # The weight MatMuls become RowwiseInt8MatMul (softdeploy.quant.rowwise); onnxruntime's dynamic quantizer
            # then takes the other candidates (embedding Gathers, Conv, ...) in its own 8-bit format.
            if config.mode != "dynamic" or not config.per_channel:
                raise QuantizationError(
                    f"{weights} weights are a dynamic, per-channel format (RowwiseInt8MatMul quantizes its activations "
                    f"per row at run time, its weights per output channel); got mode {config.mode!r}, "
                    f"{'per-channel' if config.per_channel else 'per-tensor'}: use 8-bit, 7-bit or pair-bounded weights"
                )
            from softdeploy.quant.rowwise import rewrite_matmuls

            levels, groups = ROWWISE_FORMS[weights]
            if proto is model:  # the rewrite is in place: the caller's ModelProto keeps its MatMuls
                proto, caller = onnx.ModelProto(), proto
                proto.CopyFrom(caller)
            matmuls = {name for name, op_type in candidates if op_type == "MatMul"}
            rewrite_matmuls(
                proto,
                levels=levels,
                groups=groups,
                only=matmuls if only is None else matmuls & set(only),
                exclude=exclude,
            )
            rest = [(n, t) for n, t in candidates if t != "MatMul" and (only is None or n in only) and n not in exclude]
            calibration_kernels = None
            if rest:
                op_types, only = sorted({t for _, t in rest}), [n for n, _ in rest]
                run_quantizer(reduce_range=False)
                out_model = onnx.load(os.fspath(target))
            else:
                onnx.save(proto, os.fspath(target))
                out_model = proto
        else:
            calibration_kernels = run_quantizer(reduce_range=weights == "7-bit")
            out_model = onnx.load(os.fspath(target))
            if weights == "pair-bounded":
                why_not = _bound_pairs(out_model, proto)  # the 8-bit model's int8 MatMul weights, rewritten in place
                if why_not:
                    weights = "7-bit"
                    format_note = (
                        weights_line("7-bit", config.mode, "", per_channel=config.per_channel)
                        + f"; 7-bit weights instead of pair-bounded: {why_not} ({format_note})"
                    )
                    calibration_kernels = run_quantizer(reduce_range=True)
                    out_model = onnx.load(os.fspath(target))
                else:
                    onnx.save(out_model, os.fspath(target))
    # The model says what it was quantized for, so Session and `softdeploy doctor MODEL` can tell a CPU that runs
    # its format on a slower path than its target's.
    _record_target(out_model, output, recorded_target, weights)
    # A rewritten MatMul (RowwiseInt8MatMul) or a quantized node no longer stands under its name and op type.
    quantized = _quantized_names(out_model, candidates, config.mode)
    qset = set(quantized)
    return QuantizedModel(
        path=output,
        config=config,
        quantized_nodes=quantized,
        float_nodes=[n for n, _ in candidates if n not in qset],
        calibration_kernels=calibration_kernels,
        seconds=time.perf_counter() - t0,
        int8_format=format_note,
        weights=weights,
        target=recorded_target,
    )


def _record_target(out_model: Any, output: Path, target: str, weights: str) -> None:
    """Writes the deployment target and weight format into the quantized model's metadata_props (formats.TARGET_KEY,
    FORMAT_KEY) and saves it to ``output`` again, atomically."""
    import onnx

    from softdeploy.quant.formats import set_int8_metadata

    set_int8_metadata(out_model, target, weights)
    with atomic_output(output, "quantized model") as target_path:
        onnx.save(out_model, os.fspath(target_path))


def _bound_pairs(model: Any, source: Any) -> str:
    """Rewrites the int8 MatMul weights of the quantized ``model`` (in place) to pair-bounded ones from their float
    weights in ``source``; "" when done, else why pair-bounded weights do not apply (the caller then quantizes again
    with 7-bit weights)."""
    from softdeploy.quant.pair_bounded import bound_weight_pairs, unbounded_gemm_weights

    try:
        done = bound_weight_pairs(model, source)
    except ValueError as e:
        return str(e)
    left = unbounded_gemm_weights(model, set(done))
    if left:
        return (
            f"int8 weights of GEMM-like ops other than MatMul ({', '.join(left[:3])}{', ...' if len(left) > 3 else ''})"
        )
    return ""


def calibration_kernels_from_cache(cache: Path | None) -> str | None:
    """Ranges loaded from a cache file: the kernels that produced them are recorded beside it."""
    if cache is None:
        return None
    marker = cache.with_suffix(".kernels")
    return marker.read_text().strip() if marker.is_file() else None
