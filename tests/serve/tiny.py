"""Tiny ONNX models for the serve tests (onnx.helper; built in milliseconds)."""

from __future__ import annotations

from typing import Any

import numpy as np


def rowwise_mlp(features: int = 16, hidden: int = 32, out: int = 8, seed: int = 0) -> Any:
    """X float32[batch, features] -> MatMul -> com.softdeploy RowwiseInt8MatMul -> Y float32[batch, out].

    RowwiseInt8MatMul refuses a non-finite activation (naming the entry): the model refuses NaN."""
    from onnx import TensorProto, helper, numpy_helper

    from softdeploy import DOMAIN, OPSET_VERSION
    from softdeploy.export import attach_function_bodies

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((features, hidden)) * 0.5).astype(np.float32)
    b = rng.integers(-127, 128, (hidden, out)).astype(np.int8)
    scale = np.full(out, 0.01, np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["h"], name="fc1"),
        helper.make_node("RowwiseInt8MatMul", ["h", "B", "BScale"], ["Y"], name="fc2", domain=DOMAIN),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_rowwise",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", out])],
        initializer=[
            numpy_helper.from_array(w1, "W1"),
            numpy_helper.from_array(b, "B"),
            numpy_helper.from_array(scale, "BScale"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)], ir_version=10
    )
    helper.set_model_props(model, {"softdeploy.int8_target": "avx2", "softdeploy.int8_format": "lane-bounded"})
    return attach_function_bodies(model)


def two_inputs(features: int = 8) -> Any:
    """A float32[batch, features], I int64[batch, features] -> Y = A * 2 + float(I), S = sum(A) (no batch axis):
    two inputs of different dtypes, and an output without a batch dimension (the model is not batched)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Cast", ["I"], ["If"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["A", "two"], ["A2"]),
        helper.make_node("Add", ["A2", "If"], ["Y"]),
        helper.make_node("ReduceSum", ["A"], ["S"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "two_inputs",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, ["batch", features]),
            helper.make_tensor_value_info("I", TensorProto.INT64, ["batch", features]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", features]),
            helper.make_tensor_value_info("S", TensorProto.FLOAT, []),
        ],
        initializer=[numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def mean_pool(width: int = 32) -> Any:
    """X float32[batch, tokens, width] -> Y = ReduceSum over the tokens -> float32[batch, width]: the pooling of a
    sentence encoder. onnxruntime sums [1, T, W] (reduced as [T, W]) in another order than [B, T, W] for T >= 16, so
    a row's sum stacked differs from its sum alone in the last bits: the model is not batch-invariant."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["X", "axis"], ["Y"], keepdims=0)],
        "mean_pool",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", "tokens", width])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", width])],
        initializer=[numpy_helper.from_array(np.array([1], np.int64), "axis")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
