"""Real architectures from transformers configs (tiny, random weights) through the user's path with no factory code:
``softdeploy export FOLDER`` -> validated against torch -> ``softdeploy quantize`` -> ``softdeploy compare``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from hf_folders.tiny import ARCHITECTURES, EXPECTED, inputs_for, write_folder
from softdeploy.cli import main

pytestmark = pytest.mark.models


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_folder_exports_validated_then_quantizes_and_compares(
    arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from softdeploy.export.hf import inspect_folder, load_folder
    from softdeploy.runtime import Session

    monkeypatch.chdir(tmp_path)
    folder = write_folder(arch, tmp_path / arch)
    assert main(["export", str(folder), "fp32.onnx"]) == 0
    out = capsys.readouterr().out
    task, outputs = EXPECTED[arch]
    assert f"task {task}" in out
    error = float(re.search(r"max abs error vs torch: (\S+)", out).group(1))  # type: ignore[union-attr]
    assert error < 1e-4, out
    model = onnx.load("fp32.onnx")
    assert tuple(o.name for o in model.graph.output) == outputs
    first = model.graph.input[0].type.tensor_type.shape.dim
    assert first[0].dim_param == "batch" and (arch == "vit" or first[1].dim_param == "seq")

    # another batch and another length than the export's (dynamic axes) agree with transformers in torch
    feeds = inputs_for(arch, n=3, seq=11, seed=7)
    session = Session("fp32.onnx", kernels="auto")
    got = session.run(feeds)
    module = load_folder(inspect_folder(folder)).module
    with torch.no_grad():
        want = module(*[torch.from_numpy(feeds[name]) for name in session.input_names])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-5)

    np.savez("eval.npz", **inputs_for(arch))
    assert main(["quantize", "fp32.onnx", "--data", "eval.npz", "-o", "int8.onnx"]) == 0
    assert Path("int8.onnx").is_file()
    variants = "ort-fp32,ort-int8-dynamic"
    args = ["compare", "fp32.onnx", "--data", "eval.npz", "--metric", "cosine", "--variants", variants, "--quick"]
    assert main([*args, "--out", "results"]) == 0
    rows = {r["variant"]: r for r in json.loads(Path("results/fp32/results.json").read_text())["rows"]}
    assert rows["ort-int8-dynamic"]["cosine"] > 0.95


@pytest.mark.slow
def test_a_decoder_folder_exports_with_its_kv_cache_then_quantizes_and_compares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Llama-style (grouped-query attention, RMSNorm, rotary positions): ``--task causal-lm-with-past`` writes the
    prefill and step graphs (softdeploy.export.decoder); the step fed the prefill's cache gives the logits that the
    full sequence gives in transformers; the step graph then quantizes and compares like any model."""
    import torch
    import transformers

    from softdeploy.runtime import Session

    monkeypatch.chdir(tmp_path)
    folder = write_folder("llama", tmp_path / "llama")
    assert main(["export", str(folder), "decoder", "--task", "causal-lm-with-past"]) == 0
    out = capsys.readouterr().out
    assert float(re.search(r"max abs error vs torch \(logits and cache\): (\S+)", out).group(1)) < 1e-4  # type: ignore[union-attr]

    n, past = 8, 5
    ids = np.random.default_rng(3).integers(5, 128, (n, past + 1)).astype(np.int64)
    prefill = Session("decoder/prefill.onnx", kernels="auto")
    positions = np.broadcast_to(np.arange(past), (n, past)).astype(np.int64)
    cache = prefill.run(
        {"input_ids": ids[:, :past], "attention_mask": np.ones((n, past), np.int64), "position_ids": positions}
    )[1:]
    step_feeds = {
        "input_ids": ids[:, past:],
        "attention_mask": np.ones((n, past + 1), np.int64),
        "position_ids": np.full((n, 1), past, np.int64),
        **dict(zip([name for name in Session("decoder/step.onnx").input_names[3:]], cache, strict=True)),
    }
    step_logits = Session("decoder/step.onnx", kernels="auto").run(step_feeds, ["logits"])[0]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids), use_cache=False).logits[:, -1:].numpy()
    np.testing.assert_allclose(step_logits, want, rtol=1e-4, atol=1e-5)

    np.savez("step.npz", **step_feeds)
    assert main(["quantize", "decoder/step.onnx", "--data", "step.npz", "-o", "step.int8.onnx"]) == 0
    args = ["compare", "decoder/step.onnx", "--data", "step.npz", "--metric", "cosine=logits", "--quick"]
    assert main([*args, "--variants", "ort-fp32,ort-int8-dynamic", "--out", "results"]) == 0
    rows = {r["variant"]: r for r in json.loads(Path("results/step/results.json").read_text())["rows"]}
    assert rows["ort-int8-dynamic"]["cosine"] > 0.95
