"""Hostile files for every CLI verb that reads one (quantize, optimize, compile, export) and for
Session: missing, a directory, empty, random bytes, truncated ONNX, valid ONNX of the wrong kind, an
.npz holding a pickled object array (whose unpickling would run code), and overwrite refusals.

Each must end in a one-line error and a non-zero exit, never a Python traceback, and never unpickle.
``compare`` reads no user file (its inputs are built-in cases), so it has no case here. No verb
reads a torch checkpoint; test_no_unsafe_deserialization checks every torch.load in softdeploy/.
"""

from __future__ import annotations

import ast
import pathlib
from pathlib import Path

import numpy as np
import pytest

from softdeploy import SoftdeployError

ROOT = Path(__file__).resolve().parents[2]


class _Unpickled:
    """An object whose unpickling creates a marker file: proof that a loader unpickled user data."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _model_bytes(op_type: str = "MatMul", domain: str = "") -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 8])
    w = numpy_helper.from_array(np.eye(8, dtype=np.float32), "W")
    inputs = ["X", "W"] if op_type == "MatMul" else ["X"]
    node = helper.make_node(op_type, inputs, ["Y"], domain=domain)
    graph = helper.make_graph([node], "g", [x], [y], initializer=[w] if op_type == "MatMul" else [])
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """One of each hostile file (and a good model, for the cases where only another argument is bad)."""
    d = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(0)
    good = _model_bytes()
    f = {
        "missing": d / "missing.onnx",
        "directory": d / "directory.onnx",
        "empty": d / "empty.onnx",
        "random": d / "random.onnx",
        "truncated": d / "truncated.onnx",
        "unknown_op": d / "unknown_op.onnx",  # valid ONNX, wrong kind: an op nothing implements
        "tensor": d / "tensor.onnx",  # valid ONNX protobuf, wrong kind: a TensorProto, not a model
        "good": d / "good.onnx",
        "pickled_npz": d / "pickled.npz",
        "random_npz": d / "random.npz",
        "marker": d / "UNPICKLED",
    }
    f["directory"].mkdir()
    f["empty"].write_bytes(b"")
    f["random"].write_bytes(rng.bytes(4096))
    f["truncated"].write_bytes(good[: len(good) // 2])
    f["unknown_op"].write_bytes(_model_bytes("NoSuchOp", "com.softdeploy"))
    from onnx import numpy_helper

    f["tensor"].write_bytes(numpy_helper.from_array(np.ones((2, 8), np.float32)).SerializeToString())
    f["good"].write_bytes(good)
    np.savez(f["pickled_npz"], X=np.array([_Unpickled(f["marker"])], dtype=object))
    f["random_npz"].write_bytes(rng.bytes(4096))
    # export factories (FACTORY = file.py:attr)
    for name, text in {
        "empty_py": b"",
        "random_py": rng.bytes(512),
        "truncated_py": b"def make():\n    return (\n",
        "wrong_py": b"def make():\n    return 42\n",  # valid Python, wrong kind: not (module, inputs)
    }.items():
        f[name] = d / f"{name}.py"
        f[name].write_bytes(text)
    f["directory_py"] = d / "directory_py.py"
    f["directory_py"].mkdir()
    f["missing_py"] = d / "missing_py.py"
    return f


MODEL_KINDS = ("missing", "directory", "empty", "random", "truncated", "unknown_op", "tensor")


def _cases() -> dict[str, tuple[str, ...]]:
    """Case id -> CLI argv template ({name} is a hostile file, {out} a fresh output path)."""
    cases: dict[str, tuple[str, ...]] = {}
    for kind in MODEL_KINDS:
        cases[f"quantize-{kind}"] = ("quantize", f"{{{kind}}}", "-o", "{out}.onnx")
        cases[f"optimize-{kind}"] = ("optimize", f"{{{kind}}}", "{out}.onnx")
        cases[f"compile-{kind}"] = ("compile", f"{{{kind}}}", "-o", "{out}.so")
    for kind in ("missing_py", "directory_py", "empty_py", "random_py", "truncated_py", "wrong_py"):
        cases[f"export-{kind}"] = ("export", f"{{{kind}}}:make", "{out}.onnx")
    cases["export-onnx_as_factory"] = ("export", "{good}:make", "{out}.onnx")
    for kind in ("pickled_npz", "random_npz", "missing"):
        cases[f"quantize-data-{kind}"] = (
            "quantize",
            "{good}",
            "-o",
            "{out}.onnx",
            "--mode",
            "static",
            "--data",
            f"{{{kind}}}",
        )
        cases[f"optimize-feeds-{kind}"] = ("optimize", "{good}", "{out}.onnx", "--feeds", f"{{{kind}}}")
    return cases


CASES = _cases()


def _argv(case: str, files: dict[str, Path], out: Path) -> list[str]:
    subs = {k: str(v) for k, v in files.items()} | {"out": str(out / case)}
    return [a.format(**subs) for a in CASES[case]]


def assert_one_line_error(result) -> None:
    """``result``: a CliRun (tests/conftest.py). An exception escaping main() fails the test by itself."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, f"exit 0 on a hostile input; stdout: {result.stdout[-2000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(lines) == 1 and "error" in lines[0].lower(), result.stderr[-3000:]


@pytest.mark.parametrize("case", list(CASES))
def test_cli_refuses_hostile_file_in_one_line(case, files, run_cli, tmp_path):
    assert_one_line_error(run_cli(*_argv(case, files, tmp_path), cwd=tmp_path))
    assert not files["marker"].exists(), "a pickled object array was unpickled"


def test_no_cli_case_unpickled_user_data(files, run_cli, tmp_path):
    """Independent of the error format: whatever the exit, no command given the pickled array unpickled it."""
    pickled = [case for case in CASES if "pickled_npz" in case]
    assert pickled
    for case in pickled:
        run_cli(*_argv(case, files, tmp_path), cwd=tmp_path)
        assert not files["marker"].exists(), f"{case}: a pickled object array was unpickled"


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_session_refuses_hostile_file_with_a_softdeploy_error(kind, files):
    from softdeploy.runtime import Session

    with pytest.raises(SoftdeployError) as info:
        Session(files[kind])
    message = str(info.value)
    assert "\n" not in message.strip() and message.strip(), message


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_session_refuses_hostile_bytes(kind, files):
    """The same files given as bytes (Session accepts serialized models too)."""
    from softdeploy.runtime import Session

    path = files[kind]
    if not path.is_file():
        return  # missing / directory: no bytes to give; the path form is tested above
    with pytest.raises(SoftdeployError):
        Session(path.read_bytes())


# ---- overwrite refusals ------------------------------------------------------------------------------


OVERWRITE_CASES = {
    "quantize-existing-output": ("quantize", "{good}", "-o", "{existing}"),
    "quantize-onto-its-source": ("quantize", "{model}", "-o", "{model}"),
    "optimize-existing-output": ("optimize", "{good}", "{existing}"),
    "compile-existing-output": ("compile", "{good}", "--shape", "X=2x8", "-o", "{existing}"),
}


@pytest.mark.parametrize("case", list(OVERWRITE_CASES))
def test_cli_refuses_to_overwrite(case, files, tmp_path, run_cli):
    existing = tmp_path / "existing.onnx"
    existing.write_bytes(b"precious")
    model = tmp_path / "model.onnx"
    model.write_bytes(files["good"].read_bytes())
    subs = {"good": str(files["good"]), "existing": str(existing), "model": str(model)}
    argv = OVERWRITE_CASES[case]
    result = run_cli(*[a.format(**subs) for a in argv], cwd=tmp_path)
    assert existing.read_bytes() == b"precious", "the existing output was overwritten"
    assert model.read_bytes() == files["good"].read_bytes(), "the source model was overwritten"
    assert not (tmp_path / "existing.json").exists(), "a report next to the existing output was written"
    assert_one_line_error(result)
    # Writing onto the input is refused even with --overwrite; any other existing output names the flag.
    assert ("is also the input" if "onto-its-source" in case else "--overwrite") in result.stderr, result.stderr


# ---- no unsafe deserialization anywhere ---------------------------------------------------------------


def unsafe_loads(source: str, filename: str) -> list[str]:
    """Calls that can unpickle: pickle.load(s) / cPickle / dill / joblib.load, np.load without
    allow_pickle=False, torch.load without weights_only=True."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        name, kw = node.func.attr, {k.arg: k.value for k in node.keywords}

        def is_const(key: str, value: object, kw: dict = kw) -> bool:
            v = kw.get(key)
            return isinstance(v, ast.Constant) and v.value is value

        where = f"{filename}:{node.lineno}"
        if owner_name in ("pickle", "cPickle", "dill", "joblib", "_pickle") and name in ("load", "loads"):
            found.append(f"{where}: {owner_name}.{name}")
        elif owner_name in ("np", "numpy") and name == "load" and not is_const("allow_pickle", False):
            found.append(f"{where}: {owner_name}.load without allow_pickle=False")
        elif owner_name == "torch" and name == "load" and not is_const("weights_only", True):
            found.append(f"{where}: torch.load without weights_only=True")
    return found


def test_unsafe_load_detector_finds_each_pattern():
    bad = (
        "import pickle, numpy as np, torch\n"
        "pickle.load(f)\npickle.loads(b)\nnp.load(p)\nnp.load(p, allow_pickle=True)\n"
        "torch.load(p)\ntorch.load(p, weights_only=False)\n"
    )
    assert len(unsafe_loads(bad, "bad.py")) == 6
    good = "np.load(p, allow_pickle=False)\ntorch.load(p, map_location='cpu', weights_only=True)\n"
    assert unsafe_loads(good, "good.py") == []


def test_no_unsafe_deserialization_in_softdeploy():
    found = []
    for path in sorted((ROOT / "softdeploy").rglob("*.py")):
        found += unsafe_loads(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, found
