"""softdeploy.lora: LoRA-Mixer projections on a tiny BERT (wrap, hard-soft training, routing loss), the
routed export (MatMul + Add + LoRAMixer per projection), PEFT adapters as frozen experts (adapters that
PEFT itself writes), the merge pass against PEFT's merge_and_unload, and quantization of the routed
model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from softdeploy import export
from softdeploy.errors import AdapterError, ArgumentError
from softdeploy.lora import BERT_ATTENTION, LoRAMixerLinear, load_experts, merge, mixers, routing_loss, wrap
from softdeploy.quant.rowwise import FORMS as ROWWISE_FORMS
from softdeploy.runtime import Session

# Without these the module is skipped, naming the extra that installs them (CI installs both).
peft = pytest.importorskip("peft", reason='needs peft, which the `test` extra pins: pip install ".[test]"')
transformers = pytest.importorskip("transformers", reason='needs the `models` extra: pip install ".[models]"')

pytestmark = [pytest.mark.models, pytest.mark.peft]


class Encoder(nn.Module):
    """A tiny BERT (eager attention) returning its last hidden state."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        cfg = transformers.BertConfig(
            vocab_size=60,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=48,
            max_position_embeddings=32,
            attn_implementation="eager",
        )
        self.bert = transformers.BertModel(cfg, add_pooling_layer=False).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids).last_hidden_state


def ids(batch: int = 2, seq: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 60, (batch, seq), generator=torch.Generator().manual_seed(seed))


def randomize_experts(model: nn.Module, seed: int = 2) -> None:
    g = torch.Generator().manual_seed(seed)
    for m in mixers(model).values():
        with torch.no_grad():
            m.Bm.copy_(torch.randn(m.Bm.shape, generator=g) * 0.05)
            m.router.copy_(torch.randn(m.router.shape, generator=g))


def count_ops(model: onnx.ModelProto) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in model.graph.node:
        out[n.op_type] = out.get(n.op_type, 0) + 1
    return out


def test_wrap_bert_attention_projections_and_routed_export():
    model = Encoder()
    x = ids()
    base = model(x)
    names = wrap(model, BERT_ATTENTION, num_experts=4, rank=4, top_k=2, alpha=8)
    assert len(names) == 8 and all(isinstance(m, LoRAMixerLinear) for m in mixers(model).values())
    assert mixers(model)[names[0]].scaling == 2.0
    torch.testing.assert_close(model(x), base)  # Bm starts at zero: the wrapped model is the base model
    randomize_experts(model)
    result = export(model, (x,))  # validates against torch eager (kernel and function-body backends)
    ops = count_ops(result.model)
    assert ops["LoRAMixer"] == 8
    assert result.custom_ops == ["LoRAMixer"]
    assert result.validation is not None and result.validation.ok
    # each LoRAMixer adds to the output of its base projection's MatMul (+ bias Add)
    producers = {o: n for n in result.model.graph.node for o in n.output}
    for node in result.model.graph.node:
        if node.op_type == "LoRAMixer":
            (consumer,) = [n for n in result.model.graph.node if node.output[0] in n.input]
            assert consumer.op_type == "Add"
            other = next(i for i in consumer.input if i != node.output[0])
            assert producers[other].op_type in ("Add", "MatMul")


def test_no_matching_linear_is_an_error():
    with pytest.raises(ArgumentError, match=r"no nn.Linear of the model matches \['\*q_proj'\]"):
        wrap(Encoder(), ["*q_proj"])


def test_hard_forward_soft_backward_and_frozen_base():
    model = Encoder()
    wrap(model, BERT_ATTENTION, num_experts=4, rank=4, top_k=1)
    randomize_experts(model)
    x = ids()
    model.eval()
    with torch.no_grad():
        hard = model(x)
    model.train()
    model.bert.embeddings.dropout.p = 0.0
    for layer in model.bert.encoder.layer:
        layer.attention.self.dropout.p = 0.0
        layer.attention.output.dropout.p = 0.0
        layer.output.dropout.p = 0.0
    y = model(x)
    torch.testing.assert_close(y, hard)  # the forward value is the hard top-1 routing
    (y.square().mean() + routing_loss(model)).backward()
    for m in mixers(model).values():
        assert m.base.weight.grad is None  # frozen
        # top_k = 1: the hard path gives the unselected experts no gradient; the soft backward does
        assert m.router.grad is not None and m.router.grad.abs().sum() > 0
        assert (m.A.grad.abs().sum(dim=(1, 2)) > 0).all()
        assert (m.Bm.grad.abs().sum(dim=(1, 2)) > 0).all()
    # right after a training step the model merges (its routing statistics are graph tensors, which
    # deepcopy refuses) and keeps them for routing_loss
    merged = merge(model, [1.0] + [0.0] * (next(iter(mixers(model).values())).num_experts - 1))
    assert not mixers(merged) and all(m.last_probs is not None for m in mixers(model).values())


def test_routing_loss_terms():
    m = LoRAMixerLinear(nn.Linear(4, 3), num_experts=4, rank=2, top_k=1)
    m.last_probs = torch.full((8, 4), 0.25)
    m.last_experts = torch.arange(8).remainder(4).reshape(8, 1)
    holder = nn.Sequential(m)
    # uniform load and probabilities: balance = E * sum_e (1/E)(1/E) = 1, entropy = log E
    torch.testing.assert_close(routing_loss(holder, balance_weight=1.0, specialization_weight=0.0), torch.tensor(1.0))
    torch.testing.assert_close(
        routing_loss(holder, balance_weight=0.0, specialization_weight=1.0), torch.tensor(math.log(4))
    )
    m.last_probs = torch.eye(4).repeat(2, 1)  # one-hot routing: entropy 0
    m.last_experts = torch.zeros(8, 1, dtype=torch.int64)  # all on expert 0: f = (1, 0, 0, 0), P = 1/4 each
    torch.testing.assert_close(routing_loss(holder, balance_weight=1.0, specialization_weight=1.0), torch.tensor(1.0))


# ---- PEFT adapters ---------------------------------------------------------------------------------

ADAPTERS = [  # (r, alpha, targets): different ranks and scalings, one adapter without the key projection
    (2, 4, ["query", "value", "key"]),
    (4, 8, ["query", "value", "key"]),
    (4, 2, ["query", "value"]),
]


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    dirs = []
    for i, (r, alpha, targets) in enumerate(ADAPTERS):
        cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, init_lora_weights=False)
        torch.manual_seed(100 + i)
        pm = peft.get_peft_model(Encoder().bert, cfg)
        d = tmp_path_factory.mktemp(f"adapter{i}")
        pm.save_pretrained(d)
        assert (d / "adapter_model.safetensors").is_file()
        dirs.append(d)
    return dirs


def peft_merged(adapter: Path) -> nn.Module:
    pm = peft.PeftModel.from_pretrained(Encoder().bert, adapter)
    return pm.merge_and_unload()


def test_peft_adapters_become_frozen_experts_and_merge_equals_merge_and_unload(adapter_dirs):
    model = Encoder()
    names = load_experts(model.bert, adapter_dirs, top_k=2)
    assert len(names) == 6  # q, k, v of 2 layers
    for m in mixers(model).values():
        assert m.num_experts == 3 and m.rank == 4 and not m.A.requires_grad and m.router.requires_grad
    x = ids()
    for e, d in enumerate(adapter_dirs):
        one_hot = [0.0] * 3
        one_hot[e] = 1.0
        merged = merge(model, one_hot)
        assert not mixers(merged)
        want = peft_merged(d)
        for name in names:
            torch.testing.assert_close(
                merged.get_submodule("bert." + name).weight, want.get_submodule(name).weight, rtol=1e-6, atol=1e-7
            )
        torch.testing.assert_close(merged(x), want(input_ids=x).last_hidden_state, rtol=1e-5, atol=1e-5)


def test_weighted_merge_equals_peft_cat_combination(adapter_dirs):
    """Mixed gates: PEFT expresses sum_e w_e s_e B_e A_e as add_weighted_adapter(combination_type="cat")."""
    pm = peft.PeftModel.from_pretrained(Encoder().bert, adapter_dirs[0], adapter_name="a0")
    for i, d in enumerate(adapter_dirs[1:], start=1):
        pm.load_adapter(d, adapter_name=f"a{i}")
    w = [0.5, 0.3, 0.2]
    pm.add_weighted_adapter(["a0", "a1", "a2"], w, "mix", combination_type="cat")
    pm.set_adapter("mix")
    want = pm.merge_and_unload()
    model = Encoder()
    names = load_experts(model.bert, adapter_dirs)
    merged = merge(model, w)
    for name in names:
        torch.testing.assert_close(
            merged.get_submodule("bert." + name).weight, want.get_submodule(name).weight, rtol=1e-6, atol=1e-7
        )
    x = ids()
    torch.testing.assert_close(merged(x), want(input_ids=x).last_hidden_state, rtol=1e-5, atol=1e-5)


def test_merged_uniform_equals_routed_with_fixed_gates(adapter_dirs):
    """A zero router ties every expert and top_k = E takes them all with gates 1/E: the routed model
    with these fixed gates equals the merge with uniform weights (both exported and validated)."""
    model = Encoder()
    load_experts(model.bert, adapter_dirs, top_k=3)
    for m in mixers(model).values():
        with torch.no_grad():
            m.router.zero_()
    x = ids()
    merged = merge(model, [1 / 3] * 3)
    routed_onnx = export(model, (x,)).model
    merged_onnx = export(merged, (x,)).model
    assert "LoRAMixer" in count_ops(routed_onnx) and "LoRAMixer" not in count_ops(merged_onnx)
    feeds = {routed_onnx.graph.input[0].name: x.numpy()}
    a = Session(routed_onnx, kernels="native").run(feeds)[0]
    b = Session(merged_onnx, kernels="native").run({merged_onnx.graph.input[0].name: x.numpy()})[0]
    assert np.max(np.abs(a - b)) <= 1e-4 * np.max(np.abs(b))


def test_routed_quantized_keeps_lora_mixer_in_float(adapter_dirs, tmp_path):
    from softdeploy.quant import QuantConfig, output_cosine, quantize

    model = Encoder()
    load_experts(model.bert, adapter_dirs, top_k=2)
    randomize_experts(model)
    x = ids()
    src = tmp_path / "routed.onnx"
    export(model, (x,), src)
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic"))
    out = onnx.load(q.path)
    ops = count_ops(out)
    int8_op = "RowwiseInt8MatMul" if q.weights in ROWWISE_FORMS else "MatMulInteger"  # this CPU's format
    assert ops["LoRAMixer"] == 6 and int8_op in ops
    inits = {t.name: t for t in out.graph.initializer}
    for node in out.graph.node:
        if node.op_type == "LoRAMixer":  # the factors and the router are still float initializers
            for name in node.input[1:]:
                assert inits[name].data_type == onnx.TensorProto.FLOAT, name
    feeds = {out.graph.input[0].name: x.numpy()}
    ref = Session(src, kernels="native").run(feeds)[0]
    got = Session(q.path, kernels="native").run(feeds)[0]
    assert output_cosine([ref], [got]) > 0.99
    # a merged model (per task) quantizes like any model: no custom op left, base MatMuls int8
    merged_src = tmp_path / "merged.onnx"
    export(merge(model, [0.0, 1.0, 0.0]), (x,), merged_src)
    qm = quantize(merged_src, tmp_path / "qm.onnx", QuantConfig("dynamic"))
    ops_m = count_ops(onnx.load(qm.path))
    assert "LoRAMixer" not in ops_m and int8_op in ops_m
    ref_m = Session(merged_src, kernels="native").run(feeds)[0]
    assert output_cosine([ref_m], [Session(qm.path, kernels="native").run(feeds)[0]]) > 0.99


def _write_adapter(d: Path, tensors: dict[str, torch.Tensor], **cfg: object) -> Path:
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 2, **cfg}))
    save_file(tensors, str(d / "adapter_model.safetensors"))
    return d


def test_adapter_errors_name_file_value_and_rule(adapter_dirs, tmp_path):
    key = "base_model.model.encoder.layer.0.attention.self.query"
    good = {f"{key}.lora_A.weight": torch.zeros(2, 32), f"{key}.lora_B.weight": torch.zeros(32, 2)}
    wrong_in = _write_adapter(tmp_path / "in", {**good, f"{key}.lora_A.weight": torch.zeros(2, 30)})
    with pytest.raises(AdapterError, match=r"in/adapter_model.safetensors: .*lora_A.weight has shape \[2, 30\].*rule"):
        load_experts(Encoder().bert, [wrong_in])
    wrong_r = _write_adapter(tmp_path / "r", {**good, f"{key}.lora_B.weight": torch.zeros(32, 3)})
    with pytest.raises(AdapterError, match=r"lora_B.weight has shape \[32, 3\] \(rule: lora_B is \[out_features, r\]"):
        load_experts(Encoder().bert, [wrong_r])
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    (garbage / "adapter_model.safetensors").write_bytes(b"\x80\x04not safetensors at all")
    with pytest.raises(AdapterError, match=r"garbage/adapter_model.safetensors: not a readable safetensors file"):
        load_experts(Encoder().bert, [garbage])
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    torch.save(good, pickled / "adapter_model.bin")
    with pytest.raises(AdapterError, match=r"adapters are read from safetensors only.*pickle"):
        load_experts(Encoder().bert, [pickled])
    ia3 = _write_adapter(tmp_path / "ia3", good, peft_type="IA3")
    with pytest.raises(AdapterError, match=r"ia3/adapter_config.json: peft_type 'IA3'"):
        load_experts(Encoder().bert, [ia3])
    stray = _write_adapter(tmp_path / "stray", {**good, "base_model.model.classifier.weight": torch.zeros(2, 32)})
    with pytest.raises(AdapterError, match=r"tensor 'base_model.model.classifier.weight' is not a LoRA factor"):
        load_experts(Encoder().bert, [stray])
    # a PEFT adapter applied to a model of another width
    other = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24
        )
    )
    with pytest.raises(AdapterError, match=r"adapter0\d*/adapter_model.safetensors: .* Linear\(16 -> 16\)"):
        load_experts(other, adapter_dirs[:1])
