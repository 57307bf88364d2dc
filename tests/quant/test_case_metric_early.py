"""`quantize --case NAME --max-drop D --metric M`: a task metric the case does not declare is refused before the
case's model is prepared or exported; its agreement cosines and declared metrics go on to the budget search."""

from __future__ import annotations

from pathlib import Path

import pytest
from compare.tiny_case import TinyCase

from softdeploy.progress import SilentProgress
from softdeploy.quant import QuantConfig, QuantizationError
from softdeploy.workflow.quantize import quantize_case


def test_an_undeclared_metric_is_refused_before_the_export(tmp_path: Path) -> None:
    case = TinyCase()

    def export_fp32(path: Path) -> None:
        raise AssertionError("exported before the metric was checked")

    case.export_fp32 = export_fp32  # type: ignore[method-assign]
    with pytest.raises(QuantizationError, match=r"metric 'f1' is not measured by case tiny; choose from \['top-1"):
        quantize_case(
            case, tmp_path / "m.onnx", QuantConfig("dynamic"), max_drop=0.01, metric="f1", progress=SilentProgress()
        )
    assert not case.prepared


@pytest.mark.parametrize("metric", ["top-1 accuracy", "output cosine"])
def test_declared_metrics_and_agreement_cosines_reach_the_search(tmp_path: Path, metric: str) -> None:
    path, result = quantize_case(
        TinyCase(), tmp_path / "m.onnx", QuantConfig("dynamic"), max_drop=1.0, metric=metric, progress=SilentProgress()
    )
    assert path.is_file() and result.metric_name == metric  # type: ignore[union-attr]
