"""SoftNMS beyond the generic conformance tests: the kernel against an independent transcription of
the original authors' Cython loop, against onnxruntime's NonMaxSuppression (method "hard"), the
properties the contract promises, the NaN rule, and torch export."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softdeploy import conformance
from softdeploy.ops import REGISTRY, Sample
from softdeploy.ops.soft_nms import clustered_boxes

OP = REGISTRY["SoftNMS"]
METHOD_CODE = {"hard": 0, "linear": 1, "gaussian": 2}


# ---- oracle: bharatsingh430/soft-nms lib/nms/cpu_nms.pyx::cpu_soft_nms, transcribed line by line ----
# Every cdef float of the Cython source is an np.float32 here; np.exp receives a Python float (double)
# as in the Cython code. Two generalisations, both named in docs/ops/SoftNMS.md: the "+ 1" of the pixel-inclusive
# areas is `offset` (1 = the original), and `original_index` rides along in the rows.


def cpu_soft_nms(boxes, sigma=0.5, Nt=0.3, threshold=0.001, method=0, offset=1.0):
    """boxes: list of rows [x1, y1, x2, y2, score, original_index]; mutated in place. Returns keep."""
    N = len(boxes)
    sigma, Nt, threshold = np.float32(sigma), np.float32(Nt), np.float32(threshold)
    off = np.float32(offset)
    for i in range(N):  # the bound stays the original N; rows >= the current N are inert
        maxscore = boxes[i][4]
        maxpos = i
        tx1, ty1, tx2, ty2, ts, tid = boxes[i]
        pos = i + 1
        # get max box
        while pos < N:
            if maxscore < boxes[pos][4]:
                maxscore = boxes[pos][4]
                maxpos = pos
            pos = pos + 1
        # add max box as a detection
        boxes[i] = list(boxes[maxpos])
        # swap ith box with position of max box
        boxes[maxpos] = [tx1, ty1, tx2, ty2, ts, tid]
        tx1, ty1, tx2, ty2, ts, tid = boxes[i]
        pos = i + 1
        # NMS iterations, note that N changes if detection boxes fall below threshold
        while pos < N:
            x1, y1, x2, y2 = boxes[pos][:4]
            area = (x2 - x1 + off) * (y2 - y1 + off)
            iw = min(tx2, x2) - max(tx1, x1) + off
            if iw > 0:
                ih = min(ty2, y2) - max(ty1, y1) + off
                if ih > 0:
                    ua = np.float32((tx2 - tx1 + off) * (ty2 - ty1 + off) + area - iw * ih)
                    ov = iw * ih / ua  # iou between max box and detection box
                    if method == 1:  # linear
                        weight = np.float32(1) - ov if ov > Nt else np.float32(1)
                    elif method == 2:  # gaussian
                        weight = np.float32(np.exp(float(-(ov * ov) / sigma)))
                    else:  # original NMS
                        weight = np.float32(0) if ov > Nt else np.float32(1)
                    boxes[pos][4] = weight * boxes[pos][4]
                    # if box score falls below threshold, discard the box by swapping with last box
                    # update N
                    if boxes[pos][4] < threshold:
                        boxes[pos] = list(boxes[N - 1])
                        N = N - 1
                        pos = pos - 1
            pos = pos + 1
    return list(range(N))


def oracle(boxes_yxyx, scores, *, method, sigma, iou, score_thr, offset):
    """One (batch, class) through the transcription, after the contract's up-front score filter."""
    rows = [
        [np.float32(b[1]), np.float32(b[0]), np.float32(b[3]), np.float32(b[2]), np.float32(s), j]
        for j, (b, s) in enumerate(zip(boxes_yxyx, scores, strict=True))
        if s >= np.float32(score_thr)
    ]
    keep = cpu_soft_nms(rows, sigma, iou, score_thr, METHOD_CODE[method], offset)
    return [rows[k][5] for k in keep], [float(rows[k][4]) for k in keep]


# ---- running the kernel -----------------------------------------------------------------------------


@functools.cache
def _session(isa: str, method: str, sigma: float, offset: int, dtype: str = "float32"):
    from softdeploy.runtime import Session

    t = np.dtype(dtype)
    sample = Sample(
        "model",
        (
            np.zeros((1, 1, 4), t),
            np.zeros((1, 1, 1), t),
            np.zeros(1, np.int64),
            np.zeros(1, np.float32),
            np.zeros(1, np.float32),
        ),
        {"method": method, "sigma": sigma, "coordinate_offset": offset},
    )
    with conformance.forced_isa(isa):
        return Session(OP.make_model(sample), kernels="native")


def run_kernel(boxes, scores, max_out=0, iou=0.3, score_thr=0.001, *, method="linear", sigma=0.5, offset=0, isa=None):
    isa = isa or conformance.available_isas()[-1]
    session = _session(isa, method, sigma, offset, np.asarray(boxes).dtype.name)
    feeds = {
        "Boxes": boxes,
        "Scores": scores,
        "MaxOutputBoxesPerClass": np.array([max_out], np.int64),
        "IouThreshold": np.array([iou], np.float32),
        "ScoreThreshold": np.array([score_thr], np.float32),
    }
    return session.run(feeds)


def per_class(rows, scores, b, c):
    sel = (rows[:, 0] == b) & (rows[:, 1] == c)
    return rows[sel, 2].tolist(), scores[sel].astype(np.float64).tolist()


# ---- strategies: clustered boxes, integer corners, few score levels (many exact ties) ---------------


@st.composite
def detections(draw, max_boxes: int = 48):
    n = draw(st.integers(1, max_boxes))
    classes = draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    clusters = draw(st.integers(1, 4))
    boxes = clustered_boxes(rng, n, clusters=clusters, integer=draw(st.booleans()))
    levels = draw(st.sampled_from([2, 3, 5, 0]))  # 0: continuous scores
    if levels:
        scores = (rng.integers(0, levels + 1, (1, classes, n)) / levels).astype(np.float32)
    else:
        scores = rng.uniform(0, 1, (1, classes, n)).astype(np.float32)
    return boxes[None], scores


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("isa", conformance.available_isas())
@pytest.mark.parametrize("method", ["linear", "gaussian", "hard"])
@given(data=detections(), iou=st.sampled_from([0.0, 0.3, 0.5, 0.7]), thr=st.sampled_from([0.001, 0.1, 0.35]))
@SETTINGS
def test_kernel_equals_the_original_loop(isa, method, data, iou, thr):
    boxes, scores = data
    for offset in (0, 1):
        rows, sel_scores = run_kernel(boxes, scores, 0, iou, thr, method=method, offset=offset, isa=isa)
        for c in range(scores.shape[1]):
            want = oracle(boxes[0], scores[0, c], method=method, sigma=0.5, iou=iou, score_thr=thr, offset=offset)
            got = per_class(rows, sel_scores, 0, c)
            assert got[0] == want[0], (method, offset, c)
            np.testing.assert_array_equal(got[1], want[1])  # bit for bit (float32)


@given(data=detections(max_boxes=24), sigma=st.sampled_from([0.1, 0.5, 2.0]))
@SETTINGS
def test_gaussian_sigma_equals_the_original_loop(data, sigma):
    boxes, scores = data
    rows, sel_scores = run_kernel(boxes, scores, method="gaussian", sigma=sigma, offset=1)
    for c in range(scores.shape[1]):
        want = oracle(boxes[0], scores[0, c], method="gaussian", sigma=sigma, iou=0.3, score_thr=0.001, offset=1)
        assert per_class(rows, sel_scores, 0, c) == want


@pytest.mark.parametrize("method", ["linear", "gaussian", "hard"])
@given(data=detections(), max_out=st.integers(-1, 6))
@SETTINGS
def test_properties(method, data, max_out):
    boxes, scores = data
    rows, sel = run_kernel(boxes, scores, max_out, method=method)
    full_rows, full_sel = run_kernel(boxes, scores, 0, method=method)
    assert rows.dtype == np.int64 and rows.shape == (len(sel), 3)
    # batches, then classes, ascending
    assert np.all(np.diff(rows[:, 0] * scores.shape[1] + rows[:, 1]) >= 0)
    for c in range(scores.shape[1]):
        idx, s = per_class(rows, sel, 0, c)
        full_idx, full_s = per_class(full_rows, full_sel, 0, c)
        assert len(set(idx)) == len(idx)  # every box at most once
        if max_out > 0:  # the limit keeps the unlimited run's first selections
            assert idx == full_idx[:max_out] and s == full_s[:max_out]
        else:
            assert (idx, s) == (full_idx, full_s)
        # scores >= 0: weights are in [0, 1], so the selected scores never rise, never exceed the
        # box's input score, and never fall under the threshold
        assert all(a >= b for a, b in itertools.pairwise(s))
        assert all(v <= scores[0, c, k] for k, v in zip(idx, s, strict=True))
        assert all(v >= np.float32(0.001) for v in s)


@functools.cache
def _many_boxes() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    n = 600
    boxes = clustered_boxes(rng, n, integer=True)
    boxes[::97] = [0, 0, 1000, 1000]  # wide boxes overlap every block
    scores = (rng.integers(1, 9, (1, 2, n)) / 8).astype(np.float32)  # many exact ties
    return boxes, scores


@functools.cache
def _many_boxes_oracle(method: str, offset: int, c: int):
    boxes, scores = _many_boxes()
    return oracle(boxes, scores[0, c], method=method, sigma=0.5, iou=0.3, score_thr=0.2, offset=offset)


@pytest.mark.parametrize("isa", conformance.available_isas())
@pytest.mark.parametrize("method", ["linear", "gaussian", "hard"])
def test_many_boxes_equal_the_original_loop(isa, method):
    """Hundreds of boxes (the hypothesis cases stay under 48): many slices and blocks of the kernel's
    spatial index, blocks that empty, compactions, ties between far-apart boxes, a few wide boxes."""
    boxes, scores = _many_boxes()
    for offset in (0, 1):
        rows, sel = run_kernel(boxes[None], scores, 0, 0.3, 0.2, method=method, offset=offset, isa=isa)
        for c in range(scores.shape[1]):
            want = _many_boxes_oracle(method, offset, c)
            got = per_class(rows, sel, 0, c)
            assert got[0] == want[0], (method, offset, c)
            np.testing.assert_array_equal(got[1], want[1])


def test_selected_scores_can_rise_with_negative_scores():
    """The non-increasing order needs scores >= 0: a decay moves a negative score up towards 0."""
    boxes = np.array([[[0, 0, 10, 10], [0, 0, 10, 11]]], np.float32)  # IoU 10/11 > 0.3
    scores = np.array([[[-0.3, -0.5]]], np.float32)
    rows, sel = run_kernel(boxes, scores, 0, 0.3, -1.0)
    assert rows[:, 2].tolist() == [0, 1]
    assert sel[1] > sel[0]  # -0.5 * (1 - 10/11) = -0.045 > -0.3
    want = oracle(boxes[0], scores[0, 0], method="linear", sigma=0.5, iou=0.3, score_thr=-1.0, offset=0)
    assert per_class(rows, sel, 0, 0) == want


def test_tied_scores_follow_the_swap_order_not_the_index_order():
    """Five identical scores: after the first selection swaps row 3 into row 0's slot, the tie goes
    to the earlier row of the *working* order (the original loop), not to the lowest box index."""
    boxes = np.array([[[0, 0, 10, 10], [100, 0, 110, 10], [200, 0, 210, 10], [300, 0, 310, 10], [0, 0, 10, 10]]])
    scores = np.array([[[0.5, 0.5, 0.5, 0.9, 0.5]]], np.float32)
    rows, sel = run_kernel(boxes.astype(np.float32), scores, 0, 0.3, 0.001)
    # working order after selecting 3 (row 3 <-> row 0): [3, 1, 2, 0, 4]; box 4 (IoU 1 with box 0) is
    # never decayed by 3; next picks: 1, 2, 0 (decays 4 to 0 -> removed)
    want = oracle(
        boxes[0].astype(np.float32), scores[0, 0], method="linear", sigma=0.5, iou=0.3, score_thr=0.001, offset=0
    )
    assert want[0] == [3, 1, 2, 0]
    assert per_class(rows, sel, 0, 0) == want


def test_removal_moves_the_last_row_into_the_slot():
    """Rows that die are replaced by the last working row: the later tie-break sees that order."""
    # box 0 selected first; boxes 1, 2 overlap it fully (die under "hard"); 3, 4 tie at 0.5 elsewhere
    boxes = np.array([[[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10], [50, 50, 60, 60], [80, 80, 90, 90]]], np.float32)
    scores = np.array([[[0.9, 0.5, 0.5, 0.5, 0.5]]], np.float32)
    rows, sel = run_kernel(boxes, scores, 0, 0.5, 0.001, method="hard")
    # after box 0: row 1 dies -> row 4 moves in (working [0, 4, 2, 3]); row 2 dies -> row 3 moves in
    # -> working [0, 4, 3]: the tie between boxes 3 and 4 goes to 4
    assert rows[:, 2].tolist() == [0, 4, 3]
    want = oracle(boxes[0], scores[0, 0], method="hard", sigma=0.5, iou=0.5, score_thr=0.001, offset=0)
    assert per_class(rows, sel, 0, 0) == want


def test_nan_rule():
    """NaN scores are dropped up front, NaN boxes overlap nothing, inf * 0 (NaN) is dropped."""
    boxes = np.array([[[0, 0, 10, 10], [0, 0, 10, 10], [np.nan, 0, 10, 10], [0, 0, 10, 10], [1, 1, 9, 9]]], np.float32)
    scores = np.array([[[np.nan, np.inf, 0.7, 0.6, 0.5]]], np.float32)
    for method in ("linear", "gaussian", "hard"):
        rows, sel = run_kernel(boxes, scores, 0, 0.3, 0.001, method=method)
        idx = rows[:, 2].tolist()
        assert 0 not in idx  # NaN score: never selected
        assert idx[0] == 1 and sel[0] == np.inf  # +inf: selected first
        assert 2 in idx and sel[idx.index(2)] == np.float32(0.7)  # NaN box: never decayed
        if method == "hard":
            assert idx == [1, 2]  # boxes 3, 4 suppressed by box 1 (score 0 < 0.001)
        assert not np.isnan(sel).any()
    # inf * 0: an infinite score fully overlapped by another infinite box is NaN -> dropped
    rows, sel = run_kernel(boxes[:, :2], np.array([[[np.inf, np.inf]]], np.float32), 0, 0.3, 0.001, method="hard")
    assert rows[:, 2].tolist() == [0]
    ref_rows, ref_sel = conformance.run(OP, Sample("nan", (boxes, scores), {"method": "gaussian"}), "reference")
    got_rows, got_sel = run_kernel(boxes, scores, 0, 0.3, 0.001, method="gaussian")
    np.testing.assert_array_equal(got_rows, ref_rows)
    np.testing.assert_array_equal(got_sel, ref_sel)


def test_degenerate_boxes_have_iou_zero():
    boxes = np.array([[[5, 0, 5, 10], [5, 0, 5, 10], [0, 3, 10, 3], [0, 0, 10, 10]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7, 0.6]]], np.float32)
    rows, sel = run_kernel(boxes, scores, 0, 0.0, 0.001, method="hard")
    np.testing.assert_array_equal(rows[:, 2], [0, 1, 2, 3])  # nothing overlaps a zero-area box
    np.testing.assert_array_equal(sel, scores[0, 0])
    # with pixel-inclusive areas (offset 1) the same boxes are 1 px wide and all overlap box 0
    rows, _ = run_kernel(boxes, scores, 0, 0.0, 0.001, method="hard", offset=1)
    assert rows[:, 2].tolist() == [0]


@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 60),
    iou=st.sampled_from([0.3, 0.5, 0.7]),
    max_out=st.integers(0, 8),
)
@SETTINGS
def test_hard_equals_onnxruntime_nonmaxsuppression(seed, n, iou, max_out):
    """Tie-free scores: SoftNMS(method="hard") selects exactly what ai.onnx.NonMaxSuppression does."""
    from onnx import TensorProto, helper

    from softdeploy.runtime import Session

    rng = np.random.default_rng(seed)
    boxes = clustered_boxes(rng, n, clusters=max(1, n // 10))[None]
    scores = rng.permutation(np.arange(1, 2 * n + 1, dtype=np.float32) / (2 * n + 1))[: 2 * n].reshape(1, 2, n)
    score_thr = np.float32(1 / (4 * n + 2))  # between scores: ORT keeps score > thr, we keep score >= thr
    node = helper.make_node("NonMaxSuppression", ["B", "S", "M", "I", "T"], ["Y"])
    graph = helper.make_graph(
        [node],
        "nms",
        [
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [1, None, 4]),
            helper.make_tensor_value_info("S", TensorProto.FLOAT, [1, 2, None]),
            helper.make_tensor_value_info("M", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("I", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("T", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.INT64, [None, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    nms = Session(model, kernels="portable")  # stock onnxruntime
    # NonMaxSuppression: 0 means "no boxes"; SoftNMS: 0 means "no limit"
    ort_max = max_out if max_out > 0 else n
    (want,) = nms.run(
        {
            "B": boxes,
            "S": scores,
            "M": np.array([ort_max], np.int64),
            "I": np.array([iou], np.float32),
            "T": np.array([score_thr], np.float32),
        },
    )
    rows, sel = run_kernel(boxes, scores, max_out, iou, score_thr, method="hard")
    np.testing.assert_array_equal(rows, want)
    np.testing.assert_array_equal(sel, scores[0][rows[:, 1], rows[:, 2]])  # "hard" never decays


def test_float16_is_computed_in_float32():
    rng = np.random.default_rng(3)
    boxes = clustered_boxes(rng, 40, clusters=2, integer=True)[None].astype(np.float16)
    scores = rng.uniform(0, 1, (1, 2, 40)).astype(np.float16)
    rows, sel = run_kernel(boxes, scores, method="gaussian")
    assert sel.dtype == np.float16
    rows32, sel32 = run_kernel(boxes.astype(np.float32), scores.astype(np.float32), method="gaussian")
    np.testing.assert_array_equal(rows, rows32)
    np.testing.assert_array_equal(sel, sel32.astype(np.float16))


def test_torch_export_runs_with_kernel_and_function_body():
    import torch

    from softdeploy.export.torch_export import export_module
    from softdeploy.ops._torch import torch_op
    from softdeploy.runtime import Session

    soft_nms = torch_op(OP)

    class Detector(torch.nn.Module):
        def forward(self, boxes, scores):
            keep, kept_scores = soft_nms(boxes, scores, None, torch.tensor([0.4]), None, method="gaussian", sigma=0.5)
            return keep, kept_scores * 2

    rng = np.random.default_rng(0)
    boxes = clustered_boxes(rng, 50)[None]
    scores = rng.uniform(0, 1, (1, 3, 50)).astype(np.float32)
    model = export_module(Detector().eval(), (torch.from_numpy(boxes), torch.from_numpy(scores)))
    nodes = [n for n in model.graph.node if n.domain == "com.softdeploy"]
    assert [n.op_type for n in nodes] == ["SoftNMS"]
    assert any(f.name == "SoftNMS" for f in model.functions)
    want_rows, want_scores = OP.reference(boxes, scores, None, np.array([0.4], np.float32), method="gaussian")
    for kernels in ("native", "portable"):
        got_rows, got_scores = Session(model, kernels=kernels).run(
            {n: v for n, v in zip([i.name for i in model.graph.input], (boxes, scores), strict=True)}
        )
        np.testing.assert_array_equal(got_rows, want_rows)
        np.testing.assert_allclose(got_scores, want_scores * 2, rtol=1e-6)
    # the exported graph is shape-polymorphic in the number of selections (a new dynamic size)
    out_dim = model.graph.output[0].type.tensor_type.shape.dim[0]
    assert out_dim.dim_param and not out_dim.HasField("dim_value")


def test_no_boxes_in_a_huge_batch_returns_at_once():
    """Boxes [2^40, 0, 4] holds no data: every backend returns empty outputs at once instead of visiting
    2^40 (batch, class) pairs (~13 h in the kernel). Run in a child process, so that a regression fails
    on the timeout instead of hanging the suite."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import numpy as np
        from softdeploy import conformance
        from softdeploy.ops import REGISTRY, Sample
        op = REGISTRY["SoftNMS"]
        huge = 2**40
        sample = Sample("t", (np.zeros((huge, 0, 4), np.float32), np.zeros((huge, 3, 0), np.float32)))
        runs = [("reference", None), ("function", None), ("torch", None)]
        runs += [("kernel", isa) for isa in conformance.available_isas()]
        for backend, isa in runs:
            rows, scores = conformance.run(op, sample, backend, isa=isa)
            assert rows.shape == (0, 3) and rows.dtype == np.int64, (backend, isa, rows.shape, rows.dtype)
            assert scores.shape == (0,) and scores.dtype == np.float32, (backend, isa, scores.shape)
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
