"""`softdeploy quantize MODEL` reads and checks the model file once on its way CLI -> workflow -> quantizer: the
workflow hands its ModelProto down instead of the path, and nothing on the way back reads the file again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
from quant.tiny import mlp_with_custom_op

import softdeploy.files
from softdeploy.cli import main


def test_the_model_file_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(mlp_with_custom_op(with_function=True), src)
    reads: list[str] = []
    load_model = softdeploy.files.load_model

    def counting(path: Any, **kwargs: Any) -> Any:
        reads.append(str(path))
        return load_model(path, **kwargs)

    monkeypatch.setattr(softdeploy.files, "load_model", counting)
    out = tmp_path / "m.int8.onnx"
    assert main(["quantize", str(src), "--mode", "dynamic", "-o", str(out)]) == 0
    assert out.is_file()
    assert reads.count(str(src)) == 1, reads  # four reads before the workflow handed its ModelProto down
