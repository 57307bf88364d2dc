"""PEFT adapters that must be refused before they reach a model -- non-finite or zero lora_alpha, NaN / inf factors,
empty dimensions, repeated keys in the safetensors header or in adapter_config.json -- each with an AdapterError
naming the file, the tensor or key, and the rule; and wrapping that is all-or-nothing, so a failed call can be
retried on the same model."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from softdeploy.errors import AdapterError, ArgumentError
from softdeploy.lora import LoRAMixerLinear, load_experts, mixers, read_adapter, wrap
from softdeploy.lora import mixer as mixer_module

# Without these the module is skipped, naming the extra that installs them (CI installs both).
peft = pytest.importorskip("peft", reason='needs peft, which the `test` extra pins: pip install ".[test]"')
transformers = pytest.importorskip("transformers", reason='needs the `models` extra: pip install ".[models]"')

pytestmark = [pytest.mark.models, pytest.mark.peft]

Q0 = "base_model.model.encoder.layer.0.attention.self.query"
Q1 = "base_model.model.encoder.layer.1.attention.self.query"


def bert() -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    return transformers.BertModel(cfg, add_pooling_layer=False).eval()


def factors(*modules: str, r: int = 2, width: int = 32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    out = {}
    for m in modules:
        out[f"{m}.lora_A.weight"] = torch.randn(r, width, generator=g)
        out[f"{m}.lora_B.weight"] = torch.randn(width, r, generator=g) * 0.1
    return out


def write(d: Path, tensors: dict[str, torch.Tensor] | None = None, config: str | None = None, **cfg: object) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    text = config if config is not None else json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4, **cfg})
    (d / "adapter_config.json").write_text(text)
    save_file(tensors if tensors is not None else factors(Q0), str(d / "adapter_model.safetensors"))
    return d


def state(model: nn.Module) -> dict[str, tuple[torch.Tensor, bool]]:
    return {k: (p.detach().clone(), p.requires_grad) for k, p in model.named_parameters()}


def same(a: dict[str, tuple[torch.Tensor, bool]], b: dict[str, tuple[torch.Tensor, bool]]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k][0], b[k][0]) and a[k][1] == b[k][1] for k in a)


@pytest.mark.parametrize("alpha", ["0", "0.0", "-4", "NaN", "Infinity", "-Infinity", '"8"', "true", "null"])
def test_lora_alpha_must_be_a_finite_positive_number(tmp_path: Path, alpha: str) -> None:
    d = write(tmp_path / "a", config='{"peft_type": "LORA", "r": 2, "lora_alpha": ' + alpha + "}")
    with pytest.raises(AdapterError, match=r"a/adapter_config.json: lora_alpha .* \(rule: lora_alpha is a finite"):
        read_adapter(d)


def test_missing_lora_alpha_is_peft_default(tmp_path: Path) -> None:
    # PEFT reads an adapter_config.json without lora_alpha with LoraConfig's default, not alpha = r
    d = write(tmp_path / "a", config='{"peft_type": "LORA", "r": 2}')
    default = peft.LoraConfig.__dataclass_fields__["lora_alpha"].default
    assert read_adapter(d).scaling == default / 2


@pytest.mark.parametrize("r", ["0", "-1", "2.5", "true", '"2"'])
def test_rank_is_an_integer_of_at_least_one(tmp_path: Path, r: str) -> None:
    d = write(tmp_path / "a", config='{"peft_type": "LORA", "lora_alpha": 4, "r": ' + r + "}")
    with pytest.raises(AdapterError, match=r"adapter_config.json: r .* \(rule: r is an integer >= 1\)"):
        read_adapter(d)


@pytest.mark.parametrize(("which", "value"), [("lora_A", math.nan), ("lora_B", math.inf), ("lora_B", -math.inf)])
def test_non_finite_factors_are_refused_naming_file_and_tensor(tmp_path: Path, which: str, value: float) -> None:
    t = factors(Q0)
    t[f"{Q0}.{which}.weight"][1, 0] = value
    d = write(tmp_path / "nan", t)
    with pytest.raises(
        AdapterError,
        match=rf"nan/adapter_model.safetensors: tensor '{Q0}.{which}.weight' holds 1 non-finite value.*rule",
    ):
        load_experts(bert(), [d])


def test_scaled_factor_overflowing_float32_is_refused(tmp_path: Path) -> None:
    t = factors(Q0, r=1)
    t[f"{Q0}.lora_B.weight"].fill_(10.0)
    d = write(tmp_path / "big", t, r=1, lora_alpha=1e38)
    with pytest.raises(AdapterError, match=r"big/adapter_model.safetensors: .*lora_B.weight times the scaling 1e\+38"):
        load_experts(bert(), [d])


def test_empty_dimension_is_refused_from_the_header(tmp_path: Path) -> None:
    t = factors(Q0)
    t[f"{Q0}.lora_A.weight"] = torch.zeros(2, 0)
    d = write(tmp_path / "empty", t)
    with pytest.raises(AdapterError, match=rf"empty/adapter_model.safetensors: tensor '{Q0}.lora_A.weight' has shape"):
        read_adapter(d)


def _header_file(path: Path, entries: list[tuple[str, dict[str, object]]], data: bytes) -> None:
    """A safetensors file whose JSON header is written by hand (json.dumps cannot repeat a key)."""
    body = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in entries) + "}"
    raw = body.encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_repeated_tensor_name_in_the_header_is_refused(tmp_path: Path) -> None:
    a, b = torch.ones(2, 32), torch.full((32, 2), 0.5)
    a_bytes, b_bytes = a.numpy().tobytes(), b.numpy().tobytes()
    n_a = len(a_bytes)
    entry_a = {"dtype": "F32", "shape": [2, 32], "data_offsets": [0, n_a]}
    entry_b = {"dtype": "F32", "shape": [32, 2], "data_offsets": [n_a, n_a + len(b_bytes)]}
    d = tmp_path / "dup"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4}))
    # the second lora_A entry points at the same bytes: the Rust reader keeps one of them without a word
    _header_file(
        d / "adapter_model.safetensors",
        [(f"{Q0}.lora_A.weight", entry_a), (f"{Q0}.lora_B.weight", entry_b), (f"{Q0}.lora_A.weight", entry_a)],
        a_bytes + b_bytes,
    )
    with pytest.raises(
        AdapterError, match=rf"dup/adapter_model.safetensors: the header names '{Q0}.lora_A.weight' twice"
    ):
        read_adapter(d)


def test_repeated_key_in_adapter_config_is_refused(tmp_path: Path) -> None:
    d = write(tmp_path / "cfg", config='{"peft_type": "LORA", "r": 2, "lora_alpha": 4, "r": 4}')
    with pytest.raises(AdapterError, match=r"cfg/adapter_config.json: key 'r' appears twice"):
        read_adapter(d)


def test_failing_later_module_leaves_the_model_as_it_was_and_a_retry_works(tmp_path: Path) -> None:
    model = bert()
    before = state(model)
    bad = factors(Q0, Q1)
    bad[f"{Q1}.lora_B.weight"] = torch.zeros(30, 2)  # layer 1 (wrapped after layer 0) does not fit
    with pytest.raises(AdapterError, match=r"layer.1.attention.self.query.lora_B.weight has shape \[30, 2\]"):
        load_experts(model, [write(tmp_path / "bad", bad)])
    assert not mixers(model)
    assert same(state(model), before)  # nothing replaced, nothing frozen
    names = load_experts(model, [write(tmp_path / "good", factors(Q0, Q1))])
    assert sorted(mixers(model)) == names == [Q0[len("base_model.model.") :], Q1[len("base_model.model.") :]]


def test_wrap_is_all_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    model = bert()
    before = state(model)
    real_init = LoRAMixerLinear.__init__
    calls = [0]

    def failing_init(self: LoRAMixerLinear, *args: object, **kwargs: object) -> None:
        calls[0] += 1
        if calls[0] == 3:
            raise MemoryError("no room for the third mixer")
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mixer_module.LoRAMixerLinear, "__init__", failing_init)
    with pytest.raises(MemoryError):
        wrap(model, num_experts=2, rank=2)
    assert calls[0] == 3
    assert not mixers(model)
    assert same(state(model), before)
    monkeypatch.setattr(mixer_module.LoRAMixerLinear, "__init__", real_init)
    assert len(wrap(model, num_experts=2, rank=2)) == 8


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"rank": 0}, r"rank 0 is out of range"),
        ({"alpha": 0.0}, r"alpha 0.0 is out of range"),
        ({"alpha": math.nan}, r"alpha nan is out of range"),
        ({"alpha": math.inf}, r"alpha inf is out of range"),
        ({"num_experts": 0}, r"num_experts 0 is out of range"),
    ],
)
def test_wrap_arguments_are_checked_before_any_module_changes(kwargs: dict[str, float], rule: str) -> None:
    model = bert()
    before = state(model)
    with pytest.raises(ArgumentError, match=rule):
        wrap(model, **kwargs)  # type: ignore[arg-type]
    assert same(state(model), before)
