"""A workflow as a :class:`softdeploy.compare.case.Case`: the user's model, data and metrics go
through the same comparison machinery (variants, timing, agreement, reports) as the built-in cases."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.compare.case import Evaluation, Floor, Progress, Runner, Timed
from softdeploy.workflow.data import (
    Dataset,
    ModelInput,
    collect_outputs,
    load_dataset,
    model_inputs,
    model_outputs,
)
from softdeploy.workflow.metrics import Metric, resolve
from softdeploy.workflow.spec import MetricSpec, Workflow, WorkflowError

# Columns the runner derives from Evaluation.rows / .scores against the fp32 reference.
AGREEMENT_K = 5
# outputs that hold class scores, by name (transformers' logits / start_logits, detectors' scores, probs)
_CLASS_SCORES = re.compile(r"(logits|scores|probs|probabilities)$", re.IGNORECASE)


class WorkflowCase:
    """The Case of a :class:`~softdeploy.workflow.spec.Workflow` (see softdeploy/compare/case.py)."""

    timed_phases = ("infer",)
    agreement_k = AGREEMENT_K

    def __init__(self, workflow: Workflow) -> None:
        self.workflow = workflow
        self.name = workflow.name
        self.title = (
            workflow.title
            or f"{workflow.name}: {Path(workflow.model).name if not workflow.factory else workflow.model}"
        )
        self._model: Any = None  # onnx.ModelProto of the fp32 model
        self._module: Any = None  # the torch module (factory workflows)
        self._inputs: list[ModelInput] = []
        self._outputs: dict[str, str] = {}
        self._data: Dataset | None = None
        self._metrics: list[Metric] = []
        self._fp32_path: Path | None = None
        self._reference: dict[str, np.ndarray] | None = None
        self.exclude: tuple[str, ...] = tuple(workflow.quantize.exclude)  # nodes kept in float (+ the budget's)
        self.budget: Any = None  # the BudgetResult, when the workflow has quantize.max_drop

    # ---- the Case protocol ------------------------------------------------------------------------

    @property
    def primary_metric(self) -> str:
        """The metric of the plot and the accuracy budget: the workflow's ``primary``, else the first metric."""
        labels = [m.label for m in self.metrics]
        want = self.workflow.primary
        if want is not None and want not in labels:
            raise WorkflowError(f"primary: {want!r} is not one of the metrics {labels}")
        return want or labels[0]

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The column labels of the workflow's metrics, in the file's order."""
        return tuple(m.label for m in self.metrics)

    @property
    def cosine_name(self) -> str:
        """'<first float output> cosine', the agreement column of the plot."""
        return f"{self._first_float()} cosine"

    @property
    def metrics(self) -> list[Metric]:
        """The resolved metrics (available after prepare(), which checks them against the model's outputs)."""
        if not self._metrics:
            raise WorkflowError("call prepare() first")
        return self._metrics

    def prepare(self, progress: Progress) -> None:
        """Loads (or exports) the model, checks the data against its inputs, resolves the metrics."""
        if self._model is not None:
            return
        from softdeploy.workflow.precheck import check_workflow

        read = check_workflow(self.workflow)  # variants, metric names, data files, labels: before the model is read

        from softdeploy.export.hf import rename_outputs
        from softdeploy.files import load_model

        wf = self.workflow
        if wf.folder:
            from softdeploy.export.hf import export_folder

            step = f"export {wf.folder} folder {wf.model} to ONNX (validated against torch; onnxruntime fusions)"
            with progress.step(step):
                result = export_folder(
                    wf.model, task=wf.task, output_names=wf.outputs, attention=wf.attention, opset=wf.opset
                )
                self._module = result.folder.module
                self._model = result.model
        elif wf.factory:
            from softdeploy.export.api import export
            from softdeploy.export.factory import load_factory

            with progress.step(f"export {wf.model} to ONNX (validated against torch)"):
                spec = load_factory(wf.model)
                self._module = spec.module
                self._model = export(
                    spec.module, spec.example_inputs, dynamic_shapes=spec.dynamic_shapes, opset=wf.opset
                ).model
        else:
            self._model = load_model(wf.model)
        if wf.outputs and not wf.folder:  # a folder's export names them itself
            rename_outputs(self._model, wf.outputs, f"{wf.name}: model.outputs")
        self._inputs = model_inputs(self._model)
        self._outputs = model_outputs(self._model)
        with progress.step(f"read and check data {wf.data.inputs}"):
            self._data = load_dataset(wf.data, self._inputs, read=read)
        specs = wf.metrics or (MetricSpec("cosine"),)
        metrics = [resolve(s, self._outputs, self._data.labels is not None) for s in specs]
        labels = [m.label for m in metrics]
        # The same metric on two outputs: each column names its output.
        self._metrics = [
            dataclasses.replace(m, label=f"{m.label} ({m.output})") if labels.count(m.label) > 1 else m for m in metrics
        ]
        _ = self.primary_metric  # a wrong `primary` fails here, before any work

    def describe(self) -> dict[str, Any]:
        """Model (and its inputs), data, metrics and int8 settings, for the report."""
        wf = self.workflow
        return {
            "model": f"{'torch factory ' if wf.factory else f'{wf.folder} folder ' if wf.folder else ''}{wf.model}"
            + (f" (task {wf.task})" if wf.task else "")
            + "; inputs "
            + ", ".join(f"{i.name} {i.dtype}{list(i.dims)}" for i in self._inputs),
            "data": self._data.description if self._data else wf.data.inputs,
            "metrics": ", ".join(f"{m.label} ({m.goal}, on {m.output or 'every output'})" for m in self._metrics),
            "int8 settings": self.quant_config().describe()
            + (f"; kept in float: {list(self.exclude)}" if self.exclude else ""),
        }

    def fingerprint(self) -> str:
        """The model (its serialized graph and weights), the data and the settings."""
        from softdeploy.compare.cache import fingerprint

        assert self._data is not None
        return fingerprint(self._model, self._data.batches, self._data.labels, self.describe())

    def export_fp32(self, path: Path) -> None:
        """Writes the fp32 ONNX model (exported from the factory, or the given file) to ``path`` (atomically), the
        model :meth:`reference` reads."""
        from softdeploy.files import save_model

        save_model(self._model, path, "fp32 model")
        self._fp32_path = Path(path)

    def use_fp32(self, path: Path) -> None:
        """The fp32 model the comparison uses (just exported or reused from an earlier run): :meth:`reference` reads
        it. The reference outputs of another model are dropped."""
        path = Path(path)
        if path != self._fp32_path:
            self._reference = None
        self._fp32_path = path

    def torch_runner(self, threads: int) -> Runner:
        """The torch module as a runner over the same feeds (WorkflowError for an ONNX-file model, which has none)."""
        if self._module is None:
            raise WorkflowError(
                f"variant torch-fp32 needs a torch model: {self.workflow.model} is an ONNX file (give model: "
                "{factory: 'pkg.mod:fn'} or {hf: FOLDER}, or leave torch-fp32 out of variants)"
            )
        import torch

        module, names = self._module, [i.name for i in self._inputs]

        def run(feeds: Any) -> list[np.ndarray]:
            with torch.no_grad():
                out = module(*[torch.from_numpy(np.asarray(feeds[n])) for n in names])
            outs = out if isinstance(out, (tuple, list)) else (out,)
            return [o.detach().numpy() for o in outs]

        return run

    def calibration_feeds(self) -> list[dict[str, np.ndarray]]:
        """Batches for static calibration: ``data.calibration`` when given, else the evaluation batches."""
        assert self._data is not None
        return self._data.calibration

    def probe_feeds(self) -> list[dict[str, np.ndarray]]:
        """The first four evaluation batches, for the per-node sensitivity probe."""
        assert self._data is not None
        return self._data.batches[:4]

    def outputs_of(self, runner: Runner) -> dict[str, np.ndarray]:
        """Every output over the evaluation data, batches concatenated along axis 0."""
        assert self._data is not None
        return collect_outputs(runner, self._data.batches, list(self._outputs))

    def reference(self) -> dict[str, np.ndarray]:
        """The fp32 model's outputs on onnxruntime with softdeploy's kernels (what "cosine" etc. compare to)."""
        if self._reference is None:
            from softdeploy.runtime import Session

            if self._fp32_path is None:
                raise WorkflowError("the fp32 model is not exported yet")
            self._reference = self.outputs_of(Session(self._fp32_path, kernels="auto").run)
        return self._reference

    def score(self, outputs: dict[str, np.ndarray]) -> dict[str, float]:
        """Every metric on these outputs."""
        assert self._data is not None
        needs_ref = any(m.reads == "reference" for m in self._metrics)
        ref = self.reference() if needs_ref else None
        return {m.label: m(outputs, self._data.labels, ref) for m in self._metrics}

    def evaluate(self, runner: Runner, kernels: str, progress: Progress, label: str) -> Evaluation:
        """Runs every batch through ``runner`` and scores the workflow's metrics; float outputs also feed the cosine and
        top-k agreement with the reference."""
        assert self._data is not None
        with progress.step(f"{label}: {len(self._data.batches)} batches"):
            outputs = self.outputs_of(runner)
        rows = {f"{n} cosine": v for n, v in outputs.items() if v.dtype.kind == "f" and v.ndim >= 1 and v.size}
        # top-k agreement and KL read an output as class scores: only one named so (logits, scores, probs); hidden
        # states and embeddings have no classes to agree on (name an output with model.outputs)
        scores = next(
            (
                v.reshape(-1, v.shape[-1])
                for n, v in outputs.items()
                if v.dtype.kind == "f" and v.ndim >= 2 and _CLASS_SCORES.search(n)
            ),
            None,
        )
        return Evaluation(metrics=self.score(outputs), rows=rows, scores=scores, notes={"softdeploy ops": kernels})

    def timed(self, runner: Runner, kernels: str, threads: int) -> dict[str, Timed]:
        """One latency measurement, 'infer': the first batch through the model (items = its batch size)."""
        assert self._data is not None
        feeds = self._data.batches[0]
        batched = [i.name for i in self._inputs if i.name not in self.workflow.data.constant]
        items = len(feeds[batched[0]]) if batched else 1
        return {"infer": Timed(lambda: runner(feeds), items)}

    def floors(self, rows: list[dict[str, Any]]) -> list[Floor]:
        """With ``quantize.max_drop``: the budget metric's drop from ort-fp32 to the workflow's int8 variant, held to
        the budget."""
        q = self.workflow.quantize
        if q.max_drop is None:
            return []
        metric = q.metric or self.primary_metric
        by = {r["variant"]: r for r in rows}
        ref, mine = by.get("ort-fp32"), by.get(f"ort-int8-{q.mode}")
        if ref is None or mine is None or metric not in ref:
            return []
        goal = next(m.goal for m in self._metrics if m.label == metric)
        drop = (ref[metric] - mine[metric]) if goal == "max" else (mine[metric] - ref[metric])
        return [Floor(f"{metric} drop, ort-int8-{q.mode} vs ort-fp32", drop, f"<= {q.max_drop}", drop <= q.max_drop)]

    # ---- quantization -----------------------------------------------------------------------------

    def quant_config(self) -> Any:
        """The workflow's QuantConfig, with the nodes kept in float (its own and the budget's)."""
        from softdeploy.quant import QuantConfig

        q = self.workflow.quantize
        return QuantConfig(
            mode=q.mode,
            per_channel=q.per_channel,
            calibrate_method=q.calibrate_method,
            exclude=self.exclude,
            target=q.target,
        )

    def static_config(self, fp32: Path) -> Any:
        """The static-quantization settings: the workflow's own when its mode is static, else the defaults."""
        return self.quant_config() if self.workflow.quantize.mode == "static" else _default("static", self.workflow)

    def dynamic_config(self, fp32: Path) -> Any:
        """The dynamic-quantization settings: the workflow's own when its mode is dynamic, else the defaults."""
        return self.quant_config() if self.workflow.quantize.mode == "dynamic" else _default("dynamic", self.workflow)

    def torch_size_bytes(self) -> int | None:
        """The torch module's parameter bytes (None for an ONNX-file model)."""
        if self._module is None:
            return None
        return sum(p.numel() * p.element_size() for p in self._module.parameters())

    def _first_float(self) -> str:
        return next((n for n, t in self._outputs.items() if t.startswith("float")), next(iter(self._outputs), "output"))


def _default(mode: str, workflow: Any) -> Any:
    """The other mode's defaults, for the workflow's deployment target."""
    from softdeploy.quant import QuantConfig

    return QuantConfig(mode, target=workflow.quantize.target)
