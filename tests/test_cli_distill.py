"""``softdeploy distill``: a real (tiny) run writes a loadable student and its summary, resume state is
cleaned up, and bad input is one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from softdeploy.cli import main

QUICK = ["--steps", "2", "--batch-size", "4", "--limit-texts", "8", "--max-length", "16", "--extra-count", "6"]


@pytest.mark.models
def test_distill_writes_a_loadable_student(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from softdeploy.distill import load_student

    out = tmp_path / "run"
    assert main(["distill", str(out), "--layers", "0,3", *QUICK]) == 0
    printed = capsys.readouterr().out
    assert "teacher layers [0, 3]" in printed and "2 steps on 8 texts" in printed
    student, meta = load_student(out / "student.safetensors")
    assert student.num_layers == 2
    summary = json.loads((out / "distill.json").read_text())
    assert summary["layers"] == 2 and summary["config"]["steps"] == 2
    assert summary["extra_texts"] == 6  # fact and WordNet questions in half of every batch by default
    assert json.loads(meta["summary"])["student"] == summary["student"]
    assert not (out / "checkpoints").exists()
    # a second run does not replace the student without --overwrite
    assert main(["distill", str(out), *QUICK]) == 2
    assert "student.safetensors exists; pass --overwrite" in capsys.readouterr().err


@pytest.mark.models
def test_distill_without_extra_texts_and_from_other_sources(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["distill", str(out), "--layers", "0,3", *QUICK, "--extra-texts", "none", "--sources", "wordnet"]) == 0
    summary = json.loads((out / "distill.json").read_text())
    assert summary["texts"] == 8 and summary["extra_texts"] == 0


@pytest.mark.models
def test_distill_mixes_extra_texts_into_every_batch(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["--layers", "0,3", *QUICK, "--extra-texts", "wordnet", "--extra-count", "12", "--extra-fraction", "0.25"]
    assert main(["distill", str(out), *argv]) == 0
    summary = json.loads((out / "distill.json").read_text())
    assert summary["texts"] == 8 and summary["extra_texts"] == 12 and summary["config"]["extra_fraction"] == 0.25


@pytest.mark.models
def test_distill_takes_its_broad_texts_from_a_file(tmp_path: Path) -> None:
    broad = tmp_path / "broad.txt"
    broad.write_text(
        "Who wrote Hamlet?\n\nWhat is the capital of Peru?\nWho wrote Hamlet?\n"
        + "".join(f"Which planet is number {i} from the sun?\n" for i in range(1, 9))
    )
    out = tmp_path / "run"
    argv = ["--layers", "0,3", *QUICK, "--extra-file", str(broad)]
    assert main(["distill", str(out), *argv]) == 0  # QUICK's --extra-count 6: a sample of the 10 distinct texts
    assert json.loads((out / "distill.json").read_text())["extra_texts"] == 6
    assert main(["distill", str(out), *argv, "--extra-count", "50", "--overwrite"]) == 0
    assert json.loads((out / "distill.json").read_text())["extra_texts"] == 10  # blank and repeated lines dropped


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--stages", "4,5"], "stages [4, 5] must be decreasing", marks=pytest.mark.models),
        pytest.param(
            ["--student", "l3", "--layers", "0,1"], "apply to student 'reduce', not 'l3'", marks=pytest.mark.models
        ),
        (["--objective", "kd", "--batch-size", "2"], "needs batch_size >= 3"),
        (["--softening", "uniform_mixing", "--objective", "kd", "--temperature", "0.5"], "temperature 0.5"),
        (["--texts", "/nonexistent/texts.txt"], "no such file"),
        (["--steps", "0"], "steps 0 is out of range"),
        pytest.param(["--extra-texts", "wikipedia"], "source 'wikipedia' is not one of", marks=pytest.mark.models),
        (["--sources", "chatterbot,news"], "source 'news' is not one of"),
        pytest.param(
            ["--extra-texts", "wordnet-questions:0"],
            "the count '0' is not a positive integer",
            marks=pytest.mark.models,
        ),
        pytest.param(["--extra-texts", "wordnet,wordnet:5"], "name a source twice", marks=pytest.mark.models),
        (["--extra-texts", "wordnet", "--extra-fraction", "1.5"], "extra_fraction 1.5 is out of range"),
        pytest.param(
            ["--extra-file", "/nonexistent/broad.txt"],
            "--extra-file /nonexistent/broad.txt: no such file",
            marks=pytest.mark.models,
        ),
        pytest.param(["--extra-file", "EMPTY"], "the file holds no text", marks=pytest.mark.models),
        pytest.param(
            ["--extra-texts", "wordnet", "--extra-file", "EMPTY"],
            "--extra-texts and --extra-file both name",
            marks=pytest.mark.models,
        ),
        (["--lr", "-1"], "lr -1.0 is out of range (rule: a learning rate >= 0)"),
        (["--lr", "nan"], "lr nan is not a finite number"),
        (["--lam", "-0.5"], "lam -0.5 is out of range"),
    ],
)
def test_distill_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "empty.txt").write_text("\n  \n")
    argv = [str(tmp_path / "empty.txt") if a == "EMPTY" else a for a in argv]
    assert main(["distill", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("softdeploy: error: ") and message in err[0], err
    assert len([line for line in err if line.startswith("softdeploy: error")]) == 1


def test_distill_into_a_file_is_one_line_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "student"
    out.write_text("a file the user keeps")
    assert main(["distill", str(out), *QUICK]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"softdeploy: error: distill: OUT {out} is a file; give a folder (the student, distill.json and "
        "checkpoints go there)"
    ]
    assert out.read_text() == "a file the user keeps"


def test_distill_usage_error_for_a_bad_layer_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["distill", "out", "--layers", "0,x"])
    assert e.value.code == 2
    assert "'0,x' is not a comma-separated list of integers" in capsys.readouterr().err
