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


@pytest.mark.parametrize("weights", ["8-bit", "7-bit", "pair-bounded", "lane-bounded"])
def test_quantize_weights_option(model_and_data: tuple[Path, Path], tmp_path: Path, weights: str) -> None:
    model, _ = model_and_data
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(model), "-o", str(out), "--weights", weights]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["weights"] == weights and report["config"]["weights"] == weights
    assert report["reduce_range"] is (weights == "7-bit")


def test_static_needs_data(model_and_data: tuple[Path, Path]) -> None:
    model, _ = model_and_data
    assert main(["quantize", str(model), "--mode", "static"]) == 2


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_quantize_refuses_to_overwrite(
    model_and_data: tuple[Path, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model, _ = model_and_data
    source = model.read_bytes()
    out = tmp_path / "q.onnx"
    out.write_bytes(b"the user's earlier result")
    assert main(["quantize", str(model), "-o", str(out)]) == 2
    assert f"{out} exists; pass --overwrite to replace it" in _one_line(capfd.readouterr().err)
    assert out.read_bytes() == b"the user's earlier result"
    out.unlink()
    out.with_suffix(".json").write_text("{}")  # the report alone is also the user's
    assert main(["quantize", str(model), "-o", str(out)]) == 2
    assert "q.json exists" in _one_line(capfd.readouterr().err)
    assert not out.exists() and out.with_suffix(".json").read_text() == "{}"
    for flags in ([], ["--overwrite"]):  # the source model: refused even with --overwrite
        assert main(["quantize", str(model), "-o", str(model), *flags]) == 2
        assert "is also the input" in _one_line(capfd.readouterr().err)
        assert model.read_bytes() == source
    assert main(["quantize", str(model), "-o", str(out), "--overwrite"]) == 0  # asked: replaced
    assert out.stat().st_size > 0 and json.loads(out.with_suffix(".json").read_text())["quantized_nodes"]


def test_quantize_without_model_or_case_prints_usage(tmp_path: Path, run_cli) -> None:
    # Used to start the all-MiniLM-L6-v2 job (a download and minutes of work) without being asked.
    run = run_cli("quantize", cwd=tmp_path)
    assert run.returncode == 2
    assert (
        run.stderr.startswith("usage: softdeploy quantize") and "give MODEL (an ONNX file) or --case CASE" in run.stderr
    )
    assert not (tmp_path / "softdeploy-quantize").exists()


def test_quantize_refuses_an_op_softdeploy_does_not_define(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = mlp_with_custom_op(with_function=False)
    for node in model.graph.node:
        if node.name == "soft":
            node.op_type = "TwoPassSoftmaxx"
    path, out = tmp_path / "bad.onnx", tmp_path / "q.onnx"
    onnx.save(model, path)
    assert main(["quantize", str(path), "-o", str(out)]) == 2  # exited 0 and wrote an unusable model
    line = _one_line(capfd.readouterr().err)
    assert "node 'soft' (graph): com.softdeploy.TwoPassSoftmaxx" in line, line
    assert not out.exists()


def test_quantize_missing_data_is_one_line(model_and_data: tuple[Path, Path], tmp_path: Path, capfd) -> None:
    model, _ = model_and_data
    missing = tmp_path / "nope.npz"
    assert main(["quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--data", str(missing)]) == 2
    assert _one_line(capfd.readouterr().err) == f"softdeploy: error: data.inputs: {missing} does not exist"
