"""SoftTokenEmbedding's kernel against its function body, SoftmaxTopK alone and the torch module, in one run.

    python -m bench.soft_token_embedding [--B 8] [--V 151936] [--E 1024] [--max-topk 10] [--rounds 15] [--out FILE]

All at 1 intra-op thread, on the same logits (N(0, 3^2)) and embedding table (N(0, 1)):
  kernel-<isa>       com.softdeploy SoftTokenEmbedding kernel in onnxruntime, forced to each ISA variant this CPU
                     runs (SOFTDEPLOY_ISA at session creation)
  body               its standard-ONNX function body in stock onnxruntime (library not registered)
  softmax_topk-<isa> SoftmaxTopK(k = max_topk) kernel alone on the same logits, same variant
  torch_module       softdeploy.nn.SoftTokenEmbedding (eager torch, float64 inside like the reference)
Two attribute sets: "plain" (defaults) and "sampling" (temperature 0.6, top_p 0.95, min_p 0.001, Gumbel noise
with a fixed Noise, tau 0.5). Each round times every variant once, in turn (interleaved), each right after one
untimed call of its own; medians over rounds.
Floors (issue 48): kernel >= 5x body; kernel within 1.5x of SoftmaxTopK alone.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

from softdeploy import conformance
from softdeploy.ops import REGISTRY, Sample
from softdeploy.runtime import Session

ATTRS = {
    "plain": {},
    "sampling": {"temperature": 0.6, "top_p": 0.95, "min_p": 0.001, "noise": "gumbel", "tau": 0.5},
}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--V", type=int, default=151936)
    ap.add_argument("--E", type=int, default=1024)
    ap.add_argument("--max-topk", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    args = ap.parse_args()

    import torch

    from softdeploy import nn as sdnn

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((args.B, args.V)) * 3).astype(np.float32)
    emb = rng.standard_normal((args.V, args.E)).astype(np.float32)
    u = rng.uniform(1e-6, 1 - 1e-6, (args.B, args.V)).astype(np.float32)
    op, topk = REGISTRY["SoftTokenEmbedding"], REGISTRY["SoftmaxTopK"]
    isas = conformance.available_isas()
    lines = [
        f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs, shared with other jobs); ISA variants: {', '.join(isas)}",
        f"B {args.B}, V {args.V}, E {args.E}, max_topk {args.max_topk}, 1 thread, {args.rounds} interleaved rounds; "
        "median ms per call",
        "",
    ]
    rows = []
    for name, extra in ATTRS.items():
        attrs = {"max_topk": args.max_topk, **extra}
        inputs = (x, emb, u) if extra.get("noise") == "gumbel" else (x, emb)
        sample = Sample(name, inputs, attrs)
        feeds = op.feeds(sample)
        runs = {}
        for isa in isas:
            with conformance.forced_isa(isa):
                s = Session(conformance.kernel_model(op, sample), kernels="native", threads=1)
                t = Session(
                    topk.make_model(Sample("t", (x,), {"k": args.max_topk}), with_function=False, outputs=2),
                    kernels="native",
                    threads=1,
                )
            runs[f"kernel-{isa}"] = lambda s=s: s.run(feeds)
            runs[f"softmax_topk-{isa}"] = lambda t=t: t.run({"X": x})
        body = Session(op.make_model(sample, with_function=True), kernels="portable", threads=1)
        runs["body"] = lambda: body.run(feeds)
        module = sdnn.SoftTokenEmbedding(torch.from_numpy(emb), **attrs)
        tx, tu = torch.from_numpy(x), torch.from_numpy(u)
        runs["torch_module"] = lambda: module(tx, tu if extra.get("noise") == "gumbel" else None)
        # agreement first: the kernel's Ids equal the body's
        want = runs["body"]()
        for isa in isas:
            got = runs[f"kernel-{isa}"]()
            assert np.array_equal(got[2], want[2]), f"{name}: kernel-{isa} Ids differ from the body's"
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.rounds):
            for key, fn in runs.items():
                # one untimed call first: every variant is timed with the logits as warm as the others
                # see them (a variant timed right after the body or torch would start from a cold cache)
                fn()
                t0 = time.perf_counter()
                fn()
                times[key].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        for isa in isas:
            k_ms = med[f"kernel-{isa}"]
            rows.append(
                f"| {name} | {isa} | {k_ms:.3f} | {med[f'softmax_topk-{isa}']:.3f} | "
                f"{k_ms / med[f'softmax_topk-{isa}']:.2f} | {med['body']:.1f} | {med['body'] / k_ms:.0f}x | "
                f"{med['torch_module']:.1f} | {med['torch_module'] / k_ms:.0f}x |"
            )
    lines += [
        "| attributes | kernel variant | kernel ms | SoftmaxTopK ms | kernel / SoftmaxTopK | body ms | body / kernel "
        "| torch module ms | torch / kernel |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        from softdeploy.files import write_text

        write_text(args.out, text + "\n")


if __name__ == "__main__":
    main()
