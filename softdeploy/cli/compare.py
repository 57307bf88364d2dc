"""``softdeploy compare`` and ``softdeploy run``: a case or a workflow file through :mod:`softdeploy.workflow`."""

from __future__ import annotations

import argparse

from softdeploy.cli._common import refuse_overwrite, wide_console


def cmd_compare(args: argparse.Namespace) -> int:
    """``softdeploy compare``: a built-in or user --case, a --workflow file, or MODEL with --data/--metric, in every
    variant; prints the table and writes the reports."""
    import dataclasses
    from pathlib import Path

    from softdeploy.compare import VARIANTS, run_compare
    from softdeploy.compare.report import REPORT_FILES, write_reports
    from softdeploy.errors import ArgumentError
    from softdeploy.models import DEFAULT_CASE
    from softdeploy.progress import RichProgress
    from softdeploy.terminal import captured

    console = wide_console()
    variants = [v for v in args.variants.split(",") if v] if args.variants else None
    if args.model or args.workflow:
        if args.case:
            raise ArgumentError("compare: give MODEL / --workflow or --case, not both")
        workflow = _compare_workflow(args)
        if args.target:  # the command line's target outranks the workflow file's
            workflow = dataclasses.replace(
                workflow,  # type: ignore[type-var]
                quantize=dataclasses.replace(workflow.quantize, target=args.target),  # type: ignore[attr-defined]
            )
        return _run_workflow(workflow, console, variants=variants, quick=args.quick)
    case = _load_case(args.case or DEFAULT_CASE, quick=args.quick)
    out = Path(args.out) / case.name
    # reports are rewritten on every run; a folder or a dangling link in their place is refused before the run
    refuse_overwrite([out / name for name in REPORT_FILES.values()], True)
    with RichProgress(console) as progress, captured("compare"):
        result = run_compare(
            case,
            out,
            variants=variants or list(VARIANTS),
            threads=args.threads,
            eval_threads=args.eval_threads,
            rounds=3 if args.quick else args.rounds,
            quiet_wait=0.0 if args.quick else args.quiet_wait,
            int8_target=args.target,
            progress=progress,
        )
        with progress.step("write report.md, results.csv, results.json, accuracy_vs_latency.png"):
            paths = write_reports(result, out)
    _print_result(result, paths, out, console)
    return 0


def _print_result(result: object, paths: dict, out: object, console: object) -> None:
    from softdeploy.compare.report import print_table

    print_table(result, console)  # type: ignore[arg-type]
    console.print(f"reports in {out}/: " + ", ".join(p.name for p in paths.values()))  # type: ignore[attr-defined]
    console.print(f"total {result.seconds:.0f} s")  # type: ignore[attr-defined]


def _load_case(name: str, quick: bool) -> object:
    """A built-in case by name, or the user's ``pkg.mod:MyCase`` (a Case instance, class or factory)."""
    from softdeploy.models import CASES, get_case
    from softdeploy.workflow.spec import is_callable_ref

    if name in CASES or not is_callable_ref(name):
        return get_case(name, quick=quick)
    from softdeploy.export.factory import load_callable

    made = load_callable(name, "case")
    case = made() if callable(made) else made
    missing = [m for m in ("name", "prepare", "export_fp32", "evaluate", "timed") if not hasattr(case, m)]
    if missing:
        from softdeploy.errors import SoftdeployError

        raise SoftdeployError(f"case {name}: {type(case).__name__} lacks {missing} of softdeploy.compare.case.Case")
    return case


def _compare_workflow(args: argparse.Namespace) -> object:
    """The workflow of `compare --workflow F` or of `compare MODEL --data ... --metric ...`."""
    from pathlib import Path

    from softdeploy.errors import ArgumentError
    from softdeploy.workflow import load_workflow, parse
    from softdeploy.workflow.spec import folder_name_for

    if args.workflow:
        if args.model or args.data:
            raise ArgumentError("compare: --workflow holds the model and data; give no MODEL or --data")
        return load_workflow(args.workflow)
    if not args.data:
        raise ArgumentError("compare MODEL needs --data (the inputs to evaluate on)")
    metrics = []
    for m in args.metric:  # NAME or NAME=OUTPUT; NAME may be pkg.mod:fn
        name, _, output = m.partition("=")
        metrics.append({"name": name, **({"output": output} if output else {})})
    raw = {
        "name": folder_name_for(Path(args.model).stem),
        "model": args.model,
        "data": {
            "inputs": args.data,
            **({"labels": args.labels} if args.labels else {}),
            "batch": args.batch,
            "constant": [c for c in args.constant.split(",") if c],
        },
        **({"metrics": metrics} if metrics else {}),
        "threads": args.threads,
        "rounds": args.rounds,
        "out": args.out,
    }
    return parse(raw, base=Path.cwd(), name=folder_name_for(Path(args.model).stem))


def _run_workflow(workflow: object, console: object, *, variants: list[str] | None = None, quick: bool = False) -> int:
    import dataclasses

    from softdeploy.progress import RichProgress
    from softdeploy.terminal import captured
    from softdeploy.workflow.run import run_workflow

    if variants:
        workflow = dataclasses.replace(workflow, variants=tuple(variants))  # type: ignore[type-var]
    with RichProgress(console) as progress, captured("run"):
        result = run_workflow(workflow, progress, quick=quick)  # type: ignore[arg-type]
    if result.budget is not None:
        for line in result.budget.explain():
            console.print(line)  # type: ignore[attr-defined]
    _print_result(result.compare, result.reports, result.out, console)
    met = all(f.met for f in result.compare.floors)
    return 0 if met else 1


def cmd_run(args: argparse.Namespace) -> int:
    """``softdeploy run WORKFLOW``: export, quantize with the budget on the workflow's metric, compare."""
    from softdeploy.workflow import load_workflow

    return _run_workflow(load_workflow(args.workflow), wide_console(), quick=args.quick)


def _add_compare_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from softdeploy.compare import VARIANTS
    from softdeploy.models import CASES, DEFAULT_CASE
    from softdeploy.quant.formats import TARGETS

    p = sub.add_parser(
        "compare",
        help="accuracy and latency of every variant of a model on real data",
        description="Variants: " + ", ".join(VARIANTS) + ". Reports go to OUT/CASE/.",
    )
    p.add_argument(
        "model", nargs="?", help="your own ONNX model (with --data and --metric); omit for a built-in --case"
    )
    p.add_argument(
        "--case",
        default=None,
        help=f"an installed case ({', '.join(sorted(CASES)) or 'none: pip install ./cases'}; default {DEFAULT_CASE}) or "
        "your own 'pkg.mod:MyCase' "
        "(a softdeploy.compare.case.Case, or a callable returning one)",
    )
    p.add_argument(
        "--workflow", help="a workflow file (YAML/JSON): model, data, metrics, variants (see `softdeploy run`)"
    )
    p.add_argument("--data", help="with MODEL: inputs (.npz, folder of .npy, or pkg.mod:fn)")
    p.add_argument("--labels", help="with MODEL: an array of --data that holds the labels, or an .npy file")
    p.add_argument(
        "--metric",
        action="append",
        default=[],
        help="with MODEL: a metric NAME[=OUTPUT] (repeat; built-in or pkg.mod:fn); default cosine",
    )
    p.add_argument("--batch", type=int, default=8, help="with MODEL: samples per batch")
    p.add_argument("--constant", default="", help="with MODEL: comma-separated inputs that are not batched")
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
    p.add_argument(
        "--target",
        choices=TARGETS,
        default=None,
        help="the CPU class the int8 variants are quantized for (as quantize --target; default: the case's or "
        "workflow's, else this CPU's)",
    )
    p.add_argument("--quick", action="store_true", help="a subset of the data and fewer rounds (smoke test)")
    p.set_defaults(fn=cmd_compare)
