"""The soft_thinking compare case, on a small model trained for a few steps (the real one trains for minutes)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.models  # transformers, chatterbot-corpus


@pytest.mark.slow
def test_the_case_runs_every_variant_and_torch_gives_the_same_traces(tmp_path, monkeypatch):
    from softdeploy.cache import CACHE_ENV
    from softdeploy.compare.runner import run_compare
    from softdeploy.progress import SilentProgress
    from softdeploy_cases.soft_thinking import TrainConfig
    from softdeploy_cases.soft_thinking_case import SoftThinkingCase

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    small = TrainConfig(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, steps=30, batch_size=8)
    case = SoftThinkingCase(questions=8, steps=10, train=small)
    result = run_compare(
        case,
        tmp_path / "out",
        variants=("torch-fp32", "ort-fp32-stock", "ort-fp32", "ort-int8-dynamic"),
        rounds=1,
        round_seconds=0.01,
        progress=SilentProgress(),
    )
    rows = {r["variant"]: r for r in result.rows()}
    assert set(rows) == {"torch-fp32", "ort-fp32-stock", "ort-fp32", "ort-int8-dynamic"}
    assert rows["ort-fp32"]["trace agreement"] == 1.0
    assert [f.met for f in result.floors] == [True, True], result.floors
    assert 0.0 <= rows["ort-int8-dynamic"]["trace agreement"] <= 1.0
