"""The README's demo end to end: trained, exported, and the three variants agree."""

from __future__ import annotations

import pytest

from softdeploy.demo import run_demo


@pytest.mark.slow
def test_demo_trains_exports_and_agrees(tmp_path):
    results = run_demo(threads=1, out=str(tmp_path))
    assert (tmp_path / "softpick_classifier.onnx").is_file()
    assert set(results) == {"torch eager", "ORT, stock ops", "ORT + softdeploy"}
    eager = results["torch eager"]
    assert eager["top1"] > 0.5  # it learned (chance is 0.01)
    for name in ("ORT, stock ops", "ORT + softdeploy"):
        r = results[name]
        assert r["max_abs_diff"] < 1e-5, (name, r)
        assert r["top5_agreement"] == 1.0, (name, r)
        assert r["top1"] == eager["top1"]
