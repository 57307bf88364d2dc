"""The decoder export (prefill + step graphs with a flat KV cache) against torch eager."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from softdeploy.errors import ArgumentError, ExportError, OverwriteError
from softdeploy.export.decoder import DecoderExport, decoder_graph, export_decoder, positions
from softdeploy.runtime import Session

pytestmark = pytest.mark.models  # transformers

# float32 graphs against float32 eager: reassociation only (measured ~1e-6 on these 2-layer models)
ATOL = 1e-4


def _inputs(export: DecoderExport, model, batch: int, seq: int, past: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, export.vocab_size, (batch, seq))
    table = export.load_embedding()
    first = table[ids] if export.input_kind == "inputs_embeds" else ids.astype(np.int64)
    mask = np.ones((batch, past + seq), np.int64)
    if batch > 1:
        mask[1, : min(2, past + seq - 1)] = 0  # row 1 left-padded
    pos = np.ascontiguousarray(positions(mask)[:, past:])
    shape = (batch, export.num_kv_heads, past, export.head_dim)
    pasts = [rng.standard_normal(shape).astype(np.float32) for _ in range(2 * export.num_layers if past else 0)]
    return [first, mask, pos, *pasts]


def _check(export: DecoderExport, model, batch: int, seq: int, past: int) -> None:
    graph = export.step if past else export.prefill
    sess = Session(graph, kernels="auto")
    arrays = _inputs(export, model, batch, seq, past, seed=batch * 100 + seq)
    names = [export.input_kind, "attention_mask", "position_ids", *(export.past_names if past else [])]
    got = sess.run(dict(zip(names, arrays, strict=True)))
    module = decoder_graph(model, export.num_layers, input_kind=export.input_kind, with_past=bool(past))
    with torch.no_grad():
        ref = [t.numpy() for t in module(*map(torch.from_numpy, arrays))]
    assert sess.output_names == ["logits", *export.present_names]
    keep = arrays[1].astype(bool)
    logits_err = np.abs(got[0] - ref[0])[keep[:, past:]].max()
    assert logits_err <= ATOL, logits_err
    assert got[0].shape == (batch, seq, export.vocab_size)
    for a, b in zip(got[1:], ref[1:], strict=True):
        assert a.shape == (batch, export.num_kv_heads, past + seq, export.head_dim)
        assert np.abs(a - b).transpose(0, 2, 1, 3)[keep].max() <= ATOL


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("seq", [1, 4])
def test_prefill_and_step_match_eager(tiny_export, kind, batch, seq):
    model, export = tiny_export(kind)
    _check(export, model, batch, seq, past=0)
    _check(export, model, batch, seq, past=5)
    assert all(v <= 1e-3 for v in export.max_error.values()), export.max_error


@pytest.mark.slow
def test_input_ids_variant(tiny_export):
    model, export = tiny_export("qwen2", inputs_embeds=False)
    assert export.input_kind == "input_ids"
    for batch, seq in ((1, 1), (2, 3)):
        _check(export, model, batch, seq, past=0)
        _check(export, model, batch, seq, past=3)


def test_graphs_keep_batch_and_lengths_dynamic(tiny_export):
    import onnx

    _, export = tiny_export("llama")
    step = onnx.load(str(export.step), load_external_data=False)
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in step.graph.input}
    assert dims["inputs_embeds"][:2] == ["batch", "sequence"]
    assert dims["past_key_values.0.key"][0] == "batch" and dims["past_key_values.0.key"][2] == "past_sequence"
    assert isinstance(dims["attention_mask"][1], str)


def test_manifest_round_trips(tiny_export):
    _, export = tiny_export("llama")
    back = DecoderExport.load(export.folder)
    assert back == export
    assert back.load_embedding().shape == (export.vocab_size, export.hidden_size)
    assert json.loads((export.folder / "decoder.json").read_text())["files"]["step"] == "step.onnx"


def test_refuses_overwrite_and_bad_examples(tiny_export, tmp_path):
    model, export = tiny_export("llama")
    with pytest.raises(OverwriteError, match="overwrite"):
        export_decoder(model, export.folder)
    with pytest.raises(ArgumentError, match="example_length 1"):
        export_decoder(model, tmp_path / "x", example_length=1)
    with pytest.raises(ArgumentError, match=r"no config\.json"):
        export_decoder(tmp_path, tmp_path / "y")
    with pytest.raises(ArgumentError, match="not a transformers causal LM"):
        export_decoder(torch.nn.Linear(2, 2), tmp_path / "z")
    with pytest.raises(ExportError, match=r"no decoder\.json"):
        DecoderExport.load(tmp_path)
