"""Where a distilled 3-layer student loses its MaxSim MRR@10 (issue 16's accuracy floors): which side (questions or
corpus), which questions (trivia, ending in "?", or chat lines), which query tokens ([CLS], [SEP], punctuation,
words).

For a student saved by ``bench/distill_ablation.py --save F`` (layers 0, 3, 5 of all-MiniLM-L6-v2), on the
minilm_distilled case's task (653 held-out chatterbot questions x 871 answers, max length 128):

* MRR@10 with each side encoded by the teacher or the student (four combinations), over all questions and split
  into the 341 ending in "?" and the rest;
* the mean cosine between the student's and the teacher's token vectors, by token kind, questions and corpus;
* the symmetric MRR@10 with one kind of query token taken from the teacher (what that kind costs);
* the corpus tokens beyond the training length (32): their cosine to the teacher's, and the symmetric MRR@10 with
  them taken from the teacher;
* the question error by direction: in the basis of the teacher's answer tokens' second-moment matrix, the share of
  the error energy in its top k eigen-directions, and the symmetric MRR@10 with the error removed in the top k
  directions or in the others.

Run: ``PYTHONPATH=. python bench/distill_sides.py F``. Results: bench/results/distill_recipes.md (nineteenth and
twenty-first sessions).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: F401
import numpy as np
import torch
from distill_students import encode, maxsim
from safetensors.torch import load_file

from softdeploy.compare.metrics import mrr_at_k
from softdeploy.distill import layer_reduce, load_teacher
from softdeploy.models.minilm_retrieval import load_chatterbot

KINDS = ("cls", "sep", "punct", "word")


def token_kinds(tok, text: str) -> list[str]:
    """Each token's kind: [CLS], [SEP], punctuation (a piece that starts with neither letter nor digit), word."""
    ids = tok(text, truncation=True, max_length=128)["input_ids"]
    pieces = tok.convert_ids_to_tokens(ids)
    last = len(ids) - 1
    return [
        "cls" if j == 0 else "sep" if j == last else "word" if p[0].isalnum() else "punct" for j, p in enumerate(pieces)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("student", help="safetensors of a layers-0,3,5 student")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    teacher, tok = load_teacher()
    data = load_chatterbot(96)
    student = layer_reduce(teacher, [0, 3, 5])
    student.load_state_dict(load_file(a.student))
    student.eval()
    tq, _ = encode(teacher, tok, data.queries)
    td, _ = encode(teacher, tok, data.corpus)
    sq, _ = encode(student, tok, data.queries)
    sd, _ = encode(student, tok, data.corpus)
    trivia = [i for i, q in enumerate(data.queries) if q.strip().endswith("?")]
    chat = [i for i in range(len(data.queries)) if i not in set(trivia)]

    def mrr(q, d, rows=None):
        rows = range(len(data.queries)) if rows is None else rows
        s = maxsim([q[i] for i in rows], d)
        return mrr_at_k(s, [data.relevant[i] for i in rows])

    print(f"| questions | corpus | MRR@10 | '?' ({len(trivia)}) | other ({len(chat)}) |")
    print("|---|---|---|---|---|")
    for qn, q in (("teacher", tq), ("student", sq)):
        for dn, d in (("teacher", td), ("student", sd)):
            print(f"| {qn} | {dn} | {mrr(q, d):.4f} | {mrr(q, d, trivia):.4f} | {mrr(q, d, chat):.4f} |")
    q_kinds = [token_kinds(tok, t) for t in data.queries]
    d_kinds = [token_kinds(tok, t) for t in data.corpus]
    for side, kinds, t_side, s_side in (("questions", q_kinds, tq, sq), ("corpus", d_kinds, td, sd)):
        cos = {k: [] for k in KINDS}
        for ks, t, s in zip(kinds, t_side, s_side, strict=True):
            for k, c in zip(ks, (t * s).sum(-1), strict=True):
                cos[k].append(c)
        print(f"token cosine, {side}: " + ", ".join(f"{k} {np.mean(v):.4f} ({len(v)})" for k, v in cos.items() if v))
    for kind in KINDS:
        mixed = [np.where(np.array(ks)[:, None] == kind, t, s) for ks, t, s in zip(q_kinds, tq, sq, strict=True)]
        print(f"student questions with the teacher's {kind} tokens: MRR@10 {mrr(mixed, sd):.4f} (student corpus)")
    train_length = 32  # the minilm_distilled case's train_max_length: answer tokens past it are never a target
    long = [i for i, t in enumerate(td) if len(t) > train_length]
    tail_cos = np.concatenate([(td[i][train_length:] * sd[i][train_length:]).sum(-1) for i in long])
    fitted_cos = np.concatenate([(t * s).sum(-1) for t, s in zip(td, sd, strict=True) if len(t) <= train_length])
    tail_fixed = [np.concatenate([s[:train_length], t[train_length:]]) for t, s in zip(td, sd, strict=True)]
    print(
        f"answers over {train_length} tokens: {len(long)}; token cosine past {train_length} {tail_cos.mean():.4f} "
        f"(answers that fit: {fitted_cos.mean():.4f}); with the teacher's tokens past it: MRR@10 "
        f"{mrr(sq, tail_fixed):.4f}"
    )
    c = np.concatenate(td).astype(np.float64)
    lam, vec = np.linalg.eigh(c.T @ c / len(c))
    lam, vec = lam[::-1], vec[:, ::-1]  # largest first
    err = (np.concatenate(sq) - np.concatenate(tq)) @ vec
    for k in (8, 32, 64, 128):
        top = vec[:, :k] @ vec[:, :k].T
        in_top = [s + (t - s) @ top for t, s in zip(tq, sq, strict=True)]
        in_rest = [t + (s - t) @ top for t, s in zip(tq, sq, strict=True)]
        print(
            f"top {k} answer directions: {lam[:k].sum() / lam.sum():.3f} of the answers' energy, "
            f"{(err[:, :k] ** 2).sum() / (err**2).sum():.3f} of the question error's; MRR@10 with the error removed "
            f"there {mrr(in_top, sd):.4f}, in the others {mrr(in_rest, sd):.4f}"
        )


if __name__ == "__main__":
    main()
