"""Encyclopedic sentences for distillation experiments (issue 16): the English Wikipedia articles that gensim ships
as test data, markup stripped, one sentence per line.

gensim==4.4.0's wheel holds ``gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened
.bz2``: a 2000s dump's first 206 pages (106 articles once redirects are dropped: Anarchism, Abraham Lincoln,
Aristotle, Algeria, Academy Awards, Andre Agassi, ...), 6.1 MB of wiki markup. This script reads it as a file
(gensim is never imported, so ``pip install --no-deps gensim==4.4.0`` suffices) and strips the markup with
mwparserfromhell (``pip install mwparserfromhell==0.7.2``); sentences of 5-40 words ending in . ! or ?, without
leftover markup characters, distinct, in article order: 18,275 of them.

Run: ``PYTHONPATH=. python bench/wiki_sentences.py /tmp/enwiki.txt``, then ``bench/distill_ablation.py
--extra-file /tmp/enwiki.txt ...``; ``--wordnet N`` puts a seeded sample of N WordNet texts
(``softdeploy.distill.data.wordnet_texts``, ``random.Random(0).sample``) before the sentences. ``--questions N
--fill F --seed S`` instead writes the sentences' facts asked as trivia (the library's pattern rules,
``softdeploy.distill.facts.facts_as_questions``: "Who was thanked by Armstrong?", "When was Captain Lincoln killed in
an Indian raid?"; 7,363 of them), then a ``random.Random(S).sample`` of the lines of F (e.g.
``bench/wordnet_questions.py``'s file) to N lines (N below 7,363: a sample of the questions). Results:
bench/results/distill_recipes.md (tenth and twenty-third sessions).
"""

from __future__ import annotations

import argparse
import bz2
import random
import re
import xml.etree.ElementTree as ET

from softdeploy.distill.facts import facts_as_questions
from softdeploy.models.assets import package_dir

WIKI_FILE = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


def wiki_sentences() -> list[str]:
    """The sentences of the dump's articles (redirect pages skipped), as described in the module docstring."""
    import mwparserfromhell

    with bz2.open(package_dir("gensim") / WIKI_FILE) as f:
        root = ET.fromstring(f.read())
    ns = root.tag.split("}")[0] + "}"
    out: dict[str, None] = {}
    for page in root.iter(ns + "page"):
        text = page.find(f"{ns}revision/{ns}text")
        if text is None or text.text is None or text.text.lstrip().lower().startswith("#redirect"):
            continue
        plain = mwparserfromhell.parse(text.text).strip_code(normalize=True, collapse=True)
        for para in plain.split("\n"):
            para = para.strip()
            if not para or para.startswith(("*", "|", "!", "{", "=")):  # lists, tables, headings
                continue
            for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", para):
                s = " ".join(s.split())
                if 5 <= len(s.split()) <= 40 and s[-1] in ".!?" and not re.search(r"[{}|<>=\[\]]", s):
                    out.setdefault(s, None)
    return list(out)


def fill_lines(path: str) -> list[str]:
    """The non-blank lines of a ``--fill`` file, newline stripped (the rest of each line kept as it is)."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the text file to write, one text per line")
    ap.add_argument("--wordnet", type=int, default=0, help="a seeded sample of this many WordNet texts first")
    ap.add_argument("--questions", type=int, default=0, help="N lines: the sentences asked as questions, --fill")
    ap.add_argument("--fill", default="", help="--questions's fill: a seeded sample of this file's lines")
    ap.add_argument("--seed", type=int, default=0, help="--questions's draw of the fill")
    a = ap.parse_args()
    if a.questions and not a.fill:
        ap.error("--questions needs --fill")
    texts = wiki_sentences()
    if a.questions:
        texts, rng = facts_as_questions(texts), random.Random(a.seed)
        if a.questions < len(texts):
            texts = rng.sample(texts, a.questions)
        fill = fill_lines(a.fill)
        texts += rng.sample(fill, a.questions - len(texts))
    elif a.wordnet:
        from softdeploy.distill.data import wordnet_texts

        texts = random.Random(0).sample(wordnet_texts(), a.wordnet) + texts
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(texts) + "\n")
    print(f"{len(texts)} texts -> {a.out}")


if __name__ == "__main__":
    main()
