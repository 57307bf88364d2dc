"""Damaged and hostile distillation files: checkpoints that are truncated, edited or of another shape, a checkpoint
whose step is past the run's steps, students whose recorded config asks for far more than the file holds, and
writes that fail midway. Each is a DistillError (or an OutputError for a write) naming the file and what is wrong;
nothing partial is left behind. The allocation test runs in a child process under an address-space limit, so a
loader that builds first and checks later fails the test instead of exhausting the machine."""

from __future__ import annotations

import errno
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from reliability.memory_limit import load_under_memory_limit
from safetensors import safe_open
from safetensors.torch import save_file

from softdeploy.distill import DistillConfig, distill, layer_reduce, load_student, save_student
from softdeploy.distill.students import STUDENT_FORMAT
from softdeploy.errors import DistillError, OutputError

from .conftest import TEXTS, tiny_encoder

pytestmark = pytest.mark.models  # BERT students need transformers, real ones the weight packages

CFG = DistillConfig(steps=4, batch_size=4, lr=3e-3, max_length=16, checkpoint_every=2)


def run(tokenizer: Any, ckpt: Path, cfg: DistillConfig = CFG) -> Any:
    teacher = tiny_encoder(4)
    return distill(teacher, layer_reduce(teacher, [1, 3]), TEXTS, tokenizer=tokenizer, config=cfg, checkpoint=ckpt)


@pytest.fixture(scope="module")
def halfway(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint of CFG's run after 2 of its 4 steps (the key covers steps: a 2-step run is another run, so the
    checkpoint is taken from a run interrupted after its first save)."""
    ckpt = tmp_path_factory.mktemp("halfway") / "run.safetensors"

    class Interrupt(Exception):
        pass

    class Stop:
        def step(self, description: str, total: int | None = None) -> Any:
            from contextlib import contextmanager

            @contextmanager
            def cm() -> Any:
                count = [0]

                def advance(n: int = 1) -> None:
                    count[0] += n
                    if description == "distill" and count[0] >= 3:
                        raise Interrupt

                yield advance

            return cm()

    teacher = tiny_encoder(4)
    with pytest.raises(Interrupt):
        distill(
            teacher,
            layer_reduce(teacher, [1, 3]),
            TEXTS,
            tokenizer=tokenizer,
            config=CFG,
            checkpoint=ckpt,
            progress=Stop(),
        )
    with safe_open(str(ckpt), framework="pt") as f:
        assert f.metadata()["step"] == "2"
    return ckpt


def edited(src: Path, dst: Path, *, meta: dict[str, str] | None = None, tensors: Any = None) -> Path:
    """A copy of the checkpoint ``src`` with metadata entries replaced and ``tensors(dict)`` applied."""
    with safe_open(str(src), framework="pt") as f:
        m = dict(f.metadata())
        t = {k: f.get_tensor(k) for k in f.keys()}
    m.update(meta or {})
    if tensors is not None:
        tensors(t)
    save_file(t, str(dst), metadata=m)
    return dst


def test_checkpoint_step_past_the_runs_steps_is_refused(tokenizer: Any, halfway: Path, tmp_path: Path) -> None:
    ckpt = edited(halfway, tmp_path / "run.safetensors", meta={"step": "40"})
    # before: range(40, 4) is empty, and the untrained student came back as the result of the run
    with pytest.raises(DistillError, match=r"run.safetensors: step 40 is past the run's 4 steps"):
        run(tokenizer, ckpt)


def test_checkpoint_at_the_last_step_returns_the_trained_student(tokenizer: Any, tmp_path: Path) -> None:
    ckpt = tmp_path / "run.safetensors"
    done = run(tokenizer, ckpt)
    again = run(tokenizer, ckpt)
    assert again.resumed_from == CFG.steps and again.main_losses == []
    a, b = done.student.state_dict(), again.student.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def _drop_student_weight(t: dict[str, torch.Tensor]) -> None:
    del t["student.bert.encoder.layer.0.output.dense.bias"]


def _reshape_exp_avg(t: dict[str, torch.Tensor]) -> None:
    t["optimizer.3.exp_avg"] = torch.zeros(7)


def _stray_optimizer_key(t: dict[str, torch.Tensor]) -> None:
    t["optimizer.x.exp_avg"] = torch.zeros(1)


def _nan_weight(t: dict[str, torch.Tensor]) -> None:
    t["student.bert.encoder.layer.1.output.dense.weight"][0, 0] = float("nan")


@pytest.mark.parametrize(
    ("meta", "change", "message"),
    [
        ({"step": "two"}, None, r"step 'two' \(rule: the checkpoint records its step as an integer >= 0\)"),
        ({"step": "-1"}, None, r"step '-1' \(rule"),
        ({"param_groups": "{not json"}, None, r"param_groups is not JSON"),
        ({"param_groups": "[]"}, None, r"the optimizer's parameter groups do not match"),
        (None, _drop_student_weight, r"missing \['student.bert.encoder.layer.0.output.dense.bias'\]"),
        (None, _reshape_exp_avg, r"optimizer.3.exp_avg has shape \[7\]"),
        (None, _stray_optimizer_key, r"unexpected tensor 'optimizer.x.exp_avg'"),
        (None, _nan_weight, r"tensor 'student.bert.encoder.layer.1.output.dense.weight' holds 1 non-finite"),
    ],
)
def test_damaged_checkpoint_is_a_distill_error_naming_the_file(
    tokenizer: Any, halfway: Path, tmp_path: Path, meta: dict[str, str] | None, change: Any, message: str
) -> None:
    ckpt = edited(halfway, tmp_path / "run.safetensors", meta=meta, tensors=change)
    with pytest.raises(DistillError, match=rf"run.safetensors: .*{message}"):
        run(tokenizer, ckpt)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_unreadable_checkpoint_is_a_distill_error_naming_the_file(
    tokenizer: Any, halfway: Path, tmp_path: Path, damage: str
) -> None:
    ckpt = tmp_path / "run.safetensors"
    data = halfway.read_bytes()
    ckpt.write_bytes({"truncated": data[: len(data) - 100], "garbage": b"\x89PNG" + data[4:200], "empty": b""}[damage])
    with pytest.raises(DistillError, match=r"run.safetensors: "):
        run(tokenizer, ckpt)


def _failing_save_file(real: Any, calls: list[int], fail_at: int) -> Any:
    def save(tensors: Any, filename: str, metadata: Any = None) -> None:
        calls.append(1)
        if len(calls) == fail_at:
            Path(filename).write_bytes(b"half a file")
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tensors, filename, metadata=metadata)

    return save


def test_failed_checkpoint_write_keeps_the_previous_checkpoint(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "run.safetensors"
    calls: list[int] = []
    monkeypatch.setattr(safetensors.torch, "save_file", _failing_save_file(safetensors.torch.save_file, calls, 2))
    with pytest.raises(OutputError, match=r"checkpoint .*run.safetensors: cannot be written: No space left"):
        run(tokenizer, ckpt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.safetensors"]  # no partial file beside it
    with safe_open(str(ckpt), framework="pt") as f:
        assert f.metadata()["step"] == "2"
    monkeypatch.undo()
    assert run(tokenizer, ckpt).resumed_from == 2  # the rerun goes on from the intact checkpoint


def test_failed_student_write_keeps_the_previous_student(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_student(tiny_encoder(2), tmp_path / "student.safetensors", note="first")
    calls: list[int] = []
    monkeypatch.setattr(safetensors.torch, "save_file", _failing_save_file(safetensors.torch.save_file, calls, 1))
    with pytest.raises(OutputError, match=r"student .*student.safetensors: cannot be written"):
        save_student(tiny_encoder(3), path, note="second")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["student.safetensors"]
    monkeypatch.undo()
    assert load_student(path)[1]["note"] == "first"


# ---- hostile students ------------------------------------------------------------------------------------------------


def student_file(path: Path, config: dict[str, Any] | str, tensors: dict[str, torch.Tensor]) -> Path:
    text = config if isinstance(config, str) else json.dumps(config)
    save_file(tensors, str(path), metadata={"format": STUDENT_FORMAT, "config": text})
    return path


def small_config(**changes: Any) -> dict[str, Any]:
    cfg = tiny_encoder(1).bert.config.to_dict()
    cfg.update(changes)
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # 10^9 x 32 word embeddings: 128 GB for a file of a few hundred bytes
        ({"vocab_size": 10**9, "num_hidden_layers": 0}, r"weights do not fit the config it records"),
        ({"max_position_embeddings": 10**9, "num_hidden_layers": 0}, r"weights do not fit the config it records"),
        # ten million layers: the model (even as empty Python objects) is never built
        ({"num_hidden_layers": 10**7}, r"num_hidden_layers 10000000, the file holds weights of layers \[\]"),
    ],
)
def test_tiny_student_file_with_huge_config_is_refused_before_building(
    tmp_path: Path, changes: dict[str, int], message: str
) -> None:
    path = student_file(
        tmp_path / "student.safetensors", small_config(**changes), {"embeddings.LayerNorm.weight": torch.ones(32)}
    )
    assert path.stat().st_size < 4_000
    done = load_under_memory_limit(
        path,
        imports="import torch, transformers\nfrom softdeploy.distill import load_student\nfrom softdeploy.errors import DistillError",
        call="load_student",
        error="DistillError",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{path}: " in done.stdout
    assert any(re.search(message, line) for line in done.stdout.splitlines()), done.stdout


def test_student_config_with_a_repeated_key_is_refused(tmp_path: Path) -> None:
    good = save_student(tiny_encoder(1), tmp_path / "good.safetensors")
    with safe_open(str(good), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    text = json.dumps(small_config())
    text = text[:-1] + ', "hidden_act": "relu"}'  # a second hidden_act: json would keep it silently
    path = student_file(tmp_path / "dup.safetensors", text, tensors)
    with pytest.raises(DistillError, match=r"dup.safetensors: the recorded config names 'hidden_act' twice"):
        load_student(path)


def test_student_with_non_finite_weights_is_refused(tmp_path: Path) -> None:
    s = tiny_encoder(1)
    with torch.no_grad():
        s.bert.encoder.layer[0].attention.self.query.weight[2, 3] = float("inf")
    path = save_student(s, tmp_path / "inf.safetensors")
    with pytest.raises(
        DistillError, match=r"inf.safetensors: tensor 'encoder.layer.0.attention.self.query.weight' holds 1 non-finite"
    ):
        load_student(path)


def test_copied_checkpoint_still_resumes(tokenizer: Any, halfway: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "run.safetensors"
    shutil.copy(halfway, ckpt)
    r = run(tokenizer, ckpt)
    assert r.resumed_from == 2 and len(r.main_losses) == 2


def test_checkpoint_edited_in_place_is_told_by_its_digest(tokenizer: Any, halfway: Path, tmp_path: Path) -> None:
    """A checkpoint changed after this run wrote it -- finite, well-formed, other values -- no longer matches the
    digest written beside it (softdeploy.cache) and is refused rather than resumed."""
    from softdeploy.cache import digest_path

    ckpt = tmp_path / "run.safetensors"
    assert digest_path(halfway).is_file()
    shutil.copy(digest_path(halfway), digest_path(ckpt))

    def scale(t: dict[str, torch.Tensor]) -> None:
        t["student.bert.encoder.layer.1.output.dense.weight"] *= 1.5

    edited(halfway, ckpt, tensors=scale)
    with pytest.raises(
        DistillError, match=r"run.safetensors: .*(does not match its recorded sha256|bytes, its digest)"
    ):
        run(tokenizer, ckpt)
