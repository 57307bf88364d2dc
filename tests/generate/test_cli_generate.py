"""``softdeploy generate``: a tiny model folder end to end, and bad input as one line."""

from __future__ import annotations

import json

import pytest

from softdeploy.cli import main

pytestmark = pytest.mark.models  # transformers, tokenizers


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama folder with a word-level tokenizer whose vocabulary holds <think> and </think>."""
    from generate.tiny import VOCAB, tiny_causal_lm
    from softdeploy_cases.soft_thinking import SPECIALS, QAData, write_model_folder

    vocab = [*SPECIALS, *(f"w{i}" for i in range(VOCAB - len(SPECIALS)))]
    return write_model_folder(tiny_causal_lm("llama"), QAData([], vocab), tmp_path_factory.mktemp("tiny-model"))


def one_line(err: str) -> str:
    # the CLI may also say where it logged the libraries' output (torch's warnings of an earlier call in this process)
    lines = [line for line in err.splitlines() if line.strip() and "lines of library output" not in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ([], "no prompt"),
        (["--prompt", "w1", "--max-new-tokens", "0"], "--max-new-tokens 0"),
        (["--prompt", "w1", "--soft-thinking", "--think-end", "nosuch"], "--think-end 'nosuch' is not a token"),
        (["--prompt", "w1", "--soft-thinking", "--top-p", "0"], "top_p"),
        (["--prompt", "w1", "--soft-thinking", "--max-topk", "0"], "max_topk"),
        (["--prompts-file", "missing.txt"], "--prompts-file missing.txt: no such file"),
        (["--prompt", "w1", "--step-model", "missing.onnx"], "--step-model missing.onnx: no such file"),
    ],
)
def test_bad_arguments_are_one_line(model_dir, capfd, extra, words):
    assert main(["generate", str(model_dir), *extra]) == 2
    line = one_line(capfd.readouterr().err)
    assert line.startswith("softdeploy: error:") and words in line, line


def test_a_folder_that_is_not_a_model_is_one_line(tmp_path, capfd):
    assert main(["generate", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    assert "no such folder" in one_line(capfd.readouterr().err)
    assert main(["generate", str(tmp_path), "--prompt", "x"]) == 2
    assert "no config.json" in one_line(capfd.readouterr().err)


@pytest.mark.slow
def test_generates_on_both_backends_with_the_same_ids(model_dir, tmp_path, capfd):
    common = ["--prompt", "<bos> w1 w2 w3 <think>", "--prompt", "w7 <think>", "--soft-thinking", "--noise", "gumbel"]
    common += ["--tau", "0.5", "--max-new-tokens", "12", "--seed", "3"]
    ort = tmp_path / "ort.json"
    eager = tmp_path / "torch.json"
    assert (
        main(["generate", str(model_dir), *common, "--export-dir", str(tmp_path / "export"), "--json", str(ort)]) == 0
    )
    printed = capfd.readouterr().out
    assert "thinking (" in printed and "tokens/s" in printed
    assert main(["generate", str(model_dir), *common, "--backend", "torch", "--json", str(eager)]) == 0
    a, b = json.loads(ort.read_text()), json.loads(eager.read_text())
    assert [r["tokens"] for r in a["rows"]] == [r["tokens"] for r in b["rows"]]
    assert all(len(r["tokens"]) <= 12 for r in a["rows"])
    # the export is reused, and --json refuses to replace a file without --overwrite
    assert (tmp_path / "export" / "decoder.json").is_file()
    assert (
        main(["generate", str(model_dir), *common, "--export-dir", str(tmp_path / "export"), "--json", str(ort)]) == 2
    )
    assert "--overwrite" in one_line(capfd.readouterr().err)
