"""Encode latency of the 3-layer distilled student against the all-MiniLM-L6-v2 teacher in onnxruntime,
fp32 and int8 (dynamic, per-channel: the MiniLM case's default int8), the issue's speed floors
(student fp32 >= 1.9x teacher fp32; student int8 >= 3.5x teacher fp32).

Both graphs are exported the same way (eager attention + onnxruntime's BERT fusions, softdeploy's
export_encoder); latency does not depend on the weights, so the student is the teacher's layers 0, 2, 4.
One sequence of 128 tokens (batch 1), 1 thread, interleaved rounds; "CPU ms" is the process's CPU time
per call (steadier than wall time on the shared machine, which other users load).

Run: ``python -m softdeploy_cases.experiments.distill_latency`` (markdown on stdout, ~3 min); results in
cases/results/experiments/distill_latency.md.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from softdeploy.compare.environment import environment
from softdeploy.compare.latency import measure_interleaved
from softdeploy.compare.report import markdown_table
from softdeploy.distill import layer_reduce, load_teacher
from softdeploy.distill.run import export_encoder
from softdeploy.quant import QuantConfig, quantize
from softdeploy.runtime import Session
from softdeploy.runtime.library import library_status


def main() -> None:
    """Runs the experiment with the command line's arguments and prints its markdown."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12, help="interleaved latency rounds")
    args = ap.parse_args()
    teacher, tok = load_teacher()
    tmp = Path(tempfile.mkdtemp(prefix="distill-latency-"))
    paths = {}
    for name, model in (("teacher", teacher), ("student 3 layers", layer_reduce(teacher, [0, 2, 4]))):
        fp32 = tmp / f"{name.split()[0]}.onnx"
        export_encoder(model, fp32)
        paths[f"{name} fp32"] = fp32
        paths[f"{name} int8"] = quantize(fp32, tmp / f"{name.split()[0]}_int8.onnx", QuantConfig("dynamic")).path
    enc = tok(["word " * 200], truncation=True, max_length=128, padding="max_length", return_tensors="np")
    feeds = {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}
    sessions = {k: Session(p, threads=1) for k, p in paths.items()}
    stats, load = measure_interleaved({k: (lambda s=s: s.run(feeds)) for k, s in sessions.items()}, rounds=args.rounds)
    env = environment(1)
    info = library_status().info
    isa = info.isa_summary() if info is not None else "library not found"
    print(
        f"- CPU: {env['cpu']} ({env['cores']} cores), softdeploy kernel variant: {isa}; onnxruntime CPU EP "
        f"(its MLAS picks the best ISA: int8 MatMuls on VNNI where present), 1 thread, batch 1 x 128 tokens; "
        f"background load while timing: {load:.2f} cores\n"
    )
    ref = stats["teacher fp32"]
    rows = [
        [
            k,
            f"{s.p50_ms:.2f}",
            f"{s.cpu_p50_ms:.2f}",
            f"{ref.p50_ms / s.p50_ms:.2f}",
            f"{ref.cpu_p50_ms / s.cpu_p50_ms:.2f}",
            f"{paths[k].stat().st_size / 1e6:.1f}",
        ]
        for k, s in stats.items()
    ]
    print(
        markdown_table(
            ["model", "wall p50 ms", "CPU ms", "speed-up wall vs teacher fp32", "speed-up CPU vs teacher fp32", "MB"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
