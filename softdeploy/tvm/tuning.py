"""MetaSchedule tuning into a persistent JSON database.

Three traps of TVM 0.27 are handled here:
  * MetaSchedule configures logging (``logging.config.dictConfig``) for every tuning run and lists the
    handlers already on its logger ``tvm.s_tir.meta_schedule`` by name: a handler without a name
    made it fail with ``AttributeError: 'NoneType' object has no attribute 'format'``, a named one of
    the user's with ``Unable to add handler``. pytest 9.2 attaches its (unnamed) LogCaptureHandler to
    every logger that does not propagate during each test, and the first tuning run of a process makes
    MetaSchedule's logger non-propagating: every later tuning test failed in a full run.
    :func:`_metaschedule_logging` takes such handlers off that logger while MetaSchedule configures
    it, and puts them back;
  * TVM's default build function imports ``tvm.s_tir.tensor_intrin`` in every fresh builder worker
    (LocalBuilder restarts its pool for each batch): ~30 s on 2 idle cores, minutes on busy ones,
    which hits the default 30 s timeout: every candidate then "fails to build" and tuning returns
    normally with zero trials. Our build function is the same minus that import (tensor intrinsics
    are for tensorized int8/GPU schedules, not these CPU float kernels), registered in each worker
    by a cheap initializer; timeouts are 120 s;
  * zero successful trials is raised as :class:`TuningError`, never passed on as an untuned build.

Tasks already in the database are measured again only if ``trials`` asks for more; records from
earlier runs (and the shipped ones, when the database folder is ``softdeploy/tvm/records/<class>``) are
kept: MetaSchedule appends to the JSON files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from softdeploy.tvm.errors import TuningError
from softdeploy.tvm.target import import_tvm, make_target

_BUILD_FUNC = "softdeploy.meta_schedule.build"


def _register_build_func() -> None:
    """Builder worker initializer: registers :data:`_BUILD_FUNC`, TVM's
    ``s_tir.meta_schedule.builder.default_build`` without its ``import tvm.s_tir.tensor_intrin``."""
    import tvm
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    def build(mod: Any, target: Any, _params: Any) -> Any:
        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        return tvm_build(mod, target=target)

    tvm.register_global_func(_BUILD_FUNC, build, override=True)


_ALLOC_FUNC = "softdeploy.meta_schedule.alloc_argument"
_RPC_ALLOC_FUNC = "softdeploy.meta_schedule.rpc_alloc_argument"


def _register_alloc_funcs() -> None:
    """Runner worker initializer: registers :data:`_ALLOC_FUNC` and :data:`_RPC_ALLOC_FUNC`, TVM's
    default argument allocation with integer tensors zero-filled instead of random. Integer arguments
    are indices or masks (SoftmaxTopK's values and sums gather x at the selection's indices, an
    embedding gathers at token ids); random ones read out of bounds and crash the measurement, so
    such kernels could not be tuned at all ("no candidate measured successfully"). Zero is in range
    for every index and a valid mask; the floats stay random."""
    import numpy as np
    import tvm
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common

    def filler(random_fill: Any) -> Any:
        def fill(arg: Any) -> None:
            if str(arg.dtype).startswith(("int", "uint", "bool")):
                arg.copyfrom(np.zeros(tuple(arg.shape), dtype=str(arg.dtype)))
            else:
                random_fill(arg)

        return fill

    def alloc(device: Any, args_info: Any, alloc_repeat: int) -> Any:
        random_fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure")
        return alloc_argument_common(filler(random_fill), device, args_info, alloc_repeat)

    def rpc_alloc(session: Any, device: Any, args_info: Any, alloc_repeat: int) -> Any:
        random_fill = session.get_function("tvm.contrib.random.random_fill_for_measure")
        return alloc_argument_common(filler(random_fill), device, args_info, alloc_repeat)

    tvm.register_global_func(_ALLOC_FUNC, alloc, override=True)
    tvm.register_global_func(_RPC_ALLOC_FUNC, rpc_alloc, override=True)


@dataclasses.dataclass(frozen=True)
class RPCSpec:
    """A TVM RPC tracker (``python -m tvm.exec.rpc_tracker``) and the device key its servers use."""

    host: str
    port: int
    key: str
    session_timeout_s: int = 120

    @classmethod
    def parse(cls, address: str, key: str) -> RPCSpec:
        """An RPCSpec from ``--rpc HOST:PORT`` and ``--key``; ValueError naming the expected form otherwise."""
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"--rpc wants HOST:PORT of a TVM RPC tracker, got {address!r}")
        return cls(host, int(port), key)


@dataclasses.dataclass
class TaskResult:
    """One tuning task: its name and weight, the successful trials, the best time found and, for our own kernels, the
    hand schedule's time (measured first, so the search keeps only what beats it)."""

    name: str
    weight: float
    trials: int  # successful measurements
    best_us: float | None
    hand_us: float | None = None  # our op's hand schedule, measured first (None: not one of our kernels)


@dataclasses.dataclass
class TuneReport:
    """A tuning run: the database written, one TaskResult per task and the seconds it took."""

    database: str
    tasks: list[TaskResult]
    seconds: float

    @property
    def trials(self) -> int:
        """Successful trials over all tasks (zero is an error for the caller)."""
        return sum(t.trials for t in self.tasks)

    def summary(self) -> str:
        """A few lines: tasks tuned, trials, time, the records' folder, and each task's best time against its hand
        schedule."""
        tuned = sum(t.trials > 0 for t in self.tasks)
        lines = [
            f"tuned {tuned}/{len(self.tasks)} tasks, {self.trials} successful trials in {self.seconds:.0f} s; "
            f"records in {self.database}"
        ]
        for t in self.tasks:
            best = "no successful trial" if t.best_us is None else f"best {t.best_us:.1f} us"
            hand = "" if t.hand_us is None else f" (hand schedule {t.hand_us:.1f} us)"
            lines.append(f"  {t.name}: {best}{hand}")
        return "\n".join(lines)


def _builder_runner(rpc: RPCSpec | None, workers: int) -> tuple[Any, Any]:
    import tvm.s_tir.meta_schedule as ms

    builder = ms.builder.LocalBuilder(
        max_workers=workers, timeout_sec=120, f_build=_BUILD_FUNC, initializer=_register_build_func
    )
    if rpc is None:
        runner = ms.runner.LocalRunner(timeout_sec=120, f_alloc_argument=_ALLOC_FUNC, initializer=_register_alloc_funcs)
    else:
        config = ms.runner.RPCConfig(
            tracker_host=rpc.host,
            tracker_port=rpc.port,
            tracker_key=rpc.key,
            session_timeout_sec=rpc.session_timeout_s,
        )
        runner = ms.runner.RPCRunner(
            config, max_workers=1, f_alloc_argument=_RPC_ALLOC_FUNC, initializer=_register_alloc_funcs
        )
    return builder, runner


_MS_LOGGER = "tvm.s_tir.meta_schedule"
_MS_HANDLERS = (f"{_MS_LOGGER}.console", f"{_MS_LOGGER}.file")  # the handlers MetaSchedule's config defines


@contextlib.contextmanager
def _metaschedule_logging() -> Iterator[None]:
    """While MetaSchedule sets up its loggers (tvm.s_tir.meta_schedule.logging.create_loggers), the
    handlers on its logger that its own configuration does not define are taken off (it formats each
    handler's name, which is None for an unnamed one, and dictConfig resolves only the names it
    defines), then put back, so the user's (or pytest's) handlers keep receiving MetaSchedule's records."""
    logger = logging.getLogger(_MS_LOGGER)
    foreign = [h for h in logger.handlers if h.get_name() not in _MS_HANDLERS]
    for handler in foreign:
        logger.removeHandler(handler)
    try:
        yield
    finally:
        for handler in foreign:
            logger.addHandler(handler)


def _search_strategy() -> Any:
    """Evolutionary search sized for a few dozen trials per task: TVM's defaults (population 512,
    4 genetic iterations, 50 fresh samples) spend minutes per round of 16 candidates on 2 cores
    (measured: 50 s for the first 16 trials of a GEMM, 270 s for the next 16)."""
    import tvm.s_tir.meta_schedule as ms

    return ms.search_strategy.EvolutionarySearch(
        population_size=64, init_measured_ratio=0.2, init_min_unmeasured=16, genetic_num_iters=2
    )


def _hand_schedule(sch: Any) -> None:
    """Our op's hand schedule (the first of SCHEDULES that recognises the kernel), applied in place."""
    from softdeploy.tvm.ops import SCHEDULES, inline_neighbours

    inline_neighbours(sch)
    for rule in SCHEDULES.values():
        if rule(sch):
            return


def _is_ours(task: Any) -> bool:
    """A hand rule of SCHEDULES schedules the task: a kernel of one of our ops, or a standard MatMul."""
    from softdeploy.tvm.ops import apply_schedules

    return apply_schedules(task.dispatched[0]["main"], task.task_name) is not None


def _design_space(ours: bool) -> Any:
    """MetaSchedule's generic space; for a kernel of one of our ops (``ours``), united with the op's
    hand schedule (which :func:`_measure_hand_schedule` also measures first)."""
    import tvm.s_tir.meta_schedule as ms

    if not ours:
        return "post-order-apply"
    # Without AddRFactor: our reductions are lane-split already (they vectorise as they are), and
    # rfactor doubles the design spaces per reduction block -- AdaptiveTemperatureSoftmax's ten made
    # the search hold >13 GB of candidate schedules before its first trial.
    rules = [r for r in ms.ScheduleRule.create("llvm") if not isinstance(r, ms.schedule_rule.AddRFactor)]
    return ms.space_generator.SpaceGeneratorUnion(
        [ms.space_generator.ScheduleFn(_hand_schedule), ms.space_generator.PostOrderApply(sch_rules=rules)]
    )


def _measure_hand_schedule(task: Any, target: Any, builder: Any, runner: Any, database: Any) -> float | None:
    """Builds and measures the hand schedule of one of our kernels with the tuner's own builder and
    runner, and commits it to ``database`` as a tuning record; its seconds, or None when the candidate
    failed.

    Why: the hand schedule is one point among the ~80 design spaces of MetaSchedule's generic rules
    for these kernels, so a search of a few dozen trials rarely draws it (measured: 16 trials on
    TwoPassSoftmax 4 x 32000 found 115 us, against 44 us for the hand schedule). Measured first, it
    is the record to beat, and the database never holds a best record slower than it."""
    import tvm.s_tir.meta_schedule as ms
    from tvm.s_tir import Schedule

    mod = task.dispatched[0]
    sch = Schedule(mod)
    _hand_schedule(sch)
    (built,) = builder.build([ms.builder.BuilderInput(sch.mod, target)])
    if built.error_msg is not None:
        return None
    args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
    device = "cpu" if target.kind.name == "llvm" else target.kind.name  # a device, not a compiler
    (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, device, args)])
    result = future.result()
    if result.error_msg is not None or not result.run_secs:
        return None
    run_secs = [float(getattr(t, "value", t)) for t in result.run_secs]
    workload = database.commit_workload(mod)
    database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, run_secs, target, args))
    return min(run_secs)


def _successful(database: Any, workload: Any) -> list[Any]:
    """Records of ``workload`` with a finite measured latency."""
    records = database.get_top_k(workload, 1 << 20)
    # MetaSchedule stores a failed build/run as run_secs = [1e10]
    return [r for r in records if r.run_secs and all(math.isfinite(float(s)) and float(s) < 1e9 for s in r.run_secs)]


def tune(
    mod: Any,
    database: str | Path,
    *,
    trials: int,
    target: dict[str, Any] | None = None,
    trials_per_task: int | None = None,
    rpc: RPCSpec | None = None,
    workers: int = 2,
    seed: int = 0,
    only: Sequence[str] = (),
) -> TuneReport:
    """Tunes every PrimFunc of ``mod`` (a Relax module from :func:`softdeploy.tvm.frontend.import_model`)
    for ``trials`` measurements in all, appending to the JSON database in folder ``database``.

    ``only`` restricts tuning to tasks whose names contain one of the given strings. Raises
    TuningError when no candidate of any task was measured successfully."""
    import time

    import_tvm()
    import tvm.s_tir.meta_schedule as ms

    from softdeploy.tvm.build import lower, open_database
    from softdeploy.tvm.ops import is_scheduled
    from softdeploy.tvm.target import host_target

    if trials <= 0:
        raise ValueError(f"trials must be >= 1, got {trials}")
    spec = dict(target or host_target())
    tgt = make_target(spec)
    lowered = lower(mod)
    # Written-scheduled kernels (SoftmaxTopK's block maxima and selection: attr tirx.is_scheduled) have
    # nothing to tune: their loops are the schedule, and the schedule primitives refuse them.
    extracted = [
        t for t in ms.relax_integration.extract_tasks(lowered, tgt) if not is_scheduled(t.dispatched[0]["main"])
    ]
    if only:
        extracted = [t for t in extracted if any(s in t.task_name for s in only)]
    if not extracted:
        raise TuningError("no tunable kernels in the module" + (f" matching {list(only)}" if only else ""))
    ours = [_is_ours(task) for task in extracted]  # first: a broken hand schedule raises before any worker starts
    db = open_database(database)
    builder, runner = _builder_runner(rpc, workers)
    per_task = trials_per_task or max(8, trials)
    start = time.perf_counter()
    hand = [
        _measure_hand_schedule(t, tgt, builder, runner, db) if o else None for t, o in zip(extracted, ours, strict=True)
    ]
    with tempfile.TemporaryDirectory(prefix="softdeploy-tune-") as logs:
        contexts, weights = [], []
        for task, is_ours in zip(extracted, ours, strict=True):  # a search strategy per task: they hold state
            with _metaschedule_logging():
                ctx, weight = ms.relax_integration.extracted_tasks_to_tune_contexts(
                    [task], work_dir=logs, space=_design_space(is_ours), strategy=_search_strategy(), seed=seed
                )
            contexts += ctx
            weights += weight
        try:
            ms.tune.tune_tasks(
                tasks=contexts,
                task_weights=weights,
                work_dir=logs,
                max_trials_global=trials,
                max_trials_per_task=per_task,
                num_trials_per_iter=min(16, per_task),
                builder=builder,
                runner=runner,
                database=db,
                cost_model="random",  # xgboost is not a dependency; evolutionary search still mutates the best
            )
        finally:  # MetaSchedule's per-task logs, before the folder goes: into the CLI's log file (if any)
            from softdeploy.terminal import keep_files

            keep_files(list((Path(logs) / "logs").glob("*.log")), "MetaSchedule log")
    seconds = time.perf_counter() - start
    results = []
    for task, hand_secs in zip(extracted, hand, strict=True):
        mod_task = task.dispatched[0]
        workload = db.commit_workload(mod_task) if db.has_workload(mod_task) else None
        good = _successful(db, workload) if workload is not None else []
        best = min((float(min(r.run_secs)) for r in good), default=None)
        results.append(
            TaskResult(
                task.task_name,
                float(task.weight),
                len(good),
                None if best is None else best * 1e6,
                None if hand_secs is None else hand_secs * 1e6,
            )
        )
    report = TuneReport(str(database), results, seconds)
    if report.trials == 0:
        raise TuningError(
            "MetaSchedule measured no candidate successfully (every build or run failed or timed out); "
            "nothing was tuned. Look at the builder/runner errors above; on a busy machine retry with fewer "
            "workers, or check the RPC tracker and device key."
        )
    return report


def database_size(folder: str | Path) -> int:
    """Tuning records in a database folder (0 when absent)."""
    path = Path(folder) / "database_tuning_record.json"
    if not path.is_file():
        return 0
    with path.open() as f:  # a line without its newline is being appended now, or was torn by a kill: not counted
        return sum(1 for line in f if line.endswith("\n") and line.strip() and json.loads(line))


def keep_best(folder: str | Path, per_workload: int = 1) -> tuple[int, int]:
    """Rewrites the JSON database in ``folder`` keeping the ``per_workload`` fastest successful records
    of each workload (all a build applies is the fastest) and the workloads they belong to; returns
    (records before, records after). For the records shipped in the package: every trial of a search
    is appended (MiniLM alone: 719 records, 3.4 MB), where one per kernel is what a build needs. The
    files are replaced only once both are written."""
    folder = Path(folder)
    workload_path, record_path = folder / "database_workload.json", folder / "database_tuning_record.json"
    workloads = [line for line in workload_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in record_path.read_text().splitlines() if line.strip()]

    def seconds(record: list[Any]) -> float:
        run_secs = record[1][1] or [math.inf]
        values = [float(v) for v in run_secs]
        return min(values) if all(math.isfinite(v) and v < 1e9 for v in values) else math.inf

    best: dict[int, list[list[Any]]] = {}
    for record in sorted(records, key=seconds):
        kept = best.setdefault(int(record[0]), [])
        if len(kept) < per_workload and math.isfinite(seconds(record)):
            kept.append(record)
    renumber = {old: new for new, old in enumerate(sorted(best))}
    new_workloads = [workloads[old] for old in sorted(best)]
    new_records = [[renumber[w], r[1]] for w in sorted(best) for r in best[w]]
    from softdeploy.files import atomic_output

    # both files are written completely under temporary names before either is renamed onto its own: only the instant
    # between the two renames can part them
    with atomic_output(workload_path, "tuning workloads") as tmp_workloads:
        tmp_workloads.write_text("".join(line + "\n" for line in new_workloads))
        with atomic_output(record_path, "tuning records") as tmp_records:
            tmp_records.write_text("".join(json.dumps(r) + "\n" for r in new_records))
    return len(records), len(new_records)
