"""What ``softdeploy quantize`` does, as library calls: quantize a model file with user data, or a
case's model with the case's data and task metric, optionally under an accuracy budget."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from softdeploy.quant.quantize import QuantConfig, QuantizationError, QuantizedModel, quantize
from softdeploy.quant.search import BudgetResult, budget_search


def quantize_file(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str],
    config: QuantConfig,
    *,
    data: Any = None,
    metric: Any = None,
    max_drop: float | None,
    threads: int = 1,
    progress: Callable[[str], None] | None = None,
) -> QuantizedModel | BudgetResult:
    """Quantizes an ONNX file with the user's data, optionally under an accuracy budget on the user's metric.

    ``data``: a :class:`softdeploy.workflow.spec.DataSpec` (an .npz, a folder of .npy or a loader; constant
    inputs; labels; separate calibration data), read and checked against the model's inputs before any
    work. ``metric``: a :class:`softdeploy.workflow.spec.MetricSpec` for ``max_drop`` (default: the cosine
    of the first float output to fp32; an integer output is refused as a cosine target). A result with no
    node in int8 is a QuantizationError: the file would be a float model under an int8 name."""
    from softdeploy.files import atomic_output
    from softdeploy.quant.nodes import load_named
    from softdeploy.quant.quantize import check_softdeploy_ops
    from softdeploy.workflow.data import collect_outputs, load_dataset, model_inputs, model_outputs
    from softdeploy.workflow.metrics import resolve
    from softdeploy.workflow.spec import MetricSpec

    # Read and checked here, once, before any work (a bad file or an op softdeploy does not define); the quantizer
    # gets this ModelProto (it quantizes a copy) rather than the path, which it would read again.
    proto = load_named(model)
    check_softdeploy_ops(proto)
    dataset = load_dataset(data, model_inputs(proto)) if data is not None else None
    if config.mode == "static" and dataset is None:
        raise QuantizationError("static quantization needs --data (calibration samples of the model's inputs)")
    calibration = dataset.calibration if dataset is not None and config.mode == "static" else None
    # The model is written beside ``output`` under a temporary name and renamed onto it only once it is complete and
    # holds int8 nodes: an interrupted run or a refused result leaves ``output`` as it was (an --overwrite'd previous
    # model included).
    with atomic_output(output, "quantized model") as target:
        if max_drop is None:
            probe = dataset.batches[:4] if dataset is not None else None  # routing agreement (a model that routes)
            result: QuantizedModel | BudgetResult = quantize(
                proto, target, config, calibration=calibration, probe=probe
            )
        else:
            if dataset is None:
                raise QuantizationError("--max-drop needs data to measure the metric on (--data)")
            from softdeploy.runtime import Session

            outputs = model_outputs(proto)
            chosen = resolve(metric or MetricSpec("cosine"), outputs, dataset.labels is not None)
            names = list(outputs)
            reference = collect_outputs(Session(model, kernels="auto", threads=threads).run, dataset.batches, names)
            sign = 1.0 if chosen.goal == "max" else -1.0  # the search maximises

            def evaluate(path: Path) -> float:
                got = collect_outputs(Session(path, kernels="auto", threads=threads).run, dataset.batches, names)
                return sign * chosen(got, dataset.labels, reference)

            result = budget_search(
                model,
                target,
                config,
                evaluate,
                max_drop=max_drop,
                probe=dataset.batches[:4],
                calibration=calibration,
                metric_name=chosen.label if sign > 0 else f"-{chosen.label} (lower is better)",
                threads=threads,
                progress=progress,
            )
        made = result.model if isinstance(result, BudgetResult) else result
        if not made.quantized_nodes:
            from softdeploy.quant.gemm import gemm_as_matmul_rule

            inits = {t.name: t for t in proto.graph.initializer}
            rules = [gemm_as_matmul_rule(n, inits) for n in proto.graph.node if n.op_type == "Gemm"]
            rules = [r for r in rules if r]
            hint = (
                f"; the model's {len(rules)} Gemm nodes stay float in dynamic mode: {rules[0]}; --mode static takes them"
                if rules and config.mode == "dynamic"
                else ""
            )
            raise QuantizationError(
                f"nothing was quantized in {model}: no node of the op types {list(config.resolved_op_types())} "
                + ("could be int8 within the budget" if isinstance(result, BudgetResult) else "is a candidate")
                + f" ({len(made.float_nodes)} candidates kept in float); {output} would be a float model under an "
                "int8 name (rule: an int8 model has int8 nodes; raise --max-drop, or choose --op-types)" + hint
            )
    made.path = Path(output)
    return result


def quantize_case(
    case: Any,
    output: str | os.PathLike[str],
    config: QuantConfig,
    *,
    max_drop: float | None,
    metric: str | None,
    progress: Any,
    threads: int | None = None,
) -> tuple[Path, QuantizedModel | BudgetResult]:
    """Exports the case's model next to ``output`` (``<stem>.fp32.onnx``) and quantizes it with the
    case's calibration data; with ``max_drop``, under a budget on ``metric`` (default: the case's
    primary task metric; or one of its agreement cosines, e.g. "token cosine")."""
    from softdeploy.compare.metrics import cosine_rows
    from softdeploy.runtime import Session

    threads = threads or os.cpu_count() or 1
    output = Path(output)
    # a task metric is declared by the case (metric_names): checked before its model is prepared or exported; an
    # agreement cosine ("token cosine") is one of its Evaluation.rows, known once the reference is evaluated
    named = list(getattr(case, "metric_names", ()))
    if max_drop is not None and metric and not metric.endswith("cosine") and named and metric not in named:
        raise QuantizationError(
            f"metric {metric!r} is not measured by case {case.name}; choose from {sorted(named)} or one of its "
            "agreement cosines (e.g. 'token cosine')"
        )
    case.prepare(progress)
    fp32 = output.with_name(output.stem + ".fp32.onnx")
    with progress.step(f"export {case.name} to ONNX"):
        case.export_fp32(fp32)
    calibration = case.calibration_feeds() if config.mode == "static" else None
    if max_drop is None:
        with progress.step(f"quantize: {config.describe()}"):
            return fp32, quantize(fp32, output, config, calibration=calibration, probe=case.probe_feeds())
    metric = metric or case.primary_metric
    reference = case.evaluate(Session(fp32, kernels="auto", threads=threads).run, "native", progress, "ort-fp32")
    if metric not in reference.metrics and metric not in reference.rows:
        raise QuantizationError(
            f"metric {metric!r} is not measured by case {case.name}; choose from "
            f"{sorted(reference.metrics) + sorted(reference.rows)}"
        )

    def evaluate(path: Path) -> float:
        ev = case.evaluate(Session(path, kernels="auto", threads=threads).run, "native", progress, path.stem)
        if metric in ev.metrics:
            return float(ev.metrics[metric])
        return float(cosine_rows(reference.rows[metric], ev.rows[metric]).mean())

    fp32_metric = float(reference.metrics[metric]) if metric in reference.metrics else 1.0
    with progress.step(f"budget search: {config.describe()}, {metric} drop <= {max_drop}") as advance:
        result = budget_search(
            fp32,
            output,
            config,
            evaluate,
            max_drop=max_drop,
            probe=case.probe_feeds(),
            calibration=case.calibration_feeds(),
            metric_name=metric,
            threads=threads,
            progress=lambda _s: advance(1),
            fp32_metric=fp32_metric,
        )
    return fp32, result


def report_json(result: QuantizedModel | BudgetResult) -> dict[str, Any]:
    """The JSON report of a quantization: BudgetResult.to_json(), or a plain QuantizedModel's settings and nodes."""
    if isinstance(result, BudgetResult):
        return result.to_json()
    return {
        "model": str(result.path),
        "config": dataclasses.asdict(result.config),
        "quantized_nodes": result.quantized_nodes,
        "float_nodes": result.float_nodes,
        "calibration_kernels": result.calibration_kernels,
        "reduce_range": result.reduce_range,
        "weights": result.weights,
        "int8_target": result.target,
        "int8_format": result.int8_format,
        "seconds": result.seconds,
        "size_bytes": result.size_bytes,
        "routing": result.routing.to_json() if result.routing is not None else None,
    }


def write_report(result: QuantizedModel | BudgetResult, path: str | os.PathLike[str]) -> Path:
    """Writes report_json(result) to ``path`` (the ``<output>.json`` next to a quantized model) and returns it."""
    from softdeploy.files import write_text

    return write_text(path, json.dumps(report_json(result), indent=1, default=str), "quantization report")
