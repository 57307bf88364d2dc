"""The built-in cases' trained weights in ``$SOFTDEPLOY_CACHE`` (trained experts, distilled students, attention
classifiers): a good entry is reused, a poisoned, truncated, undigested or unloadable one is reported in one line,
set aside and trained again. Training itself is replaced by something cheap: these tests are about the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from softdeploy.errors import SoftdeployWarning
from softdeploy.progress import SilentProgress

DAMAGES = ["poison", "truncate", "no digest", "garbage", "wrong shape"]


def _damage(entry: Path, damage: str) -> None:
    """Spoils the cache entry ``entry`` (a safetensors file with its .sha256 sidecar) the way ``damage`` says."""
    from softdeploy.cache import digest_path, seal

    data = entry.read_bytes()
    if damage == "poison":  # same size, other bytes: a file edited or replaced in place
        entry.write_bytes(data[:-4] + bytes(b ^ 0xFF for b in data[-4:]))
    elif damage == "truncate":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "no digest":  # a run killed between the file and its digest, or a cache from before digests
        digest_path(entry).unlink()
    elif damage == "garbage":  # the digest matches, the bytes are not safetensors: the loader raises
        entry.write_bytes(b"\x00" * 64)
        seal(entry)
    elif damage == "wrong shape":  # a valid file whose tensors do not fit the model
        from safetensors.torch import load_file, save_file

        state = {k: torch.zeros(3, *v.shape) for k, v in load_file(str(entry)).items()}
        save_file(state, str(entry))
        seal(entry)
    else:
        raise AssertionError(damage)


def _set_aside(entry: Path, caught: pytest.WarningsRecorder) -> None:
    messages = [str(w.message) for w in caught if issubclass(w.category, SoftdeployWarning)]
    assert len(messages) == 1, messages
    assert str(entry) in messages[0] and "set aside" in messages[0] and "\n" not in messages[0]
    assert len(list(entry.parent.glob(entry.name + ".bad-*"))) == 1


# ---- the shared helper ----------------------------------------------------------------------------------------------


def test_load_or_build_reuses_a_good_entry_and_rebuilds_a_bad_one(tmp_path: Path) -> None:
    from softdeploy.models.cached import load_or_build

    entry = tmp_path / "x.txt"
    builds: list[int] = []

    def build() -> str:
        builds.append(1)
        return "built"

    def run() -> tuple[str, bool]:
        return load_or_build(entry, lambda p: p.read_text(), build, lambda v, tmp: tmp.write_text(v))

    assert run() == ("built", False) and len(builds) == 1
    assert run() == ("built", True) and len(builds) == 1  # reused, not rebuilt
    entry.write_text("poisoned")
    with pytest.warns(SoftdeployWarning, match="does not match|bytes, its digest records") as caught:
        assert run() == ("built", False)
    _set_aside(entry, caught)
    assert len(builds) == 2 and entry.read_text() == "built"


# ---- trained experts (lora_mixer_retrieval) -------------------------------------------------------------------------


def _experts_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[int]]:
    from softdeploy_cases.lora_mixer_retrieval import LoRAMixerRetrieval

    case = LoRAMixerRetrieval(cache_dir=tmp_path)
    trained: list[int] = []

    def train(model: nn.Module, progress: object) -> None:  # instead of minutes of training: fixed weights
        trained.append(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.endswith(("base.weight", "base.bias")):
                    p.fill_(0.5)

    monkeypatch.setattr(case, "_train", train)
    return case, trained


def _routed() -> nn.Module:
    from softdeploy.lora import wrap

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8))
    wrap(model, ["0"], num_experts=2, rank=2)
    return model


@pytest.mark.parametrize("damage", DAMAGES)
def test_trained_experts_a_bad_entry_is_set_aside_and_trained_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    case, trained = _experts_case(tmp_path, monkeypatch)
    entry = tmp_path / "experts-k.safetensors"
    case._load_or_train(_routed(), entry, SilentProgress())
    assert not case._trained_from_cache and len(trained) == 1
    reused = _routed()
    case._load_or_train(reused, entry, SilentProgress())
    assert case._trained_from_cache and len(trained) == 1
    assert torch.equal(reused.state_dict()["0.A"], torch.full_like(reused.state_dict()["0.A"], 0.5))

    _damage(entry, damage)
    with pytest.warns(SoftdeployWarning) as caught:
        case._load_or_train(_routed(), entry, SilentProgress())
    _set_aside(entry, caught)
    assert not case._trained_from_cache and len(trained) == 2
    case._load_or_train(_routed(), entry, SilentProgress())  # the rebuilt entry is good again
    assert case._trained_from_cache


# ---- attention classifiers (attention_variants) ---------------------------------------------------------------------


@pytest.mark.parametrize("damage", DAMAGES)
def test_attention_classifier_a_bad_entry_is_set_aside_and_trained_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    from softdeploy_cases.attention_variants import AttentionVariants

    case = AttentionVariants(cache_dir=tmp_path)
    trained: list[str] = []

    def train(model: nn.Module, attention: str, progress: object) -> None:
        trained.append(attention)
        with torch.no_grad():
            model.weight.fill_(0.25)

    monkeypatch.setattr(case, "_train", train)
    entry = tmp_path / "softpick-k.safetensors"
    case._load_or_train(nn.Linear(4, 3), "softpick", entry, SilentProgress())
    assert case._from_cache["softpick"] is False and trained == ["softpick"]
    model = nn.Linear(4, 3)
    case._load_or_train(model, "softpick", entry, SilentProgress())
    assert case._from_cache["softpick"] is True and trained == ["softpick"]
    assert torch.equal(model.weight, torch.full((3, 4), 0.25))

    _damage(entry, damage)
    with pytest.warns(SoftdeployWarning) as caught:
        case._load_or_train(nn.Linear(4, 3), "softpick", entry, SilentProgress())
    _set_aside(entry, caught)
    assert case._from_cache["softpick"] is False and len(trained) == 2


def test_a_rejected_entry_leaves_the_model_untouched(tmp_path: Path) -> None:
    """A file that lacks a tensor is refused before anything is loaded (training then starts from the init)."""
    from safetensors.torch import save_file

    from softdeploy.errors import CacheError
    from softdeploy.models.cached import load_state_into

    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    save_file({"0.weight": torch.ones(3, 4), "0.bias": torch.ones(3)}, str(tmp_path / "w.safetensors"))
    with pytest.raises(CacheError, match=r"w\.safetensors: lacks 2 tensor\(s\), e\.g\. \['1\.weight', '1\.bias'\]"):
        load_state_into(model, tmp_path / "w.safetensors")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ---- distilled students (minilm_distilled) --------------------------------------------------------------------------


def _tiny_student() -> Any:
    from transformers import BertConfig, BertModel

    from softdeploy.distill.students import SentenceEncoder

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=16,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=16,
        max_position_embeddings=16,
    )
    config._attn_implementation = "eager"
    return SentenceEncoder(BertModel(config, add_pooling_layer=False).eval()).eval()


def _distilled_case(tmp_path: Path) -> tuple[Any, list[Path]]:
    from softdeploy_cases.minilm_distilled import MiniLMDistilled

    case = MiniLMDistilled(cache_dir=tmp_path)
    return case, []


@pytest.mark.models
@pytest.mark.parametrize("damage", ["poison", "truncate", "no digest", "garbage"])
def test_distilled_student_a_bad_entry_is_set_aside_and_distilled_again(tmp_path: Path, damage: str) -> None:
    case, _ = _distilled_case(tmp_path)
    calls: list[Path] = []

    def train(checkpoint: Path) -> Any:
        calls.append(checkpoint)
        return _tiny_student()

    student = case._load_or_distill("k", train, SilentProgress())
    entry = tmp_path / "student-k.safetensors"
    assert case._trained_from_cache is False and calls == [tmp_path / "checkpoint-k.safetensors"]
    reused = case._load_or_distill("k", train, SilentProgress())
    assert case._trained_from_cache is True and len(calls) == 1
    mine, theirs = student.state_dict(), reused.state_dict()
    assert list(mine) == list(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)

    _damage(entry, damage)
    with pytest.warns(SoftdeployWarning) as caught:
        case._load_or_distill("k", train, SilentProgress())
    _set_aside(entry, caught)
    assert case._trained_from_cache is False and len(calls) == 2


@pytest.mark.models
def test_a_damaged_distill_checkpoint_is_set_aside_and_training_starts_over(tmp_path: Path) -> None:
    case, _ = _distilled_case(tmp_path)
    ckpt = tmp_path / "checkpoint-k.safetensors"
    ckpt.write_bytes(b'\x08\x00\x00\x00\x00\x00\x00\x00{"a":1}')  # a truncated / garbled safetensors header
    seen: list[bool] = []

    def train(checkpoint: Path) -> Any:
        seen.append(checkpoint.exists())  # distill would resume from it (and fail on it)
        return _tiny_student()

    with pytest.warns(SoftdeployWarning, match=r"training checkpoint .*checkpoint-k\.safetensors: cannot be resumed"):
        case._load_or_distill("k", train, SilentProgress())
    assert seen == [False]
    assert len(list(tmp_path.glob("checkpoint-k.safetensors.bad-*"))) == 1


@pytest.mark.models
def test_a_readable_distill_checkpoint_is_kept_for_resuming(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from softdeploy.distill.train import CHECKPOINT_FORMAT

    case, _ = _distilled_case(tmp_path)
    ckpt = tmp_path / "checkpoint-k.safetensors"
    save_file({"student.x": torch.ones(2)}, str(ckpt), metadata={"format": CHECKPOINT_FORMAT, "step": "100"})
    seen: list[bool] = []

    def train(checkpoint: Path) -> Any:
        seen.append(checkpoint.exists())
        return _tiny_student()

    case._load_or_distill("k", train, SilentProgress())
    assert seen == [True]
    assert not ckpt.exists()  # the student is stored: its resume state is removed


@pytest.mark.models
def test_a_checkpoint_distill_refuses_is_set_aside_and_training_starts_over(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from softdeploy.distill.train import CHECKPOINT_FORMAT
    from softdeploy.errors import DistillError

    case, _ = _distilled_case(tmp_path)
    ckpt = tmp_path / "checkpoint-k.safetensors"
    save_file({"student.x": torch.ones(2)}, str(ckpt), metadata={"format": CHECKPOINT_FORMAT, "step": "100"})
    seen: list[bool] = []

    def train(checkpoint: Path) -> Any:
        seen.append(checkpoint.exists())
        if checkpoint.exists():  # what distill says of a checkpoint whose run key is not this run's
            raise DistillError(f"{checkpoint}: checkpoint of another run (key a != b); delete it")
        return _tiny_student()

    with pytest.warns(SoftdeployWarning, match=r"checkpoint-k\.safetensors: cannot be resumed \(.*another run"):
        case._load_or_distill("k", train, SilentProgress())
    assert seen == [True, False] and case._trained_from_cache is False
    assert len(list(tmp_path.glob("checkpoint-k.safetensors.bad-*"))) == 1


def test_a_distill_error_about_something_else_is_not_retried(tmp_path: Path) -> None:
    from softdeploy.errors import DistillError

    case, _ = _distilled_case(tmp_path)
    calls: list[int] = []

    def train(checkpoint: Path) -> Any:
        calls.append(1)
        raise DistillError("distill: the loss is not finite at step 3")

    with pytest.raises(DistillError, match="not finite"):
        case._load_or_distill("k", train, SilentProgress())
    assert calls == [1] and not list(tmp_path.glob("*.safetensors"))
