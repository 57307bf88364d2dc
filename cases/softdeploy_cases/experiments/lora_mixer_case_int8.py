"""The lora_mixer_retrieval case's trained router in int8: routing agreement with fp32 and MRR@10, guard off and on.

    python -m softdeploy_cases.experiments.lora_mixer_case_int8

The case (cases/softdeploy_cases/lora_mixer_retrieval.py: all-MiniLM-L6-v2, one trained LoRA expert per chatterbot
category in the last layer's q/k/v/o projections, trained router, top-1) is prepared (its trained experts come from
the cache) and exported; ``quantize`` runs in dynamic mode with the case's probe feeds (4 batches of 8 training
questions and answers) with ``routing_guard`` off and on (the default). Reported: routing agreement per LoRAMixer
node on the probe (as ``quantize`` reports it) and on the other calibration batches, the case's MRR@10 and routing
accuracy on its held-out questions, int8 / float candidate counts. A third row: the same model quantized without any
data (synthetic token ids: what ``compare`` runs, as it passes ``quantize`` no data). Results:
cases/results/experiments/lora_mixer_case_int8.md.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    """Runs the experiment with the command line's arguments and prints its markdown."""
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
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
            ["fp32", "-", "-", "-", "-", f"{ref.metrics['MRR@10']:.4f}", f"{ref.metrics['routing accuracy']:.4f}"]
        )
        for label, cfg, feeds in (
            ("int8 dynamic, guard off", QuantConfig("dynamic", routing_guard=False), probe),
            ("int8 dynamic, guard on (default)", QuantConfig("dynamic"), probe),
            ("int8 dynamic, no data (synthetic probe), guard on", QuantConfig("dynamic"), None),
        ):
            out = tmp / "q.onnx"
            q = quantize(fp32, out, cfg, probe=feeds)
            ev = case.evaluate(Session(out, kernels="auto", threads=1).run, "native", progress, label)
            other = measure(fp32, out, held)
            rows.append(
                [
                    label,
                    f"{len(q.quantized_nodes)} / {len(q.float_nodes)}",
                    f"{q.routing.agreement:.1%} (all int8: {q.routing.agreement_before:.1%})",
                    f"{min(r.agreement for r in other):.1%} / {np.mean([r.agreement for r in other]):.1%}",
                    str(len(q.routing.kept_float)),
                    f"{ev.metrics['MRR@10']:.4f}",
                    f"{ev.metrics['routing accuracy']:.4f}",
                ]
            )
            print(q.routing.line(), flush=True)
    head = [
        "model",
        "int8 / float candidates",
        "routing agreement, quantize's probe (lowest node)",
        "routing agreement, other training batches (lowest / mean)",
        "kept for routing",
        "MRR@10",
        "routing accuracy",
    ]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
