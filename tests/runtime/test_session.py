from __future__ import annotations

import threading

import numpy as np
import pytest

from softdeploy import LibraryNotFoundError, OpContractError
from softdeploy.ops import REGISTRY, Sample
from softdeploy.runtime import Session, library_path

OP = REGISTRY["TwoPassSoftmax"]


def _model():
    return OP.make_model(Sample("x", (np.zeros((2, 3), np.float32),)))


def test_missing_library_says_where_it_looked_and_how_to_fix(tmp_path, monkeypatch):
    import softdeploy.runtime.library as lib

    missing = tmp_path / "nope.so"
    monkeypatch.setattr(lib, "candidates", lambda: [missing])
    with pytest.raises(LibraryNotFoundError) as info:
        lib.library_path()
    message = str(info.value)
    assert f"{missing} (missing)" in message
    assert "cmake" in message and "SOFTDEPLOY_LIBRARY" in message


def test_unloadable_library_is_reported(tmp_path, monkeypatch):
    bogus = tmp_path / "libsoftdeploy_ops.so"
    bogus.write_bytes(b"not an ELF file")
    import softdeploy.runtime.library as lib

    monkeypatch.setattr(lib, "candidates", lambda: [bogus])
    with pytest.raises(LibraryNotFoundError, match="cannot load"):
        lib.library_path()
    s = Session(_model(), kernels="auto")  # auto falls back to the function bodies
    assert s.kernels == "portable"
    np.testing.assert_allclose(s.run({"X": np.zeros((2, 3), np.float32)})[0], 1 / 3, rtol=1e-6)
    with pytest.raises(LibraryNotFoundError):
        Session(_model(), kernels="native")


def test_native_and_portable_sessions():
    assert library_path().is_file()
    x = np.random.default_rng(0).standard_normal((4, 9)).astype(np.float32)
    native = Session(_model(), kernels="native")
    portable = Session(_model(), kernels="portable")
    assert native.kernels == "native" and portable.kernels == "portable"
    np.testing.assert_allclose(native.run({"X": x})[0], portable.run({"X": x})[0], rtol=1e-5)


def test_model_without_bodies_needs_the_library():
    model = OP.make_model(Sample("x", (np.zeros((2, 3), np.float32),)), with_function=False)
    from softdeploy import SoftdeployError

    with pytest.raises(SoftdeployError, match="TwoPassSoftmax"):
        Session(model, kernels="portable")


def test_contract_violation_is_a_typed_error():
    model = OP.make_model(Sample("x", (np.zeros((2, 3), np.float32),), {"axis": 2}))
    with pytest.raises(OpContractError, match=r"^TwoPassSoftmax: axis 2 is out of range"):
        Session(model).run({"X": np.zeros((2, 3), np.float32)})


def test_concurrent_runs_on_one_session():
    """Kernels are stateless: many threads calling run() on one session get their own results."""
    session = Session(_model(), threads=2)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((8, 1000)).astype(np.float32) for _ in range(8)]
    expected = [session.run({"X": x})[0] for x in inputs]
    errors = []

    def worker(i: int) -> None:
        for _ in range(20):
            got = session.run({"X": inputs[i]})[0]
            if not np.array_equal(got, expected[i]):
                errors.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
