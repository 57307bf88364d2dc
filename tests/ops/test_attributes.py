"""Attributes have their declared types on every path: REGISTRY's make_node writes them so (exact
conversion only), the kernels refuse a wrongly typed one instead of running the default, and
Session refuses undeclared names, wrong types, unknown ops and other opset versions of the domain
before onnxruntime sees the model -- with the same words for kernels="native" and "portable"."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from softdeploy import DOMAIN, OPSET_VERSION, OpContractError
from softdeploy.ops import REGISTRY
from softdeploy.ops.functions import attach_function_bodies
from softdeploy.runtime import Session, library_path

X = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
BOXES = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3]]], np.float32)
SCORES = np.array([[[0.9, 0.8, 0.7]]], np.float32)


def _model(op: str, attrs: dict, *, opset: int = OPSET_VERSION, bodies: bool = False) -> onnx.ModelProto:
    """One node of ``op`` with ``attrs`` written as onnx.helper infers their types (2 -> INT, 2.0 -> FLOAT),
    the way a user's own graph code does."""
    d = REGISTRY[op]
    if op == "SoftNMS":
        ins = [
            helper.make_tensor_value_info("Boxes", TensorProto.FLOAT, [1, 3, 4]),
            helper.make_tensor_value_info("Scores", TensorProto.FLOAT, [1, 1, 3]),
        ]
    else:
        ins = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 8])]
    elem = {"T": TensorProto.FLOAT, "int64": TensorProto.INT64}
    outs = [helper.make_tensor_value_info(p.name, elem[p.dtype], None) for p in d.outputs if not p.optional]
    node = helper.make_node(op, [i.name for i in ins], [o.name for o in outs], domain=DOMAIN, name="n0", **attrs)
    graph = helper.make_graph([node], "g", ins, outs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, opset)], ir_version=10
    )
    return attach_function_bodies(model) if bodies else model


def _feeds(op: str) -> dict[str, np.ndarray]:
    return {"Boxes": BOXES, "Scores": SCORES} if op == "SoftNMS" else {"X": X}


# (op, attributes as onnx.helper types them, the declared type, how the value prints). Each ran with
# the default (or without its own check) before the kernels probed the other getters.
WRONG_TYPE = [
    ("SoftmaxTopK", {"k": 2, "temperature": 2}, "temperature", "FLOAT", "INT 2"),
    ("SoftmaxTopK", {"k": 2, "temperature": 0}, "temperature", "FLOAT", "INT 0"),
    ("SoftmaxTopK", {"k": 2.0}, "k", "INT", "FLOAT 2"),
    ("Softpick", {"eps": -1}, "eps", "FLOAT", "INT -1"),
    ("SoftNMS", {"sigma": 2}, "sigma", "FLOAT", "INT 2"),
    ("SoftNMS", {"sigma": 0}, "sigma", "FLOAT", "INT 0"),
    ("SoftNMS", {"method": 1}, "method", "STRING", "INT 1"),
    ("SoftNMS", {"center_point_box": 1.0}, "center_point_box", "INT", "FLOAT 1"),
    ("SoftNMS", {"method": ["linear"]}, "method", "STRING", None),
    ("TwoPassSoftmax", {"axis": 1.5}, "axis", "INT", "FLOAT 1.5"),
    ("TwoPassSoftmax", {"axis": "last"}, "axis", "INT", "STRING 'last'"),
    ("MultiMax", {"axis": [1, 2]}, "axis", "INT", "INTS of 2 values"),
    ("AdaptiveTemperatureSoftmax", {"axis": -1.0}, "axis", "INT", "FLOAT -1"),
]
IDS = [f"{op}-{name}={attrs[name]!r}" for op, attrs, name, _, _ in WRONG_TYPE]


# The kernel's own check, where a one-input model reaches it (MultiMax needs Ranges and Ts) and the
# value is one the kernel probes (a STRINGS value is not: there is no C API getter for it).
KERNEL_CASES = [c for c in WRONG_TYPE if c[0] != "MultiMax" and c[4] is not None]


@pytest.mark.parametrize(
    ("op", "attrs", "name", "want", "got"),
    KERNEL_CASES,
    ids=[i for c, i in zip(WRONG_TYPE, IDS, strict=True) if c in KERNEL_CASES],
)
def test_kernel_refuses_a_wrongly_typed_attribute(op, attrs, name, want, got):
    """Straight through onnxruntime (no softdeploy Session check): the kernel's own answer."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.register_custom_ops_library(str(library_path()))
    with pytest.raises(Exception) as info:
        # Bypasses Session on purpose: what onnxruntime plus the library alone (a deployed model) does.
        ort.InferenceSession(_model(op, attrs).SerializeToString(), so, providers=["CPUExecutionProvider"])  # noqa: TID251
    message = str(info.value)
    # The same words as the Session check below.
    assert f"{op}: node 'n0': attribute '{name}' must be {want}, got {got} (rule: " in message, message


@pytest.mark.parametrize("kernels", ["native", "portable"])
@pytest.mark.parametrize(("op", "attrs", "name", "want", "got"), WRONG_TYPE, ids=IDS)
def test_session_refuses_a_wrongly_typed_attribute_on_every_backend(op, attrs, name, want, got, kernels):
    model = _model(op, attrs, bodies=kernels == "portable")
    with pytest.raises(OpContractError) as info:
        Session(model, kernels=kernels)
    message = str(info.value)
    assert message.startswith(f"{op}: node 'n0': attribute '{name}' must be {want}, got "), message
    if got:
        assert f"got {got} (rule: " in message, message


@pytest.mark.parametrize("kernels", ["native", "portable"])
def test_session_refuses_an_unknown_attribute(kernels):
    model = _model("SoftmaxTopK", {"k": 2, "temprature": 0.5}, bodies=kernels == "portable")
    with pytest.raises(OpContractError, match=r"SoftmaxTopK: node 'n0': unknown attribute 'temprature'; did you mean"):
        Session(model, kernels=kernels)


@pytest.mark.parametrize("kernels", ["native", "portable"])
def test_session_refuses_a_missing_required_attribute(kernels):
    model = _model("SoftmaxTopK", {}, bodies=kernels == "portable")
    with pytest.raises(OpContractError, match=r"SoftmaxTopK: node 'n0': attribute 'k' is required \(rule: "):
        Session(model, kernels=kernels)


@pytest.mark.parametrize("kernels", ["native", "portable"])
@pytest.mark.parametrize("opset", [2, 0])
def test_session_refuses_another_opset_of_the_domain(opset, kernels):
    model = _model("SoftmaxTopK", {"k": 2}, opset=opset, bodies=kernels == "portable")
    with pytest.raises(OpContractError, match=f"imports domain {DOMAIN} at opset version {opset} "):
        Session(model, kernels=kernels)


@pytest.mark.parametrize("kernels", ["native", "portable"])
def test_session_refuses_an_op_the_domain_does_not_have(kernels):
    model = _model("SoftmaxTopK", {"k": 2})
    model.graph.node[0].op_type = "SoftmaxTopKK"
    with pytest.raises(OpContractError, match=f"SoftmaxTopKK: domain {DOMAIN} has no op 'SoftmaxTopKK'"):
        Session(model, kernels=kernels)


def test_session_checks_nodes_inside_subgraphs():
    inner = helper.make_graph(
        [helper.make_node("TwoPassSoftmax", ["X"], ["Y"], domain=DOMAIN, name="inner", axis=1.5)],
        "then",
        [],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Z"])],
        "else",
        [],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["C"], ["out"], then_branch=inner, else_branch=other)],
        "g",
        [
            helper.make_tensor_value_info("C", TensorProto.BOOL, []),
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 8]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)], ir_version=10
    )
    with pytest.raises(
        OpContractError, match=r"TwoPassSoftmax: node 'inner': attribute 'axis' must be INT, got FLOAT 1.5"
    ):
        Session(model, kernels="native")


def test_the_same_attributes_written_by_make_node_run_on_every_backend():
    """REGISTRY's make_node converts exactly: temperature=2 becomes FLOAT 2.0 and runs as 2.0."""
    d = REGISTRY["SoftmaxTopK"]
    node = d.make_node(["X"], ["Values", "Indices"], k=2.0, temperature=2)
    types = {a.name: onnx.AttributeProto.AttributeType.Name(a.type) for a in node.attribute}
    assert types == {"k": "INT", "temperature": "FLOAT"}
    model = _model("SoftmaxTopK", {"k": 2})
    model.graph.node[0].CopyFrom(node)
    native = Session(model, kernels="native").run({"X": X})
    portable = Session(attach_function_bodies(model), kernels="portable").run({"X": X})
    want = d.reference(X, k=2, temperature=2.0)
    for got in (native, portable):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
        np.testing.assert_array_equal(got[1], want[1])
    # and temperature 2.0 is not the default 1.0
    assert not np.allclose(native[0], d.reference(X, k=2)[0], rtol=1e-3)


@pytest.mark.parametrize(
    ("op", "attrs", "match"),
    [
        ("SoftmaxTopK", {"k": 1.5}, "attribute 'k' must be INT, got FLOAT 1.5, which does not convert exactly"),
        ("SoftmaxTopK", {"k": float("nan")}, "attribute 'k' must be INT, got FLOAT nan"),
        ("SoftmaxTopK", {"k": 2, "temperature": 2**24 + 1}, "attribute 'temperature' must be FLOAT, got INT 16777217"),
        ("SoftmaxTopK", {"k": 2, "temperature": "2"}, "attribute 'temperature' must be FLOAT, got STRING '2'"),
        ("SoftmaxTopK", {"k": True}, "attribute 'k' must be INT, got bool True"),
        ("SoftNMS", {"method": 1}, "attribute 'method' must be STRING, got INT 1"),
        ("SoftmaxTopK", {"k": 2, "temprature": 0.5}, "unknown attribute 'temprature'; did you mean 'temperature'?"),
        ("MaxSim", {"axis": -1}, "unknown attribute 'axis' (rule: MaxSim's attributes are none)"),
    ],
)
def test_make_node_refuses_what_does_not_convert_exactly(op, attrs, match):
    with pytest.raises(OpContractError) as info:
        REGISTRY[op].make_node(["a"], ["b"], **attrs)
    assert str(info.value).startswith(f"{op}: ") and match in str(info.value), str(info.value)
    with pytest.raises(OpContractError):
        REGISTRY[op].resolve_attrs(attrs)


def test_make_node_converts_exactly():
    d = REGISTRY["SoftNMS"]
    node = d.make_node(["B", "S"], ["I", "O"], sigma=np.int64(2), center_point_box=np.float32(1.0), method="hard")
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert values == {"sigma": 2.0, "center_point_box": 1, "method": b"hard"}
    assert d.resolve_attrs({"sigma": 1}) == {
        "method": "linear",
        "sigma": 1.0,
        "center_point_box": 0,
        "coordinate_offset": 0,
    }
    assert isinstance(d.resolve_attrs({"sigma": 1})["sigma"], float)


@pytest.mark.parametrize("form", ["path", "bytes"])
def test_session_checks_models_given_as_a_path_or_bytes(form, tmp_path):
    model = _model("SoftmaxTopK", {"k": 2, "temperature": 2})
    if form == "path":
        onnx.save(model, tmp_path / "m.onnx")
        given = tmp_path / "m.onnx"
    else:
        given = model.SerializeToString()
    with pytest.raises(OpContractError, match="attribute 'temperature' must be FLOAT, got INT 2"):
        Session(given, kernels="native")
