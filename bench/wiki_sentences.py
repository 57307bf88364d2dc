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
--fill F --seed S`` instead writes the sentences' facts asked as trivia (:func:`wiki_questions`: "Who was thanked by
Armstrong?", "When was Captain Lincoln killed in an Indian raid?"; 7,363 of them), then a ``random.Random(S).sample``
of the lines of F (e.g. ``bench/wordnet_questions.py``'s file) to N lines (N below 7,363: a sample of the questions). Results: bench/results/distill_recipes.md (tenth and
twenty-third sessions).
"""

from __future__ import annotations

import argparse
import bz2
import random
import re
import xml.etree.ElementTree as ET

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


# Words that open a sentence without naming who or what it is about: a copula sentence after one is asked with
# "What", after a capitalised name with "Who"; and the first word lower-cased when the subject is asked back.
_OPENERS = frozenset(
    "The This That These Those It Its A An In On At There He She They His Her Their Some Many Most All One Each Both "
    "Such However Also As After Before During Since While When Although For By With From".split()
)
# Past-tense verbs that end a sentence's short subject ("Lincoln won the election" -> "Who won the election?")
_PAST = (
    r"(?:\w+ed|won|wrote|became|led|made|took|gave|began|built|found|fought|held|left|lost|met|ran|saw|sold|taught|"
    r"told|went|bought|brought|chose|drew|grew|knew|rose|spoke|stood|struck|threw)"
)
_COPULA = re.compile(r"^(?P<subj>[A-Z][^,;:()\"]{1,60}?) (?P<cop>is|was|are|were) (?P<rest>[^;:()\"]{3,140})$")
_VERB = re.compile(r"^(?P<subj>[A-Z][^,;:()\"]{1,40}?) (?P<verb>" + _PAST + r") (?P<rest>[^;:()\"]{3,120})$")
_YEAR = re.compile(r"^(?P<pre>.*?),? in (?:1\d{3}|20\d{2})(?P<post>.*)$")


def _sentence_questions(sentence: str) -> list[str]:
    """One declarative sentence's facts as questions; none where no rule applies. Rules, in order:
    ``S is/are/was/were R.`` -> "Who/What was R?" (Who after a name), "What was S?" (S of at most six words) and,
    where R names a year, "When was S R-without-the-year?" (the verb kept as the sentence has it); else ``S <past verb> R.`` -> "Who/What <verb> R?" (not the
    participles used / based / called / named, which start descriptions rather than facts)."""
    if not sentence.endswith(".") or "*" in sentence or "=" in sentence:
        return []
    s = sentence[:-1]
    if not 4 <= len(s.split()) <= 30:
        return []

    def wh(subject: str) -> str:
        return "What" if subject.split()[0] in _OPENERS else "Who"

    def asked_back(subject: str) -> str:
        first, *rest = subject.split()
        return " ".join([first.lower() if first in _OPENERS else first, *rest])

    if m := _COPULA.match(s):
        subj, cop, rest = m["subj"], m["cop"], m["rest"]
        out = [f"{wh(subj)} {cop} {rest}?"]
        if len(subj.split()) <= 6:
            out.append(f"What {cop} {asked_back(subj)}?")
        if (y := _YEAR.match(rest)) and (y["pre"] + y["post"]).strip():
            out.append(f"When {cop} {asked_back(subj)} {(y['pre'] + y['post']).strip()}?")
        return out
    if (m := _VERB.match(s)) and m["verb"] not in ("used", "based", "called", "named"):
        return [f"{wh(m['subj'])} {m['verb']} {m['rest']}?"]
    return []


def wiki_questions(sentences: list[str]) -> list[str]:
    """The facts of ``sentences`` asked as trivia questions (:func:`_sentence_questions`' rules), distinct, in order.

    The rules are crude (subject and verb found by pattern, no parser) and some questions are ungrammatical; each
    still asks one of the article's facts in a question's shape, the shape the held-out trivia have and the
    encyclopedic sentences (tenth session) do not."""
    out: dict[str, None] = {}
    for sentence in sentences:
        for q in _sentence_questions(sentence.strip()):
            out.setdefault(" ".join(q.split()), None)
    return list(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the text file to write, one text per line")
    ap.add_argument("--wordnet", type=int, default=0, help="a seeded sample of this many WordNet texts first")
    ap.add_argument("--questions", type=int, default=0, help="N lines: the sentences asked (wiki_questions), --fill")
    ap.add_argument("--fill", default="", help="--questions's fill: a seeded sample of this file's lines")
    ap.add_argument("--seed", type=int, default=0, help="--questions's draw of the fill")
    a = ap.parse_args()
    if a.questions and not a.fill:
        ap.error("--questions needs --fill")
    texts = wiki_sentences()
    if a.questions:
        texts, rng = wiki_questions(texts), random.Random(a.seed)
        if a.questions < len(texts):
            texts = rng.sample(texts, a.questions)
        with open(a.fill, encoding="utf-8") as f:
            fill = [line.rstrip("\n") for line in f if line.strip()]
        texts += rng.sample(fill, a.questions - len(texts))
    elif a.wordnet:
        from softdeploy.distill.data import wordnet_texts

        texts = random.Random(0).sample(wordnet_texts(), a.wordnet) + texts
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(texts) + "\n")
    print(f"{len(texts)} texts -> {a.out}")


if __name__ == "__main__":
    main()
