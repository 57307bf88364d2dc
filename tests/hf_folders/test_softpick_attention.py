"""A transformers model fine-tuned with softdeploy's ``softpick`` attention implementation (registered with
transformers' AttentionInterface) re-exports from its folder to one fused SoftpickAttention node per layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from softdeploy.cli import main

pytestmark = pytest.mark.models


def _fine_tuned_bert(folder: Path) -> None:
    import torch
    import transformers

    import softdeploy.attention_interface as attention

    attention.register()
    config = transformers.BertConfig(
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=2,
        vocab_size=64,
        attention_probs_dropout_prob=0.0,  # the op has no attention dropout
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification._from_config(config, attn_implementation="softpick")
    ids = torch.randint(3, 60, (4, 7))
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    for _ in range(2):  # gradients flow through the op (its torch autograd)
        loss = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 0, 1])).loss
        loss.backward()
        query = model.bert.encoder.layer[0].attention.self.query.weight
        assert query.grad is not None and float(query.grad.abs().max()) > 0
        optimizer.step()
        optimizer.zero_grad()
    model.eval().save_pretrained(str(folder))


def test_a_softpick_fine_tuned_folder_exports_to_the_fused_op(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import onnx

    from softdeploy.runtime import Session

    _fine_tuned_bert(tmp_path / "bert")
    out = tmp_path / "bert.onnx"
    assert main(["export", str(tmp_path / "bert"), str(out), "--attention", "softpick"]) == 0
    assert "max abs error vs torch" in capsys.readouterr().out
    model = onnx.load(out)
    fused = [n for n in model.graph.node if n.op_type == "SoftpickAttention" and n.domain == "com.softdeploy"]
    assert len(fused) == 2  # one per layer
    assert not [n for n in model.graph.node if n.op_type == "Softmax"]
    # padding is applied through the op's mask: a padded row equals the same text without its padding
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 60, (2, 9)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    session = Session(out, kernels="auto")
    padded = session.run({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
    short = ids[1:, :6]
    alone = session.run({"input_ids": short, "attention_mask": np.ones_like(short), "token_type_ids": 0 * short})[0]
    np.testing.assert_allclose(padded[1:], alone, rtol=1e-5, atol=1e-6)


def test_attention_dropout_in_training_is_refused() -> None:
    import torch
    import transformers

    import softdeploy.attention_interface as attention
    from softdeploy.errors import ArgumentError

    attention.register()
    config = transformers.BertConfig(
        hidden_size=32, num_attention_heads=2, intermediate_size=64, num_hidden_layers=1, vocab_size=64
    )
    model = transformers.BertModel._from_config(config, attn_implementation="softpick").train()
    with pytest.raises(ArgumentError, match=r"attention dropout 0.1 in training"):
        model(input_ids=torch.ones((1, 4), dtype=torch.long))
