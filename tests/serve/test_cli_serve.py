"""`softdeploy serve`'s refusals: one line, exit 2, before Ray starts."""

from __future__ import annotations

import onnx
import pytest

from serve.tiny import rowwise_mlp
from softdeploy.cli import main


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(rowwise_mlp(), path)
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--replicas", "0"], "softdeploy: error: serve: replicas = 0 (rule: an integer >= 1)"),
        (["--cpus-per-replica", "0"], "softdeploy: error: serve: cpus_per_replica = 0 (rule: an integer >= 1)"),
        (["--batch-wait-ms", "-1"], "softdeploy: error: serve: batch_wait_s = -0.001 (rule: seconds in [0, 10])"),
    ],
)
def test_bad_settings_are_one_line(model, capsys, extra, message):
    assert main(["serve", str(model), *extra]) == 2
    assert capsys.readouterr().err.strip() == message


def test_a_missing_model_is_one_line(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "none.onnx")]) == 2
    assert capsys.readouterr().err.strip() == f"softdeploy: error: {tmp_path / 'none.onnx'}: no such model file"


def test_a_workflow_with_a_torch_factory_is_refused(tmp_path, capsys):
    workflow = tmp_path / "w.yaml"
    workflow.write_text("model: {factory: 'pkg.mod:fn'}\ndata: {inputs: data.npz}\n")
    assert main(["serve", str(workflow)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"softdeploy: error: serve {workflow}: its model 'pkg.mod:fn' is a torch factory")
    assert "\n" not in err
