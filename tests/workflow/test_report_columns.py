"""The compare table's columns for workflow models: top-k agreement and KL only for an output holding class scores
(by its name), never for embeddings; a metric that is also an agreement column (`--metric cosine`) shown once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from softdeploy.cli import main


def _model(path: Path, output: str) -> None:
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], [output])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["N", 32])],
        [numpy_helper.from_array(w, "W")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)


@pytest.mark.parametrize(("output", "class_scores"), [("sentence_embedding", False), ("logits", True)])
def test_agreement_and_kl_only_for_class_scores_and_cosine_once(
    output: str, class_scores: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _model(tmp_path / "m.onnx", output)
    np.savez(tmp_path / "x.npz", X=np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32))
    monkeypatch.chdir(tmp_path)
    argv = ["compare", "m.onnx", "--data", "x.npz", "--metric", "cosine", "--quick", "--out", "res"]
    assert main([*argv, "--variants", "ort-fp32,ort-int8-dynamic"]) == 0
    report = (tmp_path / "res" / "m" / "report.md").read_text()
    header = [c.strip() for c in next(x for x in report.splitlines() if x.startswith("| variant |")).split("|")]
    assert header.count("cosine") == 1, header  # the metric; the output's own column is "<output> cosine"
    assert (f"{output} cosine" in header) and ("KL" in header) is class_scores, header
    rows = json.loads((tmp_path / "res" / "m" / "results.json").read_text())["rows"]
    for row in rows:
        assert "cosine" in row and f"{output} cosine" in row
        assert ("top5 agreement" in row) is class_scores and ("KL" in row) is class_scores, row
