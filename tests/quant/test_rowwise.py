"""softdeploy's int8 formats (softdeploy.quant.rowwise): quantize() turns the weight MatMuls into RowwiseInt8MatMul
nodes with lane-bounded (or plain 8-bit: rowwise-8-bit) weights and folded biases; the model runs on the kernels and,
through the function bodies, on stock onnxruntime with the same values; static mode refuses the formats; the table's
rowwise-8-bit falls back to onnxruntime's 8-bit format, saying why, where the kernel's VNNI tile cannot run."""

from __future__ import annotations

import importlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quant.tiny import mlp_with_custom_op
from softdeploy import DOMAIN, OPSET_VERSION
from softdeploy.quant import QuantConfig, QuantizationError, quantize
from softdeploy.quant.formats import TABLE
from softdeploy.quant.rowwise import FORMS, GROUPS, LEVELS, weight_groups
from softdeploy.runtime import Session

# the module (softdeploy.quant re-exports its function under the same name)
quantize_module = importlib.import_module("softdeploy.quant.quantize")


def _mlp_with_bias(tmp_path):
    """X [b, 3, 24] -> MatMul(W1) + b1 -> Relu -> MatMul(W2) + b2 -> Y, plus an activation x activation MatMul."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((24, 40)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((40, 24)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
        helper.make_node("Relu", ["hb"], ["r"], name="act"),
        helper.make_node("MatMul", ["r", "W2"], ["o"], name="fc2"),
        helper.make_node("Add", ["b2", "o"], ["ob"], name="fc2_bias"),  # bias first: folded all the same
        helper.make_node("Transpose", ["ob"], ["obt"], name="t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["ob", "obt"], ["Y"], name="scores"),  # activation x activation: stays float
    ]
    graph = helper.make_graph(
        nodes,
        "mlp_bias",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["b", 3, 24])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", 3, 3])],
        initializer=[
            numpy_helper.from_array(w1, "W1"),
            numpy_helper.from_array(rng.standard_normal(40).astype(np.float32), "b1"),
            numpy_helper.from_array(w2, "W2"),
            numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b2"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)], ir_version=10
    )
    path = tmp_path / "mlp_bias.onnx"
    onnx.save(model, path)
    return path, rng.standard_normal((5, 3, 24)).astype(np.float32)


def test_weight_matmuls_become_rowwise_nodes_with_folded_biases(tmp_path):
    src, x = _mlp_with_bias(tmp_path)
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic", weights="lane-bounded"))
    assert q.weights == "lane-bounded" and sorted(q.quantized_nodes) == ["fc1", "fc2"]
    assert "lane-bounded" in q.int8_format  # as asked, or this CPU's table row (an AVX2 CPU without VNNI)
    model = onnx.load(q.path)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("RowwiseInt8MatMul") == 2 and "Add" not in ops  # both biases folded into the op
    assert ops.count("MatMul") == 1  # the activation x activation one
    assert {f.name for f in model.functions} == {"RowwiseInt8MatMul"}  # portable: carries its body
    assert {t.name for t in model.graph.initializer}.isdisjoint({"W1", "W2"})  # float weights dropped
    assert all(g >= GROUPS for g in weight_groups(model).values())  # the kernel's fast form applies
    levels = {a.i for n in model.graph.node if n.op_type == "RowwiseInt8MatMul" for a in n.attribute}
    assert levels == {LEVELS}

    want = Session(src, kernels="portable").run({"X": x})[0]
    native = Session(q.path, kernels="native").run({"X": x})[0]
    body = Session(q.path, kernels="portable").run({"X": x})[0]  # stock onnxruntime, the function bodies
    np.testing.assert_allclose(body, native, rtol=1e-5, atol=1e-5)  # the same integers, float32 epilogues
    cos = float(np.dot(native.ravel(), want.ravel()) / np.linalg.norm(native) / np.linalg.norm(want))
    assert cos > 0.995, cos
    assert not np.allclose(native, want, rtol=1e-6, atol=1e-6)  # int8 really ran


def test_only_and_exclude_select_nodes(tmp_path):
    src, _ = _mlp_with_bias(tmp_path)
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic", weights="lane-bounded", exclude=("fc2",)))
    assert q.quantized_nodes == ["fc1"] and "fc2" in q.float_nodes
    ops = [n.op_type for n in onnx.load(q.path).graph.node]
    assert ops.count("RowwiseInt8MatMul") == 1 and ops.count("Add") == 1


def test_models_with_custom_ops_keep_them(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(mlp_with_custom_op(with_function=True), src)
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic", weights="lane-bounded"))
    model = onnx.load(q.path)
    assert sorted(q.quantized_nodes) == ["fc1", "fc2", "fc3"]
    assert {f.name for f in model.functions} == {"RowwiseInt8MatMul", "TwoPassSoftmax"}
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    native = Session(q.path, kernels="native").run({"X": x})[0]
    body = Session(q.path, kernels="portable").run({"X": x})[0]
    np.testing.assert_allclose(body, native, rtol=1e-5, atol=1e-6)


def test_static_mode_refuses_the_format(tmp_path):
    src, x = _mlp_with_bias(tmp_path)
    with pytest.raises(QuantizationError, match="lane-bounded weights are a dynamic, per-channel format"):
        quantize(src, tmp_path / "q.onnx", QuantConfig("static", weights="lane-bounded"), calibration=[{"X": x}])


def test_rowwise_8_bit_keeps_the_plain_8_bit_grid_and_8_bit_rows(tmp_path):
    """rowwise-8-bit: levels 255 and weights on max |w| / 127 per column (no lane bound: full-range columns reach
    +-127), the same values on the kernels (on a VNNI CPU its vpdpbusd tile) and through the function bodies."""
    src, x = _mlp_with_bias(tmp_path)
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic", weights="rowwise-8-bit"))
    assert FORMS["rowwise-8-bit"] == (255, 0)
    assert q.weights == "rowwise-8-bit" and sorted(q.quantized_nodes) == ["fc1", "fc2"]
    assert "rowwise-8-bit" in q.int8_format or "u8s8" in q.int8_format
    model = onnx.load(q.path)
    levels = {a.i for n in model.graph.node if n.op_type == "RowwiseInt8MatMul" for a in n.attribute}
    assert levels == {255}
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "RowwiseInt8MatMul":
            assert int(np.abs(inits[node.input[1]].astype(np.int32)).max(axis=0).min()) == 127  # every column
    want = Session(src, kernels="portable").run({"X": x})[0]
    native = Session(q.path, kernels="native").run({"X": x})[0]
    body = Session(q.path, kernels="portable").run({"X": x})[0]
    np.testing.assert_allclose(body, native, rtol=1e-5, atol=1e-5)
    cos = float(np.dot(native.ravel(), want.ravel()) / np.linalg.norm(native) / np.linalg.norm(want))
    assert cos > 0.998, cos  # finer than lane-bounded (0.995 above): 8-bit rows and steps
    assert not np.allclose(native, want, rtol=1e-6, atol=1e-6)


def test_the_tables_rowwise_8_bit_needs_the_vnni_tile(tmp_path, monkeypatch):
    """On the vnni row dynamic mode takes rowwise-8-bit where the kernel's vpdpbusd tile runs; where it cannot (an
    AVX-VNNI core, a lowered SOFTDEPLOY_ISA), onnxruntime's 8-bit format, and the report says why."""
    src, _ = _mlp_with_bias(tmp_path)
    import softdeploy.quant.formats as formats

    monkeypatch.setattr(formats, "int8_format", lambda *a, **k: TABLE["vnni"])
    monkeypatch.setattr(formats, "_rowwise_vnni_runs", lambda: True)
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic"))
    assert q.weights == "rowwise-8-bit" and q.int8_format == TABLE["vnni"].line("dynamic")
    assert "RowwiseInt8MatMul" in {n.op_type for n in onnx.load(q.path).graph.node}
    monkeypatch.setattr(formats, "_rowwise_vnni_runs", lambda: False)
    q = quantize(src, tmp_path / "ort.onnx", QuantConfig("dynamic"))
    assert q.weights == "8-bit" and "instead of rowwise-8-bit" in q.int8_format and "AVX-512 VNNI" in q.int8_format
    ops = {n.op_type for n in onnx.load(q.path).graph.node}
    assert "RowwiseInt8MatMul" not in ops and "MatMulInteger" in ops
    # asked for explicitly, it is what the user gets (correct everywhere; fast only with the VNNI tile)
    q = quantize(src, tmp_path / "asked.onnx", QuantConfig("dynamic", weights="rowwise-8-bit"))
    assert q.weights == "rowwise-8-bit"


def test_rowwise_vnni_rule_follows_the_selected_variant(monkeypatch):
    """_rowwise_vnni_runs is the kernel's rule: the avx512 variant selected and AVX-512 VNNI, or the avx2 variant and
    AVX-VNNI, which the library reads from CPUID as /proc/cpuinfo reports them (outside an emulated CPU)."""
    from softdeploy.compare.environment import cpuinfo
    from softdeploy.runtime import library_status

    flags = cpuinfo()[1]
    vnni = bool(flags & {"avx512_vnni", "avx512vnni"})
    avx_vnni = bool(flags & {"avx_vnni", "avxvnni"})
    monkeypatch.setenv("SOFTDEPLOY_ISA", "avx2")
    info = library_status().info
    # the avx2 variant runs the ymm tile exactly where the CPU has AVX-VNNI
    assert quantize_module._rowwise_vnni_runs() == (info is not None and info.isa_selected == "avx2" and avx_vnni)
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "avx2")  # an emulated AVX2 CPU has neither VNNI
    assert not quantize_module._rowwise_vnni_runs()
    monkeypatch.delenv("SOFTDEPLOY_TEST_CPU")
    monkeypatch.delenv("SOFTDEPLOY_ISA")

    info = library_status().info
    selected = None if info is None else info.isa_selected
    assert quantize_module._rowwise_vnni_runs() == (
        (selected == "avx512" and vnni) or (selected == "avx2" and avx_vnni)
    )
    if info is not None:
        assert info.avx512_vnni == (info.isa_detected == "avx512" and vnni)
        assert info.avx_vnni == avx_vnni


def _ffn_block(tmp_path, *, residual_shape_known: bool = True, gelu_domain: str = "com.microsoft", **gelu_attrs):
    """A transformer FFN block: X [b, 7, 32] -> MatMul(W1) + b1 -> Gelu -> MatMul(W2) + b2 -> Add(X) -> LayerNorm;
    value_info gives every tensor's shape (as exporters write it) unless ``residual_shape_known`` is False."""
    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((32, 64)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((64, 32)) * 0.3).astype(np.float32)
    gelu = helper.make_node("Gelu", ["h1b"], ["g"], name="gelu", domain=gelu_domain, **gelu_attrs)
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["h1"], name="up"),
        helper.make_node("Add", ["h1", "b1"], ["h1b"], name="up_bias"),
        gelu,
        helper.make_node("MatMul", ["g", "W2"], ["h2"], name="down"),
        helper.make_node("Add", ["h2", "b2"], ["h2b"], name="down_bias"),
        helper.make_node("Add", ["X", "h2b"], ["s"], name="residual"),  # residual first: folded all the same
        helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["Y"], name="norm", axis=-1),
    ]
    shape = {"h1": ["b", 7, 64], "h1b": ["b", 7, 64], "g": ["b", 7, 64], "h2": ["b", 7, 32], "h2b": ["b", 7, 32]}
    if residual_shape_known:
        shape["s"] = ["b", 7, 32]
    graph = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["b", 7, 32])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", 7, 32])],
        initializer=[
            numpy_helper.from_array(w1, "W1"),
            numpy_helper.from_array((rng.standard_normal(64) * 0.5).astype(np.float32), "b1"),
            numpy_helper.from_array(w2, "W2"),
            numpy_helper.from_array((rng.standard_normal(32) * 0.5).astype(np.float32), "b2"),
            numpy_helper.from_array(np.ones(32, np.float32), "gamma"),
            numpy_helper.from_array(np.zeros(32, np.float32), "beta"),
        ],
        value_info=[helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in shape.items()],
    )
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    path = tmp_path / "ffn.onnx"
    onnx.save(model, path)
    return path, rng.standard_normal((3, 7, 32)).astype(np.float32)


def _rowwise_nodes(model):
    return {n.name: n for n in model.graph.node if n.op_type == "RowwiseInt8MatMul"}


@pytest.mark.parametrize("weights", ["lane-bounded", "rowwise-8-bit"])
@pytest.mark.parametrize("gelu_domain", ["com.microsoft", ""])
def test_gelu_and_residual_add_fold_into_the_epilogue(tmp_path, monkeypatch, weights, gelu_domain):
    """The FFN's GELU becomes the up-projection's activation and the residual Add the down-projection's Residual:
    only the LayerNorm is left besides the two nodes, the graph stays valid and topologically sorted, and the values
    are those of the same quantized weights run node by node (GELU within the kernel's erf approximation)."""
    from softdeploy.quant.rowwise import fuse_epilogues, rewrite_matmuls

    src, x = _ffn_block(tmp_path, gelu_domain=gelu_domain)
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic", weights=weights))
    model = onnx.load(q.path)
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node if n.domain != "" or n.op_type != "Constant"] == [
        "RowwiseInt8MatMul",
        "RowwiseInt8MatMul",
        "LayerNormalization",
    ]
    up, down = _rowwise_nodes(model).values()
    assert helper.get_attribute_value(next(a for a in up.attribute if a.name == "activation")) == b"gelu"
    assert down.input[4] == "X" and all(a.name != "activation" for a in down.attribute)
    assert sorted(q.quantized_nodes) == ["down", "up"]

    # the same weights, unfused: the rewrite without fuse_epilogues
    plain = onnx.load(src)
    levels, groups = FORMS[weights]
    with monkeypatch.context() as patched:
        patched.setattr("softdeploy.quant.rowwise.fuse_epilogues", lambda model: {})
        rewrite_matmuls(plain, levels=levels, groups=groups)
    assert [n.op_type for n in plain.graph.node].count("Add") == 1  # the residual Add stayed there
    assert fuse_epilogues(model) == {}  # and the fused model has nothing left to fold
    fused = Session(q.path, kernels="native").run({"X": x})[0]
    unfused = Session(plain, kernels="native").run({"X": x})[0]
    np.testing.assert_allclose(fused, unfused, rtol=1e-5, atol=1e-5)
    body = Session(q.path, kernels="portable").run({"X": x})[0]  # stock onnxruntime: the function bodies
    np.testing.assert_allclose(body, fused, rtol=1e-5, atol=1e-5)


def test_what_the_epilogue_cannot_take_stays(tmp_path):
    """GELU's tanh approximation is not the epilogue's GELU, and a residual whose shape the graph does not state is
    not guessed: both nodes stay, and fuse_epilogues says what it folded."""
    from softdeploy.quant.rowwise import fuse_epilogues

    src, x = _ffn_block(tmp_path, residual_shape_known=False, gelu_domain="", approximate="tanh")
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic", weights="lane-bounded"))
    model = onnx.load(q.path)
    ops = [n.op_type for n in model.graph.node]
    assert "Gelu" in ops and ops.count("Add") == 1
    assert all("X" not in n.input[1:] for n in _rowwise_nodes(model).values())  # no Residual taken
    assert fuse_epilogues(model) == {}  # nothing left to fold
    want = Session(src, kernels="portable").run({"X": x})[0]
    got = Session(q.path, kernels="native").run({"X": x})[0]
    cos = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos > 0.99, cos


def test_a_sum_of_two_rowwise_products_folds_once(tmp_path):
    """Y = X W1 + X W2: one product takes the Add (the other's output as its Residual); the other, whose reader is
    now that node, takes nothing -- one producer per tensor, and Y's values."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["a"], name="left"),
        helper.make_node("MatMul", ["X", "W2"], ["b"], name="right"),
        helper.make_node("Add", ["a", "b"], ["Y"], name="sum"),
    ]
    graph = helper.make_graph(
        nodes,
        "two",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 8])],
        initializer=[
            numpy_helper.from_array((rng.standard_normal((16, 8)) * 0.3).astype(np.float32), name)
            for name in ("W1", "W2")
        ],
        value_info=[helper.make_tensor_value_info(t, TensorProto.FLOAT, ["n", 8]) for t in ("a", "b")],
    )
    src = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), src)
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic", weights="lane-bounded"))
    model = onnx.load(q.path)
    onnx.checker.check_model(model)
    produced = [o for n in model.graph.node for o in n.output if o]
    assert len(produced) == len(set(produced))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("RowwiseInt8MatMul") == 2 and "Add" not in ops
    x = rng.standard_normal((5, 16)).astype(np.float32)
    want = Session(src, kernels="portable").run({"X": x})[0]
    got = Session(q.path, kernels="native").run({"X": x})[0]
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05)


def test_an_activation_after_a_residual_is_not_folded():
    """The epilogue is act(V) + Residual: a GELU after a node that already adds a residual stays a node."""
    from softdeploy.ops import REGISTRY
    from softdeploy.quant.rowwise import fuse_epilogues

    op = REGISTRY["RowwiseInt8MatMul"]
    nodes = [
        op.make_node(["X", "B", "S", "", "R"], ["y"], name="fc"),
        helper.make_node("Gelu", ["y"], ["Y"], name="gelu", domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in ("X", "R")],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4])],
        initializer=[
            numpy_helper.from_array(np.ones((4, 4), np.int8), "B"),
            numpy_helper.from_array(np.ones(4, np.float32), "S"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    assert fuse_epilogues(model) == {}
    assert [n.op_type for n in model.graph.node] == ["RowwiseInt8MatMul", "Gelu"]
