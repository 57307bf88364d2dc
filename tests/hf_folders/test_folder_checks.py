"""A model folder is checked before any weight is read or module built: pickled weights are refused by name, a
config without a known task asks for --task, a sentence-transformers module softdeploy does not build is named;
every problem is one line from the CLI. Outputs are renamed only one distinct name per output."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from softdeploy.cli import main
from softdeploy.errors import ExportError

pytestmark = pytest.mark.models


def _config(folder: Path, **extra: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    raw = {"model_type": "bert", "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64}
    (folder / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 1, "vocab_size": 64, **extra}))
    return folder


def test_pickled_weights_are_refused_naming_the_file_and_never_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _config(tmp_path / "m", architectures=["BertModel"])
    # a pickle that would run code if torch.load read it: the refusal must come before any reading
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04cos\nsystem\n(S'touch pwned'\ntR.")
    assert main(["export", str(folder), str(tmp_path / "out.onnx")]) == 2
    err = capsys.readouterr().err
    assert "pytorch_model.bin: pickled weights are refused" in err and "safetensors" in err
    assert err.count("\n") == 1 and not (tmp_path / "out.onnx").exists() and not Path("pwned").exists()


def test_a_folder_without_weights_or_config_is_named(tmp_path: Path) -> None:
    from softdeploy.export.hf import inspect_folder

    with pytest.raises(ExportError, match="does not exist"):
        inspect_folder(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match=r"no config.json"):
        inspect_folder(tmp_path / "empty")
    with pytest.raises(ExportError, match=r"no model.safetensors"):
        inspect_folder(_config(tmp_path / "noweights", architectures=["BertModel"]))


def test_a_truncated_safetensors_file_is_refused_from_its_header(tmp_path: Path) -> None:
    from softdeploy.export.hf import inspect_folder

    folder = _config(tmp_path / "m", architectures=["BertModel"])
    (folder / "model.safetensors").write_bytes((10_000).to_bytes(8, "little") + b"{}")
    with pytest.raises(ExportError, match=r"model.safetensors: not a readable safetensors file"):
        inspect_folder(folder)


def test_the_task_comes_from_the_architectures_or_must_be_given(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from softdeploy.export.hf import task_from_config

    assert task_from_config(SimpleNamespace(architectures=["BertForTokenClassification"])) == "token-classification"
    assert task_from_config(SimpleNamespace(architectures=["GPT2LMHeadModel"])) == "causal-lm"
    with pytest.raises(ExportError, match=r"--task"):
        task_from_config(SimpleNamespace(architectures=["SomethingElse"]))


def test_an_unknown_task_is_one_cli_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["export", str(tmp_path), "out.onnx", "--task", "translation"])
    assert e.value.code == 2 and "invalid choice: 'translation'" in capsys.readouterr().err


def test_a_sentence_transformers_module_softdeploy_does_not_build_is_named(tmp_path: Path) -> None:
    from softdeploy.export.hf import inspect_folder

    folder = _config(tmp_path / "st", architectures=["BertModel"])
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ExportError, match=r"module 'sentence_transformers.models.Dense' is not one softdeploy builds"):
        inspect_folder(folder)
    modules[1] = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    two = {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}  # concatenated modes: not built
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(two))
    (folder / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    with pytest.raises(ExportError, match=r"pooling modes \['pooling_mode_mean_tokens', 'pooling_mode_max_tokens'\]"):
        inspect_folder(folder)


def _two_output_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("linear_1", "relu_2")]
    nodes = [helper.make_node("Neg", ["x"], ["linear_1"]), helper.make_node("Relu", ["linear_1"], ["relu_2"])]
    return helper.make_model(helper.make_graph(nodes, "g", [x], outs))


def test_outputs_are_renamed_where_they_are_read() -> None:
    from softdeploy.export.hf import rename_outputs

    model = rename_outputs(_two_output_model(), ["logits", "scores"])
    onnx.checker.check_model(model, full_check=True)
    assert [o.name for o in model.graph.output] == ["logits", "scores"]
    assert list(model.graph.node[1].input) == ["logits"]  # the second node reads the renamed value
    with pytest.raises(ExportError, match=r"the model has 2 outputs \['linear_1', 'relu_2'\]"):
        rename_outputs(_two_output_model(), ["logits"])
    with pytest.raises(ExportError, match=r"'x' already names a value"):
        rename_outputs(_two_output_model(), ["x", "y"])


def test_a_workflow_names_a_folder_and_its_outputs(tmp_path: Path) -> None:
    from softdeploy.workflow import WorkflowError, parse

    data = {"inputs": "eval.npz"}
    hf = parse(
        {"model": {"hf": "m", "task": "text-classification", "outputs": ["scores"]}, "data": data}, base=tmp_path
    )
    assert (hf.folder, hf.task, hf.outputs, hf.model) == ("hf", "text-classification", ("scores",), str(tmp_path / "m"))
    st = parse({"model": {"sentence_transformers": "st"}, "data": data}, base=tmp_path)
    assert st.folder == "sentence-transformers" and not st.factory
    factory = parse({"model": {"factory": "m.py:make", "outputs": ["logits"]}, "data": data}, base=tmp_path)
    assert factory.factory and factory.outputs == ("logits",)
    with pytest.raises(WorkflowError, match="model"):
        parse({"model": {"hf": "m", "outputs": []}, "data": data}, base=tmp_path)
