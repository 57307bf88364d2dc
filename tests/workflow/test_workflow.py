"""The loop for a model softdeploy never saw: one workflow file, export -> quantize with an accuracy
budget on the user's own metric -> compare, from the CLI; and every way the file can be wrong."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from softdeploy.workflow import WorkflowError, load_workflow, parse

HERE = Path(__file__).resolve().parent


def _data(tmp_path: Path, n: int = 64) -> Path:
    sys.path.insert(0, str(HERE))
    from newuser_model import task

    x, y = task(n, seed=7)
    np.savez(tmp_path / "eval.npz", tokens=x, labels=y)
    return tmp_path / "eval.npz"


def _workflow(tmp_path: Path, **over) -> Path:
    _data(tmp_path)
    wf = {
        "name": "newuser",
        "model": {"factory": str(HERE / "newuser_model.py") + ":make"},
        "data": {"inputs": "eval.npz", "labels": "labels", "batch": 16},
        "metrics": [
            {"name": str(HERE / "newuser_model.py") + ":macro_recall"},
            {"name": "accuracy"},
        ],
        "quantize": {"mode": "dynamic", "max_drop": 0.05},
        "rounds": 1,
        "out": "results",
    }
    wf.update(over)
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(wf))
    return path


def test_a_new_users_model_goes_through_the_whole_loop_from_one_file(tmp_path: Path, run_cli) -> None:
    wf = _workflow(tmp_path)
    run = run_cli("run", str(wf), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    out = tmp_path / "results" / "newuser"
    data = json.loads((out / "results.json").read_text())
    variants = [r["variant"] for r in data["rows"]]
    assert variants == ["torch-fp32", "ort-fp32-stock", "ort-fp32", "ort-int8-dynamic"]
    for row in data["rows"]:
        assert row["macro_recall"] > 0.5 and row["accuracy"] > 0.5
    int8 = next(r for r in data["rows"] if r["variant"] == "ort-int8-dynamic")
    assert int8["int8 nodes"] > 0
    assert data["warnings"] == []  # torch and onnxruntime agree
    budget = json.loads((out / "budget.json").read_text())
    assert budget["metric"] == "macro_recall" and budget["met"]
    report = (out / "report.md").read_text()
    assert "ort-int8-dynamic" in report and "macro_recall" in report and "accuracy budget" in report
    assert "ort-int8-dynamic" in run.stdout


def test_an_onnx_file_with_simple_flags(tmp_path: Path, run_cli) -> None:
    """`softdeploy compare MODEL.onnx --data ... --labels ... --metric ...`: no file needed."""
    sys.path.insert(0, str(HERE))
    import torch
    from newuser_model import make

    import softdeploy

    module, example, dims = make()
    softdeploy.export(module, example, tmp_path / "m.onnx", dynamic_shapes=dims)
    _data(tmp_path)
    run = run_cli(
        "compare",
        "m.onnx",
        "--data",
        "eval.npz",
        "--labels",
        "labels",
        "--metric",
        "accuracy",
        "--quick",
        "--variants",
        "ort-fp32,ort-int8-dynamic",
        "--out",
        "res",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads((tmp_path / "res" / "m" / "results.json").read_text())
    assert [r["variant"] for r in data["rows"]] == ["ort-fp32", "ort-int8-dynamic"]
    assert all(r["accuracy"] > 0.5 for r in data["rows"])
    del torch


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data": {"inputs": "eval.npz", "batch": 0}}, r"data\.batch: 0 is less than the minimum of 1"),
        ({"metrics": [{"nmae": "accuracy"}]}, r"metrics\.0: .*'nmae' was unexpected"),
        ({"quantize": {"mode": "int4"}}, r"quantize\.mode: 'int4' is not one of"),
        ({"colour": "blue"}, r"\(top level\): Additional properties are not allowed \('colour'"),
    ],
)
def test_a_wrong_key_is_named(tmp_path: Path, change: dict, message: str) -> None:
    with pytest.raises(WorkflowError, match=message):
        load_workflow(_workflow(tmp_path, **change))


@pytest.mark.parametrize(
    ("data", "metrics", "message"),
    [
        # found before the model is read: the metric needs labels, and the file holds an array that could be them
        ({"inputs": "eval.npz"}, [{"name": "accuracy"}], r"accuracy needs labels \(data.labels: .*'labels'"),
        (
            {"inputs": "eval.npz", "labels": "labels", "constant": ["docs"]},
            None,
            r"data\.constant: \['docs'\] are not model inputs",
        ),
        ({"inputs": "missing.npz"}, None, r"missing\.npz does not exist"),
        (
            {"inputs": "eval.npz", "labels": "labels"},
            [{"name": "accuracy", "output": "nope"}],
            r"output 'nope' is not an output",
        ),
        (
            {"inputs": "eval.npz", "labels": "labels"},
            [{"name": "cosine", "output": "topk_indices"}],
            r"integer outputs",
        ),
        ({"inputs": "eval.npz", "labels": "labels"}, [{"name": "f1"}], r"unknown metric 'f1'"),
    ],
)
def test_data_and_metrics_are_checked_before_any_work(tmp_path: Path, data, metrics, message) -> None:
    from softdeploy.progress import SilentProgress
    from softdeploy.workflow.case import WorkflowCase

    sys.path.insert(0, str(HERE))
    from newuser_model import make

    import softdeploy

    module, example, dims = make()
    softdeploy.export(
        module,
        example,
        tmp_path / "m.onnx",
        dynamic_shapes=dims,
        output_names=["logits", "topk_values", "topk_indices"],
    )
    _data(tmp_path)
    raw = {"model": "m.onnx", "data": data}
    if metrics:
        raw["metrics"] = metrics
    case = WorkflowCase(parse(raw, base=tmp_path))
    with pytest.raises(WorkflowError, match=message):
        case.prepare(SilentProgress())


def test_unbatched_inputs_are_held_constant(tmp_path: Path) -> None:
    """A document set scored against every query batch (MaxSim): `constant` feeds it whole."""
    import torch

    import softdeploy
    from softdeploy.progress import SilentProgress
    from softdeploy.workflow.case import WorkflowCase

    scorer = softdeploy.nn.MaxSimScorer()
    q, d = torch.randn(4, 5, 16), torch.randn(9, 7, 16)
    softdeploy.export(
        scorer, (q, d), tmp_path / "s.onnx", dynamic_shapes={"queries": {0: torch.export.Dim("b")}, "documents": None}
    )
    np.savez(
        tmp_path / "q.npz",
        queries=np.random.default_rng(0).standard_normal((10, 5, 16)).astype(np.float32),
        documents=d.numpy(),
        labels=np.arange(10) % 9,
    )
    raw = {
        "model": "s.onnx",
        "data": {"inputs": "q.npz", "labels": "labels", "constant": ["documents"], "batch": 4},
        "metrics": [{"name": "mrr", "k": 3}],
    }
    case = WorkflowCase(parse(raw, base=tmp_path))
    case.prepare(SilentProgress())
    assert [len(b["queries"]) for b in case._data.batches] == [4, 4, 2]
    assert all(b["documents"].shape == (9, 7, 16) for b in case._data.batches)
    case.export_fp32(tmp_path / "fp32.onnx")
    from softdeploy.runtime import Session

    ev = case.evaluate(Session(tmp_path / "fp32.onnx").run, "native", SilentProgress(), "x")
    assert 0 <= ev.metrics["mrr@3"] <= 1
