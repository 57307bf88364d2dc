"""Running `softdeploy compare MODEL --data ...` or `softdeploy run WORKFLOW` again into the same results folder: after
a complete run, after an interrupted one, and with a damaged cached fp32 export."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from softdeploy.cli import main

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def model_and_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny ONNX model (with a softdeploy op) and its inputs in ``tmp_path``, the current folder."""
    sys.path.insert(0, str(TESTS))
    from quant.tiny import mlp_with_custom_op

    onnx.save(mlp_with_custom_op(with_function=True, outlier=200.0), tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", X=np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32))
    monkeypatch.chdir(tmp_path)
    return tmp_path


# no --metric: cosine against the fp32 reference, the metric that read the reference model's path
COMPARE = ["compare", "m.onnx", "--data", "x.npz", "--quick", "--variants", "ort-fp32,ort-int8-dynamic", "--out", "res"]


def _rows(folder: Path) -> list[str]:
    return [r["variant"] for r in json.loads((folder / "results.json").read_text())["rows"]]


@pytest.mark.filterwarnings("error::softdeploy.errors.SoftdeployWarning")  # a clean reuse reports nothing
def test_compare_twice_into_the_same_folder(model_and_data: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(COMPARE) == 0
    first = (model_and_data / "res" / "m" / "models" / "fp32.onnx").stat().st_mtime_ns
    assert main(COMPARE) == 0, capfd.readouterr().err  # was: "the fp32 model is not exported yet"
    assert _rows(model_and_data / "res" / "m") == ["ort-fp32", "ort-int8-dynamic"]
    assert (model_and_data / "res" / "m" / "models" / "fp32.onnx").stat().st_mtime_ns == first  # reused


def test_run_a_workflow_twice(model_and_data: Path, capfd: pytest.CaptureFixture[str]) -> None:
    wf = {
        "name": "twice",
        "model": "m.onnx",
        "data": {"inputs": "x.npz"},
        "variants": ["ort-fp32", "ort-int8-dynamic"],
        "quantize": {"mode": "dynamic", "max_drop": 0.5},  # the budget search reads the reference too
        "rounds": 1,
        "out": "res",
    }
    (model_and_data / "wf.json").write_text(json.dumps(wf))
    assert main(["run", "wf.json", "--quick"]) == 0
    assert main(["run", "wf.json", "--quick"]) == 0, capfd.readouterr().err
    assert (model_and_data / "res" / "twice" / "budget.json").is_file()


def test_rerun_after_an_interrupted_run(model_and_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import softdeploy.compare.runner as runner

    def interrupted(*a: object, **k: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C after the export, while quantizing

    with monkeypatch.context() as m:
        m.setattr(runner, "quantize", interrupted)
        assert main(COMPARE) == 130
    assert main(COMPARE) == 0
    assert _rows(model_and_data / "res" / "m") == ["ort-fp32", "ort-int8-dynamic"]


@pytest.mark.filterwarnings("error::softdeploy.errors.SoftdeployWarning")
def test_a_run_stopped_while_exporting_exports_again(model_and_data: Path) -> None:
    """No stamp and a model without its digest (the run died after the export started), or a stamp without its
    digest (died while writing it, or a results folder from before digests): exported again, no fault reported."""
    assert main(COMPARE) == 0
    models = model_and_data / "res" / "m" / "models"
    (models / "fp32.stamp.json").unlink()
    (models / "fp32.stamp.json.sha256").unlink()
    (models / "fp32.onnx.sha256").unlink()
    assert main(COMPARE) == 0
    (models / "fp32.stamp.json.sha256").unlink()
    assert main(COMPARE) == 0
    assert (models / "fp32.onnx.sha256").is_file() and (models / "fp32.stamp.json.sha256").is_file()


@pytest.mark.parametrize("damage", ["truncate", "append", "no digest"])
def test_a_damaged_fp32_export_is_reported_set_aside_and_exported_again(
    model_and_data: Path, capfd: pytest.CaptureFixture[str], damage: str
) -> None:
    assert main(COMPARE) == 0
    models = model_and_data / "res" / "m" / "models"
    fp32 = models / "fp32.onnx"
    good = fp32.read_bytes()
    if damage == "truncate":
        fp32.write_bytes(good[: len(good) // 2])
    elif damage == "append":
        fp32.write_bytes(good + b"\0poison")
    else:
        (models / "fp32.onnx.sha256").unlink()
    from softdeploy.errors import SoftdeployWarning

    with pytest.warns(SoftdeployWarning) as caught:
        assert main(COMPARE) == 0, capfd.readouterr().err
    warned = [str(w.message) for w in caught if "set aside" in str(w.message)]
    assert len(warned) == 1 and "fp32.onnx" in warned[0] and "\n" not in warned[0], warned
    assert fp32.read_bytes() == good  # exported again, the same model
    assert len(list(models.glob("fp32.onnx.bad-*"))) == 1  # the bad bytes kept for a look, never reused


@pytest.mark.filterwarnings("error::softdeploy.errors.SoftdeployWarning")
def test_a_killed_export_leaves_nothing_that_outlives_the_next_export(model_and_data: Path) -> None:
    """The private export folder of a run killed while exporting is removed by the next export; a live run's stays."""
    import os

    assert main(COMPARE) == 0
    models = model_and_data / "res" / "m" / "models"
    dead = models / ".fp32-export-999999999-abc"  # beyond any pid: its process is gone
    live = models / f".fp32-export-{os.getpid()}-abc"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "fp32.onnx").write_bytes(b"partial")
    (models / "fp32.stamp.json.sha256").unlink()  # the next run exports again
    assert main(COMPARE) == 0
    assert not dead.exists() and live.exists()
    assert sorted(p.name for p in models.glob(".fp32-export-*")) == [live.name]


def test_a_model_file_name_outside_the_folder_rule_gets_a_plain_results_folder(model_and_data: Path) -> None:
    """`compare MODEL` names its results folder after the model file: a stem with spaces or brackets is made into a
    plain folder name rather than refused."""
    (model_and_data / "m.onnx").rename(model_and_data / "my model (v2).onnx")
    argv = [a if a != "m.onnx" else "my model (v2).onnx" for a in COMPARE]
    assert main(argv) == 0
    assert _rows(model_and_data / "res" / "my_model_v2_") == ["ort-fp32", "ort-int8-dynamic"]
