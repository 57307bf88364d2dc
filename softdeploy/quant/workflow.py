"""What ``softdeploy quantize`` does, as library calls: quantize a model file with user data, or a
case's model with the case's data and task metric, optionally under an accuracy budget."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.quant.quantize import QuantConfig, QuantizationError, QuantizedModel, quantize
from softdeploy.quant.search import BudgetResult, budget_search, output_cosine

OUTPUT_COSINE = "output cosine"


def load_npz_batches(path: str | os.PathLike[str], batch: int = 8) -> list[dict[str, np.ndarray]]:
    """An .npz of arrays named like the model inputs, samples along axis 0 -> batches of ``batch``."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    if not arrays:
        raise QuantizationError(f"{path} holds no arrays")
    n = {len(a) for a in arrays.values()}
    if len(n) != 1:
        raise QuantizationError(
            f"{path}: arrays differ in length along axis 0: { {k: len(a) for k, a in arrays.items()} }"
        )
    total = n.pop()
    return [{k: a[s : s + batch] for k, a in arrays.items()} for s in range(0, total, batch)]


def quantize_file(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str],
    config: QuantConfig,
    *,
    data: list[dict[str, np.ndarray]] | None,
    max_drop: float | None,
    threads: int = 1,
    progress: Callable[[str], None] | None = None,
) -> QuantizedModel | BudgetResult:
    """Without ``max_drop``: plain quantization. With it: the budget search on the mean cosine of the
    model's first output to fp32 over ``data`` (fp32 scores 1.0)."""
    if max_drop is None:
        return quantize(model, output, config, calibration=data)
    if not data:
        raise QuantizationError("--max-drop needs data to measure accuracy on (--data inputs.npz)")
    from softdeploy.runtime import Session

    reference = [Session(model, kernels="auto", threads=threads).run(f)[0] for f in data]

    def evaluate(path: Path) -> float:
        session = Session(path, kernels="auto", threads=threads)
        return output_cosine(reference, [session.run(f)[0] for f in data])

    return budget_search(
        model,
        output,
        config,
        evaluate,
        max_drop=max_drop,
        probe=data[:4],
        calibration=data,
        metric_name=OUTPUT_COSINE,
        threads=threads,
        progress=progress,
        fp32_metric=1.0,
    )


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
    case.prepare(progress)
    fp32 = output.with_name(output.stem + ".fp32.onnx")
    with progress.step(f"export {case.name} to ONNX"):
        case.export_fp32(fp32)
    calibration = case.calibration_feeds() if config.mode == "static" else None
    if max_drop is None:
        with progress.step(f"quantize: {config.describe()}"):
            return fp32, quantize(fp32, output, config, calibration=calibration)
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
    if isinstance(result, BudgetResult):
        return result.to_json()
    return {
        "model": str(result.path),
        "config": dataclasses.asdict(result.config),
        "quantized_nodes": result.quantized_nodes,
        "float_nodes": result.float_nodes,
        "calibration_kernels": result.calibration_kernels,
        "reduce_range": result.reduce_range,
        "seconds": result.seconds,
        "size_bytes": result.size_bytes,
    }


def write_report(result: QuantizedModel | BudgetResult, path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.write_text(json.dumps(report_json(result), indent=1, default=str))
    return path
