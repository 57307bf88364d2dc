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
