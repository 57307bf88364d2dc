"""What a workflow says that can be checked without its model, checked before the model is loaded or exported.

A factory model's export takes tens of seconds; a misspelt variant or metric, a missing data file, NaN labels or
labels that do not match the samples are found here first (each a WorkflowError naming the key, the value and the
rule), so a workflow fails in the time it takes to read its files. What needs the model -- the data's names, dtypes
and shapes against its inputs, metrics against its outputs -- is checked right after it is loaded
(:func:`softdeploy.workflow.data.load_dataset`, :func:`softdeploy.workflow.metrics.resolve`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from softdeploy.workflow.spec import Workflow, WorkflowError, is_callable_ref


@dataclasses.dataclass(frozen=True)
class ReadData:
    """The workflow's data as read from its files (or loader) before the model: the arrays by name (the labels array
    taken out) and the labels, so that they are read once."""

    arrays: dict[str, np.ndarray]
    labels: np.ndarray | None


def check_workflow(workflow: Workflow) -> ReadData:
    """Checks the variants, the metrics, ``primary`` / ``quantize.metric`` and the data of ``workflow`` (see the module
    docstring); returns the data read."""
    check_variants(workflow)
    check_metric_names(workflow)
    return read_data(workflow)


def check_variants(workflow: Workflow) -> None:
    """Every variant a known one; torch-fp32 only for a torch model (an ONNX file has no torch module to time)."""
    if not workflow.variants:
        return
    from softdeploy.compare.runner import known_variants

    known = list(known_variants())
    unknown = [v for v in workflow.variants if v not in known]
    if unknown:
        raise WorkflowError(f"variants: unknown {unknown}; choose from {known}")
    # a factory or a model folder has a torch module; an ONNX file has none
    if "torch-fp32" in workflow.variants and not (workflow.factory or getattr(workflow, "folder", None)):
        raise WorkflowError(
            f"variants: torch-fp32 needs a torch model: {workflow.model} is an ONNX file (give model: "
            "{factory: 'pkg.mod:fn'}, or leave torch-fp32 out of variants)"
        )


def metric_label(name: str, label: str | None, k: int | None) -> str:
    """The column label a metric spec gets (before " (output)" is added to tell two alike apart)."""
    from softdeploy.workflow.metrics import BUILTIN

    if label:
        return label
    if name in BUILTIN:
        b = BUILTIN[name]
        return f"{name}@{k or b.default_k}" if b.default_k else name
    return name.rpartition(":")[2]


def check_metric_names(workflow: Workflow) -> None:
    """Every metric a built-in or an importable callable ``pkg.mod:fn``; ``primary`` and ``quantize.metric`` among their
    labels."""
    from softdeploy.workflow.metrics import BUILTIN

    specs = workflow.metrics
    for spec in specs:
        if spec.name in BUILTIN:
            continue
        if not is_callable_ref(spec.name):
            raise WorkflowError(
                f"metrics: unknown metric {spec.name!r}; built-ins are {sorted(BUILTIN)}, or give 'pkg.mod:fn'"
            )
        from softdeploy.export.factory import load_callable

        try:
            fn = load_callable(spec.name, "metric")
        except Exception as e:
            raise WorkflowError(f"metrics: {spec.name}: {e}") from e
        if not callable(fn):
            raise WorkflowError(f"metrics: {spec.name} is not callable")
    labels = [metric_label(s.name, s.label, s.k) for s in specs] or ["cosine"]

    def known(label: str) -> bool:  # two alike metrics are told apart as "label (output)"
        return label in labels or any(label.startswith(f"{b} (") and label.endswith(")") for b in labels)

    for key, want in (("primary", workflow.primary), ("quantize.metric", workflow.quantize.metric)):
        if want is not None and not known(want):
            raise WorkflowError(f"{key}: {want!r} is not one of the metrics {labels}")


def read_data(workflow: Workflow) -> ReadData:
    """Reads ``data.inputs``, the labels and ``data.calibration``; checks what needs no model: the files exist and hold
    arrays, the labels are finite, the batched arrays and the labels agree on the number of samples (axis 0), and the
    metrics that read labels have them."""
    from softdeploy.workflow.data import check_labels, read_arrays, read_labels
    from softdeploy.workflow.metrics import BUILTIN

    spec = workflow.data
    arrays, loaded = read_arrays(spec.inputs)
    labels = read_labels(spec, arrays, loaded)
    if spec.calibration is not None:
        read_arrays(spec.calibration, "data.calibration")  # exists and holds arrays; checked against the model later
    needs = [s.name for s in workflow.metrics if s.name in BUILTIN and BUILTIN[s.name].reads == "labels"]
    if needs and labels is None:
        raise WorkflowError(
            f"metrics: {needs[0]} needs labels (data.labels: an .npy file, or the name of an array of {spec.inputs}: "
            f"one of {sorted(arrays)})"
        )
    lengths = {n: int(a.shape[0]) for n, a in arrays.items() if n not in spec.constant and a.ndim >= 1}
    if labels is not None:
        check_labels(labels, spec.labels or spec.inputs)
        counts = set(lengths.values())
        if len(counts) == 1 and len(labels) != next(iter(counts)):
            raise WorkflowError(
                f"data.labels: {len(labels)} labels for {next(iter(counts))} samples (rule: one label per sample, "
                "axis 0)"
            )
    return ReadData(arrays, labels)
