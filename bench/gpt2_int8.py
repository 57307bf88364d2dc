"""Hugging Face GPT-2 (Conv1D layers, exported as Gemm) in dynamic int8, every weight format, against its fp32.

    python -m bench.gpt2_int8 [--rounds 15] [--emulate-avx2 | --emulate-no-vnni] [--quick]

A GPT-2 from a transformers config with random weights (2 layers, width 384, 6 heads, vocabulary 8000: MiniLM's
widths; torch.manual_seed(0)), logits of batch 1 x 128 tokens, exported with softdeploy.export. Each format is
quantized by softdeploy.quant in dynamic mode (Gemm -> MatMul + Add first: softdeploy.quant.gemm) and timed through
softdeploy's Session (native kernels) in the same interleaved rounds as the fp32 model, 1 thread; logits cosine to
fp32 (rows of the last axis, mean over 4 token batches).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from bench.harness import base_parser, header, md_table, quiet_bench, sync_print, wait_quiet

FORMATS = ["8-bit", "7-bit", "pair-bounded", "lane-bounded", "rowwise-8-bit"]


def export_gpt2(path: Path, tokens: int) -> Path:
    import torch
    import transformers

    from softdeploy.export import export

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=384, n_head=6, vocab_size=8000, n_positions=tokens)
    model = transformers.GPT2LMHeadModel(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits

    export(Logits(model), (torch.randint(0, 8000, (1, tokens)),), path, input_names=["ids"], output_names=["logits"])
    return path


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.set_defaults(threads=[1])
    args = p.parse_args()
    import onnx

    from softdeploy.quant import QuantConfig, output_cosine, quantize
    from softdeploy.runtime import Session

    header("GPT-2 (Gemm layers) in dynamic int8 vs fp32")
    tmp = Path(tempfile.mkdtemp(prefix="gpt2-int8-bench-"))
    src = export_gpt2(tmp / "gpt2.onnx", 128)
    gemms = sum(n.op_type == "Gemm" for n in onnx.load(src).graph.node)
    sync_print(f"- model: GPT-2 2 layers, width 384, vocabulary 8000, random weights; {gemms} Gemm nodes\n")
    formats = FORMATS[:2] if args.quick else FORMATS
    models, notes = {"fp32": src}, {}
    for weights in formats:
        q = quantize(src, tmp / f"gpt2_{weights}.onnx", QuantConfig("dynamic", weights=weights))
        models[weights] = q.path
        notes[weights] = f"{len(q.quantized_nodes)} int8, {len(q.float_nodes)} float"
    rng = np.random.default_rng(1)
    feeds = [{"ids": rng.integers(0, 8000, (1, 128)).astype(np.int64)} for _ in range(4)]
    for nt in args.threads:
        sessions = {name: Session(path, kernels="native", threads=nt) for name, path in models.items()}
        ref = [sessions["fp32"].run(f)[0] for f in feeds]
        cos = {name: output_cosine(ref, [s.run(f)[0] for f in feeds]) for name, s in sessions.items()}
        wait_quiet(args.quiet_wait)
        fns = {name: (lambda s=s: s.run(feeds[0])) for name, s in sessions.items()}
        t, bg = quiet_bench(
            fns, rounds=args.rounds, batch_ms=args.batch_ms, max_tries=args.tries, wait_s=args.quiet_wait
        )
        us = {name: t[name].median * 1e6 for name in sessions}
        rows = [
            [
                name,
                notes.get(name, "-"),
                f"{us[name]:.0f}",
                f"{us['fp32'] / us[name]:.2f}x",
                f"{cos[name]:.5f}",
                f"{t[name].spread:.0%}",
            ]
            for name in sessions
        ]
        sync_print(f"Logits of 1 x 128 tokens, {nt} thread(s), background load {bg:.1f} cores:\n")
        sync_print(md_table(["weights", "nodes", "us per call", "fp32 / this", "logits cosine", "spread"], rows))


if __name__ == "__main__":
    main()
