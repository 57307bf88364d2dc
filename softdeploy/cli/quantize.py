"""``softdeploy quantize``: its arguments, and a call to :mod:`softdeploy.workflow.quantize`."""

from __future__ import annotations

import argparse
import sys

from softdeploy.cli._common import refuse_overwrite, terminal_console


def _quant_config(args: argparse.Namespace) -> object:
    from softdeploy.quant import QuantConfig

    return QuantConfig(
        mode=args.mode,
        per_channel=not args.per_tensor,
        op_types=tuple(args.op_types.split(",")) if args.op_types else None,
        calibrate_method=args.calibrate_method,
        exclude=tuple(n for n in (args.exclude or "").split(",") if n),
        weights=args.weights,
        target=args.target,
    )


def cmd_quantize(args: argparse.Namespace) -> int:
    """``softdeploy quantize``: a model file (data from --data) or a built-in --case, plainly or under an accuracy
    budget (--max-drop); writes the model and its .json report."""
    from pathlib import Path

    from softdeploy.progress import RichProgress
    from softdeploy.quant import BudgetResult, candidate_nodes
    from softdeploy.quant.quantize import load_named
    from softdeploy.terminal import captured
    from softdeploy.workflow.quantize import quantize_case, quantize_file, write_report

    console = terminal_console()
    config = _quant_config(args)
    if args.list:
        if not args.model:
            console.print("--list needs a MODEL file")  # type: ignore[attr-defined]
            return 2
        for name, op in candidate_nodes(load_named(args.model), config):  # type: ignore[arg-type]
            console.print(f"{op:>10}  {name}")  # type: ignore[attr-defined]
        return 0
    if bool(args.model) == bool(args.case):  # neither (no silent default job) or both
        print(args.usage, end="", file=sys.stderr)
        which = "not both" if args.model else "one of them"
        print(f"softdeploy quantize: error: give MODEL (an ONNX file) or --case CASE, {which}", file=sys.stderr)
        return 2
    if args.model:
        output = Path(args.output or Path(args.model).with_suffix("").as_posix() + f".int8_{args.mode}.onnx")
        # --data, --labels and --calibration may name arrays or loaders as well as files: the files among them
        inputs = [args.model, *(p for p in (args.data, args.labels, args.calibration) if p and Path(p).exists())]
        # the model file is read and checked once, by quantize_file, before any work
        refuse_overwrite([output, output.with_suffix(".json")], args.overwrite, sources=inputs)
        from softdeploy.workflow.spec import DataSpec, MetricSpec

        data = None
        if args.data:
            data = DataSpec(
                inputs=args.data,
                labels=args.labels,
                batch=args.batch,
                constant=tuple(c for c in (args.constant or "").split(",") if c),
                calibration=args.calibration,
            )
        metric = None
        if args.metric:  # NAME or NAME=OUTPUT (NAME: a built-in, or pkg.mod:fn)
            name, _, out_name = args.metric.partition("=")
            metric = MetricSpec(name, output=out_name or None)
        with RichProgress(console) as progress, progress.step("quantize") as advance, captured("quantize"):
            result = quantize_file(
                args.model,
                output,
                config,  # type: ignore[arg-type]
                data=data,
                metric=metric,
                max_drop=args.max_drop,
                threads=args.threads,
                progress=lambda _s: advance(1),
            )
    else:
        from softdeploy.files import make_folder
        from softdeploy.models import get_case

        case = get_case(args.case)  # an unknown or uninstalled case is said before any file or folder is touched
        output = Path(args.output or f"softdeploy-quantize/{args.case}.int8_{args.mode}.onnx")
        fp32 = output.with_name(output.stem + ".fp32.onnx")  # quantize_case exports the case's model there
        refuse_overwrite([output, output.with_suffix(".json"), fp32], args.overwrite)
        make_folder(output.parent)
        with RichProgress(console) as progress, captured("quantize"):
            _, result = quantize_case(
                case,
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
    if model.int8_format:
        console.print(model.int8_format, soft_wrap=True, highlight=False)  # type: ignore[attr-defined]
    return 0 if not isinstance(result, BudgetResult) or result.met else 1


def _add_quantize_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from softdeploy.models import DEFAULT_CASE
    from softdeploy.quant.formats import TARGETS

    p = sub.add_parser(
        "quantize",
        help="int8 quantization (dynamic / static QDQ), optionally under an accuracy budget",
        description="Quantize MODEL (an ONNX file; data from --data) or, without MODEL, a built-in case's "
        "model with its own data and task metric.",
    )
    p.add_argument("model", nargs="?", help="ONNX model (or --case instead)")
    p.add_argument("-o", "--output", help="quantized model path")
    p.add_argument("--mode", choices=("dynamic", "static"), default="dynamic")
    p.add_argument("--per-tensor", action="store_true", help="one weight scale per tensor (default: per channel)")
    p.add_argument("--op-types", help="comma-separated op types to quantize (default: per mode)")
    p.add_argument("--calibrate-method", choices=("minmax", "percentile", "entropy"), default="minmax")
    p.add_argument("--exclude", help="comma-separated node names to keep in float")
    p.add_argument(
        "--weights",
        choices=("8-bit", "7-bit", "pair-bounded", "lane-bounded", "rowwise-8-bit"),
        default=None,
        help="int8 weight format (default: this CPU's; `softdeploy doctor` shows it): pair-bounded and 7-bit "
        "cannot saturate onnxruntime's kernels on CPUs without VNNI; lane-bounded and rowwise-8-bit (dynamic mode) "
        "turn the weight MatMuls into softdeploy's RowwiseInt8MatMul with per-row activations (lane-bounded: fast "
        "without VNNI; rowwise-8-bit: fast with AVX-512 VNNI or AVX-VNNI), and need the kernels",
    )
    p.add_argument(
        "--target",
        choices=TARGETS,
        default=None,
        help="the CPU class the model is for (default: auto, this CPU's): portable runs fast and exact on every "
        "x86-64 class (dynamic: lane-bounded RowwiseInt8MatMul; static: pair-bounded QDQ); vnni, avx512, avx2, "
        "x86-64 take that class's row of `softdeploy doctor`'s table; the model records its target and format",
    )
    p.add_argument(
        "--data",
        help="model inputs (samples along axis 0): an .npz, a folder of <input>.npy, or a loader pkg.mod:fn; "
        "calibration and accuracy data",
    )
    p.add_argument("--labels", help="with --data: the array of --data holding the labels, or an .npy file")
    p.add_argument("--constant", help="with --data: comma-separated inputs that are not batched (fed whole)")
    p.add_argument("--calibration", help="calibration inputs, if not --data (same forms)")
    p.add_argument("--batch", type=int, default=8, help="batch size when reading --data")
    p.add_argument("--case", help=f"an installed case, instead of MODEL (e.g. {DEFAULT_CASE}; `pip install ./cases`)")
    p.add_argument("--max-drop", type=float, help="accuracy budget: largest allowed drop of the metric")
    p.add_argument(
        "--metric",
        help="metric of --max-drop: with --case one of the case's (default its task metric); with MODEL "
        "NAME[=OUTPUT], a built-in (accuracy, mrr, ndcg, cosine, kl, dice, ...) or pkg.mod:fn (default: cosine of "
        "the first float output to fp32)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--list", action="store_true", help="list the nodes that would be quantized and exit")
    p.add_argument("--overwrite", action="store_true", help="replace the output model (and its .json) if they exist")
    p.set_defaults(fn=cmd_quantize, usage=p.format_usage())
