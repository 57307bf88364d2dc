"""Hugging Face folders of real architectures through `softdeploy export FOLDER` -> int8 dynamic -> timing.

Per architecture (small configs with seeded random weights, written with save_pretrained as safetensors; and
all-MiniLM-L6-v2's real sentence-transformers folder): the export's wall time (torch.onnx dynamo, validation,
onnxruntime fusions and their re-validation), its max abs error against torch, the onnxruntime fused ops kept,
then softdeploy's dynamic int8 (the default target for this CPU) against the fp32 graph: median latency of
interleaved rounds (fp32 and int8 in turn, same feeds, one thread, softdeploy's kernels) and the cosine of the
first output, int8 against fp32, over the evaluation feeds. Llama-style decoder with its KV cache: the step graph
(one new token after a cache of --past positions), exported by softdeploy.export.decoder.

    python -m bench.hf_architectures [--quick] [--only bert,gpt2] > bench/results/hf_architectures.md
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import harness

HIDDEN, HEADS, FFN, LAYERS, VOCAB, POSITIONS = 256, 4, 1024, 4, 4000, 512
BATCH, SEQ = 4, 128


def configs() -> dict[str, tuple[Any, Any]]:
    """Each architecture's config and model class (the class's name is the config's ``architectures``)."""
    import transformers as t

    common = dict(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
    )
    return {
        "BERT (feature-extraction)": (t.BertConfig(**common), t.BertModel),
        "DistilBERT (token-classification)": (
            t.DistilBertConfig(
                dim=HIDDEN, n_heads=HEADS, hidden_dim=FFN, n_layers=LAYERS, vocab_size=VOCAB, num_labels=9
            ),
            t.DistilBertForTokenClassification,
        ),
        "XLM-R (text-classification)": (
            t.XLMRobertaConfig(**common, num_labels=3, type_vocab_size=1),
            t.XLMRobertaForSequenceClassification,
        ),
        "ModernBERT (fill-mask)": (
            t.ModernBertConfig(**common, pad_token_id=0, global_attn_every_n_layers=2, local_attention=64),
            t.ModernBertForMaskedLM,
        ),
        "ViT (image-classification)": (
            t.ViTConfig(
                hidden_size=HIDDEN,
                num_attention_heads=HEADS,
                intermediate_size=FFN,
                num_hidden_layers=LAYERS,
                image_size=96,
                patch_size=8,
                num_labels=10,
            ),
            t.ViTForImageClassification,
        ),
        "GPT-2 (causal-lm)": (
            t.GPT2Config(n_embd=HIDDEN, n_head=HEADS, n_layer=LAYERS, vocab_size=VOCAB, n_positions=POSITIONS),
            t.GPT2LMHeadModel,
        ),
        "Llama (causal-lm)": (
            t.LlamaConfig(**common, num_key_value_heads=2),
            t.LlamaForCausalLM,
        ),
    }


def feeds_for(session: Any, n: int, seq: int, seed: int = 1) -> dict[str, np.ndarray]:
    """Inputs for the exported graph: token ids with padded tails, or images."""
    rng = np.random.default_rng(seed)
    names = session.input_names
    if names == ["pixel_values"]:
        return {"pixel_values": rng.standard_normal((n, 3, 96, 96)).astype(np.float32)}
    ids = rng.integers(5, VOCAB, (n, seq)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[n // 2 :, seq - seq // 4 :] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {k: v for k, v in feeds.items() if k in names}


def minilm_feeds(session: Any) -> dict[str, np.ndarray]:
    """Real sentences through all-MiniLM-L6-v2's own tokenizer, padded to the longest."""
    from transformers import AutoTokenizer

    from softdeploy.models.assets import minilm_dir

    words = "the model folder exports to onnx and runs with int8 weights on a small shared cpu today".split()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, rng.integers(6, 40))) for _ in range(BATCH)]
    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))(texts, padding=True, return_tensors="np")
    return {k: np.asarray(tok[k], dtype=np.int64) for k in session.input_names}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Mean cosine of the rows (last axis) of two outputs."""
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return float(np.mean(np.sum(a * b, axis=1) / np.maximum(den, 1e-30)))


def measure(fp32: Path, feeds_fn: Any, work: Path, rounds: int, tag: str) -> dict[str, Any]:
    """int8 dynamic of ``fp32``, then fp32 vs int8 latency (interleaved) and the first output's cosine."""
    from bench.harness import quiet_bench
    from softdeploy.quant import QuantConfig, quantize
    from softdeploy.runtime import Session

    int8 = work / f"{tag}.int8.onnx"
    made = quantize(fp32, int8, QuantConfig("dynamic"))
    s32, s8 = Session(fp32, kernels="auto", threads=1), Session(int8, kernels="auto", threads=1)
    feeds = feeds_fn(s32)
    o32, o8 = s32.run(feeds), s8.run(feeds)
    timings, bg = quiet_bench({"fp32": lambda: s32.run(feeds), "int8": lambda: s8.run(feeds)}, rounds=rounds)
    return {
        "cosine": cosine(o8[0], o32[0]),
        "fp32 ms": timings["fp32"].median * 1e3,
        "int8 ms": timings["int8"].median * 1e3,
        "spread": max(timings["fp32"].spread, timings["int8"].spread),
        "bg": bg,
        "int8 nodes": len(made.quantized_nodes),
        "shape": _shapes(feeds),
    }


def _shapes(feeds: dict[str, np.ndarray]) -> str:
    """The feeds' shapes, the cache tensors of a step graph counted once."""
    pasts = [v for k, v in feeds.items() if k.startswith("past_key_values.")]
    shown = [k for k in feeds if k != "attention_mask" and not k.startswith("past_key_values.")]
    plain = " ".join(f"{k}{list(feeds[k].shape)}" for k in shown)
    return plain + (f" + {len(pasts)} cache tensors {list(pasts[0].shape)}" if pasts else "")


def main() -> None:
    p = harness.base_parser(__doc__.splitlines()[0])
    p.add_argument("--only", type=harness.str_list, default=None, help="architectures whose name starts so")
    p.add_argument("--past", type=int, default=128, help="decoder step: cached positions")
    args = p.parse_args()
    import torch

    from softdeploy.export.hf import export_folder, export_folder_with_past
    from softdeploy.models.assets import minilm_dir

    harness.header("Hugging Face folders: export FOLDER -> int8 dynamic, per architecture")
    print(
        f"- configs: hidden {HIDDEN}, {HEADS} heads, FFN {FFN}, {LAYERS} layers, vocab {VOCAB}, seeded random "
        f"weights; text batch {BATCH} x {SEQ} tokens (a quarter of half the rows padded), ViT 96x96 images; "
        "all-MiniLM-L6-v2: its real folder and tokenizer\n"
        "- export s: wall time of export_folder (torch.onnx dynamo + validation on both onnxruntime backends + "
        "onnxruntime fusions + their validation); max err: max |onnxruntime - torch| of the written graph\n"
        "- fp32 / int8 ms: one thread, median of interleaved rounds, softdeploy's kernels (int8: the default "
        "dynamic target for this CPU); cosine: first output, int8 vs fp32, mean over rows\n"
        "- CPU: AMD EPYC Zen 4 (AVX-512 F/BW/VL/DQ + VNNI), 2 cores, shared with other jobs (bg load column)\n"
        f"- command: python -m bench.hf_architectures{' --quick' if args.quick else ''}\n"
    )
    rounds = 5 if args.quick else args.rounds
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        jobs: list[tuple[str, Any]] = [(name, c) for name, c in configs().items()]
        jobs.append(("all-MiniLM-L6-v2 (sentence-transformers, real folder)", None))
        jobs.append(("Llama + KV cache (step graph)", configs()["Llama (causal-lm)"]))
        for i, (name, made) in enumerate(jobs):
            if args.only and not any(name.lower().startswith(o.lower()) for o in args.only):
                continue
            print(f"... {name}", file=sys.stderr, flush=True)
            tag = f"m{i}"
            if made is None:
                folder = minilm_dir()
            else:
                torch.manual_seed(0)
                config, cls = made
                folder = work / tag
                cls(config).eval().save_pretrained(str(folder), safe_serialization=True)
            t0 = time.perf_counter()
            if name.startswith("Llama + KV"):
                decoder = export_folder_with_past(folder, work / f"{tag}_decoder")
                seconds, fp32 = time.perf_counter() - t0, decoder.step
                error = max(decoder.max_error.values())
                fused = "- (decoder.py graphs)"
                feeds_fn = _step_feeds(decoder, args.past)
            else:
                result = export_folder(folder, work / f"{tag}.onnx")
                seconds, fp32, error = time.perf_counter() - t0, work / f"{tag}.onnx", result.max_abs_error()
                fused = ", ".join(f"{k} {v}" for k, v in sorted(result.fused.items())) or "none kept"
                feeds_fn = minilm_feeds if made is None else (lambda s: feeds_for(s, BATCH, SEQ))
            m = measure(fp32, feeds_fn, work, rounds, tag)
            rows.append(
                [
                    name,
                    f"{seconds:.1f}",
                    f"{error:.2g}",
                    fused,
                    m["shape"],
                    f"{m['fp32 ms']:.2f}",
                    f"{m['int8 ms']:.2f}",
                    f"{m['fp32 ms'] / m['int8 ms']:.2f}x",
                    f"{m['cosine']:.5f}",
                    f"{m['spread']:.0%} / {m['bg']:.1f}",
                ]
            )
    heads = [
        "architecture (task)",
        "export s",
        "max err",
        "onnxruntime fused ops (count)",
        "inputs",
        "fp32 ms",
        "int8 ms",
        "int8 speed-up",
        "cosine int8/fp32",
        "spread / bg load",
    ]
    print(harness.md_table(heads, rows))


def _step_feeds(decoder: Any, past: int) -> Any:
    """Feeds of the step graph: one new token per row after ``past`` cached positions (random cache values of the
    cache's shape; the step's cost does not depend on their values)."""

    def feeds(session: Any) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(2)
        out = {
            "input_ids": rng.integers(5, VOCAB, (BATCH, 1)).astype(np.int64),
            "attention_mask": np.ones((BATCH, past + 1), np.int64),
            "position_ids": np.full((BATCH, 1), past, np.int64),
        }
        shape = (BATCH, decoder.num_kv_heads, past, decoder.head_dim)
        for name in decoder.past_names:
            out[name] = rng.standard_normal(shape).astype(np.float32)
        return out

    return feeds


if __name__ == "__main__":
    main()
