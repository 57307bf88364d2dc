"""The ``fact-questions`` source: the pattern rules ask a sentence's fact as a question, the shipped facts give the
recorded 5,494 questions, and the ``NAME:COUNT`` source syntax samples a source with the seed."""

from __future__ import annotations

import pytest

from softdeploy.distill.data import BROAD_SOURCES, distillation_texts, held_out, parse_source
from softdeploy.errors import ArgumentError
from softdeploy_cases.facts import country_sentences, fact_questions, facts_as_questions, sentence_questions


@pytest.mark.parametrize(
    ("sentence", "questions"),
    [
        # copula after a name: "Who"; the subject asked back; the year dropped for "When"
        (
            "Abraham Lincoln was born in 1809 in Kentucky.",
            [
                "Who was born in 1809 in Kentucky?",
                "What was Abraham Lincoln?",
                "When was Abraham Lincoln born in Kentucky?",
            ],
        ),
        # copula after an opener: "What", the opener lower-cased when the subject is asked back
        (
            "The capital of Australia is Canberra.",
            ["What is Canberra?", "What is the capital of Australia?"],
        ),
        # a past-tense verb after a short subject
        ("Lincoln won the election of 1860.", ["Who won the election of 1860?"]),
        # a participle starts a description, not a deed; no copula, no past verb; not a statement; too short
        ("Paper used in banknotes lasts longer.", []),
        ("Tea called oolong grows in Taiwan.", []),
        ("Honey never spoils in a jar.", []),
        ("Was Lincoln born in Kentucky?", []),
        ("Rome was big.", []),
    ],
)
def test_sentence_questions_ask_the_fact(sentence: str, questions: list[str]) -> None:
    assert sentence_questions(sentence) == questions


def test_facts_as_questions_are_distinct_and_in_order() -> None:
    sentences = ["Lincoln won the election of 1860.", "Lincoln won the election  of 1860.", "Honey never spoils."]
    assert facts_as_questions(sentences) == ["Who won the election of 1860?"]


@pytest.mark.models
def test_fact_questions_are_the_recorded_ones() -> None:
    """randfacts==0.24.4 (its safe.txt sha256-checked) and countryinfo==1.0.1 as the models extra pins them: the 5,494
    questions the twenty-fifth session trained on (cases/results/experiments/distill_recipes.md)."""
    from softdeploy_cases.minilm_retrieval import load_chatterbot

    questions = fact_questions()
    assert len(questions) == 5_494 and len(set(questions)) == len(questions)
    assert questions == fact_questions()  # no draw: the same list every call
    assert all(q.endswith("?") and q == " ".join(q.split()) for q in questions)
    assert "The capital of Australia is Canberra." in country_sentences()
    assert {"What is the capital of Australia?", "What are the people of Australia?"} <= set(questions)
    # three are evaluation questions of the retrieval cases up to case and punctuation: the case drops them
    assert held_out(questions, load_chatterbot(96).queries)[1] == 3
    assert set(distillation_texts(("fact-questions",))) == set(questions)


@pytest.mark.slow
@pytest.mark.models
def test_a_source_with_a_count_is_a_seeded_sample_of_it() -> None:
    every = distillation_texts(("wordnet-questions",))
    sample = distillation_texts(("wordnet-questions:500",), seed=3)
    assert len(sample) == 500 and set(sample) <= set(every)
    assert sample == distillation_texts(("wordnet-questions:500",), seed=3)
    assert set(sample) != set(distillation_texts(("wordnet-questions:500",), seed=4))
    # a count above the source's size takes all of it
    assert set(distillation_texts(("fact-questions:100000",))) == set(fact_questions())
    # the broad stream: every fact question and 20,000 WordNet questions (the sets overlap in none)
    broad = distillation_texts(BROAD_SOURCES, seed=0)
    assert len(broad) == 5_494 + 20_000 and set(fact_questions()) <= set(broad)
    # the order the sources are named in does not change the texts
    assert distillation_texts(BROAD_SOURCES[::-1], seed=0) == broad
    assert distillation_texts(BROAD_SOURCES, seed=0, limit=10) == broad[:10]


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        (("wikipedia",), "source 'wikipedia' is not one of"),
        (("wordnet:x",), "the count 'x' is not a positive integer"),
        (("wordnet:0",), "the count '0' is not a positive integer"),
        (("wordnet", "wordnet:5"), "name a source twice"),
        ((), "no sources given"),
    ],
)
def test_bad_sources_are_refused_with_the_rule(sources: tuple[str, ...], message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        distillation_texts(sources)


def test_parse_source() -> None:
    assert parse_source("wordnet-questions:20000") == ("wordnet-questions", 20000)
    assert parse_source(" chatterbot ") == ("chatterbot", None)
