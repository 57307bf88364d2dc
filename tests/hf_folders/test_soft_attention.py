"""A transformers model fine-tuned with softdeploy's ``soft`` attention implementation (SOFT, registered with
transformers' AttentionInterface) re-exports from its folder to one fused NystromGaussianAttention node per layer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from softdeploy.cli import main

pytestmark = pytest.mark.models


def _config(**overrides: object) -> object:
    import transformers

    kwargs: dict[str, object] = {
        "hidden_size": 32,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "vocab_size": 64,
        "attention_probs_dropout_prob": 0.0,  # the op has no attention dropout
        "soft_landmarks": 4,  # fewer landmarks than tokens: the Nyström approximation, not the exact kernel
    }
    kwargs.update(overrides)
    return transformers.BertConfig(**kwargs)


def _fine_tuned_bert(folder: Path) -> None:
    import torch
    import transformers

    import softdeploy.attention_interface as attention

    attention.register()
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification._from_config(_config(), attn_implementation="soft")
    ids = torch.randint(3, 60, (4, 9))
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    for _ in range(2):  # gradients flow through the op (its torch autograd)
        loss = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 0, 1])).loss
        loss.backward()
        self_attention = model.bert.encoder.layer[0].attention.self
        assert self_attention.query.weight.grad is not None and float(self_attention.query.weight.grad.abs().max()) > 0
        assert float(self_attention.value.weight.grad.abs().max()) > 0
        assert self_attention.key.weight.grad is None  # K = Q: SOFT does not use the key projection
        optimizer.step()
        optimizer.zero_grad()
    model.eval().save_pretrained(str(folder))


def test_a_soft_fine_tuned_folder_exports_to_the_fused_op(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import onnx
    import torch
    import transformers

    import softdeploy.attention_interface as attention
    from softdeploy.ops import get
    from softdeploy.runtime import Session

    _fine_tuned_bert(tmp_path / "bert")
    assert json.loads((tmp_path / "bert" / "config.json").read_text())["soft_landmarks"] == 4
    out = tmp_path / "bert.onnx"
    assert main(["export", str(tmp_path / "bert"), str(out), "--attention", "soft"]) == 0
    assert "max abs error vs torch" in capsys.readouterr().out
    model = onnx.load(out)
    fused = [n for n in model.graph.node if n.op_type == "NystromGaussianAttention" and n.domain == "com.softdeploy"]
    assert len(fused) == 2  # one per layer
    assert not [n for n in model.graph.node if n.op_type == "Softmax"]

    rng = np.random.default_rng(0)
    ids = rng.integers(3, 60, (2, 11)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    session = Session(out, kernels="auto")
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    padded = session.run(feeds)[0]
    # onnxruntime equals torch eager within the op's float32 tolerance (per unit of V; V of this model is O(1))
    attention.register()
    eager = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(tmp_path / "bert"), use_safetensors=True, local_files_only=True, attn_implementation="soft"
    ).eval()
    with torch.no_grad():
        expected = eager(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()
    rtol, atol = get("NystromGaussianAttention").tolerance["float32"]
    np.testing.assert_allclose(padded, expected, rtol=rtol, atol=atol)
    # padding is applied by zeroing the padded keys' V rows and leaving them out of the landmarks: a padded row
    # equals the same text without its padding
    short = ids[1:, :7]
    alone = session.run({"input_ids": short, "attention_mask": np.ones_like(short), "token_type_ids": 0 * short})[0]
    np.testing.assert_allclose(padded[1:], alone, rtol=1e-5, atol=1e-6)


def test_soft_equals_the_op_on_the_layers_own_queries() -> None:
    """K = Q: the layer's output is the op applied to its queries, its (padding-zeroed) values and the queries'
    segment-mean landmarks; the key projection has no effect."""
    import torch
    import transformers

    import softdeploy.attention_interface as attention
    from softdeploy.ops import get

    attention.register()
    torch.manual_seed(1)
    model = transformers.BertModel._from_config(_config(num_hidden_layers=1), attn_implementation="soft").eval()
    layer = model.encoder.layer[0].attention.self
    x = torch.randn(2, 6, 32)
    valid = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    with torch.no_grad():
        q = layer.query(x).view(2, 6, 2, 16).transpose(1, 2)
        v = layer.value(x).view(2, 6, 2, 16).transpose(1, 2) * valid[:, None, :, None]
        # 4 landmarks over 6 tokens: runs [0], [1, 2], [3], [4, 5]; over 4 tokens: one token each
        runs = ([[0], [1, 2], [3], [4, 5]], [[0], [1], [2], [3]])
        lm = torch.stack([torch.stack([q[b, :, r].mean(1) for r in runs[b]], 1) for b in range(2)])
        expected = get("NystromGaussianAttention").reference(q.numpy(), v.numpy(), lm.numpy())[0]
        mask = valid[:, None, None, :].expand(2, 1, 6, 6)
        got, weights = attention.soft_attention_forward(layer, q, torch.randn_like(q), v, mask, scaling=16**-0.5)
    assert weights is None
    np.testing.assert_allclose(got.transpose(1, 2).numpy(), expected, rtol=1e-6, atol=1e-7)


def test_soft_takes_the_layers_scaling_and_grouped_value_heads() -> None:
    """A scaling s other than 1/sqrt(D) is SOFT's kernel exp(-s‖a - b‖² / 2): the op's exp(-‖·‖² / (2 sqrt D)) of
    Q scaled by sqrt(s sqrt(D)); one value head serving two query heads equals it repeated."""
    import torch
    import transformers

    import softdeploy.attention_interface as attention
    from softdeploy.ops import get

    attention.register()
    model = transformers.BertModel._from_config(_config(num_hidden_layers=1), attn_implementation="soft").eval()
    layer = model.encoder.layer[0].attention.self
    torch.manual_seed(2)
    q, v = torch.randn(1, 2, 8, 16), torch.randn(1, 1, 8, 16)
    s = 0.7
    scaled = q * (s * 16**0.5) ** 0.5
    lm = torch.stack([scaled[:, :, 2 * j : 2 * j + 2].mean(2) for j in range(4)], 2)  # 4 runs of 2 tokens
    expected = get("NystromGaussianAttention").reference(scaled.numpy(), v.expand(1, 2, 8, 16).numpy(), lm.numpy())[0]
    with torch.no_grad():
        got, _ = attention.soft_attention_forward(layer, q, q, v, None, scaling=s)
    np.testing.assert_allclose(got.transpose(1, 2).numpy(), expected, rtol=1e-6, atol=1e-7)


def test_masks_soft_cannot_take_and_dropout_in_training_are_refused() -> None:
    import torch
    import transformers

    import softdeploy.attention_interface as attention
    from softdeploy.errors import ArgumentError

    attention.register()
    model = transformers.BertModel._from_config(
        _config(num_hidden_layers=1, attention_probs_dropout_prob=0.1), attn_implementation="soft"
    ).train()
    with pytest.raises(ArgumentError, match=r"soft attention: attention dropout 0.1 in training"):
        model(input_ids=torch.ones((1, 4), dtype=torch.long))
    layer = model.encoder.layer[0].attention.self.eval()
    q = torch.randn(1, 2, 5, 16)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    with pytest.raises(ArgumentError, match=r"mask is not a key-padding mask \(rule: SOFT has no per-query mask"):
        attention.soft_attention_forward(layer, q, q, q, causal)
    with pytest.raises(ArgumentError, match=r"has 5 queries but 3 keys/values \(rule: SOFT is self-attention"):
        attention.soft_attention_forward(layer, q, q[:, :, :3], q[:, :, :3], None)
    decoder = transformers.GPT2Model._from_config(
        transformers.GPT2Config(n_embd=32, n_head=2, n_layer=1, vocab_size=64, attn_pdrop=0.0),
        attn_implementation="soft",
    ).eval()
    with pytest.raises(ArgumentError, match=r"soft attention: GPT2Attention is causal \(rule: SOFT is bidirectional"):
        decoder(input_ids=torch.ones((1, 4), dtype=torch.long))


def test_the_attention_choices_are_the_registered_implementations() -> None:
    from softdeploy.attention_interface import IMPLEMENTATIONS, register
    from softdeploy.workflow.spec import SCHEMA_PATH

    assert register() == IMPLEMENTATIONS and "soft" in IMPLEMENTATIONS
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["$defs"]["attention"]["enum"] == ["eager", *IMPLEMENTATIONS]
    with pytest.raises(SystemExit):
        main(["export", "folder", "out.onnx", "--attention", "nystrom"])
