"""Dynamic int8 of Gemm layers (softdeploy.quant.gemm: Gemm -> MatMul + Add before quantization) in every weight
format, and the quantize report's view of embedding tables (an int8 Gather keeps its name and op type)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from softdeploy.quant import QuantConfig, output_cosine, quantize
from softdeploy.quant.formats import WEIGHTS
from softdeploy.quant.gemm import gemm_as_matmul_rule, gemms_as_matmuls
from softdeploy.quant.rowwise import FORMS as ROWWISE_FORMS
from softdeploy.runtime import Session

GEMMS = ["fc_plain", "fc_transposed", "fc_scaled"]


def gemm_model(seed: int = 0, *, trans_a_node: bool = False) -> onnx.ModelProto:
    """X [b, 16] -> Gemm(W1 [16, 32], C [32]) -> Relu -> Gemm(W2 [24, 32] transB, alpha 0.5, beta 2, C [1, 24])
    -> Gemm(W3 [24, 8], no C) -> Y [b, 8]: the Gemm forms torch Linear and GPT-2's Conv1D export, and the
    attributes' other values. ``trans_a_node``: one more Gemm, with transA (which dynamic mode leaves in float)."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((16, 32)) * 0.4).astype(np.float32)
    w2 = (rng.standard_normal((24, 32)) * 0.4).astype(np.float32)
    w3 = (rng.standard_normal((24, 8)) * 0.4).astype(np.float32)
    c1 = rng.standard_normal(32).astype(np.float32)
    c2 = rng.standard_normal((1, 24)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["X", "W1", "C1"], ["h1"], name="fc_plain"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu"),
        helper.make_node("Gemm", ["r1", "W2", "C2"], ["h2"], name="fc_transposed", transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Gemm", ["h2", "W3"], ["Y" if not trans_a_node else "h3"], name="fc_scaled"),
    ]
    inits = [numpy_helper.from_array(v, n) for n, v in (("W1", w1), ("W2", w2), ("W3", w3), ("C1", c1), ("C2", c2))]
    if trans_a_node:
        nodes.append(helper.make_node("Gemm", ["h3", "W4"], ["Y"], name="fc_trans_a", transA=1))
        inits.append(numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.4).astype(np.float32), "W4"))
    graph = helper.make_graph(
        nodes,
        "gemms",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8 if trans_a_node else "b", 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [8 if trans_a_node else "b", 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _feeds(n: int = 4, batch: int = 8) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [{"X": rng.standard_normal((batch, 16)).astype(np.float32)} for _ in range(n)]


def _outputs(path: Path | onnx.ModelProto, feeds: list[dict[str, np.ndarray]], kernels: str = "native"):
    session = Session(path, kernels=kernels)
    return [session.run(f)[0] for f in feeds]


def test_the_rewrite_is_the_gemm_in_float(tmp_path: Path) -> None:
    """MatMul + Add computes the Gemm's values (alpha folded into the weight, beta into the bias, transB applied to
    the initializer): float32 rounding apart, the same outputs; names kept, so reports name the same nodes."""
    model = gemm_model()
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert sorted(gemms_as_matmuls(rewritten, set(GEMMS))) == sorted(GEMMS)
    assert {n.name: n.op_type for n in rewritten.graph.node if n.name in GEMMS} == dict.fromkeys(GEMMS, "MatMul")
    assert "Gemm" not in {n.op_type for n in rewritten.graph.node}
    onnx.checker.check_model(rewritten)
    feeds = _feeds()
    for want, got in zip(_outputs(model, feeds, "portable"), _outputs(rewritten, feeds, "portable"), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weights", sorted(WEIGHTS))
def test_dynamic_quantizes_gemms_in_every_format(tmp_path: Path, weights: str) -> None:
    src = tmp_path / "gemm.onnx"
    onnx.save(gemm_model(), src)
    q = quantize(src, tmp_path / f"q_{weights}.onnx", QuantConfig("dynamic", weights=weights))
    assert sorted(q.quantized_nodes) == sorted(GEMMS) and q.float_nodes == []
    assert q.weights == weights
    ops = {n.op_type for n in onnx.load(q.path).graph.node}
    assert "Gemm" not in ops and "MatMul" not in ops
    assert ("RowwiseInt8MatMul" in ops) == (weights in ROWWISE_FORMS)
    feeds = _feeds()
    assert output_cosine(_outputs(src, feeds), _outputs(q.path, feeds)) > 0.99


def test_gemm_selection_and_the_rule_for_the_rest(tmp_path: Path) -> None:
    """exclude keeps a Gemm in float; transA is left in float, its rule named; the caller's model is not changed;
    op_types Gemm alone quantizes the Gemms and no MatMul of the model."""
    model = gemm_model(trans_a_node=True)
    before = model.SerializeToString()
    q = quantize(model, tmp_path / "q.onnx", QuantConfig("dynamic", weights="8-bit", exclude=("fc_scaled",)))
    assert model.SerializeToString() == before
    assert sorted(q.quantized_nodes) == ["fc_plain", "fc_transposed"]
    assert sorted(q.float_nodes) == ["fc_scaled", "fc_trans_a"]
    out = {n.name: n.op_type for n in onnx.load(q.path).graph.node}
    # float: as it was, or as onnxruntime's own float rewrite of a Gemm (MatMul "<name>_MatMul" reading W3 as is)
    assert out.get("fc_scaled") == "Gemm" or out.get("fc_scaled_MatMul") == "MatMul"
    assert not any(n.startswith("fc_scaled") and t == "MatMulInteger" for n, t in out.items())
    assert out["fc_trans_a"] == "Gemm"
    inits = {t.name: t for t in model.graph.initializer}
    assert "transA = 1" in gemm_as_matmul_rule(next(n for n in model.graph.node if n.name == "fc_trans_a"), inits)

    # a model MatMul next to the Gemms, op_types ("Gemm",): only the Gemms become int8
    mixed = gemm_model()
    w = numpy_helper.from_array(np.eye(8, dtype=np.float32), "W5")
    mixed.graph.initializer.append(w)
    mixed.graph.node[-1].output[0] = "h3"
    mixed.graph.node.append(helper.make_node("MatMul", ["h3", "W5"], ["Y"], name="model_matmul"))
    q = quantize(mixed, tmp_path / "q2.onnx", QuantConfig("dynamic", weights="8-bit", op_types=("Gemm",)))
    assert sorted(q.quantized_nodes) == sorted(GEMMS)
    assert {n.name: n.op_type for n in onnx.load(q.path).graph.node}["model_matmul"] == "MatMul"


def embedding_model() -> onnx.ModelProto:
    """ids -> Gather(E [50, 16]) -> MatMul(W [16, 8]) -> Y: an embedding table and a projection."""
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["E", "ids"], ["h"], name="embed"),
            helper.make_node("MatMul", ["h", "W"], ["Y"], name="fc"),
        ],
        "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", 4, 8])],
        [
            numpy_helper.from_array(rng.standard_normal((50, 16)).astype(np.float32), "E"),
            numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "W"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("weights", ["8-bit", "rowwise-8-bit"])
def test_report_lists_an_int8_embedding_table_as_int8(tmp_path: Path, weights: str) -> None:
    """onnxruntime's dynamic int8 Gather keeps the node's name and op type and gathers from a uint8 table: the
    report must count it int8 (and an excluded one float)."""
    q = quantize(embedding_model(), tmp_path / "q.onnx", QuantConfig("dynamic", weights=weights))
    assert sorted(q.quantized_nodes) == ["embed", "fc"] and q.float_nodes == []
    table = next(n for n in onnx.load(q.path).graph.node if n.name == "embed")
    assert table.op_type == "Gather"
    kept = quantize(embedding_model(), tmp_path / "k.onnx", QuantConfig("dynamic", weights=weights, exclude=("embed",)))
    assert kept.quantized_nodes == ["fc"] and kept.float_nodes == ["embed"]


def test_gpt2_dynamic_int8(tmp_path: Path) -> None:
    """Hugging Face GPT-2 (Conv1D exports Gemm), 2 layers with random weights, exported with softdeploy's export:
    dynamic int8 quantizes its Gemms in this CPU's format, logits cosine to fp32 >= 0.99."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from softdeploy.export import export

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500, n_positions=64)
    gpt2 = transformers.GPT2LMHeadModel(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids, use_cache=False).logits

    ids = torch.randint(0, 500, (2, 16))
    src = tmp_path / "gpt2.onnx"
    export(Logits(gpt2), (ids,), src, input_names=["ids"], output_names=["logits"])
    gemms = [n.name for n in onnx.load(src).graph.node if n.op_type == "Gemm"]
    assert len(gemms) == 8  # per layer: attention c_attn and c_proj, MLP c_fc and c_proj
    q = quantize(src, tmp_path / "gpt2.int8.onnx", QuantConfig("dynamic"))
    assert set(gemms) <= set(q.quantized_nodes)
    feeds = [{"ids": np.random.default_rng(s).integers(0, 500, (2, 16)).astype(np.int64)} for s in range(3)]
    assert output_cosine(_outputs(src, feeds), _outputs(q.path, feeds)) >= 0.99
