"""``softdeploy compare``: one model in several variants on the same inputs.

Variants (``VARIANTS``; TVM joins once the backend exists):
  torch-fp32         the eager torch model (the case's post-processing in torch too)
  ort-fp32-stock     onnxruntime fp32, our ops as their standard-ONNX function bodies (no library)
  ort-fp32           onnxruntime fp32 with softdeploy's native kernels -- the reference: agreement
                     and speed-ups are measured against it
  ort-int8-dynamic   int8 weights per output channel, activations quantized at run time
  ort-int8-static    int8 QDQ with activation ranges calibrated (through our kernels) on held-out data,
                     with the case's static settings where it has them (``Case.static_config``;
                     ``Case.dynamic_config`` likewise for ort-int8-dynamic)
Opt-in, when apache-tvm is installed (``TVM_VARIANTS``; name them in ``variants``):
  tvm-fp32           TVM, our ops as TIR kernels, shipped tuning records + hand/dlight schedules
  tvm-fp32-untuned   TVM's default pipeline without schedules (what tvm.compile alone gives)

Accuracy runs with ``eval_threads`` (results do not depend on it); latency with ``threads``,
interleaved across variants (see latency.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from softdeploy.compare.case import Case, Evaluation, Floor, Progress, Runner, Section
from softdeploy.compare.environment import environment, wait_quiet
from softdeploy.compare.latency import LatencyStats, measure_interleaved
from softdeploy.compare.metrics import cosine_rows, kl_softmax, topk_agreement
from softdeploy.errors import OutputError, SoftdeployError
from softdeploy.files import final_name, make_folder
from softdeploy.quant import QuantConfig, QuantizedModel, quantize
from softdeploy.quant.formats import TARGETS

REFERENCE = "ort-fp32"


@dataclasses.dataclass(frozen=True)
class VariantSpec:
    """One variant of a comparison: its name, precision (fp32 | int8), engine (torch | onnxruntime | tvm), how
    softdeploy ops run in it (torch, portable function bodies or native kernels) and a one-line description."""

    name: str
    precision: str  # "fp32" | "int8"
    engine: str  # "torch" | "onnxruntime"
    kernels: str  # how softdeploy ops run: "torch", "portable" (function bodies) or "native"
    description: str


VARIANTS: dict[str, VariantSpec] = {
    v.name: v
    for v in (
        VariantSpec("torch-fp32", "fp32", "torch", "torch", "torch eager"),
        VariantSpec("ort-fp32-stock", "fp32", "onnxruntime", "portable", "onnxruntime, stock ops (function bodies)"),
        VariantSpec("ort-fp32", "fp32", "onnxruntime", "native", "onnxruntime, softdeploy kernels"),
        VariantSpec(
            "ort-int8-dynamic", "int8", "onnxruntime", "native", "int8 dynamic, per-channel weights, softdeploy kernels"
        ),
        VariantSpec(
            "ort-int8-static", "int8", "onnxruntime", "native", "int8 static QDQ (calibrated), softdeploy kernels"
        ),
    )
}


# Opt-in (not in the default set: each input shape is a separate TVM build, minutes for a real model).
TVM_VARIANTS: dict[str, VariantSpec] = {
    v.name: v
    for v in (
        VariantSpec("tvm-fp32", "fp32", "tvm", "native", "TVM, softdeploy ops as TIR kernels, tuned records"),
        VariantSpec("tvm-fp32-untuned", "fp32", "tvm", "native", "TVM default pipeline, no schedules"),
    )
}


def known_variants() -> dict[str, VariantSpec]:
    """VARIANTS, plus TVM_VARIANTS where apache-tvm is importable."""
    import importlib.util

    return {**VARIANTS, **(TVM_VARIANTS if importlib.util.find_spec("tvm") is not None else {})}


@dataclasses.dataclass
class VariantResult:
    """What was measured for one variant: its model file and size, the case's evaluation, agreement with the reference,
    latency per phase and, for int8, the quantization result."""

    spec: VariantSpec
    model: Path | None
    size_bytes: int | None
    evaluation: Evaluation
    agreement: dict[str, float]
    latency: dict[str, LatencyStats]
    quantized: QuantizedModel | None = None


@dataclasses.dataclass
class CompareResult:
    """Everything one ``run_compare`` measured: the case's description and metrics, one VariantResult per variant, the
    floors, the environment, the background load during timing, warnings (e.g. torch and onnxruntime disagree) and the
    time each step took."""

    case: str
    title: str
    description: dict[str, Any]
    primary_metric: str
    metric_names: tuple[str, ...]
    timed_phases: tuple[str, ...]
    agreement_k: int
    cosine_name: str
    threads: int
    variants: list[VariantResult]
    floors: list[Floor]
    environment: dict[str, Any]
    latency_background_load: dict[str, float]
    seconds: float
    steps: dict[str, float]
    warnings: list[str] = dataclasses.field(default_factory=list)  # shown above the table, in every report
    sections: list[Section] = dataclasses.field(default_factory=list)  # the case's own (Case.sections)

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per variant (the CSV/markdown/JSON table)."""
        ref = next((v for v in self.variants if v.spec.name == REFERENCE), None)
        out = []
        for v in self.variants:
            row: dict[str, Any] = {
                "variant": v.spec.name,
                "precision": v.spec.precision,
                "engine": v.spec.engine,
                "softdeploy ops": v.spec.kernels,
            }
            row.update(v.evaluation.metrics)
            row.update(v.agreement)
            for phase, st in v.latency.items():
                row[f"{phase} p50 ms"] = st.p50_ms
                row[f"{phase} p90 ms"] = st.p90_ms
                row[f"{phase} /s"] = st.throughput
                if st.cpu_p50_ms is not None:
                    row[f"{phase} CPU ms"] = st.cpu_p50_ms
            first = self.timed_phases[0]
            if ref is not None and first in v.latency and first in ref.latency:
                mine, theirs = v.latency[first], ref.latency[first]
                row[f"{first} speed-up"] = theirs.p50_ms / mine.p50_ms
                if mine.cpu_p50_ms and theirs.cpu_p50_ms:
                    row[f"{first} speed-up (CPU time)"] = theirs.cpu_p50_ms / mine.cpu_p50_ms
            row["size MiB"] = v.size_bytes / 2**20 if v.size_bytes is not None else None
            row["threads"] = self.threads
            row.update(v.evaluation.notes)
            if v.quantized is not None:
                row["int8 nodes"] = len(v.quantized.quantized_nodes)
                row["float nodes kept"] = len(v.quantized.float_nodes)
            out.append(row)
        return out

    def to_json(self) -> dict[str, Any]:
        """results.json: the rows, latency details, quantization settings, floors, environment and warnings, as plain
        JSON types."""
        return {
            "case": self.case,
            "title": self.title,
            "description": self.description,
            "primary_metric": self.primary_metric,
            "threads": self.threads,
            "rows": self.rows(),
            "latency": {v.spec.name: {p: dataclasses.asdict(s) for p, s in v.latency.items()} for v in self.variants},
            "quantization": {
                v.spec.name: {
                    "config": dataclasses.asdict(v.quantized.config),
                    "quantized_nodes": v.quantized.quantized_nodes,
                    "float_nodes": v.quantized.float_nodes,
                    "calibration_kernels": v.quantized.calibration_kernels,
                    "reduce_range": v.quantized.reduce_range,
                    "weights": v.quantized.weights,
                    "int8_format": v.quantized.int8_format,
                    "seconds": v.quantized.seconds,
                }
                for v in self.variants
                if v.quantized is not None
            },
            "floors": [dataclasses.asdict(f) for f in self.floors],
            "environment": self.environment,
            "latency_background_load_cores": self.latency_background_load,
            "seconds": self.seconds,
            "steps_seconds": self.steps,
            "warnings": self.warnings,
            "sections": [dataclasses.asdict(s) for s in self.sections],
        }


def _onnx_runner(path: Path, kernels: str, threads: int) -> Runner:
    from softdeploy.runtime import Session

    session = Session(path, kernels=kernels, threads=threads)  # type: ignore[arg-type]
    return session.run


_TVM_POOL: dict[str, int] = {}


def _tvm_runner(path: Path, tuned: bool, threads: int) -> Runner:
    """A TVMSession per input-shape signature (TVM builds static shapes), built on first use."""
    import numpy as np

    from softdeploy.tvm.session import TVMSession, set_threads

    sessions: dict[tuple[Any, ...], TVMSession] = {}

    def run(feeds: dict[str, Any]) -> list[Any]:
        shapes = {k: list(np.shape(v)) for k, v in feeds.items()}
        key = tuple(sorted((k, tuple(v)) for k, v in shapes.items()))
        if key not in sessions:
            sessions[key] = TVMSession(path, shapes=shapes, tuned=tuned)
        if _TVM_POOL.get("threads") != threads:  # process-wide pool; accuracy and latency runs differ
            set_threads(threads)
            _TVM_POOL["threads"] = threads
        return sessions[key].run(feeds)

    return run


QUANTIZED = ("ort-int8-dynamic", "ort-int8-static")


def _routes(model: Path) -> bool:
    """Whether the model holds LoRAMixer nodes (read without its weights' external data)."""
    from softdeploy.files import load_model

    return any(n.op_type == "LoRAMixer" for n in load_model(model, load_external_data=False).graph.node)


def _fp32_model(case: Case, models: Path, progress: Progress) -> Path:
    """The case's fp32 export ``models/fp32.onnx``, reused only while its content fingerprint is unchanged.

    The key is ``case.fingerprint()`` (weights, data and settings; see :mod:`softdeploy.compare.cache`)
    with the softdeploy and torch versions, kept in ``models/fp32.stamp.json``; a case without ``fingerprint`` is
    exported on every run. The model and its stamp are cache entries (:mod:`softdeploy.cache`): written atomically
    with a content digest, checked on reuse; a truncated, edited or undigested model is reported in one line, set
    aside and exported again. Either way the case's optional ``use_fp32(path)`` is told the path, so that a case
    which reads the fp32 model itself (a workflow's reference outputs) works on a rerun as on the first run."""
    import importlib.metadata

    from softdeploy import cache
    from softdeploy.domain import __version__

    path = models / "fp32.onnx"
    stamp = models / "fp32.stamp.json"
    own = getattr(case, "fingerprint", None)
    want = {
        "case": case.name,
        "softdeploy": __version__,
        "torch": importlib.metadata.version("torch"),
        "describe": case.describe(),
        "fingerprint": own() if callable(own) else None,
    }
    want = json.loads(json.dumps(want, default=str))  # as it reads back from the stamp
    # a stamp without its digest (a run stopped while writing it, or a folder from before digests) only says the
    # export is not known to be complete: exported again without a fault reported
    stamped = want["fingerprint"] is not None and cache.digest_path(stamp).is_file()
    if not stamped or cache.load_checked(stamp, _read_json) != want or cache.lookup(path) is None:
        # the stamp goes first: a run stopped while exporting leaves no stamp, so the next run exports again
        # without taking the old model (or a missing digest) for a fault
        for old in (stamp, cache.digest_path(stamp)):
            old.unlink(missing_ok=True)
        with progress.step(f"export {case.name} to ONNX (torch.onnx dynamo)"):
            cache.store(path, lambda tmp: _export_to(case, tmp), what="fp32 model")
        cache.store(stamp, lambda tmp: tmp.write_text(json.dumps(want, indent=1)), what="fp32 model stamp")
    use = getattr(case, "use_fp32", None)
    if callable(use):
        use(path)
    return path


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


_EXPORT_PREFIX = ".fp32-export-"


def _export_to(case: Case, target: Path) -> None:
    """``case.export_fp32`` into a private folder beside ``target`` (under the name ``fp32.onnx``: exporters and
    fusion passes may rewrite the file in place or want its suffix), then moved onto ``target``."""
    import os
    import shutil
    import tempfile

    from softdeploy.files import pid_alive

    for stale in target.parent.glob(f"{_EXPORT_PREFIX}*"):  # left by a run that was killed while exporting
        pid = stale.name[len(_EXPORT_PREFIX) :].split("-", 1)[0]
        if stale.is_dir() and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f"{_EXPORT_PREFIX}{os.getpid()}-") as tmp:
        exported = Path(tmp) / "fp32.onnx"
        try:
            case.export_fp32(exported)
        except OutputError as e:  # a write error of the private copy (a full disk): said of the model's own name
            raise OutputError(str(e).replace(str(exported), str(final_name(target)))) from e
        if not exported.is_file():
            raise SoftdeployError(f"case {case.name}: export_fp32 wrote no model to {exported}")
        for extra in Path(tmp).iterdir():  # external weights (fp32.onnx.data): referenced relative to the model
            if extra != exported:
                os.replace(extra, target.parent / extra.name)
        os.replace(exported, target)


# torch eager and onnxruntime fp32 (softdeploy's kernels) compute the same model: below these they
# disagree, and every other number of the comparison is suspect (a stale export, a broken op).
TORCH_MIN_COSINE = 0.999
TORCH_MIN_TOPK_AGREEMENT = 0.99


def torch_disagreement(agreement: dict[str, dict[str, float]]) -> list[str]:
    """Warnings when ``torch-fp32`` disagrees with the fp32 onnxruntime reference."""
    a = agreement.get("torch-fp32")
    if a is None:
        return []
    out = []
    for key, value in a.items():
        low = key.endswith("cosine") and value < TORCH_MIN_COSINE
        low = low or (key.endswith("agreement") and value < TORCH_MIN_TOPK_AGREEMENT)
        if low:
            out.append(
                f"torch-fp32 and {REFERENCE} DISAGREE: {key} {value:.4f} (expected >= "
                f"{TORCH_MIN_COSINE if key.endswith('cosine') else TORCH_MIN_TOPK_AGREEMENT}); the exported model "
                "does not compute what the torch model does -- every other comparison is suspect"
            )
    return out


def run_compare(
    case: Case,
    out: str | Path,
    *,
    variants: Sequence[str] = tuple(VARIANTS),
    threads: int = 1,
    eval_threads: int | None = None,
    rounds: int = 8,
    round_seconds: float = 0.25,
    quiet_wait: float = 0.0,
    int8_target: str | None = None,
    progress: Progress,
) -> CompareResult:
    """Runs ``case`` in every variant of ``variants`` (the torch reference always included) and returns the
    CompareResult; models go to ``out/models``. Accuracy runs use ``eval_threads`` (default all cores); latency runs use
    ``threads`` and ``rounds`` interleaved rounds of ``round_seconds`` each (interleaved so that a change in machine
    load hits every variant alike), after waiting up to ``quiet_wait`` seconds for the machine to go idle.
    ``int8_target`` (softdeploy.quant.formats.TARGETS) is the CPU class the int8 variants are quantized for, over the
    case's own configs (None: theirs, else SOFTDEPLOY_INT8_TARGET, else this CPU's). Unknown variant names or
    targets, a case name that is not a plain folder name and thread counts below 1 raise SoftdeployError before any
    work; thread counts above the CPU count are lowered to it with a one-line warning."""
    t_start = time.perf_counter()
    steps: dict[str, float] = {}
    specs = known_variants()
    unknown = [v for v in variants if v not in specs]
    if unknown:
        raise SoftdeployError(f"unknown variant(s) {unknown}; choose from {list(specs)}")
    if int8_target is not None and int8_target not in TARGETS:
        raise SoftdeployError(f"int8 target {int8_target!r} is not one of {list(TARGETS)}")
    if REFERENCE not in variants:
        variants = [REFERENCE, *variants]
    from softdeploy.cpu import bounded_threads, cpu_count
    from softdeploy.files import check_folder_name

    check_folder_name(case.name, f"case {case.name!r}")  # the results folder's name: never '..' or a path
    threads = bounded_threads(threads, "threads")
    eval_threads = bounded_threads(eval_threads, "eval threads") if eval_threads is not None else cpu_count()
    out = Path(out)
    models = out / "models"
    make_folder(models, "models folder")

    t0 = time.perf_counter()
    case.prepare(progress)
    steps["prepare"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fp32 = _fp32_model(case, models, progress)
    steps["export"] = time.perf_counter() - t0

    quantized: dict[str, QuantizedModel] = {}
    t0 = time.perf_counter()
    # a model that routes has its int8 routing measured on the case's own inputs (softdeploy.quant.routing)
    probe = case.probe_feeds() if any(int8 in variants for int8 in QUANTIZED) and _routes(fp32) else None
    if "ort-int8-dynamic" in variants:
        with progress.step("quantize: int8 dynamic, per-channel"):
            quantized["ort-int8-dynamic"] = quantize(
                fp32, models / "int8_dynamic.onnx", _for_target(dynamic_config(case, fp32), int8_target), probe=probe
            )
    if "ort-int8-static" in variants:
        calibration = case.calibration_feeds()
        static = _for_target(static_config(case, fp32), int8_target)
        with progress.step(f"quantize: {static.describe()}, calibrating on {len(calibration)} batches"):
            quantized["ort-int8-static"] = quantize(
                fp32, models / "int8_static.onnx", static, calibration=calibration, probe=probe
            )
    steps["quantize"] = time.perf_counter() - t0

    def model_of(name: str) -> Path | None:
        spec = specs[name]
        if spec.engine == "torch":
            return None
        return quantized[name].path if name in quantized else fp32

    def runner_of(name: str, n_threads: int) -> Runner:
        spec = specs[name]
        if spec.engine == "torch":
            return case.torch_runner(n_threads)
        path = model_of(name)
        assert path is not None
        if spec.engine == "tvm":
            return _tvm_runner(path, name == "tvm-fp32", n_threads)
        return _onnx_runner(path, spec.kernels, n_threads)

    # ---- accuracy ------------------------------------------------------------------------------
    t0 = time.perf_counter()
    evaluations: dict[str, Evaluation] = {}
    for name in variants:
        evaluations[name] = case.evaluate(runner_of(name, eval_threads), specs[name].kernels, progress, label=name)
    steps["evaluate"] = time.perf_counter() - t0
    ref = evaluations[REFERENCE]
    agreement: dict[str, dict[str, float]] = {}
    for name, ev in evaluations.items():
        a: dict[str, float] = {}
        for key, rows in ev.rows.items():
            a[key] = float(cosine_rows(ref.rows[key], rows).mean())
        if ev.scores is not None and ref.scores is not None:
            a[f"top{case.agreement_k} agreement"] = topk_agreement(ref.scores, ev.scores, case.agreement_k)
            a["KL"] = kl_softmax(ref.scores, ev.scores)
        agreement[name] = a

    # ---- latency -------------------------------------------------------------------------------
    t0 = time.perf_counter()
    timed = {}
    for name in variants:
        timed[name] = case.timed(runner_of(name, threads), specs[name].kernels, threads)
    latency: dict[str, dict[str, LatencyStats]] = {n: {} for n in variants}
    background: dict[str, float] = {}
    with _torch_threads(threads):
        for phase in case.timed_phases:
            if quiet_wait > 0:
                with progress.step(f"waiting up to {quiet_wait:.0f} s for other processes to go quiet"):
                    wait_quiet(quiet_wait)
            fns = {n: timed[n][phase].fn for n in variants if phase in timed[n]}
            items = next(timed[n][phase].items for n in variants if phase in timed[n])
            with progress.step(
                f"latency: {phase} ({len(fns)} variants interleaved, {threads} thread(s))", rounds
            ) as adv:
                stats, load = measure_interleaved(
                    fns,
                    items_per_call=items,
                    rounds=rounds,
                    round_seconds=round_seconds,
                    on_round=lambda _r: adv(1),
                )
            background[phase] = round(load, 2)
            for n, s in stats.items():
                latency[n][phase] = s
    steps["latency"] = time.perf_counter() - t0

    results = []
    for name in variants:
        path = model_of(name)
        results.append(
            VariantResult(
                spec=specs[name],
                model=path,
                size_bytes=path.stat().st_size if path is not None else case_torch_size(case),
                evaluation=evaluations[name],
                agreement=agreement[name],
                latency=latency[name],
                quantized=quantized.get(name),
            )
        )
    result = CompareResult(
        case=case.name,
        title=case.title,
        description=case.describe(),
        primary_metric=case.primary_metric,
        metric_names=case.metric_names,
        timed_phases=case.timed_phases,
        agreement_k=case.agreement_k,
        cosine_name=case.cosine_name,
        threads=threads,
        variants=results,
        floors=[],
        environment=environment(threads),
        latency_background_load=background,
        seconds=0.0,
        steps=steps,
        warnings=torch_disagreement(agreement),
    )
    own_sections = getattr(case, "sections", None)
    if callable(own_sections):
        t0 = time.perf_counter()
        result.sections = list(own_sections(result, progress))
        steps["case sections"] = time.perf_counter() - t0
    result.floors = case.floors(result.rows())
    result.seconds = time.perf_counter() - t_start
    return result


def _for_target(config: QuantConfig, target: str | None) -> QuantConfig:
    """``config`` quantizing for ``target`` when one is given (the run's choice outranks the case's)."""
    return config if target is None else dataclasses.replace(config, target=target)


def static_config(case: Case, fp32: Path) -> QuantConfig:
    """The case's static-quantization settings (``case.static_config(fp32)`` where it has one, e.g.
    a calibration method and nodes to keep in float that it measured); else QuantConfig("static")."""
    own = getattr(case, "static_config", None)
    return own(fp32) if callable(own) else QuantConfig("static")


def dynamic_config(case: Case, fp32: Path) -> QuantConfig:
    """The case's dynamic-quantization settings (``case.dynamic_config(fp32)``; else QuantConfig("dynamic"))."""
    own = getattr(case, "dynamic_config", None)
    return own(fp32) if callable(own) else QuantConfig("dynamic")


def case_torch_size(case: Case) -> int | None:
    """The case's torch model size in bytes, when it offers ``torch_size_bytes()`` (optional in the Case protocol)."""
    size = getattr(case, "torch_size_bytes", None)
    return size() if callable(size) else None


class _torch_threads:
    """torch.set_num_threads for the latency block (restored after)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.old: int | None = None

    def __enter__(self) -> None:
        try:
            import torch
        except ImportError:
            return
        self.old = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc: object) -> None:
        if self.old is not None:
            import torch

            torch.set_num_threads(self.old)
