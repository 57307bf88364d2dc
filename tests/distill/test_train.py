"""distill(): losses go down, the run is deterministic and resumes to the same weights, checkpoints are
checked, KD objectives and Bloop/sum aux train, stages chain layer reductions, mismatches are typed."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from softdeploy.distill import DistillConfig, distill, distill_stages, evenly_spaced_layers, kd_loss, layer_reduce
from softdeploy.errors import ArgumentError, DistillError

from .conftest import TEXTS, tiny_encoder

CFG = DistillConfig(steps=6, batch_size=4, lr=3e-3, max_length=16, checkpoint_every=2)


def _weights(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


@pytest.mark.models
def test_mse_distillation_lowers_the_loss_and_is_deterministic(tokenizer: Any) -> None:
    teacher = tiny_encoder(4)
    cfg = DistillConfig(steps=30, batch_size=8, lr=3e-3, max_length=16)
    a = distill(teacher, layer_reduce(teacher, [0, 2]), TEXTS, tokenizer=tokenizer, config=cfg)
    assert sum(a.main_losses[-5:]) < 0.7 * sum(a.main_losses[:5])
    b = distill(teacher, layer_reduce(teacher, [0, 2]), TEXTS, tokenizer=tokenizer, config=cfg)
    assert a.main_losses == b.main_losses
    assert not a.student.training


@pytest.mark.models
def test_checkpoint_key_covers_the_settings(tokenizer: Any, tmp_path: Path) -> None:
    teacher = tiny_encoder(4)
    cfg = CFG
    ckpt = tmp_path / "run.safetensors"
    half = dataclasses.replace(cfg, steps=4)
    first = distill(teacher, layer_reduce(teacher, [1, 3]), TEXTS, tokenizer=tokenizer, config=half, checkpoint=ckpt)
    assert first.resumed_from == 0
    with safe_open(str(ckpt), framework="pt") as f:
        assert f.metadata()["step"] == "4"
    # the key covers steps: resuming under another step count is another run
    with pytest.raises(DistillError, match="checkpoint of another run"):
        distill(teacher, layer_reduce(teacher, [1, 3]), TEXTS, tokenizer=tokenizer, config=cfg, checkpoint=ckpt)


@pytest.mark.models
def test_resume_mid_run(tokenizer: Any, tmp_path: Path) -> None:
    from softdeploy.distill.train import _TeacherCache

    teacher = tiny_encoder(4)
    lengths = [len(x) for x in tokenizer(TEXTS, truncation=True, max_length=CFG.max_length)["input_ids"]]
    assert CFG.group_by_length and _TeacherCache.fits(teacher, lengths, CFG)  # resumes with grouping and the cache
    straight = distill(teacher, layer_reduce(teacher, [1, 3]), TEXTS, tokenizer=tokenizer, config=CFG)
    ckpt = tmp_path / "run.safetensors"

    class Interrupt(Exception):
        pass

    class Stop:
        """A progress that interrupts the run at its fifth training step (as a Ctrl-C would); other progress
        steps (the teacher cache's) run through."""

        def step(self, description: str, total: int | None = None) -> Any:
            from contextlib import contextmanager

            @contextmanager
            def cm() -> Any:
                count = [0]

                def advance(n: int = 1) -> None:
                    count[0] += n
                    if description == "distill" and count[0] >= 5:
                        raise Interrupt

                yield advance

            return cm()

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
        assert f.metadata()["step"] == "4"  # checkpoint_every=2: steps 2 and 4 saved, step 5 interrupted
    resumed = distill(teacher, layer_reduce(teacher, [1, 3]), TEXTS, tokenizer=tokenizer, config=CFG, checkpoint=ckpt)
    assert resumed.resumed_from == 4
    assert resumed.main_losses == straight.main_losses[4:]
    want, got = _weights(straight.student), _weights(resumed.student)
    assert all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.models
@pytest.mark.parametrize("combine", ["bloop", "sum"])
def test_int8_aux_trains_with_bloop_and_sum(tokenizer: Any, combine: str) -> None:
    teacher = tiny_encoder(4)
    cfg = DistillConfig(steps=20, batch_size=8, lr=3e-3, max_length=16, aux="int8", combine=combine)  # type: ignore[arg-type]
    r = distill(teacher, layer_reduce(teacher, [0, 2]), TEXTS, tokenizer=tokenizer, config=cfg)
    assert len(r.aux_losses) == 20
    assert sum(r.main_losses[-4:]) < sum(r.main_losses[:4])
    assert sum(r.aux_losses[-4:]) < sum(r.aux_losses[:4])


@pytest.mark.models
@pytest.mark.parametrize(
    ("softening", "top_k", "completion"),
    [("power", None, "renorm"), ("power", 3, "renorm"), ("uniform_mixing", 3, "tail")],
)
def test_kd_objective_trains(tokenizer: Any, softening: str, top_k: int | None, completion: str) -> None:
    teacher = tiny_encoder(4)
    cfg = DistillConfig(
        objective="kd",
        softening=softening,
        temperature=2.0,
        top_k=top_k,
        completion=completion,  # type: ignore[arg-type]
        steps=25,
        batch_size=8,
        lr=3e-3,
        max_length=16,
    )
    r = distill(teacher, layer_reduce(teacher, [0, 2]), TEXTS, tokenizer=tokenizer, config=cfg)
    assert sum(r.main_losses[-5:]) < sum(r.main_losses[:5])


def test_kd_loss_known_values() -> None:
    t = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    assert float(kd_loss(t, t, temperature=3.0)) == pytest.approx(0.0, abs=1e-12)
    s = torch.zeros(1, 3, dtype=torch.float64)
    p = torch.softmax(t / 2, -1)
    want = 4 * float((p * torch.log(p * 3)).sum())  # KL(p || uniform) * T^2
    assert float(kd_loss(s, t, temperature=2.0)) == pytest.approx(want, abs=1e-12)
    # top-1 renorm teacher: one-hot on class 0 -> KL = -log q_0
    q = torch.softmax(s / 2, -1)
    assert float(kd_loss(s, t, temperature=2.0, top_k=1)) == pytest.approx(-4 * float(torch.log(q[0, 0])), abs=1e-6)


@pytest.mark.models
def test_stages_chain_layer_reductions(tokenizer: Any, tmp_path: Path) -> None:
    teacher = tiny_encoder(6)
    rs = distill_stages(teacher, TEXTS, tokenizer=tokenizer, layers=[5, 4, 3], config=CFG, checkpoint_dir=tmp_path)
    assert [r.student.num_layers for r in rs] == [5, 4, 3]
    # the stages end on the one-shot layers 0, 3, 5 (dropping 4, then 2, then 1): seen on a chain whose
    # steps leave the weights alone (lr 0, no weight decay)
    frozen = dataclasses.replace(CFG, lr=0.0, weight_decay=0.0)
    rs0 = distill_stages(teacher, TEXTS, tokenizer=tokenizer, layers=[5, 4, 3], config=frozen)
    final = rs0[-1].student
    for j, i in enumerate([0, 3, 5]):
        a, b = final.bert.encoder.layer[j].state_dict(), teacher.bert.encoder.layer[i].state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), (j, i)
    with pytest.raises(ArgumentError, match="final layers \\[0, 1\\] are not 3"):
        distill_stages(teacher, TEXTS, tokenizer=tokenizer, layers=[5, 4, 3], final_layers=[0, 1], config=CFG)
    assert [r.steps for r in rs] == [2, 2, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # each checkpoint with its content digest
        "stage1-5layers.safetensors",
        "stage1-5layers.safetensors.sha256",
        "stage2-4layers.safetensors",
        "stage2-4layers.safetensors.sha256",
        "stage3-3layers.safetensors",
        "stage3-3layers.safetensors.sha256",
    ]
    with pytest.raises(ArgumentError, match="must decrease"):
        distill_stages(teacher, TEXTS, tokenizer=tokenizer, layers=[4, 5], config=CFG)
    assert evenly_spaced_layers(6, 3) == [0, 3, 5]
    assert evenly_spaced_layers(6, 5) == [0, 1, 3, 4, 5]
    assert evenly_spaced_layers(6, 4) == [0, 2, 3, 5]
    assert evenly_spaced_layers(6, 6) == list(range(6))
    assert evenly_spaced_layers(6, 1) == [5]
    assert evenly_spaced_layers(12, 3) == [0, 6, 11]


@pytest.mark.models
def test_typed_errors(tokenizer: Any) -> None:
    teacher = tiny_encoder(4, hidden=32)
    with pytest.raises(DistillError, match="embedding dimension 32 differs from the student's 48"):
        distill(teacher, tiny_encoder(2, hidden=48), TEXTS, tokenizer=tokenizer, config=CFG)
    with pytest.raises(DistillError, match="vocabulary of 30522 tokens differs from the student's 1000"):
        distill(teacher, tiny_encoder(2, vocab=1000), TEXTS, tokenizer=tokenizer, config=CFG)

    class OtherTok:
        def get_vocab(self) -> dict[str, int]:
            return {"[PAD]": 0, "hello": 1}

    with pytest.raises(DistillError, match="tokenizers differ"):
        distill(
            teacher, layer_reduce(teacher, [0]), TEXTS, tokenizer=tokenizer, student_tokenizer=OtherTok(), config=CFG
        )
    with pytest.raises(ArgumentError, match="layers \\[2, 1\\]"):
        layer_reduce(teacher, [2, 1])
    with pytest.raises(ArgumentError, match="objective 'ce'"):
        DistillConfig(objective="ce").check()  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="top_k 8 is out of range"):
        DistillConfig(objective="kd", batch_size=8, top_k=8).check()
    with pytest.raises(ArgumentError, match="3 texts for batch_size 4"):
        distill(teacher, layer_reduce(teacher, [0]), TEXTS[:3], tokenizer=tokenizer, config=CFG)


def test_length_grouped_batches_cover_each_epoch_sorted_within_chunks() -> None:
    from softdeploy.distill.train import GROUP_CHUNK, _Batches

    rng = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 128, (1003,), generator=rng).tolist()
    grouped = _Batches(len(lengths), 8, seed=3, lengths=lengths)
    plain = _Batches(len(lengths), 8, seed=3)
    per_epoch = len(lengths) // 8
    for epoch in range(2):
        steps = range(epoch * per_epoch, (epoch + 1) * per_epoch)
        got = [grouped(s) for s in steps]
        # the same texts as the ungrouped epoch (the same permutation, the same dropped tail), each once
        assert sorted(i for b in got for i in b) == sorted(i for s in steps for i in plain(s))
        assert all(len(b) == 8 for b in got)
        # within a batch the lengths come from one sorted chunk: a batch's spread is far below the data's
        spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in got) / len(got)
        assert spread < 127 / (GROUP_CHUNK / 4)
    # a function of the step: a fresh sampler (a resumed run) gives the same batches
    again = _Batches(len(lengths), 8, seed=3, lengths=lengths)
    assert [again(s) for s in (200, 5, 130)] == [grouped(s) for s in (200, 5, 130)]
    assert grouped(0) != _Batches(len(lengths), 8, seed=4, lengths=lengths)(0)


def test_mixed_batches_take_a_fixed_share_from_each_stream() -> None:
    from softdeploy.distill.train import _Batches, _MixedBatches, extra_per_batch

    assert extra_per_batch(DistillConfig(batch_size=16, extra_fraction=0.5)) == 8
    assert extra_per_batch(DistillConfig(batch_size=4, extra_fraction=0.01)) == 1  # at least one
    assert extra_per_batch(DistillConfig(batch_size=4, extra_fraction=0.99)) == 3  # at most all but one
    rng = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 64, (40 + 900,), generator=rng).tolist()
    mixed = _MixedBatches(40, 900, 16, 6, seed=2, lengths=lengths)
    main, extra = _Batches(40, 10, 2, lengths[:40]), _Batches(900, 6, 3, lengths[40:])
    for step in (0, 3, 4, 57, 149):  # the task texts' epoch is 4 steps, the extra texts' 150
        b = mixed(step)
        assert len(b) == 16 and b[:10] == main(step) and b[10:] == [40 + j for j in extra(step)]
    # every task text in each 4-step epoch, every extra text once in 150 steps
    assert sorted(i for s in range(4) for i in mixed(s)[:10]) == sorted(range(40))
    assert sorted(i for s in range(150) for i in mixed(s)[10:]) == sorted(range(40, 940))
    assert [_MixedBatches(40, 900, 16, 6, seed=2, lengths=lengths)(s) for s in (9, 1)] == [mixed(9), mixed(1)]


@pytest.mark.models
def test_extra_texts_train_resume_and_are_checked(tokenizer: Any, tmp_path: Path) -> None:
    teacher = tiny_encoder(4)
    task, broad = TEXTS[: len(TEXTS) // 2], TEXTS[len(TEXTS) // 2 :]
    cfg = dataclasses.replace(CFG, extra_fraction=0.25)
    run = distill(teacher, layer_reduce(teacher, [1, 3]), task, tokenizer=tokenizer, config=cfg, extra_texts=broad)
    assert len(run.main_losses) == cfg.steps
    # deterministic, and another run than the one on the task texts alone
    again = distill(teacher, layer_reduce(teacher, [1, 3]), task, tokenizer=tokenizer, config=cfg, extra_texts=broad)
    assert again.main_losses == run.main_losses
    alone = distill(teacher, layer_reduce(teacher, [1, 3]), task, tokenizer=tokenizer, config=cfg)
    assert alone.main_losses != run.main_losses
    ckpt = tmp_path / "run.safetensors"
    kw: dict[str, Any] = dict(tokenizer=tokenizer, config=cfg, checkpoint=ckpt)
    first = distill(teacher, layer_reduce(teacher, [1, 3]), task, extra_texts=broad, **kw)
    done = distill(teacher, layer_reduce(teacher, [1, 3]), task, extra_texts=broad, **kw)
    assert done.resumed_from == cfg.steps
    want, got = _weights(first.student), _weights(done.student)
    assert all(torch.equal(want[k], got[k]) for k in want)
    # the checkpoint belongs to the run with these extra texts, not to one without them
    with pytest.raises(DistillError, match="checkpoint of another run"):
        distill(teacher, layer_reduce(teacher, [1, 3]), task, **kw)
    with pytest.raises(ArgumentError, match=r"extra_fraction 1\.0 is out of range"):
        DistillConfig(extra_fraction=1.0).check()
    three = dataclasses.replace(CFG, extra_fraction=0.75)  # 3 of each batch of 4
    with pytest.raises(ArgumentError, match="2 extra_texts for 3 per batch"):
        distill(teacher, layer_reduce(teacher, [0]), task, tokenizer=tokenizer, config=three, extra_texts=broad[:2])


@pytest.mark.models
def test_cached_teacher_targets_train_as_the_teacher_pass_does(tokenizer: Any) -> None:
    from softdeploy.distill.train import _TeacherCache

    teacher = tiny_encoder(4)
    cfg = DistillConfig(steps=12, batch_size=4, lr=3e-3, max_length=16, checkpoint_every=4)
    lengths = [len(x) for x in tokenizer(TEXTS, truncation=True, max_length=16)["input_ids"]]
    assert _TeacherCache.fits(teacher, lengths, cfg)
    # not when it cannot pay or cannot hold: one pass over the texts, hidden states needed, over the budget
    assert not _TeacherCache.fits(teacher, lengths, dataclasses.replace(cfg, steps=len(TEXTS) // 4))
    assert not _TeacherCache.fits(teacher, lengths, dataclasses.replace(cfg, hidden_weight=1.0))
    assert not _TeacherCache.fits(teacher, lengths, dataclasses.replace(cfg, teacher_cache_mib=0))
    assert not _TeacherCache.fits(teacher, lengths, dataclasses.replace(cfg, cache_teacher=False))
    cached = distill(teacher, layer_reduce(teacher, [0, 2]), TEXTS, tokenizer=tokenizer, config=cfg)
    fresh = distill(
        teacher,
        layer_reduce(teacher, [0, 2]),
        TEXTS,
        tokenizer=tokenizer,
        config=dataclasses.replace(cfg, cache_teacher=False),
    )
    # the same targets up to float32 rounding of another padding: the same run
    assert cached.main_losses == pytest.approx(fresh.main_losses, rel=1e-4)
    a, b = _weights(cached.student), _weights(fresh.student)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_lr_schedule_warmup_then_linear_decay() -> None:
    from softdeploy.distill.train import lr_factor

    cfg = DistillConfig(steps=10, warmup=0.2, schedule="linear")
    f = [lr_factor(cfg, s) for s in range(10)]
    assert f[:2] == pytest.approx([1 / 3, 2 / 3])  # 2 warmup steps, rising
    assert f[2] == pytest.approx(1.0) and f[-1] == pytest.approx(1 / 8)
    assert all(a > b for a, b in itertools.pairwise(f[2:]))  # then falling to 0 at step 10
    assert [lr_factor(DistillConfig(steps=10), s) for s in range(10)] == [1.0] * 10  # defaults: constant lr
    with pytest.raises(ArgumentError, match="warmup"):
        DistillConfig(warmup=1.0).check()
    with pytest.raises(ArgumentError, match="schedule"):
        DistillConfig(schedule="cosine").check()  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="hidden_weight"):
        DistillConfig(hidden_weight=-1.0).check()


@pytest.mark.models
def test_hidden_state_mse_maps_student_layers_and_trains(tokenizer: Any, tmp_path: Path) -> None:
    from softdeploy.distill.train import hidden_layer_map

    assert hidden_layer_map(6, 3) == [1, 3, 5] and hidden_layer_map(6, 6) == list(range(6))
    assert hidden_layer_map(4, 2) == [1, 3] and hidden_layer_map(6, 4) == [0, 2, 3, 5]
    teacher = tiny_encoder(4)
    plain = DistillConfig(steps=12, batch_size=8, lr=3e-3, max_length=16, warmup=0.25, schedule="linear")
    hid = dataclasses.replace(plain, hidden_weight=1.0)
    a = distill(teacher, layer_reduce(teacher, [0, 2]), TEXTS, tokenizer=tokenizer, config=plain)
    b = distill(teacher, layer_reduce(teacher, [0, 2]), TEXTS, tokenizer=tokenizer, config=hid)
    # the hidden term is added to the same token MSE: larger at the start, and it goes down
    assert b.main_losses[0] > a.main_losses[0]
    assert sum(b.main_losses[-3:]) < sum(b.main_losses[:3])
    # the schedule is a function of the step: an interrupted run resumes to the same weights
    ckpt = tmp_path / "hid.safetensors"
    distill(
        teacher,
        layer_reduce(teacher, [0, 2]),
        TEXTS,
        tokenizer=tokenizer,
        config=dataclasses.replace(hid, steps=12, checkpoint_every=5),
        checkpoint=ckpt,
        progress=None,
    )
    again = distill(teacher, layer_reduce(teacher, [0, 2]), TEXTS, tokenizer=tokenizer, config=hid, checkpoint=ckpt)
    assert again.resumed_from == 12
    for (k, x), y in zip(b.student.state_dict().items(), again.student.state_dict().values(), strict=True):
        assert torch.equal(x, y), k
