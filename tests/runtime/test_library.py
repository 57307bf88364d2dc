"""The kernel library: SOFTDEPLOY_LIBRARY is the only candidate when set, a library must prove it is
softdeploy's (SoftdeployLibraryInfo), and what it says about itself -- version, onnxruntime API,
ops, and the kernel variant SOFTDEPLOY_ISA asked for and the one that runs."""

from __future__ import annotations

import numpy as np
import pytest

import softdeploy
from softdeploy import LibraryNotFoundError, RuntimeFailure, conformance
from softdeploy.ops import REGISTRY, Sample
from softdeploy.runtime import Session
from softdeploy.runtime.library import library_info, library_path, library_status

OP = REGISTRY["TwoPassSoftmax"]
BAD = ["missing", "random_bytes", "libc", "directory", "no_info", "opset2", "no_ops"]
WHY = {
    "missing": "(missing)",
    "random_bytes": "cannot load",
    "libc": "exports no RegisterCustomOps",
    "directory": "(not a file)",
    "no_info": "no SoftdeployLibraryInfo",
    "opset2": "implements com.softdeploy opset 2",
    "no_ops": None,  # a softdeploy-shaped library that registers nothing: refused by the op check
}


def _model():
    return OP.make_model(Sample("x", (np.zeros((2, 3), np.float32),)))


@pytest.mark.parametrize("kind", [k for k in BAD if WHY[k]])
def test_a_bad_softdeploy_library_is_an_error_naming_path_and_why(kind, bad_library, monkeypatch):
    path = bad_library(kind)
    monkeypatch.setenv("SOFTDEPLOY_LIBRARY", str(path))
    with pytest.raises(LibraryNotFoundError) as info:
        library_path()  # no fall-back to the library inside the package
    message = str(info.value)
    assert str(path) in message and WHY[kind] in message, message
    assert "SOFTDEPLOY_LIBRARY" in message
    assert not library_status().ok
    with pytest.raises(LibraryNotFoundError, match="SOFTDEPLOY_LIBRARY"):
        Session(_model(), kernels="native")


@pytest.mark.parametrize("kind", BAD)
def test_kernels_say_native_only_where_softdeploys_kernels_run(kind, bad_library, monkeypatch):
    monkeypatch.setenv("SOFTDEPLOY_LIBRARY", str(bad_library(kind)))
    with pytest.raises(LibraryNotFoundError):
        Session(_model(), kernels="native")
    s = Session(_model(), kernels="auto")  # the function bodies run, and the session says so
    assert s.kernels == "portable" and s.library is None
    np.testing.assert_allclose(s.run({"X": np.zeros((2, 3), np.float32)})[0], 1 / 3, rtol=1e-6)


def test_a_library_without_the_models_op_is_refused(bad_library, monkeypatch):
    path = bad_library("no_ops")
    monkeypatch.setenv("SOFTDEPLOY_LIBRARY", str(path))
    assert library_info().ops == ()
    with pytest.raises(LibraryNotFoundError, match=r"registers no kernel for \['TwoPassSoftmax'\]"):
        Session(_model(), kernels="native")


def test_library_describes_itself():
    info = library_info()
    assert info.path == library_path()
    assert info.version == softdeploy.__version__
    assert info.domain == softdeploy.DOMAIN and info.opset_version == softdeploy.OPSET_VERSION
    assert sorted(info.ops) == sorted(REGISTRY)
    assert isinstance(info.ort_api_version, int) and 1 <= info.ort_api_version <= 100
    assert info.isa_detected in conformance.ISAS
    assert conformance.available_isas() == list(conformance.ISAS[: conformance.ISAS.index(info.isa_detected) + 1])


@pytest.mark.parametrize("isa", conformance.ISAS)
def test_isa_request_says_what_was_asked_and_what_runs(isa, monkeypatch):
    monkeypatch.setenv("SOFTDEPLOY_ISA", isa)
    info = library_info()
    detected = conformance.ISAS.index(info.isa_detected)
    asked = conformance.ISAS.index(isa)
    assert info.isa_requested == isa and info.isa_request_valid
    assert info.isa_selected == conformance.ISAS[min(asked, detected)]
    if asked > detected:  # e.g. avx512 on an AVX2-only CPU: runs avx2, and says why
        assert not info.isa_honoured
        assert info.isa_note and f"{info.isa_detected} runs" in info.isa_note
        assert f"not {isa}" in info.isa_summary()
    else:
        assert info.isa_honoured and info.isa_note is None
    # Sessions created now run what the library says (the kernels read SOFTDEPLOY_ISA the same way).
    Session(_model(), kernels="native").run({"X": np.zeros((2, 3), np.float32)})


def test_isa_unset_runs_the_best_variant(monkeypatch):
    monkeypatch.delenv("SOFTDEPLOY_ISA", raising=False)
    info = library_info()
    assert info.isa_requested is None and info.isa_selected == info.isa_detected and info.isa_honoured


@pytest.mark.parametrize("value", ["avx3", "AVX-512", "sse"])
def test_isa_request_naming_no_variant_fails_kernel_creation(value, monkeypatch):
    monkeypatch.setenv("SOFTDEPLOY_ISA", value)
    info = library_info()
    assert not info.isa_request_valid and info.isa_selected is None and not info.isa_honoured
    assert f"SOFTDEPLOY_ISA='{value}'" in info.isa_note
    with pytest.raises(
        RuntimeFailure,
        match=f"softdeploy kernel library: cannot create TwoPassSoftmax: SOFTDEPLOY_ISA='{value}' names no kernel variant",
    ):
        Session(_model(), kernels="native")
    # The function bodies do not depend on it.
    Session(_model(), kernels="portable").run({"X": np.zeros((2, 3), np.float32)})


def test_isa_request_ignores_case(monkeypatch):
    monkeypatch.setenv("SOFTDEPLOY_ISA", "Portable")
    assert library_info().isa_selected == "portable"


def _real_detected(monkeypatch) -> str:
    monkeypatch.delenv("SOFTDEPLOY_TEST_CPU", raising=False)
    monkeypatch.delenv("SOFTDEPLOY_ISA", raising=False)
    return library_info().isa_detected


@pytest.mark.parametrize("cpu", ["portable", "avx2"])
@pytest.mark.parametrize("isa", conformance.ISAS)
def test_isa_request_on_a_cpu_with_fewer_features(cpu, isa, monkeypatch):
    """SOFTDEPLOY_TEST_CPU makes any machine report like one with fewer features, so that the case of
    e.g. avx512 asked on an AVX2-only CPU is exercised everywhere: the best variant there runs, and
    the library says what was asked, what runs and why."""
    real = conformance.ISAS.index(_real_detected(monkeypatch))
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", cpu)
    monkeypatch.setenv("SOFTDEPLOY_ISA", isa)
    info = library_info()
    detected = min(real, conformance.ISAS.index(cpu))
    assert info.isa_cpu_limit == cpu and info.isa_detected == conformance.ISAS[detected]
    assert conformance.available_isas() == list(conformance.ISAS[: detected + 1])
    asked = conformance.ISAS.index(isa)
    assert info.isa_selected == conformance.ISAS[min(asked, detected)]
    if asked > detected:
        assert not info.isa_honoured
        assert info.isa_note == (
            f"SOFTDEPLOY_ISA={isa} asks for more than this CPU supports (as limited by SOFTDEPLOY_TEST_CPU={cpu}); "
            f"{info.isa_detected} runs ("
            + ("AVX-512 needs F, BW, VL and DQ" if isa == "avx512" else "AVX2 needs AVX2 and FMA")
            + ")"
        )
        assert info.isa_summary().startswith(f"{info.isa_selected}, not {isa}: ")
    else:
        assert info.isa_honoured and info.isa_note is None


def test_capped_kernels_run_the_variant_the_library_names(monkeypatch):
    """Kernels created under SOFTDEPLOY_TEST_CPU=portable give the portable variant's bits."""
    x = np.random.default_rng(1).standard_normal((4, 3000)).astype(np.float32)
    sample = Sample("x", (x,))
    model = OP.make_model(sample, with_function=False)
    monkeypatch.setenv("SOFTDEPLOY_ISA", "portable")
    want = Session(model, kernels="native").run({"X": x})[0]
    monkeypatch.setenv("SOFTDEPLOY_ISA", "avx512")
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "portable")
    assert library_info().isa_selected == "portable"
    np.testing.assert_array_equal(Session(model, kernels="native").run({"X": x})[0], want)


def test_cpu_limit_naming_no_variant_fails_kernel_creation(monkeypatch):
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "zen3")
    info = library_info()
    assert not info.isa_request_valid and "SOFTDEPLOY_TEST_CPU='zen3' names no kernel variant" in info.isa_note
    with pytest.raises(RuntimeFailure, match="SOFTDEPLOY_TEST_CPU='zen3'"):
        Session(_model(), kernels="native")


def test_library_exports_exactly_its_two_symbols():
    """RegisterCustomOps and SoftdeployLibraryInfo, plus the CUDA C ABI (sd_cuda_*) exactly when the library
    says it holds CUDA kernels."""
    import shutil
    import subprocess

    from softdeploy.runtime.cuda import SYMBOLS

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", str(library_path())], capture_output=True, text=True, check=True)
    symbols = {line.split()[-1] for line in out.stdout.splitlines() if line.split()[1:2] == ["T"]}
    cuda = set(SYMBOLS) if library_info().cuda_compiled else set()
    assert symbols == {"RegisterCustomOps", "SoftdeployLibraryInfo"} | cuda


def test_library_version_is_the_packages():
    import re
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]+)"', pyproject, flags=re.M)
    assert declared is not None
    assert library_info().version == softdeploy.__version__ == declared.group(1)
