"""The CLI on bad input: one line "softdeploy: error: ..." (exit 2) or, for an unexpected exception, one
line with its type (exit 1); a traceback only with --verbose; nothing a user saved replaced unasked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from softdeploy.cli import main
from softdeploy.ops import REGISTRY, Sample

VERBS = {
    "optimize": lambda src, tmp: ["optimize", str(src), str(tmp / "out.onnx")],
    "quantize": lambda src, tmp: ["quantize", str(src), "-o", str(tmp / "out.onnx")],
    "compile": lambda src, tmp: ["compile", str(src), "-o", str(tmp / "out_tvm.so")],
}


def _model() -> onnx.ModelProto:
    return REGISTRY["TwoPassSoftmax"].make_model(Sample("x", (np.zeros((2, 3), np.float32),)))


def hostile(tmp: Path, kind: str) -> tuple[Path, str]:
    """A path that is not a model, and the words the error must use."""
    good = _model().SerializeToString()
    if kind == "missing":
        return tmp / "missing.onnx", "no such file"
    if kind == "directory":
        (tmp / "folder.onnx").mkdir()
        return tmp / "folder.onnx", "is a directory"
    path = tmp / f"{kind}.onnx"
    data = {"empty": b"", "random": np.random.default_rng(0).bytes(4096), "truncated": good[: len(good) // 3]}[kind]
    path.write_bytes(data)
    return path, {"empty": "the file is empty", "random": "not an ONNX protobuf", "truncated": "truncated"}[kind]


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("kind", ["missing", "directory", "empty", "random", "truncated"])
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_file_that_is_not_a_model_is_one_line(tmp_path, capfd, verb, kind):
    path, words = hostile(tmp_path, kind)
    assert main(VERBS[verb](path, tmp_path)) == 2
    line = one_error_line(capfd.readouterr().err)
    assert line.startswith(f"softdeploy: error: model {path}: {words}"), line
    assert not (tmp_path / "out.onnx").exists() and not (tmp_path / "out_tvm.so").exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_shows_the_traceback(tmp_path, capfd, where):
    path, _ = hostile(tmp_path, "random")
    args = VERBS["optimize"](path, tmp_path)
    assert main(["--verbose", *args] if where == "before" else [*args, "--verbose"]) == 2
    err = capfd.readouterr().err
    assert "Traceback (most recent call last)" in err and "ModelLoadError" in err
    assert err.rstrip().splitlines()[-1].startswith(f"softdeploy: error: model {path}: not an ONNX protobuf")


def test_an_unexpected_exception_is_one_line_with_its_type(tmp_path, capfd, monkeypatch):
    import softdeploy.export.rewrites as rewrites

    def broken(*_a, **_k):
        raise ZeroDivisionError("something deep inside\nwith a second line")

    monkeypatch.setattr(rewrites, "optimize", broken)
    src = tmp_path / "in.onnx"
    onnx.save(_model(), src)
    assert main(["optimize", str(src), str(tmp_path / "out.onnx")]) == 1
    line = one_error_line(capfd.readouterr().err)
    assert line == (
        "softdeploy: error: ZeroDivisionError: something deep inside (run with --verbose for the traceback)"
    )
    assert main(["-v", "optimize", str(src), str(tmp_path / "out.onnx")]) == 1
    assert "Traceback" in capfd.readouterr().err


def test_compile_without_tvm_says_how_to_install_it(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    code = (
        "import sys; sys.modules['tvm'] = None  # as if apache-tvm were not installed\n"
        "from softdeploy.cli import main\n"
        f"sys.exit(main(['compile', {str(src)!r}, '-o', {str(tmp_path / 'm_tvm.so')!r}]))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    line = one_error_line(run.stderr)
    assert (
        line.startswith("softdeploy: error: the TVM backend needs apache-tvm 0.27") and 'pip install ".[tvm]"' in line
    )


def test_compile_refuses_to_overwrite(tmp_path, capfd):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    out = tmp_path / "m_tvm.so"
    out.write_bytes(b"a library the user built before")
    assert main(["compile", str(src)]) == 2  # the default output, MODEL_tvm.so
    assert "m_tvm.so exists; pass --overwrite" in one_error_line(capfd.readouterr().err)
    out.unlink()
    (tmp_path / "m_tvm.json").write_text("{}")  # its signature alone is also the user's
    assert main(["compile", str(src)]) == 2
    assert "m_tvm.json exists; pass --overwrite" in one_error_line(capfd.readouterr().err)
    assert main(["compile", str(src), "-o", str(src), "--overwrite"]) == 2  # never over its own input
    assert "is also the input" in one_error_line(capfd.readouterr().err)
    assert src.read_bytes() == _model().SerializeToString()
    assert main(["compile", str(src), "--shape", "X=2xa"]) == 2  # a bad --shape: one line, not SystemExit
    assert "--shape wants NAME=D0xD1" in one_error_line(capfd.readouterr().err)


def test_optimize_refuses_its_own_input_even_with_overwrite(tmp_path, capfd):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    before = src.read_bytes()
    assert main(["optimize", str(src), str(src), "--overwrite"]) == 2
    assert "is also the input" in one_error_line(capfd.readouterr().err)
    assert src.read_bytes() == before


def test_optimize_missing_feeds_and_unknown_dim_are_one_line(tmp_path, capfd):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    out = str(tmp_path / "out.onnx")
    assert main(["optimize", str(src), out, "--feeds", str(tmp_path / "nope.npz")]) == 2
    assert one_error_line(capfd.readouterr().err).endswith(f"--feeds {tmp_path / 'nope.npz'}: no such file")
    (tmp_path / "x.npz").write_bytes(b"not a zip")
    assert main(["optimize", str(src), out, "--feeds", str(tmp_path / "x.npz")]) == 2
    assert "not an .npz file" in one_error_line(capfd.readouterr().err)
    assert main(["optimize", str(src), out, "--dim", "batch=2"]) == 2
    line = one_error_line(capfd.readouterr().err)
    assert "--dim ['batch']: not a symbolic dimension" in line and "['X_0', 'X_1']" in line
