"""The int8 format per CPU (softdeploy.quant.formats): the class follows softdeploy's CPU detection
(SOFTDEPLOY_TEST_CPU emulates a CPU without AVX-512 / VNNI), the table's choice reaches the quantized
model (pair-bounded weights without VNNI) and every report says which format and why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from quant.tiny import mlp_with_custom_op
from softdeploy.quant import QuantConfig, formats, quantize
from softdeploy.quant.formats import TABLE, format_lines, int8_cpu_class, int8_format

AVX512_VNNI = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}


@pytest.fixture
def no_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Detection by softdeploy's own rule on the given flags (the kernel library answers otherwise)."""
    from softdeploy.runtime.library import LibraryStatus

    monkeypatch.setattr("softdeploy.runtime.library_status", lambda: LibraryStatus(None, "not in this test"))


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        (AVX512_VNNI, "vnni"),
        (AVX512_VNNI - {"avx512_vnni"}, "avx512"),  # Skylake-SP: AVX-512 without VNNI
        ({"avx2", "fma"}, "avx2"),  # Zen 3, Haswell..Comet Lake
        ({"avx2", "fma", "avx_vnni"}, "vnni"),  # Alder Lake: AVX-VNNI on AVX2
        ({"sse4_2", "avx"}, "x86-64"),
    ],
)
def test_the_class_follows_the_cpu_features(no_library, monkeypatch, flags, want):
    monkeypatch.delenv("SOFTDEPLOY_TEST_CPU", raising=False)
    assert int8_cpu_class(set(flags), machine="x86_64") == want


def test_other_architectures_keep_8_bit_weights():
    assert int8_cpu_class(set(), machine="aarch64") == "other"
    assert TABLE["other"].weights == "8-bit" and not TABLE["other"].reduce_range


def test_the_test_cpu_setting_emulates_an_avx2_cpu_without_vnni(no_library, monkeypatch):
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "avx2")
    assert int8_cpu_class(AVX512_VNNI, machine="x86_64") == "avx2"
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "portable")
    assert int8_cpu_class(AVX512_VNNI, machine="x86_64") == "x86-64"


def test_the_class_follows_the_kernel_librarys_detection(monkeypatch):
    """With the library loaded, its ISA (capped by SOFTDEPLOY_TEST_CPU) decides, as for the kernels."""
    from softdeploy.runtime import library_status

    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "avx2")
    status = library_status()
    info = status.info
    assert info is not None, f"this test needs softdeploy's kernel library (built or installed): {status.error}"
    want = {"avx2": "avx2", "portable": "x86-64"}[info.isa_detected]
    assert int8_cpu_class(AVX512_VNNI, machine="x86_64") == want


def test_vnni_counts_only_where_cpuid_agrees_with_the_flags(monkeypatch):
    """A process whose CPUID hides AVX-512 and VNNI (bench/cpuid_avx2.c) runs every library's AVX2 kernels: the kernel
    library detects avx2 from CPUID while /proc/cpuinfo still lists avx512_vnni; the class is then avx2."""
    from types import SimpleNamespace

    from softdeploy.runtime.library import LibraryStatus

    monkeypatch.delenv("SOFTDEPLOY_TEST_CPU", raising=False)
    # the library's CPUID also answers for VNNI on an AVX-512 CPU: SD_CPUID_MASK=vnni hides it alone (Skylake-SP)
    for detected, vnni, want in (("avx2", False, "avx2"), ("avx512", True, "vnni"), ("avx512", False, "avx512")):
        status = LibraryStatus(None, None, SimpleNamespace(isa_detected=detected, avx512_vnni=vnni, avx_vnni=False))
        monkeypatch.setattr("softdeploy.runtime.library_status", lambda status=status: status)
        assert int8_cpu_class(AVX512_VNNI, machine="x86_64") == want
    # an AVX2 CPU: the library's AVX-VNNI answer decides (Alder Lake: vnni), whatever the flags list
    for avx_vnni, want in ((True, "vnni"), (False, "avx2")):
        status = LibraryStatus(None, None, SimpleNamespace(isa_detected="avx2", avx512_vnni=False, avx_vnni=avx_vnni))
        monkeypatch.setattr("softdeploy.runtime.library_status", lambda status=status: status)
        assert int8_cpu_class({"avx2", "fma", "avx_vnni"}, machine="x86_64") == want
        assert int8_cpu_class(AVX512_VNNI, machine="x86_64") == want  # an emulated AVX2 CPU on an AVX-512 host
    # without the library the flags decide, where they give the detected ISA
    monkeypatch.setattr("softdeploy.runtime.library_status", lambda: LibraryStatus(None, "not built", None))
    assert int8_cpu_class({"avx2", "fma", "avx_vnni"}, machine="x86_64") == "vnni"
    assert int8_cpu_class({"avx2", "fma"}, machine="x86_64") == "avx2"


def test_the_cpuid_shim_gives_the_avx2_class_for_real(cpuid_shim):
    """bench/cpuid_avx2.c preloaded into a fresh interpreter: the kernel library detects avx2 and the int8 class is
    avx2 (needs gcc and a kernel with CPUID faulting; both are reported when missing)."""
    import os

    code = (
        "from softdeploy.quant.formats import int8_cpu_class\n"
        "from softdeploy.runtime import library_status\n"
        "print(library_status().info.isa_detected, int8_cpu_class())\n"
    )
    done = cpuid_shim.run(code)
    assert done.returncode == 0, done.stderr
    isa, cls = done.stdout.split()
    assert isa in ("avx2", "portable") and cls in ("avx2", "x86-64"), done.stdout
    # SD_CPUID_MASK=vnni hides only the VNNI bits: on an AVX-512 host, an AVX-512 CPU without VNNI (Skylake-SP)
    from softdeploy.runtime import library_status

    info = library_status().info
    if info is not None and info.isa_detected == "avx512" and not os.environ.get("SOFTDEPLOY_TEST_CPU"):
        done = cpuid_shim.run(code, mask="vnni")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["avx512", "avx512"], done.stdout


_AVX_VNNI_CHOICE = """
from softdeploy.quant.formats import int8_cpu_class
from softdeploy.quant.quantize import table_weights
from softdeploy.runtime import library_status

info = library_status().info
print(info.isa_detected, info.avx_vnni, int8_cpu_class(), table_weights("dynamic")[0], table_weights("static")[0])
"""


def test_the_cpuid_shim_with_avx_vnni_gives_the_alder_lake_choice(cpuid_shim):
    """SD_CPUID_MASK=avxvnni: an AVX2 CPU with AVX-VNNI (Alder Lake) as CPUID reports it. The kernel library reads
    AVX-VNNI (its avx2 variant's VEX vpdpbusd tiles), the int8 class is vnni and dynamic mode takes rowwise-8-bit
    (RowwiseInt8MatMul's ymm tile), static mode onnxruntime's 8-bit QDQ. Only the choice runs: this host has no
    AVX-VNNI to execute (the tile itself is swept through its EVEX twin, tests/ops/test_sweep.py)."""
    from softdeploy.runtime import library_status

    info = library_status().info
    if info is None or info.isa_detected == "portable":
        pytest.skip("needs softdeploy's kernel library on an AVX2 CPU")
    done = cpuid_shim.run(_AVX_VNNI_CHOICE, mask="avxvnni")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["avx2", "True", "vnni", "rowwise-8-bit", "8-bit"], done.stdout


def test_the_table_bounds_weight_pairs_exactly_where_vpmaddubsw_saturates():
    assert {name for name, row in TABLE.items() if row.weights == "pair-bounded"} == {"avx512", "avx2", "x86-64"}
    assert {name for name, row in TABLE.items() if row.weights == "8-bit"} == {"vnni", "other"}
    for row in TABLE.values():  # the rest is the same everywhere (measured on MiniLM)
        assert row.weights in formats.WEIGHTS and not row.reduce_range
        assert row.per_channel and row.static_format == "QDQ" and "attention" in row.float_matmuls
        assert row.why and ("pair-bounded" in row.why or "8-bit" in row.why)
        assert row.weights_for("static") == row.weights  # static mode is always onnxruntime's QDQ


def test_dynamic_mode_takes_rowwise_int8_on_avx2_without_vnni_and_on_vnni():
    """softdeploy's RowwiseInt8MatMul beats onnxruntime's int8 where MLAS multiplies with vpmaddubsw (AVX2 and
    AVX-512 without VNNI: lane-bounded), and matches it with better accuracy on VNNI (rowwise-8-bit). Static mode is
    always onnxruntime's QDQ."""
    lane = {name for name, row in TABLE.items() if row.weights_for("dynamic") == "lane-bounded"}
    assert lane == {"avx2", "avx512"}
    assert {name for name, row in TABLE.items() if row.weights_for("dynamic") == "rowwise-8-bit"} == {"vnni"}
    for name, fmt in (("avx2", "u7s8"), ("avx512", "u7s8"), ("vnni", "u8s8")):
        row = TABLE[name]
        assert "RowwiseInt8MatMul" in row.line("dynamic") and fmt in row.line("dynamic")
        assert "RowwiseInt8MatMul" not in row.line("static")


def _int8_weights(path: Path) -> list[np.ndarray]:
    model = onnx.load(path)
    return [
        numpy_helper.to_array(t)
        for t in model.graph.initializer
        if t.data_type == onnx.TensorProto.INT8 and t.name.endswith("_quantized")  # weights, not zero points
    ]


def test_quantize_bounds_weight_pairs_on_an_avx2_cpu_and_says_why(tmp_path, monkeypatch):
    from softdeploy.quant.pair_bounded import PAIR_LIMIT, max_same_sign_pair

    src = tmp_path / "m.onnx"
    onnx.save(mlp_with_custom_op(with_function=True), src)
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "avx2")
    cls = int8_cpu_class()
    assert cls in ("avx2", "x86-64")  # avx2 on any AVX2 machine; x86-64 on an older one
    table = int8_format(cls).weights_for("dynamic")  # lane-bounded (avx2) or pair-bounded (x86-64)
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic"))
    assert q.weights == table and not q.reduce_range
    assert q.int8_format == int8_format(cls).line("dynamic")
    ops = {n.op_type for n in onnx.load(q.path).graph.node}
    if table == "lane-bounded":  # softdeploy's int8 GEMM: RowwiseInt8MatMul instead of onnxruntime's integer ops
        assert "RowwiseInt8MatMul" in ops and "MatMulInteger" not in ops and "RowwiseInt8MatMul" in q.int8_format
    # onnxruntime's format on this class: pair-bounded (the table's where MLAS runs the model)
    q = quantize(src, tmp_path / "pairs.onnx", QuantConfig("dynamic", weights="pair-bounded"))
    assert q.weights == "pair-bounded" and not q.reduce_range
    weights = _int8_weights(q.path)
    assert weights and max(max_same_sign_pair(w) for w in weights) <= PAIR_LIMIT  # no saturation
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) > 64  # finer than 7 bits
    assert "pair-bounded" in q.int8_format and ("vpmaddubsw" in q.int8_format or "guidance" in q.int8_format)
    # an explicit setting wins, and the report says it overrode the table
    full = quantize(src, tmp_path / "full.onnx", QuantConfig("dynamic", reduce_range=False))
    assert full.weights == "8-bit" and f"8-bit weights as asked, not the table's {table}" in full.int8_format
    assert max(max_same_sign_pair(w) for w in _int8_weights(full.path)) > PAIR_LIMIT
    seven = quantize(src, tmp_path / "seven.onnx", QuantConfig("dynamic", weights="7-bit"))
    assert seven.reduce_range and seven.weights == "7-bit"
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in _int8_weights(seven.path)) <= 64


def test_reports_record_the_format(tmp_path, monkeypatch):
    from softdeploy.workflow.quantize import write_report

    src = tmp_path / "m.onnx"
    onnx.save(mlp_with_custom_op(with_function=True), src)
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "avx2")
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic"))
    report = json.loads(write_report(q, tmp_path / "q.json").read_text())
    want = int8_format(int8_cpu_class()).weights_for("dynamic")  # lane-bounded on an AVX2 machine
    assert report["int8_format"] == q.int8_format and report["weights"] == want
    assert report["reduce_range"] is False


def test_doctor_lines_name_this_cpus_format_and_the_avx2_one(monkeypatch):
    monkeypatch.setattr(formats, "int8_cpu_class", lambda *a, **k: "vnni")
    monkeypatch.delenv("SOFTDEPLOY_TEST_CPU", raising=False)
    here, avx2 = format_lines()
    assert here.startswith("this CPU (vnni): ") and "8-bit weights" in here
    assert avx2.startswith("an AVX2 CPU without VNNI would get: lane-bounded 8-bit weights in com.softdeploy")
    assert format_lines("static")[1].startswith("an AVX2 CPU without VNNI would get: pair-bounded 8-bit weights")
    # where RowwiseInt8MatMul's VNNI tile cannot run (AVX-VNNI only, a lowered SOFTDEPLOY_ISA), the line says what
    # quantize() takes instead
    monkeypatch.setattr(formats, "_rowwise_vnni_runs", lambda: False)
    here = format_lines()[0]
    assert "here quantize() takes 8-bit weights in onnxruntime's format instead" in here and "AVX-512 VNNI" in here
    monkeypatch.setattr(formats, "_rowwise_vnni_runs", lambda: True)
    assert "instead" not in format_lines()[0]
    assert "instead" not in format_lines("static")[0]
    monkeypatch.setattr(formats, "int8_cpu_class", lambda *a, **k: "avx2")
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "avx2")
    (only,) = format_lines()
    assert only.startswith("this CPU (avx2 (no VNNI)): ") and "RowwiseInt8MatMul" in only
    assert "SOFTDEPLOY_TEST_CPU emulates" in only
