"""``task: causal-lm-with-past`` in a workflow file: two graphs with a KV cache do not fit a workflow's one-model
compare, so the file is refused in one line naming the rule and the command-line alternative (it was the schema's
bare enum message, which said neither)."""

from __future__ import annotations

from pathlib import Path

import pytest

from softdeploy.cli import main
from softdeploy.workflow import WorkflowError, parse

WITH_PAST = {"model": {"hf": "decoder", "task": "causal-lm-with-past"}, "data": {"inputs": "x.npz"}}


def test_causal_lm_with_past_is_refused_naming_the_rule_and_the_cli() -> None:
    with pytest.raises(WorkflowError) as e:
        parse(WITH_PAST, name="wf")
    message = str(e.value)
    assert message.startswith("wf: model.task: causal-lm-with-past exports two graphs")
    assert "rule: a workflow exports and compares one model" in message
    assert "softdeploy export FOLDER OUT_DIR --task causal-lm-with-past" in message
    assert "\n" not in message


def test_the_run_command_says_it_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "wf.json").write_text(json.dumps(WITH_PAST))
    assert main(["run", "wf.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "causal-lm-with-past exports two graphs" in err
    assert "Traceback" not in err
