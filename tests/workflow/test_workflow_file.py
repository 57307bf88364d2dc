"""What a workflow file may say: a results folder inside ``out`` only, thread counts this machine can run, and every
problem with the file itself (encoding, YAML tags, duplicate keys) as one WorkflowError line naming the file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from softdeploy.cli import main
from softdeploy.errors import SoftdeployWarning
from softdeploy.workflow import WorkflowError, load_workflow, parse

TESTS = Path(__file__).resolve().parents[1]
MINIMAL = {"model": "m.onnx", "data": {"inputs": "x.npz"}}


def _write(tmp_path: Path, text: str | bytes, name: str = "wf.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# ---- the results folder ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["..", ".", "..."])
@pytest.mark.parametrize("form", ["yaml", "json"])
def test_a_name_that_is_not_a_folder_of_its_own_is_refused(tmp_path: Path, name: str, form: str) -> None:
    raw = {"name": name, **MINIMAL}
    text = json.dumps(raw) if form == "json" else f"name: '{name}'\nmodel: m.onnx\ndata: {{inputs: x.npz}}\n"
    path = _write(tmp_path, text, f"wf.{form}")
    with pytest.raises(WorkflowError, match=r"name: .*not a folder of its own \(rule: a plain folder name") as e:
        load_workflow(path)
    assert "\n" not in str(e.value)


def test_a_file_whose_stem_is_dots_needs_a_name(tmp_path: Path) -> None:
    """The default name is the file's stem: '..yaml' would name the folder '.'."""
    path = _write(tmp_path, "model: m.onnx\ndata: {inputs: x.npz}\n", "..yaml")
    with pytest.raises(WorkflowError, match=r"name: '\.' is not a folder of its own"):
        load_workflow(path)
    assert load_workflow(_write(tmp_path, "name: ok\nmodel: m.onnx\ndata: {inputs: x.npz}\n", "..yaml")).name == "ok"


@pytest.mark.parametrize("name", ["a/b", "..\\up", "x\0y"])
def test_a_name_with_a_separator_is_refused_even_without_the_schema(name: str) -> None:
    from softdeploy.workflow.spec import check_folder_name

    with pytest.raises(WorkflowError, match=r"name: .*(separator|NUL)"):
        check_folder_name(name, "workflow")


@pytest.fixture
def model_and_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny ONNX model and its inputs in ``tmp_path/wf``, beside the user's own report.md and models/fp32.onnx."""
    sys.path.insert(0, str(TESTS))
    from quant.tiny import mlp_with_custom_op

    folder = tmp_path / "wf"
    folder.mkdir()
    onnx.save(mlp_with_custom_op(with_function=True, outlier=200.0), folder / "m.onnx")
    np.savez(folder / "x.npz", X=np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32))
    (folder / "report.md").write_text("the user's own notes\n")
    monkeypatch.chdir(tmp_path)
    return folder


def test_a_run_named_dot_dot_writes_nothing_outside_its_results_folder(model_and_data: Path) -> None:
    wf = {**MINIMAL, "name": "..", "out": "results", "variants": ["ort-fp32"], "rounds": 1}
    (model_and_data / "wf.json").write_text(json.dumps(wf))
    before = sorted(p.name for p in model_and_data.iterdir())
    assert main(["run", str(model_and_data / "wf.json"), "--quick"]) == 2  # was: 0, report.md overwritten
    assert (model_and_data / "report.md").read_text() == "the user's own notes\n"
    assert sorted(p.name for p in model_and_data.iterdir()) == before  # no models/, results.json, ...


def test_run_workflow_refuses_a_workflow_built_in_code_with_a_bad_name(model_and_data: Path) -> None:
    import dataclasses

    from softdeploy.progress import SilentProgress
    from softdeploy.workflow.run import run_workflow

    wf = parse({**MINIMAL, "out": "results"}, base=model_and_data, name="ok")
    with pytest.raises(WorkflowError, match=r"name: '\.\.'"):
        run_workflow(dataclasses.replace(wf, name=".."), SilentProgress())
    assert not (model_and_data / "models").exists()


def test_run_compare_refuses_a_case_named_dot_dot(tmp_path: Path) -> None:
    from softdeploy.compare import run_compare
    from softdeploy.progress import SilentProgress

    class Case:
        name = ".."

        def prepare(self, progress: object) -> None:
            raise AssertionError("no work before the name is checked")

    with pytest.raises(WorkflowError, match=r"case '\.\.': name"):
        run_compare(Case(), tmp_path / "res" / "..", progress=SilentProgress())  # type: ignore[arg-type]
    assert not (tmp_path / "models").exists()


# ---- threads ------------------------------------------------------------------------------------------------------


def test_threads_above_the_cpu_count_are_lowered_to_it_with_a_warning() -> None:
    from softdeploy.workflow.spec import bounded_threads, cpu_count

    over = cpu_count() + 1
    with pytest.warns(SoftdeployWarning, match=rf"threads: {over} is more than the {cpu_count()} CPU cores"):
        wf = parse({**MINIMAL, "threads": over}, name="wf")
    assert wf.threads == cpu_count()
    with pytest.warns(SoftdeployWarning, match="threads: 100000 is more than"):
        assert bounded_threads(100000) == cpu_count()
    assert parse({**MINIMAL, "threads": 1}).threads == 1


@pytest.mark.parametrize("value", [0, True, 2.5])
def test_bounded_threads_refuses_what_is_not_a_thread_count(value: object) -> None:
    from softdeploy.workflow.spec import bounded_threads

    with pytest.raises(WorkflowError, match=r"threads: .* \(rule: a whole number of threads, at least 1\)"):
        bounded_threads(value)  # type: ignore[arg-type]


def test_threads_1e30_is_a_workflow_error(tmp_path: Path) -> None:
    path = _write(tmp_path, json.dumps({**MINIMAL, "threads": 1e30}), "wf.json")
    with pytest.raises(WorkflowError, match=r"wf: threads: 1e\+30 is greater than the maximum of 4096"):
        load_workflow(path)


def test_compare_threads_above_the_cpu_count(model_and_data: Path) -> None:
    from softdeploy.workflow.spec import cpu_count

    over = cpu_count() + 1
    args = ["compare", "wf/m.onnx", "--data", "wf/x.npz", "--quick", "--variants", "ort-fp32", "--out", "res"]
    with pytest.warns(SoftdeployWarning, match=f"threads: {over} is more than"):
        assert main([*args, "--threads", str(over)]) == 0
    assert json.loads(Path("res/m/results.json").read_text())["threads"] == cpu_count()


def test_compare_threads_zero_is_one_line(model_and_data: Path, capfd: pytest.CaptureFixture[str]) -> None:
    args = ["compare", "wf/m.onnx", "--data", "wf/x.npz", "--quick", "--variants", "ort-fp32", "--out", "res"]
    assert main([*args, "--threads", "0"]) == 2
    err = capfd.readouterr().err.strip()
    assert err == "softdeploy: error: m: threads: 0 is less than the minimum of 1", err
    assert not Path("res").exists()


# ---- the file itself ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_file_that_is_not_utf8_is_named(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path, b"name: caf\xe9\nmodel: m.onnx\n", f"wf{suffix}")
    with pytest.raises(WorkflowError, match=r"wf\.(yaml|json): not UTF-8 text: byte 0xe9 at line 1 \(rule: save"):
        load_workflow(path)


def test_a_yaml_tag_error_is_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "model: m.onnx\ndata: {inputs: x.npz}\nthreads: !!python/object:os.system x\n")
    with pytest.raises(WorkflowError) as e:
        load_workflow(path)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: not valid YAML: line 3, column 10: could not determine a constructor")


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ("model: m.onnx\ndata: {inputs: x.npz}\nthreads: 1\nthreads: 2\n", ".yaml", r"line 4, column 1: key 'threads'"),
        ("model: m.onnx\ndata:\n  inputs: x.npz\n  batch: 4\n  batch: 8\n", ".yaml", r"line 5, column 3: key 'batch'"),
        ('{"model": "m.onnx", "data": {"inputs": "x.npz"}, "model": "n.onnx"}', ".json", r"key 'model'"),
        ('{"model": "m.onnx", "data": {"inputs": "x.npz", "inputs": "y.npz"}}', ".json", r"key 'inputs'"),
    ],
)
def test_a_duplicate_key_is_refused(tmp_path: Path, text: str, suffix: str, message: str) -> None:
    path = _write(tmp_path, text, f"wf{suffix}")
    with pytest.raises(WorkflowError, match=message + r" appears twice .*\(rule: each key once") as e:
        load_workflow(path)
    assert str(e.value).startswith(str(path))


def test_yaml_merge_keys_are_not_duplicates() -> None:
    """A merge key (``<<: *anchor``) overridden by the mapping's own key is YAML's way to share settings."""
    from softdeploy.workflow.spec import _load_yaml

    text = "x: &d {inputs: x.npz, batch: 4}\nmodel: m.onnx\ndata:\n  <<: *d\n  batch: 8\n"
    assert _load_yaml(text)["data"] == {"inputs": "x.npz", "batch": 8}
