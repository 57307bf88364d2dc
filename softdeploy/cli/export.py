"""``softdeploy export`` and ``softdeploy optimize``: a torch factory or a transformers folder to ONNX, and the
rewrite rules on an ONNX file."""

from __future__ import annotations

import argparse

from softdeploy.cli._common import refuse_overwrite


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
    refuse_overwrite([args.out], args.overwrite, sources=sources)
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
    refuse_overwrite([args.out], args.overwrite, sources=[])
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

    refuse_overwrite([args.out], args.overwrite, sources=[args.input, *([args.feeds] if args.feeds else [])])
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
