"""A distilled student exports to the ONNX interface the MiniLM cases use and computes what torch computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from softdeploy.distill.run import export_encoder
from softdeploy.runtime.session import Session

from .conftest import tiny_encoder

pytestmark = pytest.mark.models  # BERT students need transformers, real ones the weight packages


def test_export_encoder_matches_torch(tmp_path: Path) -> None:
    model = tiny_encoder(2)
    path = tmp_path / "student.onnx"
    export_encoder(model, path)
    ids = torch.tensor([[101, 2054, 2003, 1037, 3274, 102], [101, 7592, 102, 0, 0, 0]])
    mask = (ids != 0).to(torch.int64)
    with torch.no_grad():
        want_tok, want_sent = model(ids, mask)
    sess = Session(str(path), kernels="portable")
    got_tok, got_sent = sess.run(
        {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}, ["token_embeddings", "sentence_embedding"]
    )
    valid = mask.numpy().astype(bool)
    assert np.abs(got_tok[valid] - want_tok.numpy()[valid]).max() < 1e-4
    assert np.abs(got_sent - want_sent.numpy()).max() < 1e-4
