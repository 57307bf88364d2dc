"""Dice semimetric losses (Wang & Blaschko, MICCAI 2023, arXiv 2303.16296), as JDTLosses' ``JDTLoss``
computes its mIoU^D term (research notes algorithms.md section 11).

For ``x = softmax(logits)`` over the class axis 1 and a label ``y`` (soft: same shape, float; hard: class
indices without the class axis, long), per class ``c`` with p-norm cardinalities ``|v| = ||v||_p^p``
taken over the spatial positions of each sample and summed over the batch::

    tp = (|x| + |y| - |x - y|) / 2,   fp = |x| - tp,   fn = |y| - tp
    loss_c = 1 - (tp + s) / (tp + alpha fp + beta fn + s)
    loss   = mean of loss_c * w_c over the active classes

``alpha = beta = 0.5`` is Dice (DML_1 = ||x - y||_1 / (||x||_1 + ||y||_1) for ``s = 0``; DML_2 =
1 - 2<x, y> / (||x||^2 + ||y||^2)); ``alpha = beta = 1`` is Jaccard. For hard labels it equals the soft
Dice loss; for soft labels it is zero iff ``x = y``, symmetric, and (for Dice, norm 1, s = 0) satisfies
the triangle inequality up to a constant -- a semimetric. Active classes: ``ALL``, or ``PRESENT``
(the label's maximum over the batch and the positions exceeds ``threshold``). ``ignore_index`` (hard
labels) zeroes both sides at those positions. With no active class the loss is ``0 * sum(tp)`` (keeps
the graph, as JDTLoss does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from softdeploy.errors import ArgumentError


def _cardinality(v: Tensor, norm: int) -> Tensor:
    """``||v||_p^p`` over the last axis."""
    return v.abs().sum(dim=-1) if norm == 1 else v.abs().pow(norm).sum(dim=-1)


def dice_semimetric_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    norm: int = 1,
    smooth: float = 1e-3,
    alpha: float = 0.5,
    beta: float = 0.5,
    active: Literal["ALL", "PRESENT"] = "ALL",
    threshold: float = 0.01,
    ignore_index: int | None = None,
    class_weights: Sequence[float] | Tensor | None = None,
) -> Tensor:
    """The Dice (Tversky for other alpha/beta) semimetric loss of ``softmax(logits, dim=1)`` against
    ``labels``; ``logits`` ``[B, C, ...]``, ``labels`` the same shape (soft) or ``[B, ...]`` int64 (hard).
    Equals JDTLoss(alpha=alpha, beta=beta, smooth=smooth, threshold=threshold, norm=norm, ...) with its
    active-class mode ``active`` for both label kinds (JDTLoss's own defaults: PRESENT for hard, ALL
    for soft)."""
    if not isinstance(norm, int) or norm < 1:
        raise ArgumentError(f"dice_semimetric_loss: norm {norm!r} is out of range (rule: an integer >= 1)")
    if active not in ("ALL", "PRESENT"):
        raise ArgumentError(f"dice_semimetric_loss: active {active!r} is not one of ['ALL', 'PRESENT']")
    if min(alpha, beta, smooth, threshold) < 0:
        raise ArgumentError("dice_semimetric_loss: alpha, beta, smooth and threshold must be >= 0")
    if logits.dim() < 2:
        raise ArgumentError(f"dice_semimetric_loss: logits of shape {list(logits.shape)} have no class axis 1")
    b, c = logits.shape[:2]
    hard = not labels.is_floating_point()
    if hard and tuple(labels.shape) != (b, *logits.shape[2:]):
        raise ArgumentError(
            f"dice_semimetric_loss: hard labels of shape {list(labels.shape)} do not match logits "
            f"{list(logits.shape)} without their class axis"
        )
    if not hard and labels.shape != logits.shape:
        raise ArgumentError(
            f"dice_semimetric_loss: soft labels of shape {list(labels.shape)} differ from logits {list(logits.shape)}"
        )
    x = logits.reshape(b, c, -1).log_softmax(dim=1).exp()
    keep = None
    if hard:
        flat = labels.reshape(b, -1)
        if ignore_index is not None:
            keep = (flat != ignore_index).unsqueeze(1).to(x.dtype)
        y = F.one_hot(flat.clamp(0, c - 1), num_classes=c).permute(0, 2, 1).to(x.dtype)
    else:
        y = labels.reshape(b, c, -1).to(x.dtype)
    if keep is not None:
        x, y = x * keep, y * keep
    xc, yc, dc = _cardinality(x, norm), _cardinality(y, norm), _cardinality(x - y, norm)
    tp = (xc + yc - dc) / 2
    fp, fn = xc - tp, yc - tp
    if active == "ALL":
        mask = torch.ones(c, dtype=torch.bool, device=x.device)
    else:
        mask = y.amax(dim=(0, 2)) > threshold
    if not bool(mask.any()):
        return 0.0 * tp.sum()
    tp, fp, fn = tp.sum(0), fp.sum(0), fn.sum(0)
    loss = 1.0 - (tp + smooth) / (tp + alpha * fp + beta * fn + smooth)
    if class_weights is not None:
        w = torch.as_tensor(class_weights, dtype=loss.dtype, device=loss.device)
        if w.shape != (c,):
            raise ArgumentError(f"dice_semimetric_loss: {w.numel()} class weights for {c} classes")
        loss = loss * w
    return loss[mask].mean()
