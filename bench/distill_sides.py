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
  directions or in the others;
* with ``--seen S --unseen U`` (text files, one text per line: broad texts the student was trained on, and texts of
  the same source it never saw), how far it generalises: the mean token cosine to the teacher on a seeded 600 of
  each, on the in-domain training questions, on the held-out questions by kind and token count, and on the held-out
  questions' word pieces by how often the training texts (in-domain + S) hold them;
* with ``--covered-by T`` (a text file, e.g. bench/wiki_sentences.py's sentences), the trivia questions split into
  those that share at least two content words (four letters or more, not a question word) with one line of T and
  the rest: MRR@10 of each, teacher and student (does a stream of T's facts help where T knows the answer?).

Run: ``PYTHONPATH=. python bench/distill_sides.py F [--seen S --unseen U] [--covered-by T]``. Results:
bench/results/distill_recipes.md (nineteenth, twenty-first and twenty-third sessions).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: F401
import numpy as np
import torch
from distill_students import encode, maxsim
from safetensors.torch import load_file

from softdeploy.compare.metrics import mrr_at_k
from softdeploy.distill import layer_reduce, load_teacher
from softdeploy.distill.data import distillation_texts, held_out
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
    ap.add_argument("--seen", default="", help="broad texts the student trained on, one per line")
    ap.add_argument("--unseen", default="", help="texts of the same source it never saw, one per line")
    ap.add_argument("--covered-by", default="", help="split the trivia by content words shared with this file's lines")
    a = ap.parse_args()
    if bool(a.seen) != bool(a.unseen):
        ap.error("--seen and --unseen go together")
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
    if a.seen:
        q_cos = [(t * s).sum(-1) for t, s in zip(tq, sq, strict=True)]  # the held-out questions, encoded above
        d_cos = [(t * s).sum(-1) for t, s in zip(td, sd, strict=True)]
        generalisation(teacher, student, tok, data, a.seen, a.unseen, q_cos, d_cos)
    if a.covered_by:
        lines = [_content_words(t) for t in _lines(a.covered_by)]
        asked = {i: _content_words(data.queries[i]) for i in trivia}
        covered = [i for i in trivia if any(len(asked[i] & w) >= 2 for w in lines)]
        rest = sorted(set(trivia) - set(covered))
        for name, rows in ((f"covered by {a.covered_by}", covered), ("not covered", rest)):
            print(
                f"trivia {name}: {len(rows)} questions, MRR@10 teacher {mrr(tq, td, rows):.4f}, "
                f"student {mrr(sq, sd, rows):.4f}"
            )


# question words and other frequent words of four letters or more, left out of --covered-by's content words
_NOT_CONTENT = frozenset(
    "what which whom whose when where does have were been being this that these those with from into about than "
    "then there their they them your also".split()
)


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 4 and w not in _NOT_CONTENT}


def _lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def generalisation(
    teacher, student, tok, data, seen_file: str, unseen_file: str, q_cos: list[np.ndarray], d_cos: list[np.ndarray]
) -> None:
    """Mean token cosine (student vs teacher) on texts seen in training, unseen texts of the same source and the
    held-out questions (``q_cos`` / ``d_cos``: per token, the held-out questions' and the answers', as ``main``
    encoded them): is the loss on the questions a generalisation gap, or a gap between the training texts'
    distribution and the questions'?"""

    def cosines(texts: list[str]) -> list[np.ndarray]:
        t, _ = encode(teacher, tok, texts)
        s, _ = encode(student, tok, texts)
        return [(x * y).sum(-1) for x, y in zip(t, s, strict=True)]

    seen, unseen = _lines(seen_file), _lines(unseen_file)
    held = set(data.queries)
    questions = [t for t in data.calibration_texts[0::2] if t not in held]
    for name, c in (
        ("in-domain training questions", cosines(questions)),
        ("--seen, a seeded 600", cosines(random.Random(0).sample(seen, min(600, len(seen))))),
        ("--unseen, a seeded 600", cosines(random.Random(0).sample(unseen, min(600, len(unseen))))),
        ("held-out questions", q_cos),
        ("answers", d_cos),
    ):
        print(f"token cosine, {name} ({len(c)}): {np.concatenate(c).mean():.4f}")
    by_shape: dict[tuple[str, str], list[float]] = defaultdict(list)
    for q, c in zip(data.queries, q_cos, strict=True):
        n = len(c)
        length = "<=6" if n <= 6 else "7-10" if n <= 10 else "11-16" if n <= 16 else ">16"
        by_shape[("trivia ('?')" if q.strip().endswith("?") else "chat", length)].append(float(c.mean()))
    for (kind, length), v in sorted(by_shape.items()):
        print(f"held-out {kind}, {length} tokens: {len(v)} questions, token cosine {np.mean(v):.4f}")
    in_domain, _ = held_out(distillation_texts(("chatterbot",)) + data.calibration_texts[0::2], data.queries)
    count = Counter(i for t in in_domain + seen for i in tok(t, truncation=True, max_length=32)["input_ids"])
    by_count: dict[tuple[int, int], list[float]] = defaultdict(list)
    bins = ((0, 0), (1, 4), (5, 19), (20, 99), (100, 999), (1000, 10**12))
    for q, c in zip(data.queries, q_cos, strict=True):
        ids = tok(q, truncation=True, max_length=128)["input_ids"]
        for i, x in zip(ids[1:-1], c[1:-1], strict=True):  # the word pieces, [CLS] / [SEP] left out
            by_count[next(b for b in bins if b[0] <= count[i] <= b[1])].append(float(x))
    for lo, hi in bins:
        v = by_count[(lo, hi)]
        print(
            f"held-out question pieces seen {lo}-{hi if hi < 10**12 else 'more'} times: {len(v)}, cosine {np.mean(v):.4f}"
        )


if __name__ == "__main__":
    main()
