"""Trivia facts asked as trivia: the ``fact-questions`` distillation source.

A retrieval student must encode questions about things ("Who was the first emperor of Rome?") that its task texts
never mention. Facts from registry packages, asked as questions by pattern rules, teach it those things in a
question's shape: beside WordNet's definition questions they lifted the minilm_distilled student's MRR@10 by +0.005
on every one of four paired seeds (0.4254 vs 0.4205; cases/results/experiments/distill_recipes.md).

* randfacts==0.24.4 (MIT): ``randfacts/safe.txt``, 7,193 one-line trivia facts ("The Earth orbits the Sun at a
  speed of about 108,000 km per hour");
* countryinfo==1.0.1 (MIT): ``countryinfo/data/*.json``, 254 countries' capital, region and demonym, written as
  sentences ("The capital of Australia is Canberra.", "Australia is a country in Australia and New Zealand.",
  "The people of Australia are called Australians.").

Both are read as files (neither is imported) and asked by :func:`facts_as_questions`: 4,356 questions from the
facts and 1,170 from the 738 country sentences, 5,494 distinct (:func:`fact_questions`; 32 are asked by both). The
same rules asked gensim's Wikipedia sentences (cases/results/experiments/distill_recipes.md).
"""

from __future__ import annotations

import json
import re

from softdeploy_cases.assets import package_dir, verified_file

RANDFACTS_FILE = "safe.txt"

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
# participles that start a description rather than state a fact ("Tea made from ..." is no deed of "Tea")
_NOT_DEEDS = ("used", "based", "called", "named")


def sentence_questions(sentence: str) -> list[str]:
    """One declarative sentence's facts as questions; none where no rule applies. Rules, in order:
    ``S is/are/was/were R.`` -> "Who/What was R?" (Who after a name), "What was S?" (S of at most six words) and,
    where R names a year, "When was S R-without-the-year?" (the verb kept as the sentence has it); else
    ``S <past verb> R.`` -> "Who/What <verb> R?" (not the participles used / based / called / named). Sentences of
    4-30 words ending in a full stop only."""
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
    if (m := _VERB.match(s)) and m["verb"] not in _NOT_DEEDS:
        return [f"{wh(m['subj'])} {m['verb']} {m['rest']}?"]
    return []


def facts_as_questions(sentences: list[str]) -> list[str]:
    """The facts of ``sentences`` asked as trivia questions (:func:`sentence_questions`' rules), whitespace
    collapsed, distinct, in order.

    The rules are crude (subject and verb found by pattern, no parser) and some questions are ungrammatical; each
    still asks one fact in a question's shape, the shape of the trivia a retrieval student meets, which the
    declarative sentences do not have (cases/results/experiments/distill_recipes.md)."""
    out: dict[str, None] = {}
    for sentence in sentences:
        for q in sentence_questions(sentence.strip()):
            out.setdefault(" ".join(q.split()), None)
    return list(out)


def randfacts_sentences() -> list[str]:
    """randfacts' safe facts (the file the package draws from without ``unsafe=True``), one per line, each ended
    with a full stop where it has no end mark, in file order."""
    lines = verified_file("randfacts", RANDFACTS_FILE).read_text(encoding="utf-8").splitlines()
    return [s if s[-1] in ".!?" else s + "." for s in (line.strip() for line in lines) if s]


def country_sentences() -> list[str]:
    """Three sentences per country of countryinfo's data (capital; subregion, else region; demonym: those it has),
    countries in file-name order."""
    out = []
    for path in sorted((package_dir("countryinfo") / "data").glob("*.json")):
        c = json.loads(path.read_text(encoding="utf-8"))
        name = c.get("name")
        if not name:
            continue
        if c.get("capital"):
            out.append(f"The capital of {name} is {c['capital']}.")
        if region := c.get("subregion") or c.get("region"):
            out.append(f"{name} is a country in {region}.")
        if c.get("demonym"):
            out.append(f"The people of {name} are called {c['demonym']}s.")
    return out


def fact_questions() -> list[str]:
    """randfacts' facts and countryinfo's countries asked as questions (:func:`facts_as_questions`), distinct, in
    that order: 5,494 questions ("What is the capital of Australia?", "Who wrote ...?")."""
    return list(dict.fromkeys(facts_as_questions(randfacts_sentences()) + facts_as_questions(country_sentences())))
