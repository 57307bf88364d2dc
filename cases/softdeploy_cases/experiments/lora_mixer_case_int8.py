"""The lora_mixer_retrieval case's trained router in int8: routing agreement with fp32, MRR@10 and encode speed, with
the routing guard off, on (the default: the sensitivity search) and on with the coarse stages only.

    python -m softdeploy_cases.experiments.lora_mixer_case_int8 [--rounds 15]

The case (cases/softdeploy_cases/lora_mixer_retrieval.py: all-MiniLM-L6-v2, one trained LoRA expert per chatterbot
category in the last layer's q/k/v/o projections, trained router, top-1) is prepared (its trained experts come from
the cache) and exported; ``quantize`` runs in dynamic mode with the case's probe feeds (its first 4 calibration
batches of 8 training questions and answers) with ``routing_guard`` off, on, and on with
``routing_search_evaluations=0`` (the coarse stages: the nearest residual-stream writers, then everything upstream).
Reported: routing agreement per LoRAMixer node on the probe (as ``quantize`` reports it) and on the other
calibration batches (never seen by ``quantize``), the case's MRR@10 and routing accuracy on its held-out questions,
int8 / float candidate counts, the search's quantize + probe runs, ``quantize``'s seconds, and encode speed vs fp32
(1 thread, one calibration batch not in the probe, medians of interleaved rounds: softdeploy.compare.latency). A last
row: the same model quantized without any data (synthetic token ids: what ``quantize`` measures on when given no
probe or calibration data; ``compare`` hands it the case's probe feeds, as the default row). Results:
cases/results/experiments/lora_mixer_case_int8.md.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    """Runs the experiment with the command line's arguments and prints its markdown."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds (0: no speed column)")
    args = p.parse_args()
    from softdeploy.compare.latency import time_batches_interleaved
    from softdeploy.models import get_case
    from softdeploy.progress import SilentProgress
    from softdeploy.quant import QuantConfig, quantize
    from softdeploy.quant.routing import measure
    from softdeploy.runtime import Session

    case = get_case("lora_mixer_retrieval")
    progress = SilentProgress()
    case.prepare(progress)
    probe, held = case.probe_feeds(), case.calibration_feeds()[4:]
    rows = []
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        fp32 = tmp / "fp32.onnx"
        case.export_fp32(fp32)
        ref = case.evaluate(Session(fp32, kernels="auto", threads=1).run, "native", progress, "fp32")
        rows.append(
            [
                "fp32",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                f"{ref.metrics['MRR@10']:.4f}",
                f"{ref.metrics['routing accuracy']:.4f}",
            ]
        )
        paths = {"fp32": fp32}
        for i, (label, cfg, feeds) in enumerate(
            (
                ("int8 dynamic, guard off", QuantConfig("dynamic", routing_guard=False), probe),
                ("int8 dynamic, guard on (default: sensitivity search)", QuantConfig("dynamic"), probe),
                (
                    "int8 dynamic, guard on, coarse stages only",
                    QuantConfig("dynamic", routing_search_evaluations=0),
                    probe,
                ),
                ("int8 dynamic, no data (synthetic probe), guard on (default)", QuantConfig("dynamic"), None),
            )
        ):
            out = tmp / f"q{i}.onnx"
            q = quantize(fp32, out, cfg, probe=feeds)
            paths[label] = out
            ev = case.evaluate(Session(out, kernels="auto", threads=1).run, "native", progress, label)
            other = measure(fp32, out, held)
            rows.append(
                [
                    label,
                    f"{len(q.quantized_nodes)} / {len(q.float_nodes)}",
                    f"{q.routing.agreement:.1%} (all int8: {q.routing.agreement_before:.1%})",
                    f"{min(r.agreement for r in other):.1%} / {np.mean([r.agreement for r in other]):.1%}",
                    str(len(q.routing.kept_float)),
                    str(q.routing.search.evaluations) if q.routing.search is not None else "-",
                    f"{q.seconds:.0f}",
                    f"{ev.metrics['MRR@10']:.4f}",
                    f"{ev.metrics['routing accuracy']:.4f}",
                ]
            )
            print(f"{label}: {q.routing.line()}", flush=True)
        speed = {}
        if args.rounds > 0:
            feed = held[0]
            sessions = {k: Session(v, kernels="auto", threads=1) for k, v in paths.items()}
            fns = {k: (lambda s=s: s.run(feed)) for k, s in sessions.items()}
            timings = time_batches_interleaved(fns, rounds=args.rounds, batch_seconds=0.0)
            ms = {k: t.median * 1e3 for k, t in timings.items()}
            speed = {k: f"{ms['fp32'] / v:.2f}x ({v:.1f} ms)" for k, v in ms.items()}
            print(f"encode batch {feed['input_ids'].shape}, 1 thread, medians of {args.rounds} interleaved rounds")
    head = [
        "model",
        "int8 / float candidates",
        "routing agreement, quantize's probe (lowest node)",
        "routing agreement, other training batches (lowest / mean)",
        "kept for routing",
        "search runs",
        "quantize s",
        "MRR@10",
        "routing accuracy",
        "encode vs fp32",
    ]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join([*r, speed.get(r[0], "-")]) + " |")


if __name__ == "__main__":
    main()
