"""Relax IRModule -> executable, untuned or with tuned schedules applied.

``untuned``: TVM's default pipeline and nothing else (TVM's naive loop nests; what a user gets
from ``tvm.compile`` alone). ``tuned``: the module is lowered to PrimFuncs (legalize + fuse), every
PrimFunc found in the tuning databases (the records shipped in ``softdeploy/tvm/records/<class>/`` for the
target's CPU class, see :func:`shipped_records_for`, and the user's own) gets its tuned schedule, the rest our ops' hand schedules or dlight's CPU default
schedules, then it is built. :class:`BuildReport` says which kernel got which schedule, and why any
kernel got none (a rule that raises is reported and warned about, never taken for "does not apply").
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from softdeploy.tvm.target import import_tvm, make_target

# One MetaSchedule database per CPU class (softdeploy.tvm.target.record_class): records/avx512/, records/avx2/.
RECORDS_DIR = Path(__file__).resolve().parent / "records"


@dataclasses.dataclass(frozen=True)
class ShippedRecords:
    """Which shipped tuning records a target gets: the folder (None: none match its CPU), the target's
    record class and ``-mcpu``, and the classes shipped."""

    folder: Path | None
    record_class: str | None
    mcpu: str
    shipped: tuple[str, ...]

    def note(self) -> str:
        """One line for the build report: which class applies, or that the build is untuned for this CPU."""
        if self.folder is not None:
            return f"tuned records: {self.record_class} class for -mcpu={self.mcpu}"
        why = (
            f"whose class {self.record_class} ships no records"
            if self.record_class is not None
            else "which is neither AVX-512 nor AVX2 + FMA"
        )
        return (
            f"UNTUNED for this CPU: no shipped tuning records for -mcpu={self.mcpu}, {why} (shipped classes: "
            f"{', '.join(self.shipped) or 'none'}); another class's schedules are not applied"
        )


def shipped_records_for(spec: dict[str, Any], root: Path = RECORDS_DIR) -> ShippedRecords:
    """The shipped records for target ``spec``: ``root/<class>/`` where the target's record class
    (:func:`softdeploy.tvm.target.record_class`) has a database there, else no folder."""
    from softdeploy.tvm.target import record_class

    shipped = tuple(
        sorted(p.name for p in root.iterdir() if (p / "database_tuning_record.json").is_file()) if root.is_dir() else ()
    )
    cls = record_class(spec)
    folder = root / cls if cls in shipped else None
    return ShippedRecords(folder, cls, str(spec.get("mcpu", "")), shipped)


@dataclasses.dataclass
class BuildReport:
    """What a TVM build used: the target, whether tuning records applied, the databases read, how many kernels took a
    schedule, how many came from a record and which did not, and how many were written scheduled."""

    target: dict[str, Any]
    tuned: bool
    databases: list[str]
    # which shipped records applied ("tuned records: avx2 class for -mcpu=znver3") or that none match this
    # CPU (ShippedRecords.note); empty when the build left the shipped records out
    records_note: str = ""
    tasks: int = 0  # PrimFuncs in the lowered module that take a schedule (written-scheduled ones aside)
    from_database: int = 0  # of those, scheduled from a tuning record
    written: int = 0  # PrimFuncs written scheduled (SoftmaxTopK's block maxima and selection): no record applies
    names_untuned: list[str] = dataclasses.field(default_factory=list)
    # every kernel reads its parameters at any element-aligned address (_element_aligned_params), so a
    # session can pass numpy inputs in place instead of copying them to 64-byte-aligned memory
    any_alignment: bool = False
    # kernel -> how it was scheduled: "tuning record", "written", "hand (<SCHEDULES rule>)" or "dlight"
    schedules: dict[str, str] = dataclasses.field(default_factory=dict)
    # kernel -> why it got NO schedule and runs TVM's default loop nest (correct, but a broken hand
    # schedule measured 30-77x slower): the dlight error, or that no rule applies
    unscheduled: dict[str, str] = dataclasses.field(default_factory=dict)
    # kernel -> {hand schedule rule -> its error}: rules that raised (a broken schedule, never "does not
    # apply": a rule that does not recognise a kernel returns False); each is also warned about
    schedule_errors: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    # kernel -> why its parameters kept TVM's 64-byte alignment (see _element_aligned_params)
    alignment_kept: dict[str, str] = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        """One line: tuned or not, kernels from tuning records out of all, the databases."""
        if not self.tuned:
            return f"untuned build for {self.target}"
        hand = sum(v.startswith("hand") for v in self.schedules.values())
        text = (
            f"tuned build for {self.target}: {self.from_database}/{self.tasks} kernels from tuning records "
            f"({', '.join(self.databases) or 'no database'}); {hand} hand-scheduled, dlight defaults for the rest"
            + (f"; {self.written} written scheduled" if self.written else "")
            + (f"; {self.records_note}" if self.records_note else "")
        )
        problems = [f"  {k}: NO schedule ({why})" for k, why in sorted(self.unscheduled.items())]
        problems += [
            f"  {k}: hand schedule {rule} failed: {why}"
            for k, errors in sorted(self.schedule_errors.items())
            for rule, why in sorted(errors.items())
        ]
        return "\n".join([text, *problems])


DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")


def drop_torn_lines(folder: str | Path) -> list[Path]:
    """Cuts the last line of each JSON database file in ``folder`` that does not end in a newline: MetaSchedule
    appends one JSON line per workload and record, so a tuning run killed during an append leaves half a line, which
    would stop every later run that opens the database. Says so in one warning per file; returns the files cut."""
    from softdeploy.errors import SoftdeployWarning
    from softdeploy.files import write_bytes

    cut = []
    for name in DATABASE_FILES:
        path = Path(folder) / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if not data or data.endswith(b"\n"):
            continue
        keep = data[: data.rfind(b"\n") + 1]
        write_bytes(path, keep, "tuning database")
        warnings.warn(
            f"{path}: its last line ({len(data) - len(keep)} bytes) was cut short, as by a run killed while writing "
            "it; dropped (the lines before it are kept)",
            SoftdeployWarning,
            stacklevel=2,
        )
        cut.append(path)
    return cut


def open_database(path: str | Path) -> Any:
    """The JSON tuning database in folder ``path`` (created when missing; a line that a killed run left half-written
    is dropped, see :func:`drop_torn_lines`)."""
    import_tvm()
    import tvm.s_tir.meta_schedule as ms

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    drop_torn_lines(path)
    return ms.database.JSONDatabase(
        path_workload=str(path / "database_workload.json"),
        path_tuning_record=str(path / "database_tuning_record.json"),
        module_equality="structural",
    )


def lower(mod: Any) -> Any:
    """Legalize + fuse: the module whose PrimFuncs are the tuning tasks.

    FastMathTransform swaps exp / erf / tanh for TVM's polynomial versions: the plain ones lower to
    one libm call per element, which no schedule vectorises (MiniLM's GELU, erf-based, took 3.4 ms per
    layer at 2 threads that way, more than its matmuls)."""
    import_tvm()
    from tvm import relax

    mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = relax.transform.FastMathTransform()(mod)
    return relax.get_pipeline("zero")(mod)


def _default_schedules(mod: Any, report: BuildReport) -> Any:
    """Our ops' hand schedules, then dlight's CPU rules, for every kernel without a schedule, one kernel
    at a time, recorded in ``report`` (``schedules``, ``unscheduled``, ``schedule_errors``). A kernel no
    rule schedules (e.g. dlight refusing the zero-extent loops of an empty tensor) keeps TVM's default
    loop nest -- still correct -- and is listed with the reason; a hand rule that raises is listed
    and warned about (ScheduleWarning), never taken for "does not apply"."""
    tvm = import_tvm()
    from tvm.s_tir import dlight as dl

    from softdeploy.tvm.ops import error_line, is_scheduled, try_schedules

    rules = dl.ApplyDefaultSchedule(dl.cpu.GEMV(), dl.cpu.Reduction())
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tvm.tirx.PrimFunc) or is_scheduled(func):
            continue
        name = gv.name_hint
        ours, rule, errors = try_schedules(func)
        if errors:
            report.schedule_errors[name] = errors
        if ours is not None:
            mod[gv] = ours.with_attr("tirx.is_scheduled", True)
            report.schedules[name] = f"hand ({rule})"
            continue
        failed = "; ".join(f"hand schedule {r} raised {why}" for r, why in sorted(errors.items()))
        try:
            scheduled = rules(tvm.IRModule({gv: func}))
        except Exception as e:  # reported below: the kernel keeps TVM's default loop nest
            report.unscheduled[name] = "; ".join(filter(None, [failed, f"dlight raised {error_line(e)}"]))
            continue
        if not is_scheduled(scheduled[gv]):
            report.unscheduled[name] = failed or "no hand schedule or dlight rule applies"
            continue
        mod[gv] = scheduled[gv]
        report.schedules[name] = "dlight"
    return mod


# A parallel loop wakes the pool's workers on every call; when they do not spin (the benchmarks'
# policy, as for onnxruntime's pool in softdeploy's sessions) that costs ~10 us here, more than a small
# kernel takes: SoftmaxTopK 4 x 32000 at 2 threads took 86 us with its four kernels parallel, 40 us
# serial. As the C++ kernels (ops/common/kernel.h, NumTasks: >= 65536 entries per task), a kernel keeps
# its parallel loops only when its largest buffer holds two such tasks.
PARALLEL_MIN_ELEMENTS = 2 * 65536


def _largest_buffer(func: Any) -> int:
    """Elements of the largest parameter buffer of a PrimFunc (a dynamic shape counts as large)."""
    tvm = import_tvm()
    largest = 0
    for param in func.params:
        shape = getattr(param.ty, "shape", None)
        if shape is None:  # a scalar parameter
            continue
        if not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
            return PARALLEL_MIN_ELEMENTS
        n = 1
        for d in shape:
            n *= int(d)
        largest = max(largest, n)
    return largest


def _element_aligned_params(mod: Any, kept: dict[str, str] | None = None) -> tuple[Any, bool]:
    """Every PrimFunc of ``mod`` with its parameter buffers declared aligned to their element size
    instead of TVM's 64 bytes, and whether that held for all of them.

    Why: numpy allocates at 16-byte boundaries, and a kernel declared 64-byte aligned gets aligned
    vector loads (a fault on other addresses), so each input had to be copied first (~10 us per
    512 KiB, ~350 us for MaxSim's 4 MiB documents; onnxruntime reads in place). Declared element-aligned,
    LLVM emits unaligned loads, which cost the same on aligned data on x86-64 (measured:
    TwoPassSoftmax 4 x 32000, 42.8 us aligned, 43.5 us at +4 bytes). TVM 0.27 has no option or
    public constructor for this, so the signature is rewritten in TVMScript and parsed back; a kernel
    whose round trip fails (or does not show the new alignment) keeps 64 and the result says False;
    ``kept`` (when given) gets each such kernel and why.
    The same round trip makes a small kernel's parallel loops serial (:data:`PARALLEL_MIN_ELEMENTS`)."""
    tvm = import_tvm()
    from softdeploy.tvm.ops import error_line

    ok = True
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        serial = _largest_buffer(func) < PARALLEL_MIN_ELEMENTS
        why = "the round trip lost the declared alignment"
        try:
            rewritten = _parse_with_element_alignment(func, serial=serial)
        except Exception as e:  # TVMScript that does not parse back: the kernel stays as it was, reported
            rewritten, why = None, f"its TVMScript does not parse back: {error_line(e)}"
        if rewritten is None:
            ok = False
            if kept is not None:
                kept[gv.name_hint] = why
            continue
        mod[gv] = rewritten
    return mod, ok


def _parse_with_element_alignment(func: Any, *, serial: bool = False) -> Any | None:
    """The round trip of :func:`_element_aligned_params`; ``serial``: its parallel loops made serial
    too (:data:`PARALLEL_MIN_ELEMENTS`)."""
    tvm = import_tvm()
    head, sep, body = func.script().partition("):\n")  # the signature ends at the first "):" line end
    if serial:
        body = body.replace("T.parallel(", "T.serial(")
    out, pos = [], 0
    while (start := head.find("T.Buffer(", pos)) >= 0:
        depth, end = 0, start + len("T.Buffer")
        while end < len(head):  # to the matching ")" (shapes hold calls: T.int64(128))
            depth += {"(": 1, ")": -1}.get(head[end], 0)
            if depth == 0:
                break
            end += 1
        args = head[start:end]
        dtype = args.split('"')[1] if '"' in args else "float32"  # T.Buffer((shape), "dtype", ...)
        out.append(head[pos:end] + f", align={max(1, tvm.DataType(dtype).bits // 8)})")
        pos = end + 1
    out.append(head[pos:])
    parsed = _parse_script("".join(out) + sep + body)
    want = [max(1, tvm.DataType(p.ty.dtype).bits // 8) for p in parsed.params]
    if [int(p.ty.data_alignment) for p in parsed.params] != want:
        return None
    return parsed


@functools.lru_cache(maxsize=256)
def _parse_script(text: str) -> Any:
    """``text`` parsed as TVMScript, once per distinct text: parsing costs far more than printing (the
    parser inspects the Python stack), and the same kernel recurs across builds of one model and of
    models sharing a shape. The PrimFunc is shared safely: TVM IR nodes are immutable (passes and
    ``with_attr`` return new nodes; copy-on-write copies a node the cache still holds)."""
    return import_tvm().script.from_source(text)


def schedule(
    mod: Any,
    *,
    target: dict[str, Any] | None = None,
    databases: Sequence[str | Path] = (),
    shipped_records: bool = True,
) -> tuple[Any, BuildReport]:
    """(scheduled module, report): the tuned build up to, not including, code generation.
    ``shipped_records=False`` leaves out softdeploy/tvm/records (so that the hand schedules show); otherwise
    the records of the target's CPU class apply (:func:`shipped_records_for`), and the report says which, or that
    none match this CPU."""
    tvm = import_tvm()
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from softdeploy.tvm.errors import ScheduleWarning
    from softdeploy.tvm.ops import is_scheduled
    from softdeploy.tvm.target import host_target

    spec = dict(target or host_target())
    tgt = make_target(spec)
    choice = shipped_records_for(spec) if shipped_records else None
    folders = ([choice.folder] if choice is not None and choice.folder is not None else []) + [
        Path(p) for p in databases
    ]
    mod = lower(mod)
    dbs = [open_database(p) for p in folders]
    report = BuildReport(spec, True, [str(p) for p in folders], records_note=choice.note() if choice else "")
    written = {gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc) and is_scheduled(f)}
    with tgt, tvm.transform.PassContext(opt_level=3):
        if dbs:
            union = dbs[0] if len(dbs) == 1 else ms.database.UnionDatabase(*dbs)
            with union:
                mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
        prims = {
            gv.name_hint: f
            for gv, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint not in written
        }
        report.tasks, report.written = len(prims), len(written)
        report.from_database = sum(is_scheduled(f) for f in prims.values())
        report.names_untuned = sorted(n for n, f in prims.items() if not is_scheduled(f))
        report.schedules = {n: "written" for n in written} | {
            n: "tuning record" for n, f in prims.items() if is_scheduled(f)
        }
        mod = _default_schedules(mod, report)
        mod, report.any_alignment = _element_aligned_params(mod, report.alignment_kept)
    for kernel, errors in sorted(report.schedule_errors.items()):
        rules = "; ".join(f"{rule}: {why}" for rule, why in sorted(errors.items()))
        how = report.schedules.get(kernel) or f"NO schedule ({report.unscheduled.get(kernel, '')})"
        warnings.warn(ScheduleWarning(f"hand schedule failed on kernel {kernel} ({rules}); it got {how}"), stacklevel=3)
    return mod, report


def build(
    mod: Any,
    *,
    target: dict[str, Any] | None = None,
    tuned: bool = True,
    databases: Sequence[str | Path] = (),
    shipped_records: bool = True,
) -> tuple[Any, BuildReport]:
    """(executable, report). ``databases``: user tuning folders, applied over the shipped records
    (``shipped_records=False``: without them)."""
    tvm = import_tvm()
    from tvm import relax

    from softdeploy.tvm.target import host_target

    spec = dict(target or host_target())
    tgt = make_target(spec)
    if not tuned:
        mod = relax.transform.DecomposeOpsForInference()(mod)
        return tvm.compile(mod, target=tgt), BuildReport(spec, False, [])
    mod, report = schedule(mod, target=spec, databases=databases, shipped_records=shipped_records)
    return tvm.compile(mod, target=tgt), report
