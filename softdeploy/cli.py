"""The ``softdeploy`` command: a thin layer over library calls.

softdeploy ops      the operator registry (inputs, attributes, kernel variant on this CPU)
softdeploy doctor   is the native library found and loadable; versions; CPU features
softdeploy demo     a small model using the softmax-family ops: trained, exported, run with stock
                    onnxruntime and with softdeploy's kernels; agreement and latency
softdeploy compile  compile an ONNX model with TVM (optionally MetaSchedule-tuned, locally or over RPC)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _console() -> object:
    from rich.console import Console

    return Console()


def cmd_ops(args: argparse.Namespace) -> int:
    from rich.table import Table

    from softdeploy.conformance import available_isas
    from softdeploy.ops import REGISTRY
    from softdeploy.runtime import library_status

    status = library_status()
    variant = available_isas()[-1] if status.ok else "none (library not found)"
    table = Table(title=f"softdeploy ops (domain com.softdeploy, opset 1) -- kernel variant here: {variant}")
    for col in ("op", "inputs", "outputs", "attributes", "types"):
        table.add_column(col)
    for d in REGISTRY.values():
        ins = ", ".join(p.name + ("?" if p.optional else "") for p in d.inputs)
        outs = ", ".join(p.name + ("?" if p.optional else "") for p in d.outputs)
        attrs = ", ".join(f"{a.name}={'REQUIRED' if a.required else a.default!r}" for a in d.attrs)
        table.add_row(d.name, ins, outs, attrs, "/".join(d.float_types))
    _console().print(table)  # type: ignore[attr-defined]
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    import platform

    import onnx
    import onnxruntime

    import softdeploy
    from softdeploy.conformance import available_isas
    from softdeploy.runtime import library_status

    status = library_status()
    console = _console()
    rows = [
        ("softdeploy", softdeploy.__version__),
        ("python", platform.python_version()),
        ("onnxruntime", onnxruntime.__version__),
        ("onnx", onnx.__version__),
        ("library", str(status.path) if status.ok else f"NOT FOUND: {status.error}"),
        ("built against", "onnxruntime C API version 21 headers (libonnxruntime-dev 1.21)"),
        ("cpu", _cpu_model()),
        ("kernel variants", ", ".join(available_isas())),
    ]
    if status.ok:
        import numpy as np

        from softdeploy.ops import REGISTRY
        from softdeploy.runtime import Session

        bad = []
        for d in REGISTRY.values():
            sample = next(iter(d.samples(np.random.default_rng(0))))
            try:
                Session(d.make_model(sample, with_function=False), kernels="native").run(d.feeds(sample))
            except Exception as e:
                bad.append(f"{d.name}: {e}")
        rows.append(("kernels load", "all " + str(len(REGISTRY)) + " ops" if not bad else "; ".join(bad)))
    for k, v in rows:
        console.print(f"[bold]{k:>16}[/bold]  {v}")  # type: ignore[attr-defined]
    return 0 if status.ok else 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def cmd_demo(args: argparse.Namespace) -> int:
    from softdeploy.demo import run_demo

    run_demo(threads=args.threads, out=args.out, overwrite=args.overwrite)
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    import onnx

    from softdeploy.tvm.frontend import check_importable

    shapes = {}
    for item in args.shape:
        name, sep, dims = item.partition("=")
        if not sep or not dims:
            raise SystemExit(f"--shape wants NAME=D0xD1..., got {item!r}")
        shapes[name] = [int(d) for d in dims.lower().split("x")]
    if (args.rpc is None) != (args.key is None):
        raise SystemExit("--rpc HOST:PORT and --key K go together")
    model = onnx.load(args.model)
    check_importable(model)  # every op TVM cannot take, all at once, before any work

    from softdeploy.runtime.tvm import TVMSession
    from softdeploy.tvm.frontend import import_model, prepare
    from softdeploy.tvm.target import host_target
    from softdeploy.tvm.tuning import RPCSpec, tune

    rpc = RPCSpec.parse(args.rpc, args.key) if args.rpc else None
    target = host_target(mcpu=args.target_cpu)
    records = [args.records] if args.records else []
    if args.tune_trials:
        folder = args.records or "tvm-records"
        records = [folder]
        report = tune(import_model(prepare(model, shapes)), folder, trials=args.tune_trials, target=target, rpc=rpc)
        print(report.summary())
    sess = TVMSession(model, shapes=shapes, tuned=not args.untuned, databases=records, target=target, rpc=rpc)
    out = args.output or str(args.model).removesuffix(".onnx") + "_tvm.so"
    sess.save(out)
    print(sess.report.summary())
    if sess.tir_ops or sess.inlined_ops:
        print(f"softdeploy ops as TIR kernels: {list(sess.tir_ops)}; from function bodies: {list(sess.inlined_ops)}")
    print(f"wrote {out} and {out.removesuffix('.so')}.json (load with softdeploy.runtime.tvm.TVMSession.load)")
    if rpc is not None:
        import numpy as np

        feeds = {
            n: np.zeros(s, d)
            for n, s, d in zip(sess.input_names, sess.input_shapes.values(), sess.input_dtypes, strict=True)
        }
        secs = sorted(sess.benchmark(feeds))
        print(f"latency on the RPC device {rpc.key}: median {secs[len(secs) // 2] * 1e3:.3f} ms")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="softdeploy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ops", help="list the operator registry").set_defaults(fn=cmd_ops)
    sub.add_parser("doctor", help="check the native library and the environment").set_defaults(fn=cmd_doctor)
    p = sub.add_parser("demo", help="train, export and run a small model with the softmax-family ops")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="folder for the exported model (default: a new temporary folder)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing model file in --out")
    p.set_defaults(fn=cmd_demo)
    p = sub.add_parser("compile", help="compile an ONNX model with TVM (tuned schedules, RPC devices)")
    p.add_argument("model", help="ONNX model (com.softdeploy ops allowed)")
    p.add_argument("--backend", choices=["tvm"], default="tvm")
    p.add_argument("--shape", action="append", default=[], help="static input shape NAME=1x128 (repeat per input)")
    p.add_argument("--tune-trials", type=int, default=0, help="MetaSchedule trials in all (0: no tuning)")
    p.add_argument("--records", default=None, help="tuning database folder (read, and written by --tune-trials)")
    p.add_argument("--untuned", action="store_true", help="TVM's default schedules only (for comparison)")
    p.add_argument("--target-cpu", default=None, help="LLVM CPU name (default: this machine's)")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT", help="TVM RPC tracker: tune and measure there")
    p.add_argument("--key", default=None, help="device key of the RPC servers")
    p.add_argument("-o", "--output", default=None, help="compiled library (default MODEL_tvm.so)")
    p.set_defaults(fn=cmd_compile)
    args = parser.parse_args(argv)
    from softdeploy.errors import SoftdeployError

    try:
        return int(args.fn(args))
    except SoftdeployError as e:
        print(f"softdeploy: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
