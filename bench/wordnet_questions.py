"""Trivia-shaped questions for distillation experiments (issue 16), built from WordNet's glosses: one per line.

The minilm_distilled student loses its MRR@10 on the query side (bench/results/distill_recipes.md, nineteenth
session): its corpus encodings score 0.441-0.444 against the teacher's questions, its question encodings 0.42
against the teacher's corpus. The held-out questions are trivia that describe a thing without naming it ("Which
mammal has no vocal cords?"); no shipped text has that shape. This script writes
:func:`softdeploy.distill.data.wordnet_questions` (WordNet's definitions put in five question forms: "What do you
call a legal holiday in Canada commemorating receiving Dominion status in 1867?"; 110,936 of them), shuffled with
the generator that drew the forms, ``random.Random(0)``. None equals an evaluation question (distill_ablation.py's
held-out filter removes 0).

Run: ``PYTHONPATH=. python bench/wordnet_questions.py /tmp/glossq.txt``, then ``bench/distill_ablation.py
--extra-file /tmp/glossq.txt --extra-n 20000 --mix 0.5 ...``; ``--wordnet N`` instead writes N of these questions and
N WordNet texts (``random.Random(0).sample`` of each, the union shuffled). Results: bench/results/distill_recipes.md.
"""

from __future__ import annotations

import argparse
import random

from softdeploy.distill.data import _wordnet_questions, wordnet_texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", help="the text file to write, one question per line")
    ap.add_argument("--wordnet", type=int, default=0, help="N questions and N WordNet texts instead (a mix)")
    a = ap.parse_args()
    rng = random.Random(0)
    questions = _wordnet_questions(rng)  # softdeploy.distill.data.wordnet_questions(0), in gloss order
    rng.shuffle(questions)
    lines = questions
    if a.wordnet:
        broad = [t.replace("\n", " ") for t in wordnet_texts()]
        lines = rng.sample(questions, a.wordnet) + rng.sample(broad, a.wordnet)
        rng.shuffle(lines)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} lines -> {a.out}")


if __name__ == "__main__":
    main()
