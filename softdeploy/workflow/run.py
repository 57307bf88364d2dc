"""``softdeploy run WORKFLOW.yaml``: export (a torch factory) -> quantize (under an accuracy budget on
the workflow's own metric, when it sets ``quantize.max_drop``) -> compare every variant, with reports."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from softdeploy.compare.case import Progress
from softdeploy.workflow.case import WorkflowCase
from softdeploy.workflow.spec import Workflow, WorkflowError


@dataclasses.dataclass
class WorkflowResult:
    """What a workflow run made: the comparison, the budget search (if any) and the report files."""

    compare: Any  # softdeploy.compare.runner.CompareResult
    budget: Any  # softdeploy.quant.BudgetResult | None
    out: Path
    reports: dict[str, Path]


def default_variants(case: WorkflowCase) -> list[str]:
    """torch (factory and folder workflows), onnxruntime fp32 stock / softdeploy, and the workflow's int8 mode."""
    mode = case.workflow.quantize.mode
    torch = ["torch-fp32"] if case.workflow.factory or case.workflow.folder else []
    others = (
        ["ort-int8-dynamic", "ort-int8-static"] if case.workflow.quantize.max_drop is None else [f"ort-int8-{mode}"]
    )
    return [*torch, "ort-fp32-stock", "ort-fp32", *others]


def run_workflow(
    workflow: Workflow, progress: Progress, *, out: str | Path | None = None, quick: bool = False
) -> WorkflowResult:
    """Runs the whole loop of ``workflow``; reports in ``out/<name>/`` (default: the workflow's ``out``)."""
    import json

    from softdeploy.compare import run_compare
    from softdeploy.compare.report import write_reports
    from softdeploy.compare.runner import _fp32_model, known_variants
    from softdeploy.files import make_folder, write_text

    case = WorkflowCase(workflow)
    variants = list(workflow.variants) if workflow.variants else default_variants(case)
    unknown = [v for v in variants if v not in known_variants()]
    if unknown:  # before the model is exported (prepare)
        raise WorkflowError(f"variants: unknown {unknown}; choose from {list(known_variants())}")
    case.prepare(progress)
    folder = results_folder(Path(out or workflow.out), workflow.name)
    models = folder / "models"
    make_folder(models, "models folder")
    budget = None
    q = workflow.quantize
    if q.max_drop is not None:
        fp32 = _fp32_model(case, models, progress)  # tells the case its path (WorkflowCase.use_fp32)
        budget = budget_search_on(case, fp32, models / f"int8_{q.mode}_budget.onnx", progress)
        case.exclude = tuple(dict.fromkeys([*case.exclude, *(k.node for k in budget.kept)]))
        write_text(folder / "budget.json", json.dumps(budget.to_json(), indent=1, default=str), "budget report")
    result = run_compare(
        case,
        folder,
        variants=variants,
        threads=workflow.threads,
        rounds=2 if quick else workflow.rounds,
        round_seconds=0.05 if quick else 0.25,
        progress=progress,
    )
    if budget is not None:
        result.description["accuracy budget"] = " ".join(budget.explain())
    with progress.step("write report.md, results.csv, results.json, accuracy_vs_latency.png"):
        reports = write_reports(result, folder)
    return WorkflowResult(result, budget, folder, reports)


def results_folder(out: Path, name: str) -> Path:
    """``out/name``, the one folder a workflow writes to; WorkflowError unless ``name`` is a plain folder name, so
    that the folder lies inside ``out`` (compared as written: a link the user made inside ``out`` stays theirs)."""
    from softdeploy.workflow.spec import check_folder_name

    folder = out / check_folder_name(name, "workflow")
    if Path(os.path.normpath(folder)).parent != Path(os.path.normpath(out)):
        raise WorkflowError(f"workflow: name: {name!r} would put the results outside {out} (rule: a plain folder name)")
    return folder


def budget_search_on(case: WorkflowCase, fp32: Path, output: Path, progress: Progress) -> Any:
    """The budget search of :mod:`softdeploy.quant.search` on the workflow's own metric."""
    from softdeploy.quant import budget_search
    from softdeploy.runtime import Session

    q = case.workflow.quantize
    label = q.metric or case.primary_metric
    metric = next((m for m in case.metrics if m.label == label), None)
    if metric is None:
        raise WorkflowError(f"quantize.metric: {label!r} is not one of the metrics {list(case.metric_names)}")
    sign = 1.0 if metric.goal == "max" else -1.0  # the search maximises; a lower-is-better metric is negated

    def evaluate(path: Path) -> float:
        return sign * case.score(case.outputs_of(Session(path, kernels="auto").run))[label]

    name = label if sign > 0 else f"-{label} (lower is better)"
    with progress.step(f"budget search: {case.quant_config().describe()}, {label} drop <= {q.max_drop}") as advance:
        result = budget_search(
            fp32,
            output,
            case.quant_config(),
            evaluate,
            max_drop=q.max_drop,
            probe=case.probe_feeds(),
            calibration=case.calibration_feeds() if q.mode == "static" else None,
            metric_name=name,
            progress=lambda _s: advance(1),
        )
    if not result.model.quantized_nodes:
        from softdeploy.quant import QuantizationError

        raise QuantizationError(
            f"nothing was quantized: within the budget {label} drop <= {q.max_drop} every candidate node had to stay "
            "in float (see the budget search above); raise the budget or quantize fewer op types"
        )
    return result
