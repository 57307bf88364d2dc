"""``softdeploy distill --teacher PATH --student ... --texts FILE --layers ...``: any Hugging Face /
sentence-transformers encoder folder as the teacher, students by layer selection of it or from a folder, and the
student written as a folder that transformers' AutoModel and sentence-transformers load (what ``softdeploy export
PATH`` takes). Bad arguments are one line, before any model is loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from softdeploy.cli import main

pytestmark = pytest.mark.models

TEXTS = [
    "the cat sat on the mat",
    "how do I reset my password",
    "what is the capital of France",
    "the weather is nice today",
    "I like green tea",
    "where is the station",
    "please call me later",
    "this movie was great",
]
QUICK = ["--steps", "2", "--batch-size", "4", "--max-length", "16", "--extra-texts", "none"]


@pytest.fixture(scope="module")
def minilm() -> Path:
    from softdeploy.models.assets import minilm_dir

    return minilm_dir()


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


def st_and_ours(folder: Path, safetensors: Path) -> tuple[np.ndarray, np.ndarray]:
    """Sentence embeddings of TEXTS by sentence-transformers from ``folder`` and by softdeploy's student file."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    from softdeploy.distill import load_student

    st = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    want = st.encode(TEXTS, convert_to_numpy=True)
    student, _ = load_student(safetensors)
    enc = AutoTokenizer.from_pretrained(str(folder))(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        _, got = student(enc["input_ids"], enc["attention_mask"])
    return want, got.numpy()


@pytest.mark.slow
def test_minilm_folder_as_teacher_layers_0_3_5_gives_a_loadable_student_folder(
    tmp_path: Path, minilm: Path, texts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModel

    out = tmp_path / "run"
    argv = ["distill", str(out), "--teacher", str(minilm), "--layers", "0,3,5", "--texts", str(texts), *QUICK]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "teacher layers [0, 3, 5]" in printed and f"wrote {out / 'student'}" in printed
    folder = out / "student"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "modules.json"):
        assert (folder / name).is_file(), name
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"]
    bert = AutoModel.from_pretrained(str(folder), local_files_only=True)
    assert bert.config.num_hidden_layers == 3 and bert.config.hidden_size == 384
    want, got = st_and_ours(folder, out / "student.safetensors")
    np.testing.assert_allclose(got, want, atol=1e-5)

    # the student folder is what `softdeploy export PATH` takes: exported, validated, and its sentence embeddings
    # in onnxruntime are sentence-transformers' (the export validates against torch; this checks the pooling too)
    onnx_path = tmp_path / "student.onnx"
    assert main(["export", str(folder), str(onnx_path)]) == 0
    from transformers import AutoTokenizer

    from softdeploy.runtime import Session

    enc = AutoTokenizer.from_pretrained(str(folder))(TEXTS, padding=True, return_tensors="np")
    sess = Session(onnx_path)
    feeds = {name: enc[name].astype(np.int64) for name in sess.input_names}
    (embedding,) = sess.run(feeds, ["sentence_embedding"])
    np.testing.assert_allclose(embedding, want, atol=1e-5)
    summary = json.loads((out / "distill.json").read_text())
    assert summary["teacher"] == str(minilm) and summary["texts"] == len(TEXTS) and summary["layers"] == 3
    # the student folder is not replaced without --overwrite, and is with it
    assert main(argv) == 2 and "pass --overwrite" in capsys.readouterr().err
    assert main([*argv[:2], "--overwrite", *argv[2:]]) == 0
    # a given student folder (the teacher's tokenizer): distilled further
    again = tmp_path / "again"
    assert (
        main(["distill", str(again), "--teacher", str(minilm), "--student", str(folder), "--texts", str(texts), *QUICK])
        == 0
    )
    summary = json.loads((again / "distill.json").read_text())
    assert summary["student"] == f"student folder {folder}, distilled" and summary["layers"] == 3
    AutoModel.from_pretrained(str(again / "student"), local_files_only=True)


def distilbert_teacher(folder: Path, minilm: Path) -> Path:
    """A random 4-layer DistilBERT (no token types, layers at transformer.layer) with MiniLM's uncased tokenizer,
    saved as a sentence-transformers folder with CLS pooling and no Normalize module."""
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    cfg = DistilBertConfig(vocab_size=30522, dim=32, n_layers=4, n_heads=4, hidden_dim=64, max_position_embeddings=64)
    DistilBertModel(cfg).save_pretrained(str(folder), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm / name, folder / name)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    return folder


def test_another_architecture_and_pooling_as_teacher(tmp_path: Path, minilm: Path, texts: Path) -> None:
    from transformers import AutoModel

    teacher = distilbert_teacher(tmp_path / "teacher", minilm)
    out = tmp_path / "run"
    assert main(["distill", str(out), "--teacher", str(teacher), "--layers", "1,3", "--texts", str(texts), *QUICK]) == 0
    folder = out / "student"
    model = AutoModel.from_pretrained(str(folder), local_files_only=True)
    assert type(model).__name__ == "DistilBertModel" and model.config.n_layers == 2
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_cls_token"] and not pooling["pooling_mode_mean_tokens"]
    assert not (folder / "2_Normalize").exists()  # as the teacher: its embeddings are not normalised
    # the kept layers are the teacher's layers 1 and 3, copied
    teacher_model = AutoModel.from_pretrained(str(teacher), local_files_only=True)
    kept = dict(teacher_model.transformer.layer[3].named_parameters())
    start = json.loads((out / "distill.json").read_text())
    assert start["layers"] == 2 and kept  # trained 2 steps from them: shapes equal
    for name, p in model.transformer.layer[1].named_parameters():
        assert p.shape == kept[name].shape
    from sentence_transformers import SentenceTransformer

    e = SentenceTransformer(str(folder), device="cpu", local_files_only=True).encode(TEXTS[:2])
    assert e.shape == (2, 32) and np.isfinite(e).all()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--teacher", "/nonexistent/model"], "/nonexistent/model: no such folder"),
        (["--teacher", "EMPTYDIR"], "holds no config.json (rule: a Hugging Face model folder"),
        (
            ["--teacher", "MINILM", "--layers", "0,3,9"],
            "layers [0, 3, 9] are not distinct increasing indices of the teacher's 6 layers",
        ),
        (["--teacher", "MINILM", "--stages", "7,3"], "stages [7, 3] must start below the teacher's 6 layers"),
        (
            ["--student", "/nonexistent/student"],
            "student '/nonexistent/student' is neither 'reduce', 'l3' nor a model folder",
        ),
        (
            ["--student", "l3", "--layers", "0,1"],
            "--layers and --stages apply to student 'reduce', not 'l3'",
        ),
    ],
)
def test_argument_errors_are_one_line_before_any_model_is_loaded(
    tmp_path: Path,
    minilm: Path,
    texts: Path,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def loaded(*_: object, **__: object) -> None:
        pytest.fail("a model was loaded before the bad argument was refused")

    monkeypatch.setattr("softdeploy.distill.run.load_teacher", loaded)
    monkeypatch.setattr("softdeploy.distill.run.load_encoder_folder", loaded)
    (tmp_path / "empty").mkdir()
    swap = {"EMPTYDIR": str(tmp_path / "empty"), "MINILM": str(minilm)}
    argv = [swap.get(a, a) for a in argv]
    assert main(["distill", str(tmp_path / "out"), "--texts", str(texts), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("softdeploy: error: ") and message in err[0], err


def test_a_pickle_only_teacher_is_refused(tmp_path: Path) -> None:
    from softdeploy.distill.students import load_encoder_folder
    from softdeploy.errors import DistillError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "num_hidden_layers": 2}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(DistillError, match=r"holds no .safetensors weights .*pytorch_model.bin is never loaded"):
        load_encoder_folder(tmp_path)


def modernbert_teacher(folder: Path, minilm: Path) -> Path:
    """A random 4-layer ModernBERT (global attention every 2nd layer, local elsewhere; layers at ``layers``) with
    MiniLM's uncased tokenizer, as a plain Hugging Face folder (mean pooling, normalised: the default)."""
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    cfg = ModernBertConfig(
        vocab_size=30522,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=64,
        global_attn_every_n_layers=2,
        local_attention=16,
        pad_token_id=0,
    )
    ModernBertModel(cfg).save_pretrained(str(folder), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm / name, folder / name)
    return folder


def test_a_modernbert_teacher_keeps_layer_0_first_and_its_layer_types(
    tmp_path: Path, minilm: Path, texts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModel

    teacher = modernbert_teacher(tmp_path / "teacher", minilm)
    types = AutoModel.from_pretrained(str(teacher), local_files_only=True).config.layer_types
    out = tmp_path / "run"
    argv = ["distill", str(out), "--teacher", str(teacher), "--texts", str(texts), *QUICK]
    capsys.readouterr()  # the teacher's own saving progress
    assert main([*argv, "--layers", "1,3"]) == 2  # layer 0 is built differently: refused before any model loads
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "layers [1, 3] of a modernbert teacher (rule: keep layer 0 first" in err[0], err
    assert main([*argv, "--layers", "0,3"]) == 0
    student = AutoModel.from_pretrained(str(out / "student"), local_files_only=True)
    assert type(student).__name__ == "ModernBertModel" and student.config.num_hidden_layers == 2
    assert student.config.layer_types == [types[0], types[3]]
    from sentence_transformers import SentenceTransformer

    e = SentenceTransformer(str(out / "student"), device="cpu", local_files_only=True).encode(TEXTS[:2])
    assert e.shape == (2, 32) and np.isfinite(e).all()
