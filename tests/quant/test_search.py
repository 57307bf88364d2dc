from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from quant.tiny import feeds, mlp_with_custom_op
from softdeploy.quant import QuantConfig, budget_search, output_cosine
from softdeploy.runtime import Session


def _evaluator(src: Path):  # type: ignore[no-untyped-def]
    data = feeds(4, seed=9)
    ref = [Session(src).run(f)[0] for f in data]
    return lambda path: output_cosine(ref, [Session(path).run(f)[0] for f in data])


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_finds_the_sensitive_node(tmp_path: Path, mode: str) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(mlp_with_custom_op(with_function=True, outlier=200.0), src)
    result = budget_search(
        src,
        tmp_path / "out.onnx",
        QuantConfig(mode, per_channel=False),  # type: ignore[arg-type]
        _evaluator(src),
        max_drop=0.01,
        probe=feeds(2, seed=3),
        calibration=feeds(4),
        metric_name="cosine",
        fp32_metric=1.0,
    )
    assert result.full_int8_metric < 0.99  # all-int8 is over budget ...
    assert [s.node for s in result.kept] == ["fc2"]  # ... and the outlier layer is the culprit
    assert result.sensitivities[0].node == "fc2" and result.sensitivities[0].rank == 1
    assert result.met and result.final_metric >= 0.99
    assert result.model.path == tmp_path / "out.onnx" and result.model.path.is_file()
    assert result.model.float_nodes == ["fc2"]
    text = "\n".join(result.explain())
    assert "keep fc2 (MatMul) in float" in text and "rank 1 of 3" in text


def test_nothing_kept_when_within_budget(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(mlp_with_custom_op(with_function=True), src)
    result = budget_search(
        src, tmp_path / "out.onnx", QuantConfig("dynamic"), _evaluator(src), max_drop=0.01, probe=feeds(1)
    )
    assert result.met and result.kept == [] and result.sensitivities == [] and result.trials == []
    assert "nothing kept in float" in "\n".join(result.explain())


def test_budget_not_met_is_reported(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(mlp_with_custom_op(with_function=True, outlier=200.0), src)
    result = budget_search(
        src,
        tmp_path / "out.onnx",
        QuantConfig("dynamic", per_channel=False),
        lambda p: 0.0 if p != src else 1.0,  # no quantized model can ever be good enough
        max_drop=0.01,
        probe=feeds(1),
    )
    assert not result.met
    assert len(result.trials) >= 2 and result.trials[-1].kept_float == 3
    assert "NOT met" in "\n".join(result.explain())


def test_invalid_budget(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_drop"):
        budget_search(tmp_path / "m.onnx", tmp_path / "o.onnx", QuantConfig(), lambda p: 1.0, max_drop=-1, probe=[])


def test_node_scope_reads_the_exporters_module_path() -> None:
    from onnx import StringStringEntryProto

    from softdeploy.quant.quantize import node_scope

    model = mlp_with_custom_op(with_function=True)
    fc2 = next(n for n in model.graph.node if n.name == "fc2")
    fc2.metadata_props.append(
        StringStringEntryProto(
            key="pkg.torch.onnx.name_scopes", value="['', 'm', 'm.layer.0.output.dense', 'linear_5']"
        )
    )
    assert node_scope(model, "fc2") == "m.layer.0.output.dense"
    assert node_scope(model, "fc1") == ""
