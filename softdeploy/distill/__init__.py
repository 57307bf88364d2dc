"""Distilled students: softening operators, top-k-truncated teachers, Dice semimetric losses, Bloop,
layer-reduced and real small students, and the ``distill`` training loop (torch; ``import softdeploy``
does not import this package)."""

from __future__ import annotations

from softdeploy.distill.bloop import Bloop
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

__all__ = [
    "SOFTENING",
    "Bloop",
    "PowerSoftening",
    "SofteningOperator",
    "UniformMixing",
    "dice_semimetric_loss",
    "entropy",
    "get_softening",
    "register_softening",
    "truncate_topk",
]
