"""Quantizing for a deployment target (softdeploy.quant.formats.TARGETS): the format each target gets, the metadata
the model records, the same integers on every CPU class this machine can present, Session's warning when a model
runs a slower path here than on its target, and `softdeploy doctor MODEL`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from softdeploy.quant import QuantConfig, QuantizationError, quantize
from softdeploy.quant.formats import (
    FORMAT_KEY,
    PATH_WIDE,
    TARGET_KEY,
    TARGETS,
    WEIGHTS,
    int8_cpu_class,
    mismatch_line,
    model_int8_metadata,
    target_weights,
)
from softdeploy.runtime import library_status

ROOT = Path(__file__).resolve().parents[2]
native = pytest.mark.skipif(
    library_status().info is None or "RowwiseInt8MatMul" not in library_status().info.ops,
    reason="softdeploy's kernel library (RowwiseInt8MatMul) does not load here",
)


def _fc(k: int = 64, n: int = 32, seed: int = 0) -> Any:
    """Y = X W + b with full-range normal weights: plain 8-bit weights leave the vpmaddubsw lane bound."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["h"], name="fc"), helper.make_node("Add", ["h", "b"], ["Y"])],
        "fc",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _x(m: int = 6, k: int = 64, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)


def _models(tmp_path: Path) -> dict[str, Path]:
    """One model per target: dynamic for vnni (rowwise-8-bit), portable and avx2 (lane-bounded), static for
    portable (pair-bounded QDQ)."""
    fc = _fc()
    out = {}
    for target in ("vnni", "portable", "avx2"):
        out[f"dynamic {target}"] = quantize(fc, tmp_path / f"dyn_{target}.onnx", QuantConfig(target=target)).path
    cal = [{"X": _x(8, seed=s)} for s in range(4)]
    out["static portable"] = quantize(
        fc, tmp_path / "static_portable.onnx", QuantConfig("static", target="portable"), calibration=cal
    ).path
    return out


def test_target_weights_follow_the_table() -> None:
    assert target_weights("auto") == (None, "")
    assert target_weights("portable", "dynamic")[0] == "lane-bounded"
    assert target_weights("portable", "static")[0] == "pair-bounded"
    assert target_weights("vnni", "dynamic")[0] == "rowwise-8-bit"
    assert target_weights("vnni", "static")[0] == "8-bit"
    assert target_weights("avx2", "dynamic")[0] == "lane-bounded"
    assert target_weights("avx512", "static")[0] == "pair-bounded"
    with pytest.raises(ValueError, match="not one of"):
        target_weights("zen3")


@native
def test_each_target_writes_its_format_and_metadata(tmp_path: Path) -> None:
    fc = _fc()
    want = {"vnni": "rowwise-8-bit", "portable": "lane-bounded", "avx2": "lane-bounded", "avx512": "lane-bounded"}
    for target, weights in want.items():
        q = quantize(fc, tmp_path / f"{target}.onnx", QuantConfig(target=target))
        assert q.weights == weights
        # the format line names the format used first, then why
        assert q.int8_format.startswith(f"int8 format: {WEIGHTS[weights]}"), q.int8_format
        assert f"target {target}" in q.int8_format
        meta = model_int8_metadata(onnx.load(q.path))
        assert meta == {TARGET_KEY: target, FORMAT_KEY: weights}
    auto = quantize(fc, tmp_path / "auto.onnx", QuantConfig())
    assert model_int8_metadata(onnx.load(auto.path)) == {TARGET_KEY: int8_cpu_class(), FORMAT_KEY: auto.weights}
    assert [n.op_type for n in fc.graph.node] == ["MatMul", "Add"]  # the caller's model is left as it was


def test_static_portable_is_pair_bounded(tmp_path: Path) -> None:
    cal = [{"X": _x(8, seed=s)} for s in range(4)]
    q = quantize(_fc(), tmp_path / "s.onnx", QuantConfig("static", target="portable"), calibration=cal)
    assert q.weights == "pair-bounded" and q.int8_format.startswith(f"int8 format: {WEIGHTS['pair-bounded']}")
    assert model_int8_metadata(onnx.load(q.path)) == {TARGET_KEY: "portable", FORMAT_KEY: "pair-bounded"}


def test_unknown_target_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(QuantizationError, match=r"^target 'zen3' is not one of \[") as e:
        quantize(_fc(), tmp_path / "x.onnx", QuantConfig(target="zen3"))
    assert "\n" not in str(e.value)
    # compare and Case runs build their own configs: SOFTDEPLOY_INT8_TARGET gives them the target
    monkeypatch.setenv("SOFTDEPLOY_INT8_TARGET", "portable")
    assert QuantConfig().resolved_target() == "portable"
    monkeypatch.setenv("SOFTDEPLOY_INT8_TARGET", "nope")
    with pytest.raises(QuantizationError, match="SOFTDEPLOY_INT8_TARGET 'nope'"):
        QuantConfig().resolved_target()


_RUN = """
import json, sys, warnings
import numpy as np
from softdeploy.runtime import Session, library_status
from softdeploy.quant.formats import int8_cpu_class
paths, x, out = json.loads(sys.argv[1]), np.load(sys.argv[2]), sys.argv[3]
res = {"class": int8_cpu_class(), "isa": library_status().info.isa_selected, "warn": {}}
for name, path in paths.items():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        y = Session(path).run({"X": x})[0]
    np.save(f"{out}/{name.replace(' ', '_')}.npy", y)
    res["warn"][name] = [str(r.message) for r in rec if "lane bound" in str(r.message)]
print(json.dumps(res))
"""


def _run_class(
    tmp_path: Path, paths: dict[str, Path], label: str, env: dict[str, str] | None = None, shim=None, mask=None
):
    out = tmp_path / label
    out.mkdir()
    x = tmp_path / "x.npy"
    np.save(x, _x())
    args = [json.dumps({k: str(v) for k, v in paths.items()}), str(x), str(out)]
    if shim is not None:  # cpuid_shim.run takes code only: pass the arguments through sys.argv
        code = f"import sys; sys.argv = ['-c', *{args!r}]\n" + _RUN
        done = shim.run(code, mask=mask)
    else:
        full = dict(os.environ, **(env or {}))
        if env is None:
            full.pop("SOFTDEPLOY_TEST_CPU", None)
        full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
        done = subprocess.run([sys.executable, "-c", _RUN, *args], env=full, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    ys = {name: np.load(out / f"{name.replace(' ', '_')}.npy") for name in paths}
    return info, ys


@native
def test_a_model_for_each_target_runs_the_same_integers_on_every_class(tmp_path: Path, cpuid_shim) -> None:
    """Every target's model gives the same outputs on every class this machine can present (the integers are exact
    on every kernel path; RowwiseInt8MatMul's float epilogue is the same on every variant), and those match the
    function bodies (the reference: exact float64 integer sums)."""
    paths = _models(tmp_path)
    from softdeploy.runtime import Session

    x = _x()
    reference = {name: Session(p, kernels="portable").run({"X": x})[0] for name, p in paths.items()}
    classes = {"native": _run_class(tmp_path, paths, "native")}
    classes["test-cpu avx2"] = _run_class(tmp_path, paths, "testcpu", {"SOFTDEPLOY_TEST_CPU": "avx2"})
    classes["shim avx2"] = _run_class(tmp_path, paths, "shim_avx2", shim=cpuid_shim)
    classes["shim no-vnni"] = _run_class(tmp_path, paths, "shim_novnni", shim=cpuid_shim, mask="vnni")
    assert classes["shim avx2"][0]["class"] == "avx2" and classes["shim avx2"][0]["isa"] == "avx2"
    assert classes["shim no-vnni"][0]["class"] == "avx512"
    base = classes["native"][1]
    for label, (_, ys) in classes.items():
        for name in paths:
            if name.startswith("dynamic"):  # RowwiseInt8MatMul: the same bits on every variant
                np.testing.assert_array_equal(ys[name], base[name], err_msg=f"{name} on {label}")
            else:  # QDQ: the same integers in onnxruntime's kernels (pair-bounded cannot saturate vpmaddubsw)
                np.testing.assert_allclose(ys[name], base[name], rtol=1e-5, atol=1e-5, err_msg=f"{name} on {label}")
            np.testing.assert_allclose(ys[name], reference[name], rtol=1e-4, atol=1e-4, err_msg=f"{name} on {label}")
    # the warning: only the rowwise-8-bit model, only where it runs the widened tile (no VNNI), and it names the fix
    for label, (info, _) in classes.items():
        warned = {name for name, w in info["warn"].items() if w}
        if info["class"] == "vnni":
            assert not warned, label
        else:
            assert warned == {"dynamic vnni"}, (label, info["warn"])
            line = info["warn"]["dynamic vnni"][0]
            assert "--target portable" in line and "quantized for target vnni (rowwise-8-bit)" in line
            assert "\n" not in line


def test_mismatch_line_without_metadata_and_on_vnni() -> None:
    """A model with no recorded target still gets the warning on a CPU without VNNI; a VNNI CPU none."""
    from types import SimpleNamespace

    from softdeploy.quant.rowwise import rewrite_matmuls

    model = _fc()
    rewrite_matmuls(model, levels=255, groups=0)  # rowwise-8-bit, no metadata
    no_vnni = SimpleNamespace(isa_selected="avx2", avx_vnni=False, avx512_vnni=False)
    line = mismatch_line(model, "model m.onnx", info=no_vnni)
    assert line is not None and line.startswith("model m.onnx: 1 RowwiseInt8MatMul node(s)")
    assert "no int8 target recorded" in line and PATH_WIDE in line and "`softdeploy quantize --target portable`" in line
    vnni = SimpleNamespace(isa_selected="avx512", avx_vnni=False, avx512_vnni=True)
    assert mismatch_line(model, info=vnni) is None
    lane = _fc()
    rewrite_matmuls(lane)  # lane-bounded: the fast tile everywhere
    assert mismatch_line(lane, info=no_vnni) is None


@native
def test_doctor_model(tmp_path: Path) -> None:
    paths = _models(tmp_path)
    env = dict(os.environ, SOFTDEPLOY_TEST_CPU="avx2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "softdeploy.cli", "doctor"]
    done = subprocess.run([*cmd, str(paths["dynamic vnni"])], env=env, capture_output=True, text=True)
    text = " ".join(done.stdout.split())
    assert "target: vnni; format: 8-bit weights in com.softdeploy RowwiseInt8MatMul" in text, done.stdout
    assert "widened vpmaddwd tile" in text and "--target portable" in text
    done = subprocess.run([*cmd, str(paths["static portable"])], env=env, capture_output=True, text=True)
    text = " ".join(done.stdout.split())
    assert "target: portable; format: pair-bounded" in text and "DequantizeLinear" in text, done.stdout
    assert "--target portable" not in text


@native
def test_cli_quantize_target(tmp_path: Path) -> None:
    from softdeploy.cli import main

    src = tmp_path / "fc.onnx"
    onnx.save(_fc(), src)
    out = tmp_path / "fc.int8.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--target", "portable"]) == 0
    assert model_int8_metadata(onnx.load(out)) == {TARGET_KEY: "portable", FORMAT_KEY: "lane-bounded"}
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["int8_target"] == "portable" and report["weights"] == "lane-bounded"
    assert report["int8_format"].startswith("int8 format: lane-bounded")


def test_workflow_target_key(tmp_path: Path) -> None:
    from softdeploy.workflow import WorkflowError, parse

    raw = {"name": "t", "model": "m.onnx", "data": {"inputs": "d.npz"}, "quantize": {"target": "portable"}}
    assert parse(raw, base=tmp_path).quantize.target == "portable"
    assert parse({**raw, "quantize": {}}, base=tmp_path).quantize.target == "auto"
    with pytest.raises(WorkflowError, match="target"):
        parse({**raw, "quantize": {"target": "zen3"}}, base=tmp_path)
    from softdeploy.workflow.spec import schema

    assert schema()["properties"]["quantize"]["properties"]["target"]["enum"] == list(TARGETS)


@native
def test_a_workflows_target_reaches_its_int8_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`quantize: {target: ...}` in a workflow file is the target of both int8 variants it makes."""
    from softdeploy.cli import main

    onnx.save(_fc(), tmp_path / "fc.onnx")
    feed = onnx.load(tmp_path / "fc.onnx").graph.input[0]
    width = feed.type.tensor_type.shape.dim[-1].dim_value
    np.savez(
        tmp_path / "x.npz", **{feed.name: np.random.default_rng(0).standard_normal((16, width)).astype(np.float32)}
    )
    wf = {
        "name": "targeted",
        "model": "fc.onnx",
        "data": {"inputs": "x.npz"},
        "quantize": {"mode": "dynamic", "target": "portable"},
        "variants": ["ort-fp32", "ort-int8-dynamic", "ort-int8-static"],
        "rounds": 1,
        "out": "res",
    }
    (tmp_path / "wf.json").write_text(json.dumps(wf))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "wf.json", "--quick"]) == 0
    models = tmp_path / "res" / "targeted" / "models"
    assert model_int8_metadata(onnx.load(models / "int8_dynamic.onnx")) == {
        TARGET_KEY: "portable",
        FORMAT_KEY: "lane-bounded",
    }
    assert model_int8_metadata(onnx.load(models / "int8_static.onnx"))[TARGET_KEY] == "portable"


@native
def test_compare_target_outranks_the_workflows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`compare --workflow F --target T`: both int8 variants are quantized for T, over the file's own target."""
    from softdeploy.cli import main

    onnx.save(_fc(), tmp_path / "fc.onnx")
    np.savez(tmp_path / "x.npz", X=np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32))
    wf = {
        "name": "targeted",
        "model": "fc.onnx",
        "data": {"inputs": "x.npz"},
        "quantize": {"mode": "dynamic", "target": "vnni"},
        "variants": ["ort-fp32", "ort-int8-dynamic", "ort-int8-static"],
        "rounds": 1,
        "out": "res",
    }
    (tmp_path / "wf.json").write_text(json.dumps(wf))
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--workflow", "wf.json", "--quick", "--target", "portable"]) == 0
    models = tmp_path / "res" / "targeted" / "models"
    assert model_int8_metadata(onnx.load(models / "int8_dynamic.onnx")) == {
        TARGET_KEY: "portable",
        FORMAT_KEY: "lane-bounded",
    }
    assert model_int8_metadata(onnx.load(models / "int8_static.onnx")) == {
        TARGET_KEY: "portable",
        FORMAT_KEY: "pair-bounded",
    }


@native
def test_run_compare_quantizes_a_case_for_the_target(tmp_path: Path) -> None:
    """`compare --case NAME --target T` reaches run_compare(int8_target=T): the case's int8 models record T."""
    from compare.tiny_case import TinyCase

    from softdeploy.compare import run_compare
    from softdeploy.errors import SoftdeployError
    from softdeploy.progress import SilentProgress

    with pytest.raises(SoftdeployError, match="int8 target 'zen3' is not one of"):
        run_compare(TinyCase(), tmp_path / "bad", int8_target="zen3", progress=SilentProgress())
    assert not (tmp_path / "bad").exists()  # refused before any work
    variants = ["ort-fp32", "ort-int8-dynamic", "ort-int8-static"]
    run_compare(
        TinyCase(),
        tmp_path,
        variants=variants,
        rounds=1,
        round_seconds=0.01,
        int8_target="avx2",
        progress=SilentProgress(),
    )
    for name in ("int8_dynamic.onnx", "int8_static.onnx"):
        assert model_int8_metadata(onnx.load(tmp_path / "models" / name))[TARGET_KEY] == "avx2"


@pytest.mark.parametrize("scale", [0.05, 0.3, 1.0, 3.0])
@pytest.mark.parametrize("levels", [127, 255])
def test_the_warning_scan_agrees_with_lane_groups(scale: float, levels: int) -> None:
    """Session's scan (single pairs, int16, stops at the first block over the bound) finds exactly the nodes whose
    lane_groups is 0, the widened tile's."""
    from types import SimpleNamespace

    from onnx import numpy_helper

    from softdeploy.quant.formats import slow_rowwise_nodes
    from softdeploy.quant.rowwise import weight_groups

    rng = np.random.default_rng(int(scale * 100) + levels)
    model = _fc(k=130, n=24)
    q = np.clip(np.rint(rng.standard_normal((130, 24)) * 127 * scale / 3), -127, 127).astype(np.int8)
    from softdeploy.ops import REGISTRY

    node = REGISTRY["RowwiseInt8MatMul"].make_node(["X", "Q", "S"], ["Y"], name="r", levels=levels)
    del model.graph.node[:]
    model.graph.node.append(node)
    del model.graph.initializer[:]
    model.graph.initializer.extend(
        [numpy_helper.from_array(q, "Q"), numpy_helper.from_array(np.ones(24, np.float32), "S")]
    )
    no_vnni = SimpleNamespace(isa_selected="avx2", avx_vnni=False, avx512_vnni=False)
    want = [name for name, g in weight_groups(model).items() if g == 0]
    assert slow_rowwise_nodes(model, no_vnni) == want
