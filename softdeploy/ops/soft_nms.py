"""SoftNMS: Soft non-maximum suppression (Bodla et al. 2017), a drop-in for ai.onnx.NonMaxSuppression
that also returns the decayed score of every selected box.

    SelectedIndices, SelectedScores = SoftNMS(Boxes, Scores[, MaxOutputBoxesPerClass, IouThreshold,
                                               ScoreThreshold])

Boxes ``[B, N, 4]``, Scores ``[B, C, N]``; the optional scalar inputs default to 0 (no limit), 0.3 and
0.001. Attributes: ``method`` ("linear" | "gaussian" | "hard"), ``sigma`` (> 0), ``center_point_box``
(0: ``[y1, x1, y2, x2]``, 1: ``[x_center, y_center, w, h]``), ``coordinate_offset`` (1: pixel-inclusive
areas ``(x2 - x1 + 1)(y2 - y1 + 1)`` as in the original code).

Per (batch, class), with every quantity a float32 computed in exactly this order (the original
Cython loop, ``lib/nms/cpu_nms.pyx::cpu_soft_nms``; float16 inputs are widened to float32 first):

  corners   center_point_box 0: (p, q) = (a0, a2) and (a1, a3); 1: (a0 -+ a2*0.5), (a1 -+ a3*0.5);
            lo = min(p, q), hi = max(p, q) per axis (either corner order works). A box with a NaN
            p or q overlaps nothing (IoU 0 with every box, in both roles).
  area      (hi0 - lo0 + off) * (hi1 - lo1 + off)
  IoU       iw = min(hi0, hi0') - max(lo0, lo0') + off, ih likewise; if iw > 0 and ih > 0:
            IoU = iw*ih / ((area + area') - iw*ih), else IoU = 0 (so zero-area boxes, offset 0, have
            IoU 0 and nothing divides by 0).
  weight    linear: 1 - IoU if IoU > IouThreshold else 1;  hard: 0 if IoU > IouThreshold else 1;
            gaussian: float32(exp(float64(-(IoU*IoU) / sigma)))  (exp in double, as the original's
            np.exp; IoU 0 gives exactly 1).
  loop      working list = the boxes with ``score >= ScoreThreshold`` in index order (n of them);
            for i = 0, 1, ... while i < n (and i < MaxOutputBoxesPerClass when that is > 0):
              m = the first position in [i, n) with the largest score; swap rows i and m; emit
              (index, score) of row i; for every pos in (i, n): score *= weight(IoU(row i, row pos));
              then for pos = i+1 while pos < n: if not score[pos] >= ScoreThreshold, row n-1 moves
              into pos and n -= 1 (pos is looked at again), else pos += 1.

Rows ``[batch, class, box_index]`` (int64, index into the original N) come out in selection order,
batches then classes ascending; ``SelectedScores[M]`` are the decayed scores at selection time (dtype
of Scores).

NaN rule: a NaN score is never ``>= ScoreThreshold``, so a box whose input score is NaN is dropped up
front and a box whose decayed score becomes NaN (inf * 0, or a NaN IoU from infinite coordinates under
the gaussian weight) is dropped when it is decayed; NaN never enters the max search. (The original
loop would keep such boxes and select a NaN whenever it sits at row i.) +inf scores are ordinary:
selected first, in index order (and a later inf * 0 is NaN: dropped).

Order of the selected scores: every weight is in [0, 1] (IoU <= 1 holds in float32 too), so with
non-negative scores each (batch, class) selects in non-increasing score order. With negative scores
(a negative ScoreThreshold) a decay moves a score up towards 0 and a later selection can score higher.

The kernel (ops/soft_nms.cc) runs one (batch, class) per task; each round it decays only the boxes
that overlap the selected one (weight(IoU 0) is exactly 1), found through 16-box blocks with bounding
boxes, while keeping the original loop's working order for the tie-breaks. The function body runs
the same loop with ONNX Loop (standard ops, opset 18). The oracle below is float32 like the original,
not float64: the selection is discrete, and every backend must make the same comparisons to select
the same boxes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from softdeploy.errors import OpContractError
from softdeploy.ops._body import function_body
from softdeploy.ops._schema import Attr, ErrorCase, OpDef, Port, Sample

if TYPE_CHECKING:  # bound when the body is compiled (softdeploy/ops/_body.py)
    from onnxscript import FLOAT, INT64
    from onnxscript import opset18 as op

NAME = "SoftNMS"
METHODS = ("linear", "gaussian", "hard")
DEFAULT_MAX_OUTPUT = 0
DEFAULT_IOU_THRESHOLD = 0.3
DEFAULT_SCORE_THRESHOLD = 0.001


def _shape_str(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def validate(
    boxes_shape: Sequence[int],
    scores_shape: Sequence[int],
    scalar_shapes: Sequence[tuple[str, Sequence[int] | None]],
    method: str,
    sigma: float,
    center_point_box: int,
    coordinate_offset: int,
) -> None:
    """Every error rule of the contract; the messages are word for word the kernel's."""
    if method not in METHODS:
        raise OpContractError(
            f"{NAME}: method '{method}' is not supported (rule: method is one of 'linear', 'gaussian', 'hard')"
        )
    if not sigma > 0:
        raise OpContractError(f"{NAME}: sigma {float(np.float32(sigma)):g} must be > 0 (rule: sigma > 0)")
    if center_point_box not in (0, 1):
        raise OpContractError(
            f"{NAME}: center_point_box {center_point_box} is not supported (rule: center_point_box is 0 or 1)"
        )
    if coordinate_offset not in (0, 1):
        raise OpContractError(
            f"{NAME}: coordinate_offset {coordinate_offset} is not supported (rule: coordinate_offset is 0 or 1)"
        )
    if len(boxes_shape) != 3 or boxes_shape[2] != 4:
        raise OpContractError(
            f"{NAME}: Boxes shape {_shape_str(boxes_shape)} is not [B, N, 4] (rule: Boxes is [num_batches, num_boxes, 4])"
        )
    if len(scores_shape) != 3:
        raise OpContractError(
            f"{NAME}: Scores shape {_shape_str(scores_shape)} is not [B, C, N] "
            "(rule: Scores is [num_batches, num_classes, num_boxes])"
        )
    if scores_shape[0] != boxes_shape[0] or scores_shape[2] != boxes_shape[1]:
        raise OpContractError(
            f"{NAME}: Scores shape {_shape_str(scores_shape)} does not match Boxes shape {_shape_str(boxes_shape)} "
            "(rule: Scores is [B, C, N] for Boxes [B, N, 4])"
        )
    for name, shape in scalar_shapes:
        if shape is not None and int(np.prod(shape)) != 1:
            raise OpContractError(
                f"{NAME}: {name} has shape {_shape_str(shape)} (rule: the optional inputs hold one value each)"
            )


def _scalar_shapes(*shapes: Sequence[int] | None) -> list[tuple[str, Sequence[int] | None]]:
    """(input name, shape or None when omitted) of the three optional scalar inputs."""
    return list(zip(("MaxOutputBoxesPerClass", "IouThreshold", "ScoreThreshold"), shapes, strict=True))


# ---- float32 oracle ------------------------------------------------------------------------------


def box_extents(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """[..., 4] float32 boxes -> [..., 4] float32 (lo0, hi0, lo1, hi1); a box with a NaN corner gets
    (+inf, -inf, +inf, -inf), which overlaps nothing."""
    b = np.asarray(boxes, np.float32)
    a0, a1, a2, a3 = (b[..., k] for k in range(4))
    if center_point_box:
        half = np.float32(0.5)
        p0, q0, p1, q1 = a0 - a2 * half, a0 + a2 * half, a1 - a3 * half, a1 + a3 * half
    else:
        p0, q0, p1, q1 = a0, a2, a1, a3
    with np.errstate(invalid="ignore"):
        out = np.stack([np.minimum(p0, q0), np.maximum(p0, q0), np.minimum(p1, q1), np.maximum(p1, q1)], axis=-1)
    nan_box = np.isnan(p0) | np.isnan(q0) | np.isnan(p1) | np.isnan(q1)
    out[nan_box] = np.array([np.inf, -np.inf, np.inf, -np.inf], np.float32)
    return out


def box_areas(ext: np.ndarray, offset: np.float32) -> np.ndarray:
    """Areas (hi0 - lo0 + offset) * (hi1 - lo1 + offset) of boxes in extent form [..., 4], in float32 as the kernel
    computes them (overflow and NaN pass through)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return ((ext[..., 1] - ext[..., 0]) + offset) * ((ext[..., 3] - ext[..., 2]) + offset)


def decay_weights(
    sel_ext: np.ndarray,
    sel_area: np.float32,
    ext: np.ndarray,
    area: np.ndarray,
    offset: np.float32,
    method: str,
    iou_threshold: np.float32,
    sigma: np.float32,
) -> np.ndarray:
    """float32 weights of the boxes ``ext`` against the selected box (the contract's arithmetic)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        iw = (np.minimum(sel_ext[1], ext[:, 1]) - np.maximum(sel_ext[0], ext[:, 0])) + offset
        ih = (np.minimum(sel_ext[3], ext[:, 3]) - np.maximum(sel_ext[2], ext[:, 2])) + offset
        overlap = (iw > 0) & (ih > 0)
        inter = iw * ih
        iou = np.where(overlap, inter / ((sel_area + area) - inter), np.float32(0)).astype(np.float32)
        if method == "linear":
            return np.where(iou > iou_threshold, np.float32(1) - iou, np.float32(1)).astype(np.float32)
        if method == "hard":
            return np.where(iou > iou_threshold, np.float32(0), np.float32(1)).astype(np.float32)
        return np.exp((-(iou * iou) / sigma).astype(np.float64)).astype(np.float32)


def soft_nms_one(
    ext: np.ndarray,
    area: np.ndarray,
    scores: np.ndarray,
    *,
    max_output: int,
    iou_threshold: np.float32,
    score_threshold: np.float32,
    method: str,
    sigma: np.float32,
    offset: np.float32,
) -> tuple[list[int], list[float]]:
    """One (batch, class): the swap-based loop on float32 working rows. Returns (indices, scores)."""
    keep = np.flatnonzero(scores >= score_threshold)  # NaN is never >= : dropped
    e, a, s, idx = ext[keep].copy(), area[keep].copy(), scores[keep].astype(np.float32), keep.copy()
    n = len(keep)
    out_idx: list[int] = []
    out_score: list[float] = []
    i = 0
    while i < n and (max_output <= 0 or i < max_output):
        m = i + int(np.argmax(s[i:n]))  # first position of the max (no NaN in the working rows)
        for arr in (e, a, s, idx):
            arr[[i, m]] = arr[[m, i]]
        out_idx.append(int(idx[i]))
        out_score.append(float(s[i]))
        rest = slice(i + 1, n)
        s[rest] = s[rest] * decay_weights(e[i], a[i], e[rest], a[rest], offset, method, iou_threshold, sigma)
        dead = np.flatnonzero(~(s[rest] >= score_threshold))
        if dead.size:  # the original's removal: the last working row moves into the dead slot
            pos = i + 1 + int(dead[0])
            while pos < n:
                if not s[pos] >= score_threshold:
                    for arr in (e, a, s, idx):
                        arr[pos] = arr[n - 1]
                    n -= 1
                else:
                    pos += 1
        i += 1
    return out_idx, out_score


def _scalar(v: Any, default: Any, dtype: Any) -> Any:
    return dtype(default) if v is None else dtype(np.asarray(v).reshape(-1)[0])


def reference(
    boxes: np.ndarray,
    scores: np.ndarray,
    max_output_boxes_per_class: np.ndarray | None = None,
    iou_threshold: np.ndarray | None = None,
    score_threshold: np.ndarray | None = None,
    *,
    method: str = "linear",
    sigma: float = 0.5,
    center_point_box: int = 0,
    coordinate_offset: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """The float32 NumPy oracle of SoftNMS (float32 like the original loop, not float64: the selection is discrete,
    so every backend must make the same comparisons); it checks the contract first, so a bad input raises the same
    OpContractError."""
    validate(
        np.shape(boxes),
        np.shape(scores),
        _scalar_shapes(
            *(None if v is None else np.shape(v) for v in (max_output_boxes_per_class, iou_threshold, score_threshold))
        ),
        method,
        sigma,
        center_point_box,
        coordinate_offset,
    )
    max_out = _scalar(max_output_boxes_per_class, DEFAULT_MAX_OUTPUT, int)
    iou_thr = _scalar(iou_threshold, DEFAULT_IOU_THRESHOLD, np.float32)
    score_thr = _scalar(score_threshold, DEFAULT_SCORE_THRESHOLD, np.float32)
    offset = np.float32(coordinate_offset)
    ext = box_extents(np.asarray(boxes).astype(np.float32), center_point_box)
    area = box_areas(ext, offset)
    s32 = np.asarray(scores).astype(np.float32)
    if s32.size == 0:  # no boxes or no classes: nothing to select, whatever the batch count (2^40)
        return np.zeros((0, 3), np.int64), np.zeros((0,), np.float32)
    rows: list[tuple[int, int, int]] = []
    values: list[float] = []
    for b in range(s32.shape[0]):
        for c in range(s32.shape[1]):
            idx, sc = soft_nms_one(
                ext[b],
                area[b],
                s32[b, c],
                max_output=max_out,
                iou_threshold=iou_thr,
                score_threshold=score_thr,
                method=method,
                sigma=np.float32(sigma),
                offset=offset,
            )
            rows += [(b, c, k) for k in idx]
            values += sc
    return np.array(rows, np.int64).reshape(-1, 3), np.array(values, np.float32)


# ---- portable function body (standard ONNX, opset 18) ---------------------------------------------


@function_body
def SoftNMS(
    Boxes,
    Scores,
    MaxOutputBoxesPerClass,
    IouThreshold,
    ScoreThreshold,
    method: str = "linear",
    sigma: float = 0.5,
    center_point_box: int = 0,
    coordinate_offset: int = 0,
):
    # Omitted optional inputs take their defaults: Clip(d, v, v) = v, and Clip(d) = d.
    max_out = op.Clip(op.Constant(value_int=0), MaxOutputBoxesPerClass, MaxOutputBoxesPerClass)
    iou_thr = op.Clip(op.Constant(value_float=0.3), IouThreshold, IouThreshold)
    score_thr = op.Clip(op.Constant(value_float=0.001), ScoreThreshold, ScoreThreshold)
    # String equality in opset 18: Unique of [method, "x"] has one element iff method == "x".
    name = op.Unsqueeze(op.Constant(value_string=method), op.Constant(value_ints=[0]))
    one = op.Constant(value_int=1)
    is_linear = op.Equal(op.Size(op.Unique(op.Concat(name, op.Constant(value_strings=["linear"]), axis=0))), one)
    is_hard = op.Equal(op.Size(op.Unique(op.Concat(name, op.Constant(value_strings=["hard"]), axis=0))), one)
    sig = op.Constant(value_float=sigma)
    offset = op.Cast(op.Constant(value_int=coordinate_offset), to=FLOAT.dtype)
    centered = op.Equal(op.Constant(value_int=center_point_box), one)

    boxes = op.Cast(Boxes, to=FLOAT.dtype)
    scores = op.Cast(Scores, to=FLOAT.dtype)
    a0 = op.Gather(boxes, op.Constant(value_int=0), axis=2)
    a1 = op.Gather(boxes, op.Constant(value_int=1), axis=2)
    a2 = op.Gather(boxes, op.Constant(value_int=2), axis=2)
    a3 = op.Gather(boxes, op.Constant(value_int=3), axis=2)
    half = op.Constant(value_float=0.5)
    p0 = op.Where(centered, op.Sub(a0, op.Mul(a2, half)), a0)
    q0 = op.Where(centered, op.Add(a0, op.Mul(a2, half)), a2)
    p1 = op.Where(centered, op.Sub(a1, op.Mul(a3, half)), a1)
    q1 = op.Where(centered, op.Add(a1, op.Mul(a3, half)), a3)
    nan_box = op.Or(op.Or(op.IsNaN(p0), op.IsNaN(q0)), op.Or(op.IsNaN(p1), op.IsNaN(q1)))
    pos_inf = op.Constant(value_float=float("inf"))
    neg_inf = op.Constant(value_float=float("-inf"))
    # ext: [B, 4, N] = (lo0, hi0, lo1, hi1); a NaN box overlaps nothing.
    lo0 = op.Where(nan_box, pos_inf, op.Min(p0, q0))
    hi0 = op.Where(nan_box, neg_inf, op.Max(p0, q0))
    lo1 = op.Where(nan_box, pos_inf, op.Min(p1, q1))
    hi1 = op.Where(nan_box, neg_inf, op.Max(p1, q1))
    area = op.Mul(op.Add(op.Sub(hi0, lo0), offset), op.Add(op.Sub(hi1, lo1), offset))
    axis1 = op.Constant(value_ints=[1])
    rows_all = op.Concat(
        op.Unsqueeze(lo0, axis1),
        op.Unsqueeze(hi0, axis1),
        op.Unsqueeze(lo1, axis1),
        op.Unsqueeze(hi1, axis1),
        op.Unsqueeze(area, axis1),
        axis=1,
    )  # [B, 5, N]

    # Each Loop carries ONE tensor: onnxscript 0.7 pairs several loop-carried values with the Loop's
    # outputs in set-iteration order, which changes with Python's hash seed. The working rows are
    # therefore one float64 [7, n] tensor (lo0, hi0, lo1, hi1, area, score, index): float32 values and
    # indices < 2^53 are exact in float64, and all arithmetic is done on float32 casts.
    zero_i = op.Constant(value_int=0)
    zero_f = op.Constant(value_float=0.0)
    one_f = op.Constant(value_float=1.0)
    axis0 = op.Constant(value_ints=[0])
    num_classes = op.Gather(op.Shape(scores), op.Constant(value_int=1))
    boxes_n = op.Gather(op.Shape(scores), op.Constant(value_int=2))
    # No (batch, class) pair to visit when there are no boxes (min(N, 1) = 0): Boxes [2^40, 0, 4]
    # must not loop 2^40 times over empty pairs.
    pairs = op.Mul(op.Mul(op.Gather(op.Shape(scores), zero_i), num_classes), op.Min(boxes_n, one))
    index_row = op.Unsqueeze(op.Cast(op.Range(zero_i, boxes_n, one), to=11), axis0)  # [1, N] float64
    # every selection so far: float64 [K, 4] rows (batch, class, index, score)
    selected = op.Cast(op.ConstantOfShape(op.Constant(value_ints=[0, 4])), to=11)
    for t in range(pairs):
        b = op.Div(t, num_classes)
        c = op.Mod(t, num_classes)
        s_in = op.Gather(op.Gather(scores, b), c)  # [N]
        keep = op.GreaterOrEqual(s_in, score_thr)  # NaN is never >=: dropped
        table = op.Concat(
            op.Cast(op.Gather(rows_all, b), to=11),
            op.Unsqueeze(op.Cast(s_in, to=11), axis0),
            index_row,
            axis=0,
        )  # [7, N]
        work = op.Compress(table, keep, axis=1)  # [7, n], index order
        n = op.Gather(op.Shape(work), op.Constant(value_int=1))
        trips = op.Where(op.Greater(max_out, zero_i), op.Min(max_out, n), n)
        # The original loop, on the whole array: columns [0, i) are the selections so far.
        for i in range(trips):
            length = op.Gather(op.Shape(work), op.Constant(value_int=1))
            i1 = op.Unsqueeze(i, axis0)
            s_all = op.Cast(op.Gather(work, op.Constant(value_int=5)), to=FLOAT.dtype)
            m = op.Add(i, op.ArgMax(op.Slice(s_all, i1, op.Unsqueeze(length, axis0)), keepdims=0))  # first max
            swap = op.ScatterElements(
                op.Range(zero_i, length, one),
                op.Concat(i1, op.Unsqueeze(m, axis0), axis=0),
                op.Concat(op.Unsqueeze(m, axis0), i1, axis=0),
            )
            work = op.Gather(work, swap, axis=1)
            after = op.Add(i1, op.Constant(value_ints=[1]))
            head = op.Slice(work, axis0, after, op.Constant(value_ints=[1]))  # [7, i + 1]
            sel = op.Cast(op.Gather(work, i, axis=1), to=FLOAT.dtype)  # [7]
            rest64 = op.Slice(work, after, op.Unsqueeze(length, axis0), op.Constant(value_ints=[1]))
            rest = op.Cast(rest64, to=FLOAT.dtype)  # [7, L]
            iw = op.Add(
                op.Sub(
                    op.Min(op.Gather(sel, op.Constant(value_int=1)), op.Gather(rest, op.Constant(value_int=1))),
                    op.Max(op.Gather(sel, zero_i), op.Gather(rest, zero_i)),
                ),
                offset,
            )
            ih = op.Add(
                op.Sub(
                    op.Min(op.Gather(sel, op.Constant(value_int=3)), op.Gather(rest, op.Constant(value_int=3))),
                    op.Max(op.Gather(sel, op.Constant(value_int=2)), op.Gather(rest, op.Constant(value_int=2))),
                ),
                offset,
            )
            overlap = op.And(op.Greater(iw, zero_f), op.Greater(ih, zero_f))
            inter = op.Mul(iw, ih)
            union = op.Sub(
                op.Add(op.Gather(sel, op.Constant(value_int=4)), op.Gather(rest, op.Constant(value_int=4))), inter
            )
            iou = op.Where(overlap, op.Div(inter, union), zero_f)
            above = op.Greater(iou, iou_thr)
            gauss = op.Cast(op.Exp(op.Cast(op.Div(op.Neg(op.Mul(iou, iou)), sig), to=11)), to=FLOAT.dtype)
            weight = op.Where(
                is_linear,
                op.Where(above, op.Sub(one_f, iou), one_f),
                op.Where(is_hard, op.Where(above, zero_f, one_f), gauss),
            )
            s_new = op.Mul(op.Gather(rest, op.Constant(value_int=5)), weight)
            rest64 = op.Concat(
                op.Slice(rest64, axis0, op.Constant(value_ints=[5])),
                op.Unsqueeze(op.Cast(s_new, to=11), axis0),
                op.Slice(rest64, op.Constant(value_ints=[6]), op.Constant(value_ints=[7])),
                axis=0,
            )
            # The original's removal order: the j-th dead row (ascending) among the first `live` rows
            # takes the j-th live row (descending) among the rows from `live` on.
            alive = op.GreaterOrEqual(s_new, score_thr)
            live = op.ReduceSum(op.Cast(alive, to=INT64.dtype), keepdims=0)
            pos = op.Range(zero_i, op.Size(s_new), one)
            in_head = op.Less(pos, live)
            dead_head = op.Compress(pos, op.And(in_head, op.Not(alive)))
            live_tail = op.Compress(pos, op.And(op.Not(in_head), alive))
            live_tail = op.Slice(
                live_tail,
                op.Constant(value_ints=[-1]),
                op.Constant(value_ints=[-(2**62)]),
                axis0,
                op.Constant(value_ints=[-1]),
            )
            order = op.ScatterElements(op.Range(zero_i, live, one), dead_head, live_tail)
            work = op.Concat(head, op.Gather(rest64, order, axis=1), axis=1)
            done = op.Equal(live, zero_i)
            if done:
                break
        count = op.Min(trips, op.Gather(op.Shape(work), op.Constant(value_int=1)))
        picked = op.Slice(work, axis0, op.Unsqueeze(count, axis0), op.Constant(value_ints=[1]))  # [7, k]
        bc = op.Cast(op.Concat(op.Unsqueeze(b, axis0), op.Unsqueeze(c, axis0), axis=0), to=11)
        bc = op.Expand(
            op.Unsqueeze(bc, op.Constant(value_ints=[1])),
            op.Concat(op.Constant(value_ints=[2]), op.Unsqueeze(count, axis0), axis=0),
        )
        rows = op.Concat(bc, op.Gather(picked, op.Constant(value_ints=[6, 5]), axis=0), axis=0)  # [4, k]
        selected = op.Concat(selected, op.Transpose(rows, perm=[1, 0]), axis=0)
    out_rows = op.Cast(
        op.Slice(selected, axis0, op.Constant(value_ints=[3]), op.Constant(value_ints=[1])), to=INT64.dtype
    )
    out_scores = op.Cast(op.Gather(selected, op.Constant(value_int=3), axis=1), to=FLOAT.dtype)
    return out_rows, op.CastLike(out_scores, Scores)


# ---- torch ---------------------------------------------------------------------------------------


def _torch_scalar(v: Any, default: Any, kind: type) -> Any:
    return kind(default) if v is None else kind(v.reshape(-1)[0].item())


def _validate_tensors(
    boxes: Any,
    scores: Any,
    scalars: tuple[Any, Any, Any],
    method: str,
    sigma: float,
    center_point_box: int,
    coordinate_offset: int,
) -> None:
    """``validate`` on torch (or fake) tensors; an omitted optional scalar input is None."""
    validate(
        tuple(boxes.shape),
        tuple(scores.shape),
        _scalar_shapes(*(None if v is None else tuple(v.shape) for v in scalars)),
        method,
        sigma,
        center_point_box,
        coordinate_offset,
    )


def torch_impl(
    boxes: Any,
    scores: Any,
    max_output_boxes_per_class: Any = None,
    iou_threshold: Any = None,
    score_threshold: Any = None,
    method: str = "linear",
    sigma: float = 0.5,
    center_point_box: int = 0,
    coordinate_offset: int = 0,
) -> Any:
    """The same float32 loop in torch ops (the removal step in the original's order)."""
    import torch

    _validate_tensors(
        boxes,
        scores,
        (max_output_boxes_per_class, iou_threshold, score_threshold),
        method,
        sigma,
        center_point_box,
        coordinate_offset,
    )
    max_out = _torch_scalar(max_output_boxes_per_class, DEFAULT_MAX_OUTPUT, int)
    f32 = torch.float32
    iou_thr = torch.tensor(_torch_scalar(iou_threshold, DEFAULT_IOU_THRESHOLD, float), dtype=f32)
    score_thr = torch.tensor(_torch_scalar(score_threshold, DEFAULT_SCORE_THRESHOLD, float), dtype=f32)
    sig = torch.tensor(sigma, dtype=f32)
    off = torch.tensor(float(coordinate_offset), dtype=f32)
    b32 = boxes.to(f32)
    a0, a1, a2, a3 = b32.unbind(-1)
    if center_point_box:
        half = torch.tensor(0.5, dtype=f32)
        p0, q0, p1, q1 = a0 - a2 * half, a0 + a2 * half, a1 - a3 * half, a1 + a3 * half
    else:
        p0, q0, p1, q1 = a0, a2, a1, a3
    nan_box = p0.isnan() | q0.isnan() | p1.isnan() | q1.isnan()
    inf = torch.tensor(float("inf"), dtype=f32)
    ext = torch.stack(
        [
            torch.where(nan_box, inf, torch.minimum(p0, q0)),
            torch.where(nan_box, -inf, torch.maximum(p0, q0)),
            torch.where(nan_box, inf, torch.minimum(p1, q1)),
            torch.where(nan_box, -inf, torch.maximum(p1, q1)),
        ],
        dim=-1,
    )
    area = ((ext[..., 1] - ext[..., 0]) + off) * ((ext[..., 3] - ext[..., 2]) + off)
    s_all = scores.to(f32)
    if s_all.numel() == 0:  # no boxes or no classes: no pair to visit, whatever the batch count
        return torch.zeros((0, 3), dtype=torch.int64), torch.zeros((0,), dtype=scores.dtype)
    rows, values = [], []
    for bi in range(s_all.shape[0]):
        for ci in range(s_all.shape[1]):
            keep = torch.nonzero(s_all[bi, ci] >= score_thr).flatten()
            e, a, s, idx = ext[bi][keep].clone(), area[bi][keep].clone(), s_all[bi, ci][keep].clone(), keep.clone()
            n, i = int(keep.numel()), 0
            while i < n and (max_out <= 0 or i < max_out):
                m = i + int(torch.argmax(s[i:n]))
                swap_to, swap_from = torch.tensor([i, m]), torch.tensor([m, i])
                for arr in (e, a, s, idx):
                    arr[swap_to] = arr[swap_from]
                rows.append(torch.stack([torch.tensor(bi), torch.tensor(ci), idx[i]]))
                values.append(s[i].clone())
                r = slice(i + 1, n)
                iw = (torch.minimum(e[i, 1], e[r, 1]) - torch.maximum(e[i, 0], e[r, 0])) + off
                ih = (torch.minimum(e[i, 3], e[r, 3]) - torch.maximum(e[i, 2], e[r, 2])) + off
                inter = iw * ih
                iou = torch.where((iw > 0) & (ih > 0), inter / ((a[i] + a[r]) - inter), torch.zeros((), dtype=f32))
                if method == "linear":
                    w = torch.where(iou > iou_thr, 1 - iou, torch.ones((), dtype=f32))
                elif method == "hard":
                    w = torch.where(iou > iou_thr, torch.zeros((), dtype=f32), torch.ones((), dtype=f32))
                else:
                    w = torch.exp((-(iou * iou) / sig).double()).to(f32)
                s[r] = s[r] * w
                dead = torch.nonzero(~(s[r] >= score_thr)).flatten()
                if dead.numel():
                    pos = i + 1 + int(dead[0])
                    while pos < n:
                        if not bool(s[pos] >= score_thr):
                            for arr in (e, a, s, idx):
                                arr[pos] = arr[n - 1]
                            n -= 1
                        else:
                            pos += 1
                i += 1
    out_rows = torch.stack(rows).to(torch.int64) if rows else torch.zeros((0, 3), dtype=torch.int64)
    out_scores = torch.stack(values) if values else torch.zeros((0,), dtype=f32)
    return out_rows, out_scores.to(scores.dtype)


def torch_fake(
    boxes: Any,
    scores: Any,
    max_output_boxes_per_class: Any = None,
    iou_threshold: Any = None,
    score_threshold: Any = None,
    method: str = "linear",
    sigma: float = 0.5,
    center_point_box: int = 0,
    coordinate_offset: int = 0,
) -> Any:
    """Shapes for tracing: the number of selected boxes is data dependent (a new symbolic size)."""
    import torch

    _validate_tensors(
        boxes,
        scores,
        (max_output_boxes_per_class, iou_threshold, score_threshold),
        method,
        sigma,
        center_point_box,
        coordinate_offset,
    )
    count = torch.library.get_ctx().new_dynamic_size()
    return scores.new_empty((count, 3), dtype=torch.int64), scores.new_empty((count,))


def infer_shapes(ctx: Any) -> None:
    """ONNX shape inference for SoftNMS: selected is int64 [M, 3], selected_scores [M] in the scores' type (M depends on
    the data)."""
    from onnx import TensorProto, helper

    scores_type = ctx.get_input_type(1)
    ctx.set_output_type(0, helper.make_tensor_type_proto(TensorProto.INT64, [None, 3]))
    ctx.set_output_type(1, helper.make_tensor_type_proto(scores_type.tensor_type.elem_type, [None]))


# ---- samples and error cases ---------------------------------------------------------------------


def clustered_boxes(
    rng: np.random.Generator, n: int, *, clusters: int | None = None, integer: bool = False
) -> np.ndarray:
    """[n, 4] float32 boxes [y1, x1, y2, x2] in ``clusters`` groups of heavily overlapping boxes."""
    k = clusters or max(1, n // 20)
    centers = rng.uniform(50, 950, (k, 2))
    c = centers[rng.integers(0, k, n)] + rng.normal(0, 10, (n, 2))
    hw = rng.uniform(20, 100, (n, 2))
    boxes = np.concatenate([c - hw / 2, c + hw / 2], axis=1)
    if integer:
        boxes = np.round(boxes)
    return boxes.astype(np.float32)


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of SoftNMS, drawn from ``rng``: typical sizes, edge sizes (empty, one element, the
    kernels' tile edges) and special values (+-inf, NaN, ties) on which every backend must agree."""

    def scores_for(b: int, c: int, n: int, *, levels: int | None = None) -> np.ndarray:
        if levels:  # few distinct values: many exact ties
            return (rng.integers(1, levels + 1, (b, c, n)) / levels).astype(np.float32)
        return rng.uniform(0, 1, (b, c, n)).astype(np.float32)

    def thr(v: float) -> np.ndarray:
        return np.array([v], np.float32)

    boxes = np.stack([clustered_boxes(rng, 120), clustered_boxes(rng, 120)])
    yield Sample("clustered_b2_c3_n120", (boxes, scores_for(2, 3, 120)))
    for method in METHODS:
        yield Sample(
            f"{method}_ties_b2_c2_n80",
            (np.stack([clustered_boxes(rng, 80, integer=True)] * 2), scores_for(2, 2, 80, levels=4)),
            {"method": method},
        )
    yield Sample(
        "gaussian_sigma0.3_iou0.5_offset1",
        (clustered_boxes(rng, 120, integer=True)[None], scores_for(1, 2, 120), None, thr(0.5), thr(0.05)),
        {"method": "gaussian", "sigma": 0.3, "coordinate_offset": 1},
    )
    yield Sample(
        "max_output_5",
        (clustered_boxes(rng, 50)[None], scores_for(1, 3, 50), np.array([5], np.int64), thr(0.4), thr(0.0)),
    )
    # center format, with negative widths (either corner order is accepted)
    centered = clustered_boxes(rng, 40)
    cxcywh = np.concatenate([(centered[:, :2] + centered[:, 2:]) / 2, centered[:, 2:] - centered[:, :2]], axis=1)
    cxcywh[::3, 2:] *= -1
    yield Sample("center_point_box", (cxcywh[None].astype(np.float32), scores_for(1, 2, 40)), {"center_point_box": 1})
    flipped = clustered_boxes(rng, 40)
    flipped[::2] = flipped[::2][:, [2, 3, 0, 1]]
    yield Sample("flipped_corners", (flipped[None], scores_for(1, 1, 40)), {"method": "gaussian"})
    real = clustered_boxes(rng, 1000)
    yield Sample("clustered_n1000_gaussian", (real[None], scores_for(1, 1, 1000)), {"method": "gaussian"})

    yield Sample("no_boxes", (np.zeros((1, 0, 4), np.float32), np.zeros((1, 3, 0), np.float32)), kind="edge")
    yield Sample("no_classes", (clustered_boxes(rng, 5)[None], np.zeros((1, 0, 5), np.float32)), kind="edge")
    yield Sample("no_batches", (np.zeros((0, 5, 4), np.float32), np.zeros((0, 2, 5), np.float32)), kind="edge")
    # No boxes in 2^40 batches: no data, so every backend must return at once (not visit 2^40 pairs).
    huge = 2**40
    yield Sample(
        "no_boxes_huge_batch", (np.zeros((huge, 0, 4), np.float32), np.zeros((huge, 3, 0), np.float32)), kind="edge"
    )
    yield Sample("one_box", (clustered_boxes(rng, 1)[None], thr(0.7).reshape(1, 1, 1)), kind="edge")
    yield Sample(
        "all_below_threshold",
        (clustered_boxes(rng, 9)[None], np.full((1, 1, 9), 0.0005, np.float32)),
        kind="edge",
    )
    yield Sample(
        "max_output_equals_n",
        (clustered_boxes(rng, 12)[None], scores_for(1, 1, 12), np.array([12], np.int64)),
        kind="edge",
    )
    # SIMD tile edges of the IoU pass (16 / 8 lanes): remaining counts cross them as boxes are selected
    for n in (15, 16, 17, 33):
        yield Sample(f"n{n}_one_cluster", (clustered_boxes(rng, n, clusters=1)[None], scores_for(1, 1, n)), kind="edge")
    degenerate = clustered_boxes(rng, 30, clusters=1)
    degenerate[::4, 2] = degenerate[::4, 0]  # zero height
    degenerate[1::4, 3] = degenerate[1::4, 1]  # zero width
    degenerate[2] = degenerate[3] = degenerate[5]  # identical boxes
    yield Sample("degenerate_boxes", (degenerate[None], scores_for(1, 1, 30)), kind="edge")
    yield Sample(
        "degenerate_boxes_offset1",
        (degenerate[None], scores_for(1, 1, 30)),
        {"coordinate_offset": 1, "method": "gaussian"},
        kind="edge",
    )

    special = scores_for(1, 2, 40, levels=3)
    special[0, 0, [3, 17]] = np.nan
    special[0, 0, 5] = np.inf
    special[0, 0, 9] = -np.inf
    special[0, 1, :] = 0.5  # all tied
    special_boxes = clustered_boxes(rng, 40, clusters=2)
    special_boxes[11, 1] = np.nan  # NaN coordinate: overlaps nothing
    special_boxes[12, :] = np.array([-np.inf, -np.inf, np.inf, np.inf], np.float32)  # infinite box
    for method in METHODS:
        yield Sample(f"nan_inf_ties_{method}", (special_boxes[None], special), {"method": method}, kind="special")
    same = np.tile(np.array([[10, 10, 50, 50]], np.float32), (20, 1))
    yield Sample("identical_boxes_tied_scores", (same[None], np.full((1, 1, 20), 0.9, np.float32)), kind="special")
    yield Sample(
        "identical_boxes_tied_scores_gaussian",
        (same[None], np.full((1, 1, 20), 0.9, np.float32)),
        {"method": "gaussian"},
        kind="special",
    )


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of SoftNMS; every backend must refuse them with a message containing ``match`` (the
    operator reference lists them)."""
    boxes = np.zeros((1, 3, 4), np.float32)
    scores = np.zeros((1, 2, 3), np.float32)
    yield ErrorCase("bad_method", (boxes, scores), {"method": "cubic"}, "method 'cubic' is not supported")
    yield ErrorCase("sigma_zero", (boxes, scores), {"sigma": 0.0}, "sigma 0 must be > 0")
    yield ErrorCase("sigma_negative", (boxes, scores), {"sigma": -1.0}, "sigma -1 must be > 0")
    yield ErrorCase("center_point_box_2", (boxes, scores), {"center_point_box": 2}, "center_point_box 2 is not")
    yield ErrorCase("coordinate_offset_2", (boxes, scores), {"coordinate_offset": 2}, "coordinate_offset 2 is not")
    yield ErrorCase(
        "boxes_last_dim", (np.zeros((1, 3, 5), np.float32), scores), {}, "Boxes shape [1, 3, 5] is not [B, N, 4]"
    )
    yield ErrorCase("scores_rank", (boxes, np.zeros((2, 3), np.float32)), {}, "Scores shape [2, 3] is not [B, C, N]")
    yield ErrorCase(
        "boxes_count_mismatch",
        (boxes, np.zeros((1, 2, 4), np.float32)),
        {},
        "Scores shape [1, 2, 4] does not match Boxes shape [1, 3, 4]",
    )
    yield ErrorCase(
        "batch_mismatch",
        (boxes, np.zeros((2, 2, 3), np.float32)),
        {},
        "Scores shape [2, 2, 3] does not match Boxes shape [1, 3, 4]",
    )
    yield ErrorCase(
        "threshold_not_scalar",
        (boxes, scores, None, np.array([0.3, 0.5], np.float32)),
        {},
        "IouThreshold has shape [2]",
    )


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(
        Port("Boxes"),
        Port("Scores"),
        Port("MaxOutputBoxesPerClass", "int64", optional=True, doc="<= 0: no limit (default 0)"),
        Port("IouThreshold", "float32", optional=True, doc="default 0.3"),
        Port("ScoreThreshold", "float32", optional=True, doc="default 0.001"),
    ),
    outputs=(
        Port("SelectedIndices", "int64", doc="[M, 3] rows [batch, class, box_index] in selection order"),
        Port("SelectedScores", doc="[M] decayed scores at selection time"),
    ),
    attrs=(
        Attr("method", str, "linear", "'linear' | 'gaussian' | 'hard'"),
        Attr("sigma", float, 0.5, "gaussian weight exp(-IoU^2 / sigma); > 0"),
        Attr("center_point_box", int, 0, "0: [y1, x1, y2, x2]; 1: [x_center, y_center, w, h]"),
        Attr("coordinate_offset", int, 0, "1: pixel-inclusive widths (x2 - x1 + 1)"),
    ),
    reference=reference,
    function=SoftNMS,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    torch_fake=torch_fake,
    infer_shapes=infer_shapes,
    # Every backend makes the same float32 comparisons (exact indices); scores differ at most where a
    # gaussian weight's double exp rounds differently to float32.
    tolerance={"float32": (1e-6, 1e-30), "float16": (1e-3, 1e-6)},
    source="Bodla et al., ICCV 2017; bharatsingh430/soft-nms lib/nms/cpu_nms.pyx::cpu_soft_nms",
)
