"""FunctionBody: an op's onnxscript body, compiled on first use and then cached."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from softdeploy import DOMAIN
from softdeploy.ops import REGISTRY
from softdeploy.ops._body import function_body
from softdeploy.ops._schema import BODY_OPSET

if TYPE_CHECKING:  # bound when the body is compiled, as in the op modules
    from onnxscript import FLOAT
    from onnxscript import opset18 as op


@function_body
def Twice(X):
    return op.Add(X, X)


@function_body
def Halved(X):
    return op.Mul(op.Cast(X, to=FLOAT.dtype), op.Constant(value_float=0.5))


def test_the_name_is_known_before_compiling() -> None:
    assert Halved.name == "Halved"
    assert "not compiled yet" in repr(Halved)
    assert not Halved.compiled


def test_compiles_on_first_use_into_the_softdeploy_domain() -> None:
    proto = Twice.to_function_proto()
    assert Twice.compiled
    assert (proto.domain, proto.name) == (DOMAIN, "Twice")
    assert [n.op_type for n in proto.node] == ["Add"]
    assert {(i.domain, i.version) for i in proto.opset_import} >= {("", BODY_OPSET)}


def test_compiled_once_also_when_threads_ask_together() -> None:
    body = function_body(Halved.python_function)  # a fresh, uncompiled body of the same function
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(body.onnx_function())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(g is got[0] for g in got)
    assert body.onnx_function() is got[0]


def test_runs_eagerly_like_the_compiled_function() -> None:
    x = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(np.asarray(Twice(x)), [3.0, -4.0])


def test_each_proto_is_a_fresh_copy() -> None:
    """function_proto retargets the opset of the copy it returns; the cached body must not change."""
    op = REGISTRY["Softpick"]
    a = op.function_proto(20)
    b = op.function_proto(18)
    assert {i.version for i in a.opset_import if i.domain == ""} == {20}
    assert {i.version for i in b.opset_import if i.domain == ""} == {18}
