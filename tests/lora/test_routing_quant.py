"""Quantizing a routed (LoRA-Mixer) model: routing agreement with fp32 is measured per LoRAMixer node and reported,
and by default the routers' input path stays in float when int8 flips the experts of more than 2% of tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import peft  # the `test` extra pins it
import pytest
import torch
import transformers  # the `models` extra
from torch import nn

from softdeploy import export
from softdeploy.lora import load_experts, mixers
from softdeploy.quant import QuantConfig, output_cosine, quantize
from softdeploy.runtime import Session
from softdeploy.workflow.quantize import report_json

VOCAB, HIDDEN = 60, 32


def bert(seed: int = 0) -> transformers.BertModel:
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return transformers.BertModel(cfg, add_pooling_layer=False).eval()


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bert = bert()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids).last_hidden_state


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, np.ndarray]]]:
    """A tiny BERT with three adapters written by PEFT itself, loaded as experts with the router as created (small
    random logits: near ties that int8 noise flips), exported routed."""
    dirs = []
    for i, r in enumerate((2, 4, 4)):
        cfg = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=["query", "value"], init_lora_weights=False)
        torch.manual_seed(200 + i)
        pm = peft.get_peft_model(bert(), cfg)
        d = tmp_path_factory.mktemp(f"adapter{i}")
        pm.save_pretrained(d)
        dirs.append(d)
    model = Encoder()
    load_experts(model.bert, dirs, top_k=1)
    assert mixers(model)
    # Two outlier channels, as trained BERTs have: int8 activations with a range set by them round the other
    # channels coarsely, and the routers read only those (their outlier columns zero), so int8 flips experts.
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight[:2] = 30.0
        for m in mixers(model).values():
            m.router[:, :2] = 0
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    src = tmp_path_factory.mktemp("routed") / "routed.onnx"
    export(model, (x,), src)
    name = Session(src, kernels="native").input_names[0]
    probe = [{name: np.random.default_rng(s).integers(0, VOCAB, size=(2, 16)).astype(np.int64)} for s in range(4)]
    return src, probe


def _cosine(src: Path, q: Path, probe: list[dict[str, np.ndarray]]) -> float:
    ref, got = Session(src, kernels="native"), Session(q, kernels="native")
    return output_cosine([ref.run(f)[0] for f in probe], [got.run(f)[0] for f in probe])


def test_routing_agreement_is_measured_and_reported(routed, tmp_path):
    src, probe = routed
    q = quantize(src, tmp_path / "off.onnx", QuantConfig("dynamic", routing_guard=False), probe=probe)
    rep = q.routing
    assert rep is not None and len(rep.after) == 6  # query and value of 3 layers
    assert all(r.tokens == 4 * 2 * 16 and 0.0 <= r.agreement <= 1.0 for r in rep.after)
    assert rep.kept_float == [] and rep.before == rep.after
    doc = report_json(q)
    assert doc["routing"]["nodes"][0]["node"] == rep.after[0].node
    assert "routing agreement with fp32" in doc["routing"]["summary"]
    json.dumps(doc, default=str)  # the report is JSON


def test_default_keeps_routing_in_int8(routed, tmp_path):
    src, probe = routed
    # static: activations per tensor, so the outliers make int8 flip experts whatever this CPU's dynamic format
    off = quantize(
        src, tmp_path / "off.onnx", QuantConfig("static", routing_guard=False), probe=probe, calibration=probe
    )
    on = quantize(src, tmp_path / "on.onnx", QuantConfig("static"), probe=probe, calibration=probe)
    assert on.routing is not None and off.routing is not None
    assert off.routing.agreement < 0.98, off.routing.line()  # the model this test is for: int8 flips its routing
    assert on.routing.agreement_before == off.routing.agreement
    assert on.routing.kept_float and set(on.routing.kept_float) <= set(on.float_nodes)
    assert on.quantized_nodes, "the guard keeps the routers' input path in float, not the whole model"
    assert on.routing.agreement >= 0.98, on.routing.line()
    assert "kept in float to protect routing" in on.routing.line()
    assert _cosine(src, on.path, probe) > max(0.99, _cosine(src, off.path, probe))


def test_search_keeps_fewer_nodes_in_float_than_the_coarse_guard(routed, tmp_path):
    from softdeploy.quant.routing import measure

    src, probe = routed
    kw = {"probe": probe, "calibration": probe}
    fine = quantize(src, tmp_path / "fine.onnx", QuantConfig("static"), **kw)
    # routing_search_evaluations=0: no room for the search, so the coarse stages decide (what they keep is the bar)
    coarse = quantize(src, tmp_path / "coarse.onnx", QuantConfig("static", routing_search_evaluations=0), **kw)
    rep, bar = fine.routing, coarse.routing
    assert bar.search is None and bar.kept_float and rep.search is not None and rep.search.reached
    assert rep.agreement_before < 0.98, rep.line()  # the search had something to do
    assert 0 < len(rep.kept_float) < len(bar.kept_float), (rep.line(), bar.line())
    assert len(fine.quantized_nodes) > len(coarse.quantized_nodes)
    assert set(rep.kept_float) <= set(fine.float_nodes)
    # every node within the limit on the probe, in the report and re-measured on the model as written
    assert all(r.flip_rate <= rep.max_flip_rate for r in rep.after), rep.line()
    again = {r.node: r.agreement for r in measure(src, fine.path, probe)}
    assert again == {r.node: r.agreement for r in rep.after}
    # the kept nodes are the most harmful ones: the search's ranking, most harmful first, every candidate measured
    search = rep.search
    ranked = [e.node for e in search.effects]
    assert rep.kept_float == ranked[: len(rep.kept_float)]
    assert sorted(ranked) == sorted(bar.kept_float)  # ranked: the coarse upstream set, each quantized alone
    shares = [e.logit_error_share for e in search.effects]
    assert shares == sorted(shares, reverse=True) and shares[0] > 0
    assert search.evaluations == len(search.effects) + len(search.trials)
    # one fewer than kept is past the limit: the bisection tried it (or it is none at all)
    assert (
        any(t.kept_float == len(rep.kept_float) - 1 and not t.within_limit for t in search.trials)
        or len(rep.kept_float) == 1
    )
    # the report names the kept nodes and why, with their measured effect
    doc = report_json(fine)["routing"]
    assert doc["kept_float"] == rep.kept_float
    assert [e["node"] for e in doc["search"]["kept_float"]] == rep.kept_float
    assert all(e["logit_error_share"] > 0 for e in doc["search"]["kept_float"])
    assert doc["search"]["evaluations"] == search.evaluations
    line = rep.line()
    assert "sensitivity search" in line and rep.kept_float[0] in line and "of the logit error" in line
    assert f"{search.evaluations} extra quantize + probe runs" in line
    off = quantize(src, tmp_path / "off.onnx", QuantConfig("static", routing_guard=False), **kw)
    assert _cosine(src, fine.path, probe) > max(0.99, _cosine(src, off.path, probe))
    json.dumps(report_json(fine), default=str)


def test_search_reuses_a_previous_ranking(routed, tmp_path):
    src, probe = routed
    kw = {"probe": probe, "calibration": probe}
    first = quantize(src, tmp_path / "a.onnx", QuantConfig("static"), **kw)
    again = quantize(src, tmp_path / "b.onnx", QuantConfig("static"), routing_hint=first, **kw)
    s1, s2 = first.routing.search, again.routing.search
    assert s2.from_hint and s2.evaluations == 1 and s2.trials[0].within_limit  # the previous choice, tried once
    assert again.routing.kept_float == first.routing.kept_float
    assert [e.node for e in s2.effects] == [e.node for e in s1.effects]
    assert "previous search's ranking" in again.routing.line()


def test_synthetic_probe_when_no_data(routed, tmp_path):
    src, _ = routed
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic"))
    assert q.routing is not None and "synthetic" in q.routing.probe


def test_sensitivity_probe_skips_routing(routed, tmp_path):
    src, _ = routed
    from softdeploy.quant import candidate_nodes
    from softdeploy.quant.quantize import load_named

    first = candidate_nodes(load_named(src), QuantConfig("dynamic"))[0][0]
    q = quantize(src, tmp_path / "one.onnx", QuantConfig("dynamic", only=(first,)))
    assert q.routing is None


def test_budget_search_keeps_routing_and_reports_it(routed, tmp_path):
    from softdeploy.quant import budget_search

    src, probe = routed
    ref = Session(src, kernels="native")
    want = [ref.run(f)[0] for f in probe]

    def evaluate(path: Path) -> float:
        got = Session(path, kernels="native")
        return output_cosine(want, [got.run(f)[0] for f in probe])

    res = budget_search(
        src, tmp_path / "b.onnx", QuantConfig("static"), evaluate, max_drop=0.5, probe=probe, calibration=probe
    )
    doc = res.to_json()
    assert doc["routing"]["kept_float"] and doc["routing"]["agreement"] >= 0.98
    assert any("routing agreement with fp32" in line for line in res.explain())


def test_a_model_proto_handed_to_quantize_stays_float(tmp_path):
    # the rowwise rewrite works on the loaded model in place; a ModelProto from the caller must come back unchanged
    import onnx
    from quant.tiny import mlp_with_custom_op

    model = mlp_with_custom_op(with_function=True)
    before = model.SerializeToString()
    quantize(model, tmp_path / "q.onnx", QuantConfig("dynamic", weights="rowwise-8-bit"))
    assert model.SerializeToString() == before
    assert "RowwiseInt8MatMul" in {n.op_type for n in onnx.load(tmp_path / "q.onnx").graph.node}
