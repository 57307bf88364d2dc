"""The experiments on the cases (``python -m softdeploy_cases.experiments.NAME``) import from an installed
``./cases`` alone -- no bench/ on sys.path -- and answer ``--help`` without starting a run."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import pytest

import softdeploy_cases.experiments as experiments

NAMES = sorted(m.name for m in pkgutil.iter_modules(experiments.__path__))


def test_the_experiments_are_found() -> None:
    assert "distill_students" in NAMES and "lora_mixer_steps" in NAMES, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_help_exits_zero_without_running(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = importlib.import_module(f"{experiments.__name__}.{name}")
    monkeypatch.setattr(sys, "argv", [f"python -m {module.__name__}", "--help"])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")
