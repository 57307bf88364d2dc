"""Distilled students: softening operators, top-k-truncated teachers, Dice semimetric losses, Bloop,
layer-reduced and real small students, and the ``distill`` training loop (torch; ``import softdeploy``
does not import this package)."""

from __future__ import annotations

from softdeploy.distill.bloop import Bloop
from softdeploy.distill.data import distillation_texts, held_out
from softdeploy.distill.dice import dice_semimetric_loss
from softdeploy.distill.softening import (
    SOFTENING,
    PowerSoftening,
    SofteningOperator,
    UniformMixing,
    entropy,
    get_softening,
    register_softening,
    truncate_topk,
)
from softdeploy.distill.students import (
    SentenceEncoder,
    check_compatible,
    evenly_spaced_layers,
    layer_reduce,
    load_paraphrase_l3,
    load_student,
    load_teacher,
    save_student,
)
from softdeploy.distill.train import DistillConfig, DistillResult, distill, distill_stages, kd_loss

__all__ = [
    "SOFTENING",
    "Bloop",
    "DistillConfig",
    "DistillResult",
    "PowerSoftening",
    "SentenceEncoder",
    "SofteningOperator",
    "UniformMixing",
    "check_compatible",
    "dice_semimetric_loss",
    "distill",
    "distill_stages",
    "distillation_texts",
    "entropy",
    "evenly_spaced_layers",
    "get_softening",
    "held_out",
    "kd_loss",
    "layer_reduce",
    "load_paraphrase_l3",
    "load_student",
    "load_teacher",
    "register_softening",
    "save_student",
    "truncate_topk",
]
