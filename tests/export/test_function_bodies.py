from __future__ import annotations

import numpy as np
import onnx
import pytest

from softdeploy import ExportError
from softdeploy.export import attach_function_bodies, inline_function_bodies
from softdeploy.ops import REGISTRY, Sample
from softdeploy.runtime import Session

OP = REGISTRY["TwoPassSoftmax"]
X = (np.random.default_rng(0).standard_normal((3, 11)) * 2).astype(np.float32)


@pytest.mark.parametrize("opset", [18, 19, 20, 21, 22, 23])
def test_bodies_follow_the_model_opset(opset):
    model = OP.make_model(Sample("x", (X,)), with_function=False, opset=opset)
    attach_function_bodies(model)
    assert [f.name for f in model.functions] == ["TwoPassSoftmax"]
    assert {i.domain: i.version for i in model.functions[0].opset_import}[""] == opset
    onnx.checker.check_model(model, full_check=True)
    (y,) = Session(model, kernels="portable").run({"X": X})
    np.testing.assert_allclose(y, OP.reference(X)[0], rtol=1e-4)


def test_attach_is_idempotent():
    model = OP.make_model(Sample("x", (X,)))
    attach_function_bodies(model)
    assert len(model.functions) == 1


def test_old_opset_is_refused_with_a_fix():
    model = OP.make_model(Sample("x", (X,)), with_function=False, opset=18)
    model.opset_import[0].version = 13
    with pytest.raises(ExportError, match="version_converter"):
        attach_function_bodies(model)


def test_inlined_model_has_only_standard_ops_and_runs_in_onnx_reference():
    from onnx.reference import ReferenceEvaluator

    inlined = inline_function_bodies(OP.make_model(Sample("x", (X,))))
    assert all(n.domain in ("", "ai.onnx") for n in inlined.graph.node)
    (y,) = ReferenceEvaluator(inlined).run(None, {"X": X})
    np.testing.assert_allclose(y, OP.reference(X)[0], rtol=1e-5)


def test_omitted_masks_are_filled_all_true_inside_subgraphs_too():
    """MaxSim's omitted masks reach its body as all-true masks shaped [B, Lq] / [N, Ld] (Port.body_fill),
    also for a node inside an If branch; the kernel and the body then agree with the reference."""
    from onnx import TensorProto, helper

    op = REGISTRY["MaxSim"]
    rng = np.random.default_rng(1)
    q, d = rng.standard_normal((2, 5, 8)).astype(np.float32), rng.standard_normal((3, 4, 8)).astype(np.float32)
    node = op.make_node(["Q", "D"], ["S"])
    branch = helper.make_graph([node], "then", [], [helper.make_tensor_value_info("S", TensorProto.FLOAT, None)])
    other = helper.make_graph(
        [helper.make_node("Constant", [], ["Z"], value_floats=[0.0])],
        "else",
        [],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=other)],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("Q", TensorProto.FLOAT, [2, 5, 8]),
            helper.make_tensor_value_info("D", TensorProto.FLOAT, [3, 4, 8]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.softdeploy", 1)], ir_version=10
    )
    attach_function_bodies(model)
    then = next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then.node] == ["Shape", "ConstantOfShape", "Shape", "ConstantOfShape", "MaxSim"]
    assert all(then.node[-1].input[2:4])
    want = op.reference(q, d)[0]
    for kernels in ("native", "portable"):
        (got,) = Session(model, kernels=kernels).run({"c": np.array(True), "Q": q, "D": d})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_missing_output_slots_are_added_so_stock_onnxruntime_loads_the_body():
    """A 2-output SoftmaxTopK node (as a hand-written model or a rewrite has it) gets its third slot,
    empty (omitted, so the kernel still skips LogSumExp); stock onnxruntime refuses the body without it."""
    op = REGISTRY["SoftmaxTopK"]
    sample = Sample("x", (X,), {"k": 3})
    model = op.make_model(sample, outputs=2)
    assert list(model.graph.node[0].output) == ["Values", "Indices", ""]
    want = op.reference(X, k=3)
    for kernels in ("native", "portable"):
        values, indices = Session(model, kernels=kernels).run({"X": X})
        np.testing.assert_array_equal(indices, want[1])
        np.testing.assert_allclose(values, want[0], rtol=1e-5)
