"""Shipped tuning records per CPU class (softdeploy/tvm/records/<class>/): which class a target gets
(known -mcpu names, LLVM's features for the rest), the build report's line, and that a target of no
shipped class is built untuned for its CPU instead of with another class's schedules. No tuning here."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

pytest.importorskip("tvm", reason="the TVM backend is optional: pip install 'softdeploy[tvm]'")

from softdeploy.tvm.build import RECORDS_DIR, schedule, shipped_records_for
from softdeploy.tvm.frontend import import_model, prepare
from softdeploy.tvm.target import MCPU_RECORD_CLASS, RECORD_CLASS_FEATURES, host_target, record_class

pytestmark = pytest.mark.tvm  # for `-m` selection; without the `tvm` extra the module skips at import


@pytest.mark.parametrize(
    ("mcpu", "want"),
    [
        ("znver3", "avx2"),
        ("haswell", "avx2"),
        ("skylake", "avx2"),
        ("alderlake", "avx2"),
        ("znver4", "avx512"),
        ("skylake-avx512", "avx512"),
        ("icelake-server", "avx512"),
        ("sapphirerapids", "avx512"),
        ("cascadelake", "avx512"),
    ],
)
def test_known_cpus_map_to_their_record_class(mcpu, want):
    assert record_class({"kind": "llvm", "mcpu": mcpu, "mtriple": "x86_64-linux-gnu"}) == want


def test_the_mcpu_table_agrees_with_llvms_features():
    """Every name in the table is a CPU LLVM knows, with the features of its class (and, for AVX2, without
    AVX-512): the table only saves asking LLVM, it never decides differently."""
    from tvm.target import Target, codegen

    for mcpu, cls in MCPU_RECORD_CLASS.items():
        assert codegen.llvm_is_valid_cpu(mcpu, "x86_64-linux-gnu"), mcpu
        target = Target({"kind": "llvm", "mcpu": mcpu, "mtriple": "x86_64-linux-gnu"})
        assert codegen.llvm_cpu_has_features(list(RECORD_CLASS_FEATURES[cls]), target), mcpu
        if cls == "avx2":
            assert not codegen.llvm_cpu_has_features(list(RECORD_CLASS_FEATURES["avx512"]), target), mcpu


def test_other_cpus_are_classified_by_llvm():
    x86 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}
    assert record_class({**x86, "mcpu": "nehalem"}) is None  # SSE4.2 only
    assert record_class({**x86, "mcpu": "x86-64"}) is None
    assert record_class({**x86, "mcpu": "znver4", "mattr": ["-avx512f"]}) == "avx2"  # features switched off
    assert record_class({"kind": "llvm", "mcpu": "cortex-a76", "mtriple": "aarch64-linux-gnu"}) is None


def test_the_package_ships_both_classes():
    for cls in ("avx512", "avx2"):
        folder = RECORDS_DIR / cls
        records = [json.loads(line) for line in (folder / "database_tuning_record.json").read_text().splitlines()]
        workloads = (folder / "database_workload.json").read_text().splitlines()
        assert records and len(workloads) >= len({r[0] for r in records}), cls
    assert not (RECORDS_DIR / "database_tuning_record.json").exists()  # no class-less records left over


def _root_with(tmp_path, *classes):
    for cls in classes:
        (tmp_path / cls).mkdir()
        (tmp_path / cls / "database_tuning_record.json").write_text("")
    return tmp_path


def test_a_target_gets_its_own_class_or_none(tmp_path):
    root = _root_with(tmp_path, "avx2")
    avx2 = shipped_records_for(host_target("znver3"), root)
    assert avx2.folder == root / "avx2"
    assert avx2.note() == "tuned records: avx2 class for -mcpu=znver3"
    avx512 = shipped_records_for(host_target("znver4"), root)
    assert avx512.folder is None and avx512.record_class == "avx512"
    assert avx512.note().startswith("UNTUNED for this CPU: no shipped tuning records for -mcpu=znver4")
    assert "whose class avx512 ships no records (shipped classes: avx2)" in avx512.note()
    assert "another class's schedules are not applied" in avx512.note()
    old = shipped_records_for(host_target("nehalem"), root)
    assert old.folder is None and "which is neither AVX-512 nor AVX2 + FMA" in old.note()


def _softmax_module():
    from softdeploy.ops import REGISTRY
    from softdeploy.ops._schema import Sample

    op = REGISTRY["TwoPassSoftmax"]
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    model = op.make_model(Sample("rows_4x64", (x,), {}))
    return model, import_model(prepare(model, {"X": [4, 64]}))


@pytest.mark.parametrize(("mcpu", "cls"), [("znver3", "avx2"), ("znver4", "avx512")])
def test_the_build_report_names_the_class_it_applied(mcpu, cls):
    _, mod = _softmax_module()
    _, report = schedule(mod, target=host_target(mcpu))
    assert report.databases == [str(RECORDS_DIR / cls)]
    assert f"tuned records: {cls} class for -mcpu={mcpu}" in report.summary()


def test_a_cpu_of_no_class_is_built_untuned_and_told_so():
    _, mod = _softmax_module()
    _, report = schedule(mod, target=host_target("nehalem"))
    assert report.databases == [] and report.from_database == 0
    assert "UNTUNED for this CPU: no shipped tuning records for -mcpu=nehalem" in report.summary()
    assert report.schedules == {"two_pass_softmax": "hand (TwoPassSoftmax)"}


def test_cli_compile_says_the_build_is_untuned_for_the_cpu(tmp_path, run_cli):
    model, _ = _softmax_module()
    src = tmp_path / "softmax.onnx"
    onnx.save(model, src)
    cmd = ["compile", str(src), "--backend", "tvm", "--shape", "X=4x64", "--target-cpu", "nehalem"]
    cmd += ["-o", str(tmp_path / "s.so")]
    out = run_cli(*cmd)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "UNTUNED for this CPU: no shipped tuning records for -mcpu=nehalem" in out.stdout
