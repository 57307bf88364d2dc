from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from quant.tiny import feeds, mlp_with_custom_op
from softdeploy.quant import QuantConfig, QuantizationError, candidate_nodes, output_cosine, quantize
from softdeploy.quant.quantize import load_named
from softdeploy.quant.rowwise import FORMS as ROWWISE_FORMS
from softdeploy.runtime import Session


def _save(model: object, path: Path) -> Path:
    onnx.save(model, path)
    return path


def _cosine(a: Path, b: Path, kernels: str = "native") -> float:
    data = feeds(4, seed=11)
    ref = [Session(a, kernels=kernels).run(f)[0] for f in data]  # type: ignore[arg-type]
    return output_cosine(ref, [Session(b, kernels=kernels).run(f)[0] for f in data])  # type: ignore[arg-type]


def test_dynamic_quantizes_matmuls_and_keeps_custom_op(tmp_path: Path) -> None:
    src = _save(mlp_with_custom_op(with_function=True), tmp_path / "m.onnx")
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic"))
    assert q.quantized_nodes == ["fc1", "fc2", "fc3"] and q.float_nodes == []
    out = onnx.load(q.path)
    ops = {n.op_type for n in out.graph.node}
    # onnxruntime's integer MatMuls, or softdeploy's RowwiseInt8MatMul where this CPU's format is one of softdeploy's
    int8_op = "RowwiseInt8MatMul" if q.weights in ROWWISE_FORMS else "MatMulInteger"
    assert int8_op in ops and "TwoPassSoftmax" in ops
    assert any(f.name == "TwoPassSoftmax" for f in out.functions)
    assert _cosine(src, q.path) > 0.99
    assert _cosine(src, q.path, kernels="portable") > 0.99  # runs without our library too


def test_exclude_keeps_node_in_float(tmp_path: Path) -> None:
    src = _save(mlp_with_custom_op(with_function=True), tmp_path / "m.onnx")
    for mode in ("dynamic", "static"):
        q = quantize(
            src,
            tmp_path / f"{mode}.onnx",
            QuantConfig(mode, exclude=("fc2",)),
            calibration=feeds(2),  # type: ignore[arg-type]
        )
        assert q.float_nodes == ["fc2"]
        assert q.quantized_nodes == ["fc1", "fc3"]
        node = next(n for n in onnx.load(q.path).graph.node if n.name == "fc2")
        assert node.op_type == "MatMul"


def test_per_channel_beats_per_tensor_on_outlier_weights(tmp_path: Path) -> None:
    src = _save(mlp_with_custom_op(with_function=True, outlier=200.0), tmp_path / "m.onnx")
    per_channel = quantize(src, tmp_path / "pc.onnx", QuantConfig("dynamic", per_channel=True))
    per_tensor = quantize(src, tmp_path / "pt.onnx", QuantConfig("dynamic", per_channel=False))
    assert _cosine(src, per_channel.path) > 0.99 > _cosine(src, per_tensor.path)


def test_errors(tmp_path: Path) -> None:
    src = _save(mlp_with_custom_op(with_function=True), tmp_path / "m.onnx")
    with pytest.raises(QuantizationError, match="not in the model"):
        quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic", exclude=("nope",)))
    with pytest.raises(QuantizationError, match="calibration"):
        quantize(src, tmp_path / "q.onnx", QuantConfig("static"))
    with pytest.raises(QuantizationError, match="mode"):
        quantize(src, tmp_path / "q.onnx", QuantConfig("weird"))  # type: ignore[arg-type]


def test_unnamed_nodes_get_names() -> None:
    model = mlp_with_custom_op(with_function=True)
    for n in model.graph.node:
        n.name = ""
    named = load_named(model)
    names = [n.name for n in named.graph.node]
    assert all(names) and len(set(names)) == len(names)
    assert [op for _, op in candidate_nodes(named, QuantConfig("static"))] == ["MatMul"] * 3


def test_static_calibration_cache_is_reused(tmp_path: Path) -> None:
    src = _save(mlp_with_custom_op(with_function=True), tmp_path / "m.onnx")
    cache = tmp_path / "ranges.json"
    first = quantize(src, tmp_path / "a.onnx", QuantConfig("static"), calibration=feeds(4), calibration_cache=cache)
    assert cache.is_file()
    again = quantize(src, tmp_path / "b.onnx", QuantConfig("static"), calibration=None, calibration_cache=cache)
    assert again.calibration_kernels == first.calibration_kernels
    f = feeds(1, seed=3)[0]
    np.testing.assert_array_equal(Session(first.path).run(f)[0], Session(again.path).run(f)[0])


def test_activation_matmuls_stay_float(tmp_path: Path) -> None:
    """Attention-style MatMuls (no constant input) stay float in both modes; onnxruntime's QDQ
    quantizer would quantize them."""
    from onnx import TensorProto, helper, numpy_helper

    from softdeploy.quant.quantize import activation_matmuls

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["A"], name="proj"),
            helper.make_node("Transpose", ["A"], ["At"], name="t", perm=[1, 0]),
            helper.make_node("MatMul", ["A", "At"], ["Y"], name="scores"),
        ],
        "attn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 4])],
        initializer=[numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "W")],
    )
    src = _save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), tmp_path / "a.onnx"
    )
    assert activation_matmuls(onnx.load(src)) == {"scores"}
    data = [{"X": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(3)]
    for mode in ("dynamic", "static"):
        q = quantize(src, tmp_path / f"{mode}.onnx", QuantConfig(mode), calibration=data)  # type: ignore[arg-type]
        assert q.quantized_nodes == ["proj"] and q.float_nodes == []
        out = onnx.load(q.path)
        assert next(n for n in out.graph.node if n.name == "scores").op_type == "MatMul"
        assert not any(n.op_type in ("MatMulInteger", "QLinearMatMul") and "scores" in n.name for n in out.graph.node)
