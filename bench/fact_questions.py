"""Trivia facts asked as trivia, for distillation experiments (issue 16): one question per line.

The facts and their questions are the library's ``fact-questions`` source (``softdeploy.distill.facts``:
randfacts==0.24.4's one-line facts and countryinfo==1.0.1's countries, in the ``models`` extra; 5,494 questions);
the minilm_distilled case trains on them beside 20,000 WordNet questions. This script writes them to a file, with
more beside them, for ``bench/distill_ablation.py --extra-file``:

* ``--wiki``: the Wikipedia articles' 7,363 questions (``bench/wiki_sentences.py``; needs ``pip install --no-deps
  gensim==4.4.0 mwparserfromhell==0.7.2``), the union kept distinct;
* ``--fill F --n N --seed S`` adds a ``random.Random(S).sample`` of F's lines (e.g. ``bench/wordnet_questions.py``'s
  file) to N lines, or, with ``--add M``, M of them after all the questions;
* ``--dict D`` (repeatable) adds the questions of a Debian dictd dictionary (``apt-get download dict-foldoc
  dict-elements``, ``dpkg -x``; D the ``.dict.dz`` file): FOLDOC's first definition sentences in three of WordNet's
  question forms, the elements' symbol, number, discoverer and description sentences as "Which element ...?".

Run (the stream the case adopted, fc): ``PYTHONPATH=. python bench/fact_questions.py /tmp/fc_s0.txt --fill
/tmp/glossq.txt --add 20000 --seed 0``, then ``bench/distill_ablation.py --extra-file /tmp/fc_s0.txt --extra-n 30000
--mix 0.5 ...``. Results: bench/results/distill_recipes.md (twenty-fifth and twenty-sixth sessions).
"""

from __future__ import annotations

import argparse
import gzip
import random
import re
from pathlib import Path

from wiki_sentences import fill_lines, wiki_sentences

from softdeploy.distill.data import QUESTION_FORMS
from softdeploy.distill.facts import country_sentences, facts_as_questions, randfacts_sentences

# WordNet's question forms without the two that ask for a word: FOLDOC's headwords are often names and acronyms
_DEFINITION_FORMS = QUESTION_FORMS[1:4]
assert _DEFINITION_FORMS == ("What is the term for {}?", "What do you call {}?", "What is the name for {}?")


def _foldoc_questions(text: str, rng: random.Random) -> list[str]:
    """FOLDOC entries (a headword at column 0, its body indented, opening with ``<domain>``): the body's first
    sentence, cross-reference braces, parentheses and brackets dropped, as a definition question, where it has 3-30
    words, does not name the headword and is not a pointer ("See ...", "An abbreviation ...")."""
    out = []
    for block in re.split(r"\n(?=\S)", text):
        head, *body_lines = block.split("\n")
        m = re.match(r"^\s*<[^>]*>\s*(.*)$", " ".join(x.strip() for x in body_lines))
        if not m:
            continue
        body = re.sub(r"\{([^}(]*)(?:\([^)]*\))?\}", r"\1", m[1])
        body = " ".join(re.sub(r"\[[^\]]*\]", "", re.sub(r"\([^)]*\)", "", body)).split())
        first = re.split(r"(?<=[.!?])\s+(?=[A-Z])", body)[0].rstrip(".")
        if not 3 <= len(first.split()) <= 30 or "<" in first or head.strip().lower() in first.lower():
            continue
        if first.lower().startswith(("see ", "an abbreviation", "abbreviation")):
            continue
        if first.startswith(("A ", "An ", "The ")):
            first = first[0].lower() + first[1:]
        out.append(rng.choice(_DEFINITION_FORMS).format(first))
    return out


def _elements_questions(text: str) -> list[str]:
    """The elements dictionary's entries (name, ``Symbol:``, ``Atomic number:``, ``Atomic weight:``, description):
    symbol and number asked both ways, "Who discovered X?" (and "When ...?" where a year is given), the other
    description sentences of 3-25 words as "Which element is ...?"."""
    out = []
    entry = re.compile(r"^([a-z]+)\nSymbol: (\S+)\nAtomic number: (\d+)\nAtomic weight: [^\n]+\n(.*)$", re.S)
    for block in re.split(r"\n\n(?=[a-z]+\nSymbol:)", text):
        if not (m := entry.match(block.strip())):
            continue
        element, symbol, number, description = m.groups()
        out += [
            f"What is the chemical symbol for {element}?",
            f"Which element has the symbol {symbol}?",
            f"What is the atomic number of {element}?",
            f"Which element has atomic number {number}?",
        ]
        for s in re.split(r"(?<=\.)\s+(?=[A-Z])", " ".join(description.split())):
            s = s.rstrip(".")
            if d := re.match(r"^Discovered by .+?(?: in (\d{4}))?$", s):
                out.append(f"Who discovered {element}?")
                if d[1]:
                    out.append(f"When was {element} discovered?")
            elif 3 <= len(s.split()) <= 25 and not s.startswith(("It ", "Used", "Symbol")):
                out.append(f"Which element is {s[0].lower() + s[1:]}?")
    return out


def dict_questions(path: Path, rng: random.Random) -> list[str]:
    """The questions of a dictd dictionary file (FOLDOC or the elements, told apart by their entries' shape)."""
    text = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
    return _elements_questions(text) if "\nSymbol: " in text else _foldoc_questions(text, rng)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the text file to write, one text per line")
    ap.add_argument("--wiki", action="store_true", help="also gensim's Wikipedia articles' questions")
    ap.add_argument("--dict", action="append", default=[], help="also a dictd .dict.dz file's questions")
    ap.add_argument("--fill", default="", help="a file whose lines a seeded sample is drawn from")
    ap.add_argument("--n", type=int, default=0, help="fill to this many lines in all")
    ap.add_argument("--add", type=int, default=0, help="add this many fill lines after every question")
    ap.add_argument("--seed", type=int, default=0, help="the fill's draw (FOLDOC's forms are drawn with seed 0)")
    a = ap.parse_args()
    if (a.n or a.add) and not a.fill:
        ap.error("--n and --add need --fill")
    if a.n and a.add:
        ap.error("--n (fill to N lines in all) and --add (M more lines) exclude each other")
    questions = facts_as_questions(randfacts_sentences()) + facts_as_questions(country_sentences())
    if a.wiki:
        questions += facts_as_questions(wiki_sentences())
    texts = list(dict.fromkeys(questions))
    rng = random.Random(a.seed)
    if a.fill:
        fill = fill_lines(a.fill)
        texts += rng.sample(fill, a.add or max(a.n - len(texts), 0))
    dict_rng = random.Random(0)
    for path in a.dict:
        texts += list(dict.fromkeys(dict_questions(Path(path), dict_rng)))
    Path(a.out).write_text("\n".join(texts) + "\n", encoding="utf-8")
    print(f"{len(texts)} texts -> {a.out}")


if __name__ == "__main__":
    main()
