"""What ``softdeploy compare`` needs from a model + data + task (a *case*).

A case owns the task: it exports its fp32 model, supplies calibration and probe inputs, evaluates a
variant (anything that maps input feeds to output arrays) on its data, and says which latency
measurements matter and which floors hold. The comparison machinery (variants, timing, agreement,
reports) is the same for every case: see :mod:`softdeploy.compare.runner`.

Optional: ``static_config(fp32_path) -> QuantConfig``, the case's static-quantization settings (e.g. a
calibration method and the nodes it measured too sensitive for int8); without it, QuantConfig("static").
Optional: ``fingerprint() -> str``, a content hash of the weights, data and settings
(:func:`softdeploy.compare.cache.fingerprint`); the fp32 export is reused across runs only while it is
unchanged, and re-exported on every run by a case without one.
Optional: ``sections(result, progress) -> list[Section]``, called after every variant is measured (with the
:class:`softdeploy.compare.runner.CompareResult` so far, floors not yet checked): extra measurements of the
case (peers of its own, per-class tables) as markdown sections of the report, placed after the results
table; ``floors`` runs after it, so it can use what ``sections`` measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

Feeds = Mapping[str, np.ndarray]
Runner = Callable[[Feeds], list[np.ndarray]]


@dataclasses.dataclass
class Evaluation:
    """A variant's results on the case's data."""

    metrics: dict[str, float]  # the task's own metrics, e.g. {"MRR@10": 0.62, ...}
    # named [n, d] vector sets, each compared row by row with the reference's by cosine: the column
    # is the name (e.g. "token cosine")
    rows: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    scores: np.ndarray | None = None  # [queries, candidates] compared by top-k agreement and KL
    notes: dict[str, str] = dataclasses.field(default_factory=dict)  # e.g. {"scorer": "MaxSim op (native kernel)"}


@dataclasses.dataclass(frozen=True)
class Timed:
    """One latency measurement of a variant: ``fn`` runs one call handling ``items`` items."""

    fn: Callable[[], object]
    items: int = 1


@dataclasses.dataclass(frozen=True)
class Floor:
    """A requirement checked on the results: ``value`` against ``target``."""

    name: str
    value: float | None
    target: str
    met: bool
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Section:
    """A section of the report that the case adds (``Case.sections``): a heading and its markdown body."""

    title: str
    markdown: str


class Progress(Protocol):
    """Where a long step reports progress: ``with progress.step(description, total) as advance: advance(n)``.
    softdeploy.progress has a terminal (RichProgress) and a silent implementation."""

    def step(self, description: str, total: int | None = None) -> Any:
        """A context manager yielding ``advance(n=1)``."""


class Case(Protocol):
    """What ``softdeploy compare`` needs from a model + data + task.

    Implement these members on any class (structural typing: no base class) and run
    ``softdeploy compare --case pkg.mod:MyCase``, or ``run_compare(MyCase(), out, progress=...)``.

    Attributes:

    - ``name``: the results folder; ``title``: the report's heading;
    - ``metric_names``: the task metrics ``evaluate`` returns; ``primary_metric``: one of them, used by
      the accuracy budget and the plot;
    - ``agreement_k``: k of the top-k agreement with the reference's ``Evaluation.scores``;
    - ``cosine_name``: the ``Evaluation.rows`` entry the plot and floors use;
    - ``timed_phases``: the latency measurements ``timed`` returns; the first is the model's own.

    Methods, in the order the runner calls them: ``prepare``; ``export_fp32``; ``torch_runner``;
    ``calibration_feeds`` and ``probe_feeds`` (int8 variants); ``evaluate`` and ``timed`` (every variant);
    ``floors`` and ``describe`` (the report). Optional: ``static_config``, ``fingerprint``, ``sections``,
    ``torch_size_bytes`` (see the module docstring) and ``use_fp32(path)``, called with the fp32 model's path after
    every export *and* whenever a cached export is reused, so a case that reads its own fp32 model (a reference for
    agreement) finds it on a rerun too. :class:`softdeploy.workflow.case.WorkflowCase` is the
    implementation a workflow file builds; :mod:`softdeploy.models` finds the installed cases (the
    ``softdeploy.cases`` entry-point group; the built-in ones are this repository's cases/ distribution).
    """

    name: str  # folder name of the results, e.g. "minilm_retrieval"
    title: str  # one line for the report
    primary_metric: str  # the metric the accuracy budget and the plot use
    metric_names: tuple[str, ...]
    agreement_k: int  # k of the top-k agreement
    cosine_name: str  # the Evaluation.rows entry the plot and floors use
    timed_phases: tuple[str, ...]  # e.g. ("encode", "score"); the first is the model's own latency

    def prepare(self, progress: Progress) -> None:
        """Load the model and data (cached on the instance)."""

    def export_fp32(self, path: Path) -> None:
        """Write the fp32 ONNX model to ``path``."""

    def torch_runner(self, threads: int) -> Runner:
        """The eager torch model as a runner over the same feeds."""

    def calibration_feeds(self) -> list[dict[str, np.ndarray]]:
        """Input batches for static calibration (held apart from the evaluation queries)."""

    def probe_feeds(self) -> list[dict[str, np.ndarray]]:
        """A few input batches for the per-node sensitivity probe."""

    def evaluate(self, runner: Runner, kernels: str, progress: Progress, label: str) -> Evaluation:
        """Run the task with ``runner`` (the model) and ``kernels`` ("native", "portable" or "torch":
        how the case's own post-processing ops run)."""

    def timed(self, runner: Runner, kernels: str, threads: int) -> dict[str, Timed]:
        """The latency measurements of one variant, by phase."""

    def floors(self, rows: list[dict[str, Any]]) -> list[Floor]:
        """The requirements of this case, checked on the result rows."""

    def describe(self) -> dict[str, Any]:
        """Data set, model and settings, for the report."""
