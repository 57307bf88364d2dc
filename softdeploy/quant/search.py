"""Accuracy budget: find the nodes too sensitive to quantize and keep them in float.

Given a task metric (higher is better) and a budget ``max_drop``:

1. evaluate the fp32 model and the fully quantized one; within budget -> done, nothing kept.
2. sensitivity of each candidate node: quantize *that node alone* and measure how far the model's
   outputs move from fp32 on a few probe batches (1 - mean cosine of the output rows). This is the
   "why" of the report: a node is kept because quantizing it alone costs the most.
   A model that routes (LoRAMixer nodes) keeps its routers' input path in float in every candidate model when int8
   flips the experts of more than 2% of the probe tokens (softdeploy.quant.routing): the budget then applies to
   what routing leaves in int8.
3. keep the k most sensitive nodes in float for k = 1, 2, 4, ... until the task metric is within
   budget, then bisect between the last failing and the first passing k: the smallest such k
   (the search assumes the drop shrinks as more nodes stay in float; each trial is recorded, so a
   non-monotone case is visible in the report).

Every trial quantizes for real and evaluates the real metric; static mode calibrates once (the
activation ranges are cached) and reuses the ranges for every trial.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.errors import ArgumentError
from softdeploy.quant.quantize import (
    QuantConfig,
    QuantizationError,
    QuantizedModel,
    candidate_nodes,
    load_named,
    node_scope,
    quantize,
)
from softdeploy.runtime.session import Kernels

Evaluate = Callable[[Path], float]  # model path -> task metric (higher is better)


@dataclasses.dataclass(frozen=True)
class NodeSensitivity:
    """How much quantizing one node alone moves the outputs: the mean output cosine to fp32 with only that node in int8,
    its rank (1 = most sensitive) and the torch module it came from when the exporter recorded it."""

    node: str
    op_type: str
    cosine_alone: float  # mean output cosine to fp32 when only this node is quantized
    rank: int  # 1 = most sensitive
    scope: str = ""  # the torch module it came from, when the exporter recorded it

    @property
    def drop_alone(self) -> float:
        """1 - cosine_alone: the output drift this node causes by itself."""
        return 1.0 - self.cosine_alone


@dataclasses.dataclass(frozen=True)
class Trial:
    """One step of the budget search: with the ``kept_float`` most sensitive nodes in float, the metric, its drop from
    fp32 and whether that is within budget."""

    kept_float: int  # how many of the most sensitive nodes stayed in float
    metric: float
    drop: float
    within_budget: bool


@dataclasses.dataclass
class BudgetResult:
    """The outcome of ``budget_search``: the metric and budget, the metric at fp32, fully int8 and as written, the nodes
    kept in float (most sensitive first) and why (every candidate's sensitivity), the trials and the written model."""

    metric_name: str
    max_drop: float
    fp32_metric: float
    full_int8_metric: float
    final_metric: float
    kept: list[NodeSensitivity]  # kept in float, most sensitive first
    sensitivities: list[NodeSensitivity]  # every candidate, most sensitive first (empty if not needed)
    trials: list[Trial]
    model: QuantizedModel

    @property
    def met(self) -> bool:
        """Whether the written model's metric drop from fp32 is within ``max_drop``."""
        return self.fp32_metric - self.final_metric <= self.max_drop

    def explain(self) -> list[str]:
        """One line per decision, in words."""
        lines = [
            f"{self.metric_name}: fp32 {self.fp32_metric:.4f}, all candidates int8 {self.full_int8_metric:.4f} "
            f"(drop {self.fp32_metric - self.full_int8_metric:+.4f}; budget {self.max_drop})"
        ]
        if self.model.routing is not None:
            lines.append(self.model.routing.line())
        if not self.sensitivities:
            lines.append("within budget with every candidate quantized: nothing kept in float")
            return lines
        n = len(self.sensitivities)
        for s in self.kept:
            where = f", {s.scope}" if s.scope else ""
            lines.append(
                f"keep {s.node} ({s.op_type}{where}) in float: quantizing it alone moves the output to cosine "
                f"{s.cosine_alone:.5f} (rank {s.rank} of {n} candidates)"
            )
        for t in self.trials:
            verdict = "within budget" if t.within_budget else "over budget"
            lines.append(f"trial: top {t.kept_float} kept in float -> {self.metric_name} {t.metric:.4f} ({verdict})")
        if self.met:
            lines.append(
                f"result: {len(self.kept)} node(s) in float, {self.metric_name} {self.final_metric:.4f} "
                f"(drop {self.fp32_metric - self.final_metric:+.4f} <= {self.max_drop})"
            )
        else:
            lines.append(
                f"result: budget NOT met even with every sensitive node in float; best {self.final_metric:.4f}"
            )
        return lines

    def to_json(self) -> dict[str, Any]:
        """The ``<output>.json`` report of ``--max-drop``: budget, metrics, kept nodes, sensitivities, trials and the
        model."""
        return {
            "metric": self.metric_name,
            "max_drop": self.max_drop,
            "fp32": self.fp32_metric,
            "full_int8": self.full_int8_metric,
            "final": self.final_metric,
            "met": self.met,
            "kept_float": [dataclasses.asdict(s) for s in self.kept],
            "sensitivities": [dataclasses.asdict(s) for s in self.sensitivities],
            "trials": [dataclasses.asdict(t) for t in self.trials],
            "model": str(self.model.path),
            "quantized_nodes": len(self.model.quantized_nodes),
            "reduce_range": self.model.reduce_range,
            "weights": self.model.weights,
            "int8_format": self.model.int8_format,
            "routing": self.model.routing.to_json() if self.model.routing is not None else None,
            "explanation": self.explain(),
        }


def output_cosine(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> float:
    """Mean cosine between matching rows (last axis) of two lists of outputs; rows that are zero in
    both count as identical."""
    cos = []
    for a, b in zip(reference, outputs, strict=True):
        a2 = np.asarray(a, np.float64).reshape(-1, a.shape[-1] if a.ndim else 1)
        b2 = np.asarray(b, np.float64).reshape(a2.shape)
        num = (a2 * b2).sum(1)
        den = np.linalg.norm(a2, axis=1) * np.linalg.norm(b2, axis=1)
        both_zero = den == 0
        c = np.where(both_zero, 1.0, num / np.where(both_zero, 1.0, den))
        cos.append(c)
    return float(np.concatenate(cos).mean())


def _run(path: Path, feeds: Sequence[Mapping[str, np.ndarray]], kernels: Kernels, threads: int) -> list[np.ndarray]:
    """The model's first float output on each feed: the sensitivity probe compares rows by cosine,
    which means nothing for integer outputs (class ids, indices)."""
    from softdeploy.runtime import Session

    session = Session(path, kernels=kernels, threads=threads)
    out = []
    for f in feeds:
        values = session.run(f)
        first = next((v for v in values if np.asarray(v).dtype.kind == "f"), None)
        if first is None:
            raise QuantizationError(
                f"{path}: the model has no float output for the sensitivity probe's cosine "
                f"(outputs {session.output_names}); integer outputs are not a cosine target"
            )
        out.append(first)
    return out


def node_sensitivities(
    fp32: Path,
    config: QuantConfig,
    probe: Sequence[Mapping[str, np.ndarray]],
    *,
    calibration: Sequence[Mapping[str, np.ndarray]] | None,
    calibration_cache: Path | None,
    workdir: Path,
    kernels: Kernels = "auto",
    threads: int = 1,
    progress: Callable[[str], None] | None = None,
) -> list[NodeSensitivity]:
    """Quantize each candidate node alone; most sensitive first."""
    model = load_named(fp32)
    candidates = [(name, op) for name, op in candidate_nodes(model, config) if name not in config.exclude]
    reference = _run(fp32, probe, kernels, threads)
    out = []
    for name, op in candidates:
        q = quantize(
            model,
            workdir / "probe.onnx",
            dataclasses.replace(config, only=(name,)),
            calibration=calibration,
            calibration_cache=calibration_cache,
            kernels=kernels,
        )
        cos = output_cosine(reference, _run(q.path, probe, kernels, threads)) if q.quantized_nodes else 1.0
        out.append((name, op, cos))
        if progress is not None:
            progress(name)
    out.sort(key=lambda t: t[2])
    return [
        NodeSensitivity(name, op, cos, rank, node_scope(model, name)) for rank, (name, op, cos) in enumerate(out, 1)
    ]


def _publish(model: QuantizedModel, output: Path) -> None:
    """Copies the chosen model from the search's work folder (perhaps on another file system, where a rename fails)
    onto ``output`` through a temporary file beside it, and points ``model.path`` there."""
    import shutil

    from softdeploy.files import make_folder, write_with

    make_folder(output.parent)
    write_with(output, lambda tmp: shutil.copyfile(model.path, tmp), "quantized model")
    model.path = output


def budget_search(
    fp32: str | Path,
    output: str | Path,
    config: QuantConfig,
    evaluate: Evaluate,
    *,
    max_drop: float,
    probe: Sequence[Mapping[str, np.ndarray]],
    calibration: Sequence[Mapping[str, np.ndarray]] | None = None,
    metric_name: str = "metric",
    kernels: Kernels = "auto",
    threads: int = 1,
    progress: Callable[[str], None] | None = None,
    fp32_metric: float | None = None,
) -> BudgetResult:
    """The smallest set of most-sensitive nodes to keep in float so that the metric drops by at most
    ``max_drop``; writes that model to ``output``."""
    if not (max_drop >= 0 and math.isfinite(max_drop)):
        raise ArgumentError(f"max_drop must be a finite number >= 0, not {max_drop}")
    fp32 = Path(fp32)
    output = Path(output)
    note = progress or (lambda _s: None)
    with tempfile.TemporaryDirectory(prefix="softdeploy-budget-") as tmp:
        work = Path(tmp)
        cache = work / "calibration.json" if config.mode == "static" else None
        base = evaluate(fp32) if fp32_metric is None else fp32_metric
        note("fp32 evaluated")
        # every candidate goes to the private work folder; only the chosen one is written to ``output`` (in one
        # step, at the end): a search that is interrupted leaves no model under ``output`` that was not chosen
        full = quantize(
            fp32,
            work / "full.onnx",
            config,
            calibration=calibration,
            calibration_cache=cache,
            kernels=kernels,
            probe=probe,
        )
        full_metric = evaluate(full.path)
        note("all-int8 evaluated")
        if base - full_metric <= max_drop:
            _publish(full, output)
            return BudgetResult(metric_name, max_drop, base, full_metric, full_metric, [], [], [], full)
        sens = node_sensitivities(
            fp32,
            config,
            probe,
            calibration=calibration,
            calibration_cache=cache,
            workdir=work,
            kernels=kernels,
            threads=threads,
            progress=lambda n: note(f"sensitivity {n}"),
        )
        trials: list[Trial] = []
        results: dict[int, tuple[float, QuantizedModel]] = {}

        def attempt(k: int) -> bool:
            keep = tuple(s.node for s in sens[:k]) + config.exclude
            q = quantize(
                fp32,
                work / f"keep{k}.onnx",
                config.with_exclude(keep),
                calibration=calibration,
                calibration_cache=cache,
                kernels=kernels,
                probe=probe,
                routing_hint=full,  # the routing guard's ranking, searched once on the all-int8 model
            )
            m = evaluate(q.path)
            ok = base - m <= max_drop
            trials.append(Trial(k, m, base - m, ok))
            results[k] = (m, q)
            note(f"kept {k} in float: {metric_name} {m:.4f}")
            return ok

        lo, hi = 0, None  # lo: largest k known to fail; hi: smallest k known to pass
        k = 1
        while k <= len(sens):
            if attempt(k):
                hi = k
                break
            lo = k
            k = len(sens) if k * 2 > len(sens) and k < len(sens) else k * 2
            if lo == len(sens):
                break
        if hi is not None:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if attempt(mid):
                    hi = mid
                else:
                    lo = mid
            best_k = hi
        else:  # not even all in float meets it (e.g. float ops after dequantization differ): report the best
            best_k = max(results, key=lambda kk: results[kk][0])
        metric, chosen = results[best_k]
        _publish(chosen, output)
        return BudgetResult(metric_name, max_drop, base, full_metric, metric, sens[:best_k], sens, trials, chosen)
