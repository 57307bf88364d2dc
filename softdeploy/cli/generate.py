"""``softdeploy generate MODEL_DIR``: generation (optionally with soft thinking) from a transformers model folder.

The folder (config.json, safetensors weights, a tokenizer) is exported once with
:func:`softdeploy.export.decoder.export_decoder` into softdeploy's cache (or ``--export-dir``) and run by
:func:`softdeploy.generate.generate` on onnxruntime (``--backend ort``) or torch eager (``--backend torch``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from softdeploy.errors import ArgumentError


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The ``generate`` verb's arguments."""
    p = sub.add_parser(
        "generate",
        help="generate text from a transformers causal-LM folder on onnxruntime (or torch), optionally with soft "
        "thinking",
        description="MODEL_DIR is a transformers model folder (config.json, *.safetensors, tokenizer). It is exported "
        "once (prefill + step graphs, validated against torch) into softdeploy's cache or --export-dir. Prompts are "
        "used verbatim (include the model's thinking prefix, e.g. '<think>', where it expects one). With "
        "--soft-thinking each row feeds the SoftTokenEmbedding mixture back while it thinks, until slot 0 chooses "
        "--think-end or the cold stop fires; then it decodes discretely.",
    )
    p.add_argument("model_dir", help="transformers model folder")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for a batch)")
    p.add_argument("--prompts-file", default=None, help="a text file, one prompt per line")
    p.add_argument("--backend", choices=["ort", "torch"], default="ort")
    p.add_argument("--kernels", choices=["native", "portable", "auto"], default="native", help="onnxruntime backend")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--step-model", default=None, help="another step graph to run (e.g. an int8 one from quantize)")
    p.add_argument("--export-dir", default=None, help="where the decoder export is written / read (default: cache)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="seed of the noise and sampling stream")
    p.add_argument("--sample", action="store_true", help="sample the answer (default: greedy)")
    p.add_argument("--soft-thinking", action="store_true", help="think with soft tokens until --think-end")
    p.add_argument("--think-end", default="</think>", help="the token that ends thinking (default </think>)")
    p.add_argument("--max-topk", type=int, default=10)
    p.add_argument("--temperature", type=float, default=1.0, help="thinking temperature")
    p.add_argument("--top-k", type=int, default=0, help="thinking top-k filter (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="thinking top-p filter (1 = off)")
    p.add_argument("--min-p", type=float, default=0.001, help="thinking min-p filter (0 = off)")
    p.add_argument("--noise", choices=["none", "gumbel"], default="none", help="noise on the thinking weights")
    p.add_argument("--tau", type=float, default=1.0, help="Gumbel-softmax temperature")
    p.add_argument("--noise-factor", type=float, default=1.0)
    p.add_argument("--clamp-min", type=float, default=-1.5, help="Gumbel noise lower clamp")
    p.add_argument("--clamp-max", type=float, default=3.0, help="Gumbel noise upper clamp")
    p.add_argument("--after-thinking-temperature", type=float, default=1.0)
    p.add_argument("--after-thinking-top-k", type=int, default=0)
    p.add_argument("--after-thinking-top-p", type=float, default=1.0)
    p.add_argument("--after-thinking-min-p", type=float, default=0.0)
    p.add_argument("--early-stopping-entropy", type=float, default=0.01, help="cold stop: entropy threshold (nats)")
    p.add_argument("--early-stopping-length", type=int, default=256, help="cold stop: steps below it (0 = off)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the results as JSON")
    p.add_argument("--overwrite", action="store_true", help="replace --json OUT / re-export into --export-dir")
    p.set_defaults(fn=cmd_generate)


def _model_folder(path: str) -> Path:
    folder = Path(path)
    if not folder.is_dir():
        raise ArgumentError(f"generate: MODEL_DIR {folder}: no such folder (rule: a transformers model folder)")
    if not (folder / "config.json").is_file():
        raise ArgumentError(f"generate: MODEL_DIR {folder}: no config.json (rule: a transformers model folder)")
    if not any(folder.glob("*.safetensors")):
        raise ArgumentError(f"generate: MODEL_DIR {folder}: no *.safetensors weights (pickles are not loaded)")
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        raise ArgumentError(f"generate: MODEL_DIR {folder}: no tokenizer.json (the prompts need the model's tokenizer)")
    return folder


def _prompts(args: argparse.Namespace) -> list[str]:
    texts = list(args.prompt)
    if args.prompts_file is not None:
        src = Path(args.prompts_file)
        if not src.is_file():
            raise ArgumentError(f"--prompts-file {src}: no such file (one prompt per line)")
        texts += [line.strip() for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise ArgumentError("generate: no prompt (rule: --prompt TEXT or --prompts-file FILE)")
    return texts


def _export_dir(args: argparse.Namespace, folder: Path) -> Path:
    """--export-dir, else a cache folder keyed by the model folder's config and weights."""
    if args.export_dir is not None:
        return Path(args.export_dir)
    from softdeploy.cache import cache_root, file_digest

    parts = [(folder / "config.json").read_text(encoding="utf-8")]
    parts += [file_digest(p)[0] for p in sorted(folder.glob("*.safetensors"))]
    import hashlib

    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
    return cache_root() / "decoders" / key


def cmd_generate(args: argparse.Namespace) -> int:
    """Runs ``softdeploy generate``: checks every argument, exports (or reuses) the decoder, generates with a
    progress bar, prints each row's thinking trace and answer and one line of speed."""
    from softdeploy.generate import Decoding, SoftThinking

    folder = _model_folder(args.model_dir)
    texts = _prompts(args)
    if args.max_new_tokens < 1:
        raise ArgumentError(f"--max-new-tokens {args.max_new_tokens} (rule: >= 1)")
    if args.threads < 1:
        raise ArgumentError(f"--threads {args.threads} (rule: >= 1)")
    if args.json is not None:
        from softdeploy.files import check_outputs

        check_outputs([args.json], overwrite=args.overwrite)
    if args.step_model is not None and not Path(args.step_model).is_file():
        raise ArgumentError(f"--step-model {args.step_model}: no such file")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (ValueError, OSError) as e:
        raise ArgumentError(f"generate: MODEL_DIR {folder}: the tokenizer does not load ({e})") from None
    soft = None
    if args.soft_thinking:
        think_end = tok.convert_tokens_to_ids(args.think_end)
        if think_end is None or (think_end == tok.unk_token_id and args.think_end != tok.unk_token):
            raise ArgumentError(f"--think-end {args.think_end!r} is not a token of {folder}'s vocabulary")
        soft = SoftThinking(
            think_end_id=int(think_end),
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            max_topk=args.max_topk,
            noise=args.noise,
            tau=args.tau,
            noise_factor=args.noise_factor,
            clamp_min=args.clamp_min,
            clamp_max=args.clamp_max,
            early_stopping_entropy=args.early_stopping_entropy,
            early_stopping_length=args.early_stopping_length,
        )
        _check_op_attrs(soft, args)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    empty = [t for t, p in zip(texts, prompts, strict=True) if not p]
    if empty:
        raise ArgumentError(f"generate: prompt {empty[0]!r} has no tokens")
    eos = tok.eos_token_id
    gen_cfg = folder / "generation_config.json"
    if gen_cfg.is_file():
        found = json.loads(gen_cfg.read_text(encoding="utf-8")).get("eos_token_id", eos)
        eos = found if found is not None else eos
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
    decoding = Decoding(
        max_new_tokens=args.max_new_tokens,
        sample=args.sample,
        temperature=args.after_thinking_temperature,
        top_k=args.after_thinking_top_k,
        top_p=args.after_thinking_top_p,
        min_p=args.after_thinking_min_p,
        max_topk=args.max_topk,
        eos_token_ids=eos_ids,
    )
    result, backend_name = _run(args, folder, prompts, soft, decoding)
    _print(result, tok, texts, soft, backend_name)
    if args.json is not None:
        from softdeploy.files import write_text

        rows = [
            {
                "prompt": t,
                "tokens": ids,
                "text": tok.decode(ids),
                "thinking_steps": n,
                "think_end": how,
                "stop": s,
            }
            for t, ids, n, how, s in zip(
                texts, result.tokens, result.thinking_steps, result.think_end, result.stop, strict=True
            )
        ]
        summary = {
            "backend": backend_name,
            "steps": result.steps,
            "graph_seconds": result.graph_seconds,
            "loop_seconds": result.loop_seconds,
            "prefill_seconds": result.prefill_seconds,
        }
        write_text(args.json, json.dumps({"rows": rows, "summary": summary}, indent=2) + "\n", "results")
    return 0


def _check_op_attrs(soft: Any, args: argparse.Namespace) -> None:
    """The op's own attribute rules, as one line before any export (OpContractError names the attribute)."""
    import numpy as np

    from softdeploy.generate import Decoding, _op_attrs
    from softdeploy.ops import soft_token_embedding as op

    attrs = _op_attrs(
        soft,
        Decoding(
            temperature=args.after_thinking_temperature,
            top_k=args.after_thinking_top_k,
            top_p=args.after_thinking_top_p,
            min_p=args.after_thinking_min_p,
        ),
    )
    v = max(args.max_topk, 1)
    op.validate((1, v), (v, 1), (1, v), np.zeros(1, np.int64), op.DEF.resolve_attrs(attrs))


def _run(args: argparse.Namespace, folder: Path, prompts: list[list[int]], soft: Any, decoding: Any) -> Any:
    from rich.console import Console

    from softdeploy import terminal
    from softdeploy.generate import OrtBackend, TorchBackend, generate
    from softdeploy.progress import RichProgress
    from softdeploy.terminal import captured

    console = Console(file=terminal.stdout())
    with RichProgress(console) as progress, captured("generate"):
        if args.backend == "torch":
            backend: Any = TorchBackend(str(folder), threads=args.threads)
            name = "torch eager"
        else:
            backend = OrtBackend(
                _exported(args, folder, progress), kernels=args.kernels, threads=args.threads, step=args.step_model
            )
            name = f"onnxruntime ({backend.kernels} kernels" + (
                f", step {args.step_model})" if args.step_model else ")"
            )
        with progress.step(f"generate {len(prompts)} row(s)", total=args.max_new_tokens) as advance:
            result = generate(backend, prompts, soft_thinking=soft, decoding=decoding, seed=args.seed, progress=advance)
    return result, name


def _exported(args: argparse.Namespace, folder: Path, progress: Any) -> Any:
    """The decoder export of ``folder``: reused from the export folder when complete (and not --overwrite)."""
    from softdeploy.errors import ExportError
    from softdeploy.export.decoder import DecoderExport, export_decoder

    out = _export_dir(args, folder)
    if not args.overwrite and (out / "decoder.json").is_file():
        try:
            return DecoderExport.load(out)
        except ExportError:
            if args.export_dir is not None:
                raise
    return export_decoder(os.fspath(folder), out, overwrite=True, progress=progress)


def _print(result: Any, tok: Any, texts: list[str], soft: Any, backend: str) -> None:
    from rich.console import Console

    from softdeploy import terminal

    console = Console(file=terminal.stdout(), highlight=False)
    for text, ids, n, how, stop in zip(
        texts, result.tokens, result.thinking_steps, result.think_end, result.stop, strict=True
    ):
        console.print(f"[bold]prompt[/bold] {text}", markup=True)
        if soft is not None:
            console.print(f"  thinking ({n} steps, ended: {how}): {tok.decode(ids[:n])}", markup=False)
            console.print(f"  answer ({stop}): {tok.decode(ids[n:])}", markup=False)
        else:
            console.print(f"  output ({stop}): {tok.decode(ids)}", markup=False)
    steps = max(result.steps, 1)
    rate = result.new_tokens / result.decode_seconds if result.decode_seconds > 0 else float("nan")
    console.print(
        f"{backend}: {result.steps} steps, {result.new_tokens} tokens, {rate:.0f} tokens/s; per step "
        f"{result.graph_seconds / steps * 1e3:.2f} ms in the graphs, {result.loop_seconds / steps * 1e3:.3f} ms in "
        f"the loop ({result.overhead:.1%})",
        markup=False,
    )
