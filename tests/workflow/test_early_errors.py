"""Everything a workflow names that needs no model -- variants, metric names, data files, labels (NaN / inf, one per
sample), primary -- is refused before the model is exported: the export is replaced by a stand-in that fails the test
if it is reached. From the CLI each is one line and exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from softdeploy.cli import main
from softdeploy.progress import SilentProgress
from softdeploy.workflow import WorkflowError, load_workflow
from softdeploy.workflow.run import run_workflow

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the factory or exporting the model ends the test: every error here must come before them."""

    def reached(*_: object, **__: object) -> None:
        pytest.fail("the model was loaded / exported before the bad input was refused")

    monkeypatch.setattr("softdeploy.export.factory.load_factory", reached)
    monkeypatch.setattr("softdeploy.export.api.export", reached)


def workflow(tmp_path: Path, labels: np.ndarray | None = None, **over: object) -> Path:
    rng = np.random.default_rng(0)
    arrays = {"tokens": rng.standard_normal((16, 12, 32)).astype(np.float32)}
    arrays["labels"] = rng.integers(0, 6, 16) if labels is None else labels
    np.savez(tmp_path / "eval.npz", **arrays)
    wf = {
        "name": "early",
        "model": {"factory": str(HERE / "newuser_model.py") + ":make"},
        "data": {"inputs": "eval.npz", "labels": "labels", "batch": 8},
        "metrics": [{"name": "accuracy"}],
        "rounds": 1,
        "out": "results",
        **over,
    }
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(wf))
    return path


CASES = {
    "variant": ({"variants": ["ort-fp32", "ort-fp64"]}, None, r"variants: unknown \['ort-fp64'\]"),
    "metric": ({"metrics": [{"name": "acuracy"}]}, None, r"metrics: unknown metric 'acuracy'"),
    "metric function": (
        {"metrics": [{"name": str(HERE / "newuser_model.py") + ":no_such_metric"}]},
        None,
        r"metrics: .*no_such_metric",
    ),
    "data file": (
        {"data": {"inputs": "nope.npz", "labels": "labels"}},
        None,
        r"data.inputs: .*nope.npz does not exist",
    ),
    "labels array": ({"data": {"inputs": "eval.npz", "labels": "lables"}}, None, r"data.labels: 'lables' is neither"),
    "NaN labels": (
        {"metrics": [{"name": "mse"}]},
        np.array([0.5] * 5 + [np.nan] + [0.5] * 10, np.float32),
        r"data.labels \(labels\): 1 of 16 labels are not finite, the first nan at index \[5\]",
    ),
    "inf labels": (
        {"metrics": [{"name": "mae"}]},
        np.array([0.5] * 15 + [np.inf], np.float64),
        r"1 of 16 labels are not finite, the first inf at index \[15\]",
    ),
    "label count": ({}, np.arange(15) % 6, r"data.labels: 15 labels for 16 samples"),
    "labels needed": (
        {"data": {"inputs": "eval.npz"}, "metrics": [{"name": "cosine"}, {"name": "accuracy"}]},
        None,
        r"metrics: accuracy needs labels",
    ),
    "primary": ({"primary": "accuracy@5"}, None, r"primary: 'accuracy@5' is not one of the metrics \['accuracy'\]"),
    "quantize.metric": (
        {"quantize": {"mode": "dynamic", "max_drop": 0.1, "metric": "f1"}},
        None,
        r"quantize.metric: 'f1' is not one of the metrics",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_before_the_model_is_exported(tmp_path: Path, case: str) -> None:
    over, labels, message = CASES[case]
    wf = load_workflow(workflow(tmp_path, labels, **over))
    with pytest.raises(WorkflowError, match=message):
        run_workflow(wf, SilentProgress())


@pytest.mark.parametrize("case", ["variant", "NaN labels"])
def test_cli_says_it_in_one_line_before_the_export(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    over, labels, message = CASES[case]
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(workflow(tmp_path, labels, **over))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("softdeploy: error: "), err
    assert re.search(message, err[0]), err
    assert not (tmp_path / "results").exists()  # nothing made


def test_compare_variants_flag_is_checked_before_the_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rc = main(["compare", "--workflow", str(workflow(tmp_path)), "--variants", "ort-fp32,ort-int9"])
    assert rc == 2 and "ort-int9" in capsys.readouterr().err
