"""Tiny ONNX models for the quantization and compare tests (built with onnx.helper, fast)."""

from __future__ import annotations

from typing import Any

import numpy as np


def mlp_with_custom_op(
    *, with_function: bool, outlier: float = 0.0, seed: int = 0, hidden: int = 32, features: int = 16
) -> Any:
    """X[b, features] -> MatMul(W1) -> com.softdeploy TwoPassSoftmax -> MatMul(W2) -> MatMul(W3) -> Y.

    ``outlier`` > 0 puts one huge weight into W2: per-tensor int8 then rounds the rest of W2 to
    almost nothing, so quantizing that node ruins the output (the budget search must find it)."""
    from onnx import TensorProto, helper, numpy_helper

    from softdeploy import DOMAIN, OPSET_VERSION
    from softdeploy.export import attach_function_bodies

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((features, hidden)) * 0.5).astype(np.float32)
    w2 = (rng.standard_normal((hidden, hidden)) * 0.5).astype(np.float32)
    w3 = (rng.standard_normal((hidden, 8)) * 0.5).astype(np.float32)
    if outlier:
        w2[0, 0] = outlier
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["h1"], name="fc1"),
        helper.make_node("TwoPassSoftmax", ["h1"], ["p"], name="soft", domain=DOMAIN, axis=-1),
        helper.make_node("Mul", ["p", "scale"], ["ps"], name="rescale"),
        helper.make_node("MatMul", ["ps", "W2"], ["h2"], name="fc2"),
        helper.make_node("MatMul", ["h2", "W3"], ["Y"], name="fc3"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 8])],
        initializer=[
            numpy_helper.from_array(w1, "W1"),
            numpy_helper.from_array(w2, "W2"),
            numpy_helper.from_array(w3, "W3"),
            numpy_helper.from_array(np.array(float(hidden), np.float32), "scale"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)], ir_version=10
    )
    return attach_function_bodies(model) if with_function else model


def feeds(n: int, batch: int = 8, features: int = 16, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"X": rng.standard_normal((batch, features)).astype(np.float32)} for _ in range(n)]
