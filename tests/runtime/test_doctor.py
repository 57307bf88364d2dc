"""`softdeploy doctor` prints what the library says about itself and exits non-zero on any failure:
no usable library, an op the library does not register, an op failing its smoke run, a
SOFTDEPLOY_ISA that names no variant. A request the CPU cannot honour is a warning."""

from __future__ import annotations

import pytest

from softdeploy import cli
from softdeploy.ops import REGISTRY
from softdeploy.runtime.library import library_info


def test_doctor_prints_what_the_library_says_and_exits_0(run_cli):
    info = library_info()
    out = run_cli("doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert str(info.path) in text
    assert f"onnxruntime C API version {info.ort_api_version} headers" in text
    assert "1.21" not in text.split("built against", 1)[1].splitlines()[0]  # no literal, what the library says
    assert f"kernel variant  {info.isa_selected}" in text
    assert f"kernels run  {len(REGISTRY)} of {len(REGISTRY)} ops" in text
    assert "FAILED" not in text and "all good" in text


@pytest.mark.parametrize("kind", ["missing", "random_bytes", "libc", "directory", "no_info", "opset2"])
def test_doctor_fails_on_a_bad_softdeploy_library(kind, bad_library, monkeypatch, capsys):
    path = bad_library(kind)
    monkeypatch.setenv("SOFTDEPLOY_LIBRARY", str(path))
    assert cli.main(["doctor"]) == 1
    text = capsys.readouterr().out
    assert "FAILED  library: SOFTDEPLOY_LIBRARY is set" in text and str(path) in text, text
    assert "1 failure(s)" in text


def test_doctor_fails_on_a_library_that_registers_no_op(bad_library, monkeypatch, capsys):
    monkeypatch.setenv("SOFTDEPLOY_LIBRARY", str(bad_library("no_ops")))
    assert cli.main(["doctor"]) == 1
    text = capsys.readouterr().out
    assert f"the library registers no kernel for {sorted(REGISTRY)}" in text, text
    assert f"kernels run  0 of {len(REGISTRY)} ops" in text


def test_doctor_fails_when_the_ops_fail_their_smoke_run(bad_library, monkeypatch, capsys):
    """A library that claims every op and registers none: each op's model (no function bodies) fails."""
    monkeypatch.setenv("SOFTDEPLOY_LIBRARY", str(bad_library("lying")))
    assert cli.main(["doctor"]) == 1
    text = capsys.readouterr().out
    for name in REGISTRY:
        assert f"FAILED  {name}: " in text, text
    assert f"{len(REGISTRY)} failure(s)" in text


def test_doctor_fails_on_an_isa_request_naming_no_variant(monkeypatch, capsys):
    monkeypatch.setenv("SOFTDEPLOY_ISA", "avx3")
    assert cli.main(["doctor"]) == 1
    text = capsys.readouterr().out
    assert "FAILED  no kernel can be created: SOFTDEPLOY_ISA='avx3' names no kernel variant" in text, text


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512"])
def test_doctor_reports_the_isa_request(isa, monkeypatch, capsys):
    # The CPU as it is: a SOFTDEPLOY_TEST_CPU cap (a whole run imitating an AVX2-only host) is a warning
    # of its own, tested apart.
    monkeypatch.delenv("SOFTDEPLOY_TEST_CPU", raising=False)
    monkeypatch.setenv("SOFTDEPLOY_ISA", isa)
    info = library_info()
    assert cli.main(["doctor"]) == 0  # an unhonoured request is a warning, not a failure
    text = capsys.readouterr().out
    assert f"kernel variant  {info.isa_selected}" in text
    if info.isa_honoured:
        assert f"SOFTDEPLOY_ISA={isa};" in text and "warning" not in text
    else:  # e.g. avx512 on an AVX2-only CPU
        assert f"warning  SOFTDEPLOY_ISA not honoured: {info.isa_note}" in text, text


def test_ops_says_what_runs(monkeypatch, capsys):
    monkeypatch.setenv("SOFTDEPLOY_ISA", "portable")
    assert cli.main(["ops"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "kernel variant: portable (SOFTDEPLOY_ISA=portable;" in text, text
    assert "axis:INT=-1" in text  # attributes with their ONNX types


def test_doctor_warns_when_the_isa_request_is_not_honoured(monkeypatch, capsys):
    """avx512 asked where the CPU (here: one limited to portable) cannot run it: a warning, exit 0."""
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "portable")
    monkeypatch.setenv("SOFTDEPLOY_ISA", "avx512")
    assert cli.main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "kernel variant  portable, not avx512: SOFTDEPLOY_ISA=avx512 asks for more than this CPU supports" in text
    assert "warning  SOFTDEPLOY_ISA not honoured: " in text
    assert "warning  SOFTDEPLOY_TEST_CPU=portable" in text
    assert "all good" in text
