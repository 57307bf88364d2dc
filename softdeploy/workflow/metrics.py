"""Metrics of a workflow: built-ins by name, or any ``pkg.mod:fn`` / ``file.py:fn``.

Each reads one model output (``output:``; default the first float output), concatenated over the
batches along axis 0, and either the labels or the fp32 reference's same output:

  accuracy        labels [n] class ids; argmax of the output's last axis (or the output itself when
                  it holds integer ids) equal to the label
  top_k_accuracy  the label among the k largest entries of the last axis (k: 5)
  mrr / ndcg / recall   retrieval at k (k: 10): the output is scores [queries, documents]; labels
                  are the relevant document ids: [n] one id each, [n, m] padded with -1, or a bool
                  matrix [n, documents] (softdeploy.compare.metrics)
  dice            binary masks: output > 0.5 (probabilities) against labels != 0, 2|A∩B| / (|A|+|B|)
                  per sample, averaged (both empty: 1)
  mse / mae       against float labels of the output's shape (lower is better)
  cosine          mean row cosine to the fp32 reference's output (rows: the last axis)
  agreement       top-k agreement with the fp32 reference (k: 10)
  kl              mean KL(softmax(reference) || softmax(output)) over the rows (lower is better)

A function is called ``fn(output, labels)`` with the output array (``output: "*"``: the mapping of
every output by name) and the labels (None without); it returns a float, higher is better unless the
metric says ``goal: min``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from softdeploy.compare import metrics as m
from softdeploy.workflow.spec import MetricSpec, WorkflowError, is_callable_ref


@dataclasses.dataclass(frozen=True)
class Builtin:
    """A built-in metric: ``fn(output, other, k)`` with ``other`` the labels or the reference output."""

    fn: Callable[[np.ndarray, Any, int], float]
    goal: str  # "max" | "min"
    reads: str  # "labels" | "reference"
    default_k: int = 0


def _relevant(labels: np.ndarray) -> list[set[int]]:
    labels = np.asarray(labels)
    if labels.dtype == bool:
        return [set(np.flatnonzero(row).tolist()) for row in labels]
    if labels.ndim == 1:
        return [{int(v)} for v in labels]
    return [{int(v) for v in row if v >= 0} for row in labels]


def _rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(1, -1)


def _accuracy(y: np.ndarray, labels: Any, k: int) -> float:
    pred = y if np.issubdtype(y.dtype, np.integer) else np.asarray(y).argmax(-1)
    return float((np.asarray(pred).reshape(-1) == np.asarray(labels).reshape(-1)).mean())


def _top_k_accuracy(y: np.ndarray, labels: Any, k: int) -> float:
    top = np.argsort(-_rows(y), axis=1, kind="stable")[:, :k]
    return float(np.mean([lab in row for lab, row in zip(np.asarray(labels).reshape(-1), top, strict=True)]))


def _dice(y: np.ndarray, labels: Any, k: int) -> float:
    pred = np.asarray(y).reshape(len(y), -1) > 0.5
    true = np.asarray(labels).reshape(len(labels), -1) != 0
    inter = (pred & true).sum(1)
    total = pred.sum(1) + true.sum(1)
    return float(np.mean(np.where(total == 0, 1.0, 2 * inter / np.where(total == 0, 1, total))))


BUILTIN: dict[str, Builtin] = {
    "accuracy": Builtin(_accuracy, "max", "labels"),
    "top_k_accuracy": Builtin(_top_k_accuracy, "max", "labels", 5),
    "mrr": Builtin(lambda y, lab, k: m.mrr_at_k(_rows(y), _relevant(lab), k), "max", "labels", 10),
    "ndcg": Builtin(lambda y, lab, k: m.ndcg_at_k(_rows(y), _relevant(lab), k), "max", "labels", 10),
    "recall": Builtin(lambda y, lab, k: m.recall_at_k(_rows(y), _relevant(lab), k), "max", "labels", 10),
    "dice": Builtin(_dice, "max", "labels"),
    "mse": Builtin(lambda y, lab, k: float(np.mean((np.asarray(y, np.float64) - lab) ** 2)), "min", "labels"),
    "mae": Builtin(lambda y, lab, k: float(np.mean(np.abs(np.asarray(y, np.float64) - lab))), "min", "labels"),
    "cosine": Builtin(lambda y, ref, k: float(m.cosine_rows(_rows(ref), _rows(y)).mean()), "max", "reference"),
    "agreement": Builtin(lambda y, ref, k: m.topk_agreement(_rows(ref), _rows(y), k), "max", "reference", 10),
    "kl": Builtin(lambda y, ref, k: m.kl_softmax(_rows(ref), _rows(y)), "min", "reference"),
}


@dataclasses.dataclass(frozen=True)
class Metric:
    """A resolved metric of a workflow."""

    label: str  # its column
    output: str | None  # the output it reads; None: every output (functions given output "*")
    goal: str
    reads: str  # "labels" | "reference" | "function"
    k: int
    fn: Callable[..., float]

    def __call__(
        self, outputs: Mapping[str, np.ndarray], labels: Any, reference: Mapping[str, np.ndarray] | None
    ) -> float:
        y = outputs if self.output is None else outputs[self.output]
        if self.reads == "function":
            return float(self.fn(y, labels))
        if self.reads == "reference":
            if reference is None:
                raise WorkflowError(f"metric {self.label}: the fp32 reference is not computed yet")
            return float(self.fn(y, reference[self.output], self.k))  # type: ignore[index]
        return float(self.fn(y, labels, self.k))

    def better(self, a: float, b: float) -> bool:
        """Whether a is at least as good as b."""
        return a >= b if self.goal == "max" else a <= b


def resolve(spec: MetricSpec, outputs: Mapping[str, str], has_labels: bool) -> Metric:
    """A Metric from its spec; ``outputs`` maps the model's output names to their numpy dtype names."""
    float_outputs = [n for n, t in outputs.items() if t.startswith("float")]
    output = spec.output
    if output is not None and output != "*" and output not in outputs:
        raise WorkflowError(f"metrics: {spec.name}: output {output!r} is not an output of the model ({list(outputs)})")
    if spec.name in BUILTIN:
        b = BUILTIN[spec.name]
        if output is None:
            if not float_outputs and spec.name != "accuracy":
                raise WorkflowError(f"metrics: {spec.name} needs a float output; the model's outputs are {outputs}")
            output = float_outputs[0] if float_outputs else next(iter(outputs))
        if b.reads == "reference" and not outputs[output].startswith("float"):
            raise WorkflowError(
                f"metrics: {spec.name} on output {output!r} ({outputs[output]}): integer outputs (class ids, indices) "
                "have no cosine/KL/agreement; use accuracy, or a float output"
            )
        if b.reads == "labels" and not has_labels:
            raise WorkflowError(f"metrics: {spec.name} needs labels (data.labels)")
        k = spec.k or b.default_k
        label = spec.label or (f"{spec.name}@{k}" if b.default_k else spec.name)
        return Metric(label, output, spec.goal or b.goal, b.reads, k, b.fn)
    if is_callable_ref(spec.name):
        from softdeploy.export.factory import load_callable

        if output is None:
            output = float_outputs[0] if float_outputs else next(iter(outputs))

        try:
            fn = load_callable(spec.name, "metric")
        except Exception as e:
            raise WorkflowError(f"metrics: {spec.name}: {e}") from e
        if not callable(fn):
            raise WorkflowError(f"metrics: {spec.name} is not callable")
        label = spec.label or spec.name.rpartition(":")[2]
        return Metric(label, None if output == "*" else output, spec.goal or "max", "function", spec.k or 0, fn)
    raise WorkflowError(f"metrics: unknown metric {spec.name!r}; built-ins are {sorted(BUILTIN)}, or give 'pkg.mod:fn'")
