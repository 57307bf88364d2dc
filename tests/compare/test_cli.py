from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from quant.tiny import mlp_with_custom_op

from softdeploy.cli import main


@pytest.fixture
def model_and_data(tmp_path: Path) -> tuple[Path, Path]:
    model = tmp_path / "m.onnx"
    onnx.save(mlp_with_custom_op(with_function=True, outlier=200.0), model)
    data = tmp_path / "x.npz"
    np.savez(data, X=np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32))
    return model, data


def test_quantize_list(model_and_data: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    model, _ = model_and_data
    assert main(["quantize", str(model), "--list", "--mode", "static"]) == 0
    out = capsys.readouterr().out
    assert "fc1" in out and "fc3" in out and "soft" not in out


def test_quantize_with_budget(model_and_data: tuple[Path, Path], tmp_path: Path) -> None:
    model, data = model_and_data
    out = tmp_path / "q.onnx"
    code = main(["quantize", str(model), "-o", str(out), "--per-tensor", "--data", str(data), "--max-drop", "0.01"])
    assert code == 0 and out.is_file()
    report = json.loads(out.with_suffix(".json").read_text())
    assert [k["node"] for k in report["kept_float"]] == ["fc2"] and report["met"]


def test_static_needs_data(model_and_data: tuple[Path, Path]) -> None:
    model, _ = model_and_data
    assert main(["quantize", str(model), "--mode", "static"]) == 2
