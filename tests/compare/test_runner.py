from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from compare.tiny_case import TinyCase
from softdeploy.compare import REFERENCE, VARIANTS, run_compare
from softdeploy.compare.case import Floor
from softdeploy.compare.report import print_table, to_markdown, write_reports
from softdeploy.errors import SoftdeployError
from softdeploy.progress import SilentProgress


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("compare")
    return run_compare(TinyCase(), out, threads=1, rounds=2, round_seconds=0.01, progress=SilentProgress()), out


def test_every_variant_is_measured(result) -> None:  # type: ignore[no-untyped-def]
    r, _ = result
    rows = r.rows()
    assert [row["variant"] for row in rows] == list(VARIANTS)
    ref = next(row for row in rows if row["variant"] == REFERENCE)
    assert ref["output cosine"] == pytest.approx(1.0) and ref["infer speed-up"] == pytest.approx(1.0)
    for row in rows:
        assert row["infer p50 ms"] > 0 and row["infer p90 ms"] >= row["infer p50 ms"]
        assert row["output cosine"] > 0.98  # fp32 variants agree; int8 ones are close
        assert row["top3 agreement"] > 0.6
        assert row["size MiB"] is None or row["size MiB"] > 0
    fp32_like = [row for row in rows if row["precision"] == "fp32"]
    assert all(row["output cosine"] > 0.99999 for row in fp32_like)
    static = next(v for v in r.variants if v.spec.name == "ort-int8-static")
    assert static.quantized is not None and static.quantized.calibration_kernels == "native"
    assert r.floors and r.floors[0].met
    assert set(r.environment) >= {"cpu", "isa", "packages", "threads"}


def test_reports_are_written(result) -> None:  # type: ignore[no-untyped-def]
    r, out = result
    paths = write_reports(r, out)
    with open(paths["csv"]) as f:
        assert [row["variant"] for row in csv.DictReader(f)] == list(VARIANTS)
    data = json.loads(paths["json"].read_text())
    assert data["case"] == "tiny" and len(data["rows"]) == len(VARIANTS)
    assert "ort-int8-static" in data["quantization"]
    # the int8 format chosen for this CPU, and why, in both reports (softdeploy.quant.formats)
    from softdeploy.quant.formats import int8_format

    want = int8_format().line("dynamic")
    assert data["quantization"]["ort-int8-dynamic"]["int8_format"] == want
    assert data["quantization"]["ort-int8-dynamic"]["reduce_range"] == int8_format().reduce_range
    assert data["quantization"]["ort-int8-dynamic"]["weights"] == int8_format().weights_for("dynamic")
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"
    md = to_markdown(r)
    assert "## Floors" in md and "ort-int8-dynamic" in md and "## Environment" in md
    assert f"  - {want}" in md


def test_terminal_table(result) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console

    r, _ = result
    console = Console(record=True, width=300)
    print_table(r, console)
    text = console.export_text()
    assert "ort-int8-static" in text and "floor worst output cosine" in text


@pytest.mark.parametrize("width", [80, 100, 300])
def test_terminal_table_fits_and_never_splits_a_number(result, width: int) -> None:  # type: ignore[no-untyped-def]
    """At 80 and 100 columns the summary used to fold numbers mid-digit ("0.8" over "912"): every cell of the table
    must appear whole on one line, and no line may be wider than the terminal."""
    from rich.console import Console

    from softdeploy.compare.report import _fmt, summary_columns

    r, _ = result
    console = Console(record=True, width=width)
    print_table(r, console)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    for row in r.rows():
        line = next(x for x in lines if f" {row['variant']} " in x)  # the variant's row of the first table
        assert line
        for c in summary_columns(r):
            cell = _fmt(row.get(c))
            assert any(cell in x for x in lines if row["variant"] in x), f"{c} = {cell} split at {width} columns"
    tables = text.count(r.title)
    assert (tables == 1) if width == 300 else (tables >= 2)


def test_a_case_without_floors_has_no_empty_floors_section(result) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    r, _ = result
    assert "## Floors" not in to_markdown(dataclasses.replace(r, floors=[]))


def test_unknown_variant(tmp_path: Path) -> None:
    with pytest.raises(SoftdeployError, match="unknown variant"):
        run_compare(TinyCase(), tmp_path, variants=["tvm-tuned"], progress=SilentProgress())


def test_subset_always_includes_reference(tmp_path: Path) -> None:
    r = run_compare(
        TinyCase(), tmp_path, variants=["ort-int8-dynamic"], rounds=1, round_seconds=0.0, progress=SilentProgress()
    )
    assert [v.spec.name for v in r.variants] == [REFERENCE, "ort-int8-dynamic"]


def test_a_retrained_model_is_exported_again(tmp_path: Path) -> None:
    """The fp32 export is keyed by content: new weights under the same case name and versions are
    exported again (the stale export once showed torch top-1 0.988 next to onnxruntime 0.381)."""
    import onnx

    case = TinyCase()
    variants = ["torch-fp32", "ort-fp32"]
    first = run_compare(case, tmp_path, variants=variants, rounds=1, round_seconds=0.01, progress=SilentProgress())
    assert first.warnings == []
    w1 = next(i for i in case.model.graph.initializer if i.name == "W1")
    retrained = onnx.numpy_helper.from_array(-onnx.numpy_helper.to_array(w1), "W1")
    w1.CopyFrom(retrained)  # "retraining": the torch runner reads the same weights
    second = run_compare(case, tmp_path, variants=variants, rounds=1, round_seconds=0.01, progress=SilentProgress())
    assert second.warnings == []
    torch_row = next(r for r in second.rows() if r["variant"] == "torch-fp32")
    assert torch_row["output cosine"] > 0.9999


class _WrongExport(TinyCase):
    """An export that does not compute what the torch model does."""

    def export_fp32(self, path: Path) -> None:
        import onnx

        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        for i in model.graph.initializer:
            if i.name == "W2":
                i.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(i)[::-1].copy(), "W2"))
        onnx.save(model, path)


def test_torch_and_onnxruntime_disagreeing_is_flagged_loudly(tmp_path: Path) -> None:
    from rich.console import Console

    r = run_compare(
        _WrongExport(),
        tmp_path,
        variants=["torch-fp32", "ort-fp32"],
        rounds=1,
        round_seconds=0.01,
        progress=SilentProgress(),
    )
    assert r.warnings and "DISAGREE" in r.warnings[0] and "torch-fp32" in r.warnings[0]
    assert "**WARNING**" in to_markdown(r)
    console = Console(record=True, width=200)
    print_table(r, console)
    assert "WARNING" in console.export_text()


def test_variant_names_are_never_truncated() -> None:
    from rich.console import Console

    r = run_compare(
        TinyCase(), Path(__import__("tempfile").mkdtemp()), rounds=1, round_seconds=0.01, progress=SilentProgress()
    )
    console = Console(record=True, width=80)
    print_table(r, console)
    text = console.export_text()
    for name in VARIANTS:
        assert name in text, f"{name} cut in an 80-column terminal"


class _WithSections(TinyCase):
    """A case with the optional ``sections`` hook: its sections go into the report and results.json, and floors
    (called after it) see what it measured."""

    def sections(self, result, progress):  # type: ignore[no-untyped-def]
        from softdeploy.compare.case import Section

        self.seen = sorted(v.spec.name for v in result.variants)
        return [Section("Per class", "| class | n |\n|---|---|\n| a | 3 |")]

    def floors(self, rows):  # type: ignore[no-untyped-def]
        return [*super().floors(rows), Floor("sections ran first", None, "yes", bool(getattr(self, "seen", None)))]


def test_case_sections_reach_the_report(tmp_path: Path) -> None:
    case = _WithSections()
    r = run_compare(
        case, tmp_path, variants=["ort-int8-dynamic"], rounds=1, round_seconds=0.0, progress=SilentProgress()
    )
    assert case.seen == [REFERENCE, "ort-int8-dynamic"]
    assert r.floors[-1].met
    md = to_markdown(r)
    assert "## Per class\n\n| class | n |" in md and md.index("## Per class") > md.index("## Results")
    assert r.to_json()["sections"] == [{"title": "Per class", "markdown": "| class | n |\n|---|---|\n| a | 3 |"}]
