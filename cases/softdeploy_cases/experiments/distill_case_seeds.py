"""The minilm_distilled case over several seeds: how far its MRR@10 floors hold beyond the one seed the case runs.

The case trains its student with ``seed`` 0 (``softdeploy compare --case minilm_distilled``); a distillation's
MRR@10 moves by a few thousandths with the seed (the seed draws the broad-text sample, the batches and their
order), as much as the margin to the floors. This runs the whole case (distillation, export, int8, evaluation,
latency) once per seed, each student cached as the case caches it (``$SOFTDEPLOY_CACHE/minilm_distilled``), and
prints one markdown row per seed with the floors' numbers, then their mean.

Run: ``python -m softdeploy_cases.experiments.distill_case_seeds --seeds 0,1,2,3 --out /tmp/case_seeds`` (about 9
minutes a seed on 2 cores; a cached seed takes 1.5). Results: cases/results/experiments/distill_recipes.md (the
per-seed table of the fact questions' section).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from softdeploy.compare import run_compare
from softdeploy.compare.environment import environment
from softdeploy.models import get_case
from softdeploy.progress import SilentProgress

# the case's floors, in the order of the table's columns
FLOORS = {
    "student fp32 MRR@10 drop vs teacher fp32": "fp32 drop",
    "student int8 MRR@10 drop vs teacher fp32": "int8 drop",
    "student fp32 encode speed-up in CPU time (steadier under load)": "fp32 speed-up (CPU)",
    "student int8 encode speed-up in CPU time (steadier under load)": "int8 speed-up (CPU)",
}


def main() -> None:
    """Runs the experiment with the command line's arguments and prints its markdown."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3", help="comma-separated distillation seeds")
    ap.add_argument("--out", default="/tmp/case_seeds", help="a folder per seed: the case's reports and models")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved latency rounds")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    for seed in seeds:
        case = get_case("minilm_distilled", seed=seed)
        result = run_compare(
            case,
            Path(a.out) / f"seed{seed}",
            variants=["ort-fp32", "ort-int8-dynamic"],
            rounds=a.rounds,
            progress=SilentProgress(),
        )
        floors = {f.name: f for f in result.floors}
        rows.append(
            {
                "seed": seed,
                "fp32 MRR@10": case._peers[("student", "fp32")].evaluation.metrics["MRR@10"],
                "int8 MRR@10": case._peers[("student", "int8")].evaluation.metrics["MRR@10"],
                **{col: floors[name].value for name, col in FLOORS.items()},
                "asym fp32 MRR@10": case._asymmetric["fp32"],
                "met": all(floors[name].met for name in FLOORS),
                "train s": case._train_seconds,
            }
        )
        print(f"seed {seed}: {rows[-1]}", file=sys.stderr, flush=True)
    teacher = case._peers[("teacher", "fp32")].evaluation.metrics["MRR@10"]
    env = environment(1)
    print(
        f"- CPU: {env['cpu']} ({env['cores']} cores, {', '.join(env['isa'])}); softdeploy kernels {env['softdeploy_kernel_isa']}"
    )
    print(f"- teacher fp32 MRR@10 {teacher:.4f}; floors: fp32 drop <= 0.02, int8 drop <= 0.025, speed-ups 1.9x / 3.5x")
    print(f"- command: `python -m softdeploy_cases.experiments.distill_case_seeds --seeds {a.seeds}`")
    print()
    cols = [
        "seed",
        "fp32 MRR@10",
        "int8 MRR@10",
        *FLOORS.values(),
        "asym fp32 MRR@10",
        "every floor met",
        "train s (wall)",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = [str(r["seed"])] + [f"{r[c]:.4f}" for c in ("fp32 MRR@10", "int8 MRR@10", "fp32 drop", "int8 drop")]
        cells += [f"{r[c]:.2f}" for c in ("fp32 speed-up (CPU)", "int8 speed-up (CPU)")]
        cells += [
            f"{r['asym fp32 MRR@10']:.4f}",
            "yes" if r["met"] else "**no**",
            f"{r['train s']:.0f}" if r["train s"] else "cached",
        ]
        print("| " + " | ".join(cells) + " |")
    mean = {c: statistics.mean(r[c] for r in rows) for c in ("fp32 MRR@10", "int8 MRR@10", "fp32 drop", "int8 drop")}
    print(
        f"| mean | {mean['fp32 MRR@10']:.4f} | {mean['int8 MRR@10']:.4f} | {mean['fp32 drop']:.4f} | "
        f"{mean['int8 drop']:.4f} | | | | {sum(r['met'] for r in rows)} of {len(rows)} | |"
    )


if __name__ == "__main__":
    main()
