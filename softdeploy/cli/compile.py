"""``softdeploy compile``: an ONNX model compiled with TVM (optionally tuned, locally or over RPC)."""

from __future__ import annotations

import argparse

from softdeploy.cli._common import refuse_overwrite, terminal_console


def cmd_compile(args: argparse.Namespace) -> int:
    """``softdeploy compile MODEL --backend tvm``: checks every op is importable, then compiles (optionally tuned,
    locally or over RPC) to MODEL_tvm.so and its .json."""

    from softdeploy.errors import ArgumentError
    from softdeploy.files import load_model
    from softdeploy.tvm.frontend import check_importable
    from softdeploy.tvm.target import import_tvm

    shapes = {}
    for item in args.shape:
        name, sep, dims = item.partition("=")
        if not sep or not all(d.isdigit() for d in dims.lower().split("x")):
            raise ArgumentError(f"--shape wants NAME=D0xD1..., got {item!r}")
        shapes[name] = [int(d) for d in dims.lower().split("x")]
    if (args.rpc is None) != (args.key is None):
        raise ArgumentError("--rpc HOST:PORT and --key K go together")
    out = args.output or str(args.model).removesuffix(".onnx") + "_tvm.so"
    from pathlib import Path

    signature = Path(out).with_suffix(".json")  # what TVMSession.save writes beside the library
    refuse_overwrite([out, signature], args.overwrite, sources=[args.model])
    model = load_model(args.model)
    import_tvm()  # TVMNotInstalledError with the pip command, before anything imports tvm
    check_importable(model)  # every op TVM cannot take, all at once, before any work

    from softdeploy.terminal import captured
    from softdeploy.tvm.frontend import import_model, prepare
    from softdeploy.tvm.session import TVMSession
    from softdeploy.tvm.target import host_target
    from softdeploy.tvm.tuning import RPCSpec, tune

    rpc = RPCSpec.parse(args.rpc, args.key) if args.rpc else None
    target = host_target(mcpu=args.target_cpu)
    records = [args.records] if args.records else []
    if args.tune_trials:
        folder = args.records or "tvm-records"
        records = [folder]
        with _TuningProgress(folder, args.tune_trials), captured("tune"):
            report = tune(
                import_model(prepare(model, shapes), target), folder, trials=args.tune_trials, target=target, rpc=rpc
            )
        print(report.summary())
    with captured("build"):
        sess = TVMSession(model, shapes=shapes, tuned=not args.untuned, databases=records, target=target, rpc=rpc)
        sess.save(out)
    print(sess.report.summary())
    if sess.tir_ops or sess.inlined_ops:
        print(f"softdeploy ops as TIR kernels: {list(sess.tir_ops)}; from function bodies: {list(sess.inlined_ops)}")
    print(f"wrote {out} and {signature} (load with softdeploy.tvm.session.TVMSession.load)")
    if rpc is not None:
        import numpy as np

        feeds = {
            n: np.zeros(s, d)
            for n, s, d in zip(sess.input_names, sess.input_shapes.values(), sess.input_dtypes, strict=True)
        }
        secs = sorted(sess.benchmark(feeds))
        print(f"latency on the RPC device {rpc.key}: median {secs[len(secs) // 2] * 1e3:.3f} ms")
    else:
        note = _tvm_vs_onnxruntime(model, sess)
        if note:
            print(note)
    return 0


# A model this small per call is dominated by per-call overhead, which onnxruntime keeps lower than
# TVM's VM: worth measuring even when tuned. Bytes of initializers.
_SMALL_MODEL_BYTES = 16 * 2**20


def _tvm_vs_onnxruntime(model: object, sess: object, *, runs: int = 20) -> str | None:
    """One line comparing the compiled model with onnxruntime (softdeploy's kernels), one thread each,
    when it may well be slower: kernels without tuning records for this CPU, or a small model. Why and
    what to do, when TVM is the slower one. None when not measured."""
    import numpy as np

    from softdeploy.compare.latency import time_batches_interleaved
    from softdeploy.runtime import Session, library_status
    from softdeploy.terminal import captured
    from softdeploy.tvm.session import set_threads

    report = sess.report  # type: ignore[attr-defined]
    # kernels on TVM's default schedules: all of them in an --untuned build (which counts no tasks)
    untuned = report.tasks - report.from_database if report.tuned else -1
    size = sum(len(t.raw_data) or 4 * int(np.prod(t.dims)) for t in model.graph.initializer)  # type: ignore[attr-defined]
    if not untuned and size >= _SMALL_MODEL_BYTES and report.tuned:
        return None
    rng = np.random.default_rng(0)
    feeds = {
        n: (rng.standard_normal(s).astype(d) if np.dtype(d).kind == "f" else np.zeros(s, d))
        for n, s, d in zip(sess.input_names, sess.input_shapes.values(), sess.input_dtypes, strict=True)  # type: ignore[attr-defined]
    }

    # softdeploy's kernels where the library loads, else their function bodies (stock onnxruntime)
    kernels = "native" if library_status().info is not None else "portable"
    try:
        with captured("latency check"):
            set_threads(1)
            ort = Session(model, kernels=kernels, threads=1)
            # one call of each per round, in turn: a burst of other load hits both alike
            timings = time_batches_interleaved(
                {"tvm": lambda: sess.run(feeds), "onnxruntime": lambda: ort.run(feeds)},  # type: ignore[attr-defined]
                rounds=runs,
                batch_seconds=0.0,
            )
            tvm_ms, ort_ms = timings["tvm"].median * 1e3, timings["onnxruntime"].median * 1e3
    except Exception as e:  # the library is written; the comparison is a note, and says why it is missing
        first = next((s for s in str(e).splitlines() if s.strip()), "")
        return f"latency check against onnxruntime not done: {type(e).__name__}: {first}"
    ratio = tvm_ms / ort_ms
    line = f"latency (1 thread, median of {runs}): TVM {tvm_ms:.3f} ms, onnxruntime {ort_ms:.3f} ms"
    if kernels == "portable":
        line += " (stock, function bodies)"
    if ratio <= 1.1:
        return f"{line}: TVM {1 / ratio:.1f}x as fast"
    why = []
    if untuned < 0:
        why.append("an --untuned build: TVM's default schedules, untuned for this CPU")
    elif untuned:
        why.append(f"{untuned} of {report.tasks} kernels untuned for this CPU (TVM's default schedules)")
    if size < _SMALL_MODEL_BYTES:
        why.append(f"a small model ({size / 2**10:.0f} KiB of weights): per-call overhead dominates")
    if untuned < 0:
        todo = "build without --untuned, tuned with --tune-trials N (about 64 per kernel)"
    elif untuned:
        todo = "tune with --tune-trials N (about 64 per kernel; the records are reused by later builds)"
    else:
        todo = "for a model this small, onnxruntime is the faster backend"
    return f"note: TVM is {ratio:.1f}x slower than onnxruntime here ({line}): {'; '.join(why)}; {todo}"


class _TuningProgress:
    """A progress line while MetaSchedule tunes: trials recorded in the database folder (MetaSchedule
    appends a record per measured candidate), polled once a second; its own logs go to the log file."""

    def __init__(self, folder: str, trials: int) -> None:
        from pathlib import Path

        self.file = Path(folder) / "database_tuning_record.json"
        self.trials = trials

    def _count(self) -> int:
        try:
            with open(self.file, "rb") as f:
                return sum(1 for _ in f)
        except OSError:
            return 0

    def __enter__(self) -> _TuningProgress:
        import threading

        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.start = self._count()
        self.stop = threading.Event()
        self.progress = Progress(
            TextColumn("tune (MetaSchedule) trials measured"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=terminal_console(),  # type: ignore[arg-type]
            transient=False,
        )
        self.task = self.progress.add_task("tune", total=self.trials)
        self.progress.start()

        def poll() -> None:
            while not self.stop.wait(1.0):
                self._update()

        self.thread = threading.Thread(target=poll, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._update()
        self.progress.stop()

    def _update(self) -> None:
        # MetaSchedule measures whole batches (and softdeploy's hand schedules first): it may measure
        # more candidates than --tune-trials asked for, and the bar says so rather than stopping at 100%
        done = self._count() - self.start
        self.progress.update(self.task, completed=done, total=max(self.trials, done))
