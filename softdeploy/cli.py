"""The ``softdeploy`` command: a thin layer over library calls.

softdeploy ops      the operator registry (inputs, attributes, kernel variant on this CPU)
softdeploy doctor   is the native library found and loadable; versions; CPU features
softdeploy demo     a small model using the softmax-family ops: trained, exported, run with stock
                    onnxruntime and with softdeploy's kernels; agreement and latency
softdeploy quantize int8 dynamic (per-channel) or static QDQ with calibration through our kernels;
                    --max-drop keeps the nodes too sensitive to quantize in float and says why
softdeploy compare  one model in every variant (torch, onnxruntime fp32 stock / softdeploy, int8
                    dynamic / static) on the same data: task accuracy, agreement, latency, size;
                    with no arguments: all-MiniLM-L6-v2 MaxSim retrieval on chatterbot-corpus
softdeploy export   FACTORY OUT.onnx: export the module a factory returns, validate it against torch
softdeploy optimize IN.onnx OUT.onnx: rewrite standard-op patterns into softdeploy ops; per-rule report
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
    from softdeploy.compare.environment import cpuinfo
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
        ("cpu", cpuinfo()[0]),
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


def cmd_demo(args: argparse.Namespace) -> int:
    from softdeploy.demo import run_demo

    run_demo(threads=args.threads, out=args.out, overwrite=args.overwrite)
    return 0


def _quant_config(args: argparse.Namespace) -> object:
    from softdeploy.quant import QuantConfig

    return QuantConfig(
        mode=args.mode,
        per_channel=not args.per_tensor,
        op_types=tuple(args.op_types.split(",")) if args.op_types else None,
        calibrate_method=args.calibrate_method,
        exclude=tuple(n for n in (args.exclude or "").split(",") if n),
    )


def cmd_quantize(args: argparse.Namespace) -> int:
    from pathlib import Path

    from softdeploy.compare.progress import RichProgress
    from softdeploy.quant import BudgetResult, candidate_nodes
    from softdeploy.quant.quantize import load_named
    from softdeploy.quant.workflow import load_npz_batches, quantize_case, quantize_file, write_report

    console = _console()
    config = _quant_config(args)
    if args.list:
        if not args.model:
            console.print("--list needs a MODEL file")  # type: ignore[attr-defined]
            return 2
        for name, op in candidate_nodes(load_named(args.model), config):  # type: ignore[arg-type]
            console.print(f"{op:>10}  {name}")  # type: ignore[attr-defined]
        return 0
    if args.model:
        output = Path(args.output or Path(args.model).with_suffix("").as_posix() + f".int8_{args.mode}.onnx")
        data = load_npz_batches(args.data, args.batch) if args.data else None
        if config.mode == "static" and not data:  # type: ignore[attr-defined]
            console.print("static quantization needs --data inputs.npz (calibration samples)")  # type: ignore[attr-defined]
            return 2
        with RichProgress(console) as progress, progress.step("quantize") as advance:
            result = quantize_file(
                args.model,
                output,
                config,  # type: ignore[arg-type]
                data=data,
                max_drop=args.max_drop,
                threads=args.threads,
                progress=lambda _s: advance(1),
            )
    else:
        from softdeploy.models import get_case

        output = Path(args.output or f"softdeploy-quantize/{args.case}.int8_{args.mode}.onnx")
        output.parent.mkdir(parents=True, exist_ok=True)
        with RichProgress(console) as progress:
            _, result = quantize_case(
                get_case(args.case),
                output,
                config,  # type: ignore[arg-type]
                max_drop=args.max_drop,
                metric=args.metric,
                progress=progress,
            )
    report = write_report(result, output.with_suffix(".json"))
    if isinstance(result, BudgetResult):
        for line in result.explain():
            console.print(line)  # type: ignore[attr-defined]
        model = result.model
    else:
        model = result
    console.print(  # type: ignore[attr-defined]
        f"wrote {model.path} ({model.size_bytes / 2**20:.1f} MiB; {len(model.quantized_nodes)} nodes int8, "
        f"{len(model.float_nodes)} candidates in float"
        + (f"; calibration through {model.calibration_kernels} kernels" if model.calibration_kernels else "")
        + f") and {report}"
    )
    return 0 if not isinstance(result, BudgetResult) or result.met else 1


def cmd_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from softdeploy.compare import VARIANTS, run_compare
    from softdeploy.compare.progress import RichProgress
    from softdeploy.compare.report import print_table, write_reports
    from softdeploy.models import get_case

    console = Console()
    if not console.is_terminal:  # a log file: don't squeeze the wide table into 80 columns
        console = Console(width=240)
    variants = [v for v in args.variants.split(",") if v] if args.variants else list(VARIANTS)
    out = Path(args.out) / args.case
    with RichProgress(console) as progress:
        result = run_compare(
            get_case(args.case, quick=args.quick),
            out,
            variants=variants,
            threads=args.threads,
            eval_threads=args.eval_threads,
            rounds=3 if args.quick else args.rounds,
            quiet_wait=0.0 if args.quick else args.quiet_wait,
            progress=progress,
        )
        with progress.step("write report.md, results.csv, results.json, accuracy_vs_latency.png"):
            paths = write_reports(result, out)
    print_table(result, console)
    console.print(f"reports in {out}/: " + ", ".join(p.name for p in paths.values()))  # type: ignore[attr-defined]
    console.print(f"total {result.seconds:.0f} s")  # type: ignore[attr-defined]
    return 0


def _refuse_overwrite(path: str, overwrite: bool) -> None:
    from pathlib import Path

    from softdeploy.errors import ExportError

    if Path(path).exists() and not overwrite:
        raise ExportError(f"{path} exists; pass --overwrite to replace it")


def cmd_export(args: argparse.Namespace) -> int:
    from softdeploy.export.api import export
    from softdeploy.export.factory import load_factory

    _refuse_overwrite(args.out, args.overwrite)
    spec = load_factory(args.factory)
    tolerance = tuple(float(v) for v in args.tolerance.split(",")) if args.tolerance else None
    result = export(
        spec.module,
        spec.example_inputs,
        args.out,
        dynamic_shapes=spec.dynamic_shapes,
        opset=args.opset,
        validate=not args.no_validate,
        tolerance=tolerance,  # type: ignore[arg-type]
        strict=not args.keep_failed,
        overwrite=args.overwrite,
    )
    print(f"wrote {args.out}: com.softdeploy ops {result.custom_ops or 'none'}")
    if result.validation is not None:
        print(result.validation.to_markdown())
        return 0 if result.validation.ok else 1
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    import onnx

    from softdeploy.export.rewrites import DEFAULT_RULES, optimize

    _refuse_overwrite(args.out, args.overwrite)
    dims = dict(_dim(d) for d in args.dim)
    feeds = None
    if args.feeds:
        import numpy as np

        with np.load(args.feeds, allow_pickle=False) as data:
            feeds = {k: data[k] for k in data.files}
    result = optimize(
        args.input,
        rules=args.rules.split(",") if args.rules else list(DEFAULT_RULES),
        nms_to_softnms=args.nms_to_softnms,
        two_pass_min_row=args.two_pass_min_row,
        verify=not args.no_verify,
        feeds=feeds,
        dims=dims,
    )
    onnx.save(result.model, args.out)
    print(result.to_text())
    print(f"wrote {args.out}")
    return 0


def _dim(text: str) -> tuple[str, int]:
    name, _, size = text.partition("=")
    if not size.isdigit():
        raise argparse.ArgumentTypeError(f"--dim wants NAME=SIZE, got {text!r}")
    return name, int(size)


def _add_export_commands(sub: argparse._SubParsersAction) -> None:
    from softdeploy.export.rewrites.two_pass_softmax import MIN_ROW_LENGTH

    p = sub.add_parser(
        "export",
        help="export a torch module to ONNX with softdeploy ops, validated against torch",
        description="FACTORY is 'package.module:attr' or 'path/to/file.py:attr': a callable returning "
        "(module, example_inputs) or (module, example_inputs, dynamic_shapes).",
    )
    p.add_argument("factory")
    p.add_argument("out")
    p.add_argument("--opset", type=int, default=18)
    p.add_argument("--no-validate", action="store_true", help="skip the onnxruntime-vs-torch validation")
    p.add_argument("--tolerance", help="RTOL,ATOL for every float output (default: per dtype)")
    p.add_argument("--keep-failed", action="store_true", help="write the model even when validation fails")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("optimize", help="rewrite standard-op patterns of an ONNX model into softdeploy ops")
    p.add_argument("input")
    p.add_argument("out")
    p.add_argument("--rules", help="comma-separated rules (softmax-topk, maxsim, two-pass-softmax, nms-to-softnms)")
    p.add_argument("--nms-to-softnms", action="store_true", help="also NonMaxSuppression => SoftNMS(method=hard)")
    p.add_argument("--two-pass-min-row", type=int, default=MIN_ROW_LENGTH, help="two-pass-softmax: min row length")
    p.add_argument("--no-verify", action="store_true", help="skip running original and rewritten model")
    p.add_argument("--feeds", help=".npz of inputs for the verification (default: random)")
    p.add_argument("--dim", action="append", default=[], help="NAME=SIZE for a symbolic input dim (verification)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.set_defaults(fn=cmd_optimize)


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
    _add_quantize_parser(sub)
    _add_compare_parser(sub)
    _add_export_commands(sub)
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


def _add_quantize_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from softdeploy.models import CASES, DEFAULT_CASE

    p = sub.add_parser(
        "quantize",
        help="int8 quantization (dynamic / static QDQ), optionally under an accuracy budget",
        description="Quantize MODEL (an ONNX file; data from --data) or, without MODEL, a built-in case's "
        "model with its own data and task metric.",
    )
    p.add_argument("model", nargs="?", help="ONNX model; omit to quantize --case")
    p.add_argument("-o", "--output", help="quantized model path")
    p.add_argument("--mode", choices=("dynamic", "static"), default="dynamic")
    p.add_argument("--per-tensor", action="store_true", help="one weight scale per tensor (default: per channel)")
    p.add_argument("--op-types", help="comma-separated op types to quantize (default: per mode)")
    p.add_argument("--calibrate-method", choices=("minmax", "percentile", "entropy"), default="minmax")
    p.add_argument("--exclude", help="comma-separated node names to keep in float")
    p.add_argument("--data", help=".npz of model inputs (samples along axis 0): calibration and accuracy data")
    p.add_argument("--batch", type=int, default=8, help="batch size when reading --data")
    p.add_argument("--case", choices=sorted(CASES), default=DEFAULT_CASE, help="built-in case (without MODEL)")
    p.add_argument("--max-drop", type=float, help="accuracy budget: largest allowed drop of the metric")
    p.add_argument("--metric", help="case metric for --max-drop (default: the case's task metric)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--list", action="store_true", help="list the nodes that would be quantized and exit")
    p.set_defaults(fn=cmd_quantize)


def _add_compare_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from softdeploy.compare import VARIANTS
    from softdeploy.models import CASES, DEFAULT_CASE

    p = sub.add_parser(
        "compare",
        help="accuracy and latency of every variant of a model on real data",
        description="Variants: " + ", ".join(VARIANTS) + ". Reports go to OUT/CASE/.",
    )
    p.add_argument("--case", choices=sorted(CASES), default=DEFAULT_CASE)
    p.add_argument("--out", default="softdeploy-results", help="output folder (models and reports)")
    p.add_argument("--variants", help="comma-separated subset of the variants")
    p.add_argument("--threads", type=int, default=1, help="threads for the latency measurements")
    p.add_argument("--eval-threads", type=int, help="threads for the accuracy runs (default: all cores)")
    p.add_argument("--rounds", type=int, default=8, help="interleaved timing rounds")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="before timing, wait up to this many seconds for other processes to go idle (shared machines)",
    )
    p.add_argument("--quick", action="store_true", help="a subset of the data and fewer rounds (smoke test)")
    p.set_defaults(fn=cmd_compare)


if __name__ == "__main__":
    sys.exit(main())
