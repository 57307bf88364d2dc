"""The generation loop's own overhead per step on a decoder of a real small LM's size.

bench/generate.py measures the loop on the soft_thinking case's 1.2 M-parameter model, whose steps take ~0.25 ms:
there the loop's fixed ~30-40 us of Python per step is a large share. This script measures the same loop on a decoder
with SmolLM-135M's dimensions (LlamaForCausalLM: hidden 576, 30 layers, 9 heads / 3 KV heads, FFN 1536, vocabulary
49152; random seeded weights: speed does not depend on them) at batch 1: soft thinking with Gumbel noise, 32 steps
after a 16-token prompt, onnxruntime with softdeploy's kernels, 1 thread. Overhead = the loop's time between runtime
calls / (graphs + loop), split inside the real run (the conservative measure of bench/generate.py).

    python -m bench.generate_overhead [--rounds 5] [--steps 32] [--out bench/results/generate_overhead.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle workers must not spin on shared cores

import numpy as np


def build(folder: Path) -> None:
    """A SmolLM-135M-sized Llama with seeded random weights, saved as a transformers folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).eval().save_pretrained(folder)


def main() -> int:
    """Exports the decoder once, then runs interleaved rounds of the loop; prints (and writes) the markdown table."""
    from bench.generate import cpu_line
    from softdeploy.export.decoder import export_decoder
    from softdeploy.generate import Decoding, OrtBackend, SoftThinking, generate

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--out", default=None, help="also write the markdown here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        build(folder)
        export = export_decoder(folder, Path(tmp) / "decoder")
        backend = OrtBackend(export, kernels="native", threads=1)
        prompt = [list(np.random.default_rng(0).integers(5, 49152, 16))]
        # think_end_id out of the way: every step thinks (the op runs each step); no cold stop
        soft = SoftThinking(think_end_id=0, noise="gumbel", tau=0.5, early_stopping_length=0)
        dec = Decoding(max_new_tokens=args.steps)
        rows = []
        for r in range(args.rounds):
            for name, st in (("discrete", None), ("soft + Gumbel", soft)):
                res = generate(backend, prompt, soft_thinking=st, decoding=dec, seed=r)
                graph = float(np.median(res.step_graph_seconds))
                loop = float(np.median(res.step_loop_seconds))
                rows.append((name, graph, loop))

    lines = [
        "# Generation loop overhead on a SmolLM-135M-sized decoder (batch 1)",
        "",
        f"CPU: {cpu_line()}; onnxruntime 1 thread, softdeploy's kernels.",
        f"Command: `python -m bench.generate_overhead --rounds {args.rounds} --steps {args.steps}`",
        "",
        "LlamaForCausalLM, hidden 576, 30 layers, 9 / 3 heads, FFN 1536, vocabulary 49152 (random seeded weights),",
        f"prompt 16 tokens, {args.steps} steps; medians over the steps of a run, then over {args.rounds} interleaved",
        "rounds. Overhead = loop / (graph + loop), the loop's time between runtime calls in the real run.",
        "",
        "| decoding | graph ms/step | loop us/step | overhead |",
        "|---|---|---|---|",
    ]
    for name in ("discrete", "soft + Gumbel"):
        g = statistics.median(x[1] for x in rows if x[0] == name)
        lo = statistics.median(x[2] for x in rows if x[0] == name)
        lines.append(f"| {name} | {g * 1e3:.3f} | {lo * 1e6:.0f} | {lo / (g + lo):.2%} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from softdeploy.files import write_text

        write_text(args.out, text, "benchmark results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
