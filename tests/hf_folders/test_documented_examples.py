"""The README's and the workflow guide's documented workflow example runs as written for a factory model, a Hugging
Face folder and an ONNX file alike: only the ``model`` entry changes, its metric names the output ``logits``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from hf_folders.tiny import inputs_for, write_folder
from softdeploy.cli import main

pytestmark = pytest.mark.models
ROOT = Path(__file__).resolve().parents[2]

# The user's own code that the example names: a factory (a transformers classifier wrapped to return its logits,
# as a user writes it) and the metric function macro_recall.
USER_CODE = """
from pathlib import Path

import numpy as np
import torch
import transformers


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def make():
    folder = Path(__file__).with_name("classifier")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, attn_implementation="eager")
    ids = torch.randint(5, 100, (2, 8))
    batch, seq = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("seq", min=2, max=64)
    dims = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    return Logits(model.eval()), (ids, torch.ones_like(ids)), dims


def macro_recall(output, labels):
    predicted = output.argmax(-1)
    return float(np.mean([np.mean(predicted[labels == c] == c) for c in np.unique(labels)]))
"""


def _documented_example(page: str) -> dict:
    text = (ROOT / page).read_text()
    if page == "README.md":
        text = text.split("## Your own model", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block
    return yaml.safe_load(block.group(1))


@pytest.mark.slow
@pytest.mark.parametrize("page", ["README.md", "docs/guide/workflow.md"])
def test_the_documented_example_runs_for_factory_folder_and_onnx_models(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    example = _documented_example(page)
    assert {"name": "accuracy", "output": "logits"} in example["metrics"]
    monkeypatch.chdir(tmp_path)
    write_folder("xlm-roberta", tmp_path / "classifier")
    (tmp_path / "mymodel.py").write_text(USER_CODE)
    feeds = inputs_for("xlm-roberta", n=32)
    np.savez(tmp_path / "eval.npz", **feeds, labels=np.random.default_rng(0).integers(0, 3, 32))
    assert main(["export", "mymodel.py:make", "my.onnx"]) == 0  # the ONNX form: outputs named by torch
    capsys.readouterr()

    forms = {
        "factory": example["model"],
        "folder": {"hf": "classifier"},
        "onnx": {"onnx": "my.onnx", "outputs": example["model"]["outputs"]},
    }
    assert "factory" in forms["factory"] and forms["factory"]["outputs"] == ["logits"]
    for form, model in forms.items():
        workflow = {**example, "name": form, "model": model}
        if form == "onnx":  # an ONNX file has no torch model to time
            workflow["variants"] = [v for v in example["variants"] if v != "torch-fp32"]
        path = tmp_path / f"{form}.yaml"
        path.write_text(yaml.safe_dump(workflow))
        assert main(["run", str(path), "--quick"]) == 0, (form, capsys.readouterr())
        report = (tmp_path / "softdeploy-results" / form / "report.md").read_text()
        assert "accuracy" in report and "macro_recall" in report, form


@pytest.mark.slow
def test_a_factory_model_without_outputs_names_them_as_torch_does(tmp_path: Path) -> None:
    """Without model.outputs, `output: logits` cannot match a factory's torch-named output: the error says which
    names exist (the reason model.outputs exists)."""
    from softdeploy.progress import SilentProgress
    from softdeploy.workflow import WorkflowError, parse
    from softdeploy.workflow.case import WorkflowCase

    write_folder("xlm-roberta", tmp_path / "classifier")
    (tmp_path / "mymodel.py").write_text(USER_CODE)
    np.savez(tmp_path / "eval.npz", **inputs_for("xlm-roberta", n=8), labels=np.zeros(8, np.int64))
    raw = {
        "model": {"factory": "mymodel.py:make"},
        "data": {"inputs": "eval.npz", "labels": "labels"},
        "metrics": [{"name": "accuracy", "output": "logits"}],
    }
    case = WorkflowCase(parse(raw, base=tmp_path))
    with pytest.raises(WorkflowError, match="logits"):
        case.prepare(SilentProgress())
    renamed = WorkflowCase(parse({**raw, "model": {**raw["model"], "outputs": ["logits"]}}, base=tmp_path))
    renamed.prepare(SilentProgress())
    assert list(renamed._outputs) == ["logits"]
