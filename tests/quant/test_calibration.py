"""Static calibration must run models whose com.softdeploy nodes have no function body (only our
library can run them), without touching onnxruntime's global state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from quant.tiny import feeds, mlp_with_custom_op
from softdeploy.quant import QuantConfig, quantize, softdeploy_calibration_sessions
from softdeploy.quant.calibration import ArrayDataReader, as_calibration_reader
from softdeploy.runtime import Session


@pytest.fixture
def kernel_only_model(tmp_path: Path) -> Path:
    path = tmp_path / "kernel_only.onnx"
    onnx.save(mlp_with_custom_op(with_function=False), path)
    return path


def test_stock_calibrator_fails_on_custom_op(kernel_only_model: Path, tmp_path: Path) -> None:
    """The problem being solved: onnxruntime's own calibration session cannot load our op."""
    from onnxruntime.quantization import quantize_static

    with pytest.raises(Exception, match="TwoPassSoftmax"):
        quantize_static(kernel_only_model, tmp_path / "out.onnx", as_calibration_reader(feeds(2)))


def test_static_calibrates_through_native_kernels(kernel_only_model: Path, tmp_path: Path) -> None:
    q = quantize(kernel_only_model, tmp_path / "q.onnx", QuantConfig("static"), calibration=feeds(4), kernels="native")
    assert q.calibration_kernels == "native"
    assert q.quantized_nodes == ["fc1", "fc2", "fc3"]
    model = onnx.load(q.path)
    assert any(n.op_type == "TwoPassSoftmax" for n in model.graph.node)  # custom op left in float
    f = feeds(1, seed=7)[0]
    a, b = Session(kernel_only_model).run(f)[0], Session(q.path).run(f)[0]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.99


def test_static_calibrates_through_function_bodies(tmp_path: Path) -> None:
    path = tmp_path / "portable.onnx"
    onnx.save(mlp_with_custom_op(with_function=True), path)
    q = quantize(path, tmp_path / "q.onnx", QuantConfig("static"), calibration=feeds(4), kernels="portable")
    assert q.calibration_kernels == "portable"
    out = onnx.load(q.path)
    assert any(f.name == "TwoPassSoftmax" for f in out.functions)  # the body survives quantization
    Session(q.path, kernels="portable").run(feeds(1)[0])  # and runs in stock onnxruntime


def test_patch_is_scoped() -> None:
    import onnxruntime
    from onnxruntime.quantization import calibrate

    original = calibrate.CalibraterBase.create_inference_session
    session_options = onnxruntime.SessionOptions
    with softdeploy_calibration_sessions():
        assert calibrate.CalibraterBase.create_inference_session is not original
    assert calibrate.CalibraterBase.create_inference_session is original
    assert onnxruntime.SessionOptions is session_options
    with pytest.raises(RuntimeError), softdeploy_calibration_sessions():
        raise RuntimeError("boom")
    assert calibrate.CalibraterBase.create_inference_session is original


def test_data_reader_rewinds() -> None:
    r = ArrayDataReader(feeds(3))
    assert len(r) == 3
    assert [r.get_next() is not None for _ in range(4)] == [True, True, True, False]
    r.rewind()
    assert r.get_next() is not None
    with pytest.raises(ValueError):
        ArrayDataReader([])
