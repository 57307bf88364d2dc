"""Validation helpers shared by the op modules. Their messages are the same, word for word, as the
native kernels' (ops/common/kernel.h), so a rule reads the same from every backend."""

from __future__ import annotations

from typing import Any

import numpy as np

from softdeploy.errors import OpContractError


def normalize_axis(op: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise OpContractError(
            f"{op}: axis {axis} is out of range for an input of rank {rank} (rule: -rank <= axis < rank)"
        )
    return axis % rank


def require_rank_at_least_one(op: str, x: Any) -> None:
    if np.ndim(x) == 0:
        raise OpContractError(f"{op}: input must have rank >= 1, got a scalar")


def as_float64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def softmax64(x: np.ndarray, axis: int) -> np.ndarray:
    """Float64 softmax with ai.onnx.Softmax / torch semantics for special values: a row holding NaN,
    +inf, or only -inf is all NaN; -inf entries give exactly 0; an empty axis gives an empty result."""
    if x.shape[axis] == 0:
        return np.empty_like(x)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        e = np.exp(x - m)
        return e / np.sum(e, axis=axis, keepdims=True)
