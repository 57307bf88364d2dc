"""`softdeploy quantize MODEL` on the user's terms: the budget on the metric and output the user names,
integer outputs never a cosine target, data checked against the model before any work, and a result
without one int8 node an error (issue 12, items 2 and 4)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import softdeploy
import softdeploy.nn
from softdeploy.cli import main


class IdsFirst(torch.nn.Module):
    """A classifier whose FIRST output is int64 class ids (cosine over ids once decided its budget)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.body(x)
        return logits.argmax(-1), logits


@pytest.fixture(scope="module")
def ids_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("ids")
    module = IdsFirst().eval()
    x = np.random.default_rng(0).standard_normal((40, 16)).astype(np.float32)
    softdeploy.export(
        module,
        (torch.from_numpy(x[:8]),),
        tmp / "m.onnx",
        dynamic_shapes=({0: torch.export.Dim("batch")},),
        output_names=["ids", "logits"],
    )
    labels = module(torch.from_numpy(x))[0].numpy()
    np.savez(tmp / "data.npz", x=x, labels=labels)
    return tmp / "m.onnx", tmp / "data.npz"


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_default_budget_target_is_the_first_float_output(ids_model, tmp_path: Path) -> None:
    model, data = ids_model
    out = tmp_path / "q.onnx"
    args = ["quantize", str(model), "-o", str(out), "--mode", "static", "--data", str(data), "--labels", "labels"]
    assert main([*args, "--max-drop", "0.01"]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["metric"] == "cosine" and report["quantized_nodes"] > 0


def test_an_integer_output_is_refused_as_a_cosine_target(ids_model, tmp_path: Path, capfd) -> None:
    model, data = ids_model
    args = ["quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--mode", "static", "--data", str(data)]
    assert main([*args, "--labels", "labels", "--max-drop", "0.01", "--metric", "cosine=ids"]) == 2
    assert "integer outputs" in _one_line(capfd.readouterr().err)
    assert not (tmp_path / "q.onnx").exists()


def test_the_budget_is_on_the_users_metric_and_output(ids_model, tmp_path: Path) -> None:
    model, data = ids_model
    out = tmp_path / "q.onnx"
    args = ["quantize", str(model), "-o", str(out), "--mode", "static", "--data", str(data), "--labels", "labels"]
    assert main([*args, "--max-drop", "0.05", "--metric", "accuracy=ids"]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["metric"] == "accuracy" and report["fp32"] == 1.0 and report["met"]


def test_feeds_are_checked_before_any_work(ids_model, tmp_path: Path, capfd) -> None:
    model, _ = ids_model
    bad = tmp_path / "bad.npz"
    np.savez(bad, inputs=np.zeros((8, 16), np.float32), labels=np.zeros(8, np.int64))
    args = ["quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--mode", "static", "--data", str(bad)]
    assert main([*args, "--labels", "labels"]) == 2
    line = _one_line(capfd.readouterr().err)
    assert "no array for model input(s) ['x']" in line and "x float32['batch', 16]" in line
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=np.zeros((8, 16), np.float64))
    assert main(["quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--mode", "static", "--data", str(wrong)]) == 2
    assert "input 'x' is float64; the model expects float32" in _one_line(capfd.readouterr().err)


def test_a_short_last_batch_of_a_fixed_batch_model_is_named(tmp_path: Path, capfd) -> None:
    module = IdsFirst().eval()
    softdeploy.export(module, (torch.randn(8, 16),), tmp_path / "fixed.onnx", output_names=["ids", "logits"])
    data = tmp_path / "d.npz"
    np.savez(data, x=np.zeros((13, 16), np.float32))
    args = [
        "quantize",
        str(tmp_path / "fixed.onnx"),
        "-o",
        str(tmp_path / "q.onnx"),
        "--mode",
        "static",
        "--data",
        str(data),
    ]
    assert main(args) == 2
    assert "13 samples leave a last batch of 5" in _one_line(capfd.readouterr().err)


def test_nothing_quantized_is_an_error(tmp_path: Path, capfd) -> None:
    """A model with no MatMul / Conv: the old code wrote a float model named int8 and exited 0."""
    softdeploy.export(softdeploy.nn.TwoPassSoftmax(), (torch.randn(4, 40),), tmp_path / "soft.onnx")
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(tmp_path / "soft.onnx"), "-o", str(out)]) == 2
    assert "nothing was quantized" in _one_line(capfd.readouterr().err)
    assert not out.exists()


def test_unbatched_inputs_are_held_constant_for_calibration(tmp_path: Path) -> None:
    """Queries batched, the document set fed whole with each batch (--constant)."""

    class Retriever(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.proj = torch.nn.Linear(16, 16)
            self.score = softdeploy.nn.MaxSimScorer(normalize=True)

        def forward(self, queries: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
            return self.score(self.proj(queries), self.proj(documents))

    q, d = torch.randn(4, 5, 16), torch.randn(9, 7, 16)
    softdeploy.export(
        Retriever().eval(),
        (q, d),
        tmp_path / "r.onnx",
        dynamic_shapes={"queries": {0: torch.export.Dim("b")}, "documents": None},
    )
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", queries=rng.standard_normal((10, 5, 16)).astype(np.float32), documents=d.numpy())
    out = tmp_path / "q.onnx"
    args = ["quantize", str(tmp_path / "r.onnx"), "-o", str(out), "--mode", "static", "--data", str(tmp_path / "d.npz")]
    assert main([*args, "--constant", "documents", "--batch", "4"]) == 0
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(out).graph.node)
