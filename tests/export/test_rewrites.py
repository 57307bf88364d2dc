"""softdeploy optimize on ONNX models built by hand with onnx.helper (not exported by softdeploy):
each rule fires where it is safe, reports why where it is not, and the result agrees with the original."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from softdeploy import DOMAIN, ExportError
from softdeploy.export.rewrites import DEFAULT_RULES, optimize
from softdeploy.export.rewrites.two_pass_softmax import MIN_ROW_LENGTH
from softdeploy.runtime import Session

F = TensorProto.FLOAT


def make_model(nodes, inputs, outputs, opset, initializers=()):
    graph = helper.make_graph(nodes, "hand_built", inputs, outputs, initializer=list(initializers))
    # Output shapes are left out on purpose (as many hand-written models do); optimize() must cope.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def tensor(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def custom_ops(model):
    return sorted(n.op_type for n in model.graph.node if n.domain == DOMAIN)


def reasons(result, rule):
    return [r.reason for r in next(x for x in result.rules if x.name == rule).rejected]


# ---- Softmax -> TopK ---------------------------------------------------------------------------


def softmax_topk_model(opset=18, sm_axis=-1, tk_axis=-1, largest=1, sorted_=1, k=5, k_const=True, extra_use=False):
    nodes = [
        helper.make_node("Softmax", ["X"], ["P"], axis=sm_axis),
        helper.make_node("TopK", ["P", "K"], ["V", "I"], axis=tk_axis, largest=largest, sorted=sorted_),
    ]
    outputs = [tensor("V", F, None), tensor("I", TensorProto.INT64, None)]
    if extra_use:
        nodes.append(helper.make_node("Neg", ["P"], ["NP"]))
        outputs.append(tensor("NP", F, None))
    inputs = [tensor("X", F, ["B", 200])]
    inits = [ints("K", [k])] if k_const else []
    if not k_const:
        inputs.append(tensor("K", TensorProto.INT64, [1]))
    return make_model(nodes, inputs, outputs, opset, inits)


@pytest.mark.parametrize("opset", [17, 18, 20])
def test_softmax_topk_fires_and_agrees(opset):
    result = optimize(softmax_topk_model(opset), dims={"B": 4})
    assert result.counts["softmax-topk"] == 1
    assert custom_ops(result.model) == ["SoftmaxTopK"]
    node = next(n for n in result.model.graph.node if n.op_type == "SoftmaxTopK")
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["k"] == 5
    assert [f.name for f in result.model.functions] == ["SoftmaxTopK"]
    assert result.ok and {v.backend for v in result.verification} == {"native", "portable"}
    onnx.checker.check_model(result.model, full_check=True)


def test_softmax_topk_rewrite_equals_the_original_on_ties_and_masks():
    model = softmax_topk_model(18, k=3)
    x = np.zeros((3, 200), np.float32)
    x[1, ::7] = 2.0  # ties: lower index first in both
    x[2, :150] = -np.inf
    x[2, 150:] = np.arange(50, dtype=np.float32)
    result = optimize(model, feeds={"X": x})
    assert result.counts["softmax-topk"] == 1
    want = Session(model, kernels="portable").run({"X": x})
    got = Session(result.model, kernels="native").run({"X": x})
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"sm_axis": 0, "tk_axis": -1}, "Softmax axis 0 and TopK axis -1 differ"),
        ({"largest": 0}, "largest=0"),
        ({"sorted_": 0}, "sorted=0"),
        ({"k_const": False}, "K is not a constant"),
        ({"k": 300}, "K=300 exceeds the axis length 200"),
        ({"extra_use": True}, "also used elsewhere"),
    ],
)
def test_softmax_topk_reports_why_it_did_not_fire(kwargs, reason):
    model = softmax_topk_model(18, **kwargs)
    feeds = {"X": np.random.default_rng(0).standard_normal((2, 200)).astype(np.float32)}
    if not kwargs.get("k_const", True):
        feeds["K"] = np.array([4], np.int64)
    verify = kwargs.get("k", 5) <= 200  # TopK itself refuses k > n at run time
    result = optimize(model, feeds=feeds, verify=verify)
    assert result.counts["softmax-topk"] == 0
    assert custom_ops(result.model) == []
    assert any(reason in r for r in reasons(result, "softmax-topk")), reasons(result, "softmax-topk")


def test_double_softmax_is_not_rewritten():
    nodes = [helper.make_node("Softmax", ["X"], ["P"]), helper.make_node("TopK", ["P", "K"], ["V", "I"])]
    model = make_model(
        nodes,
        [tensor("X", TensorProto.DOUBLE, [2, 10])],
        [tensor("V", TensorProto.DOUBLE, None), tensor("I", TensorProto.INT64, None)],
        18,
        [ints("K", [2])],
    )
    result = optimize(model)
    assert result.counts["softmax-topk"] == 0
    assert "input dtype float64" in reasons(result, "softmax-topk")[0]


# ---- MatMul -> ReduceMax -> ReduceSum ----------------------------------------------------------


def maxsim_peer_model(opset=18, keepdims=0, max_axis=1, transpose=True):
    """shared/notes/perf/maxsim.py's ORT peer: Q [Lq, dim], D [N, Ld, dim] -> [N]."""
    nodes = []
    qt = "Q"
    if transpose:
        nodes.append(helper.make_node("Transpose", ["Q"], ["QT"], perm=[1, 0]))
        qt = "QT"
        q_shape = [8, 16]
    else:
        q_shape = [16, 8]  # already [dim, Lq]
    nodes.append(helper.make_node("MatMul", ["D", qt], ["M"]))
    inits = []
    if opset >= 18:
        nodes.append(helper.make_node("ReduceMax", ["M", "AXM"], ["R"], keepdims=keepdims))
        inits.append(ints("AXM", [max_axis]))
    else:
        nodes.append(helper.make_node("ReduceMax", ["M"], ["R"], axes=[max_axis], keepdims=keepdims))
    nodes.append(helper.make_node("ReduceSum", ["R", "AXS"], ["S"], keepdims=keepdims))
    inits.append(ints("AXS", [1 if keepdims == 0 else 2]))
    return make_model(
        nodes, [tensor("Q", F, q_shape), tensor("D", F, ["N", 12, 16])], [tensor("S", F, None)], opset, inits
    )


@pytest.mark.parametrize("opset", [17, 18, 20])
def test_maxsim_fires_on_the_peer_layout(opset):
    result = optimize(maxsim_peer_model(opset), dims={"N": 5})
    assert result.counts["maxsim"] == 1
    assert custom_ops(result.model) == ["MaxSim"]
    assert not any(n.op_type in ("MatMul", "ReduceMax", "Transpose") for n in result.model.graph.node)
    assert result.ok


def test_maxsim_inserts_a_transpose_when_none_is_there():
    result = optimize(maxsim_peer_model(transpose=False), dims={"N": 4})
    assert result.counts["maxsim"] == 1
    assert any(n.op_type == "Transpose" for n in result.model.graph.node)


def _matmul_reduce(a_shape, b_shape, max_axis, sum_axis, opset=18):
    nodes = [
        helper.make_node("MatMul", ["A", "B"], ["M"]),
        helper.make_node("ReduceMax", ["M", "AXM"], ["R"], keepdims=0),
        helper.make_node("ReduceSum", ["R", "AXS"], ["S"], keepdims=0),
    ]
    return make_model(
        nodes,
        [tensor("A", F, a_shape), tensor("B", F, b_shape)],
        [tensor("S", F, None)],
        opset,
        [ints("AXM", [max_axis]), ints("AXS", [sum_axis])],
    )


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "max_axis", "sum_axis"),
    [
        ([6, 16], [3, 16, 9], -1, -1),  # query [Lq, dim] @ documents^T [N, dim, Ld] -> [N]
        ([4, 6, 16], [16, 9], -1, -1),  # queries [B, Lq, dim] @ one document^T -> [B]
        ([6, 16], [16, 9], 1, 0),  # one against one -> scalar
        ([4, 1, 6, 16], [3, 16, 9], -1, -1),  # all pairs -> [B, N]
    ],
)
def test_maxsim_layouts(a_shape, b_shape, max_axis, sum_axis):
    result = optimize(_matmul_reduce(a_shape, b_shape, max_axis, sum_axis))
    assert result.counts["maxsim"] == 1, result.to_text()
    assert result.ok


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "max_axis", "sum_axis", "reason"),
    [
        ([4, 6, 16], [4, 16, 9], -1, -1, "diagonal"),
        ([4, 6, 16], [4, 16, 9], 0, -1, "not a token axis"),
        ([6, 16], [3, 16, 9], -1, 0, "not the remaining token axis"),
    ],
)
def test_maxsim_reports_why_it_did_not_fire(a_shape, b_shape, max_axis, sum_axis, reason):
    result = optimize(_matmul_reduce(a_shape, b_shape, max_axis, sum_axis))
    assert result.counts["maxsim"] == 0
    assert any(reason in r for r in reasons(result, "maxsim")), reasons(result, "maxsim")


def test_maxsim_keepdims_is_reported():
    result = optimize(maxsim_peer_model(keepdims=1), dims={"N": 3})
    assert result.counts["maxsim"] == 0
    assert "keepdims=1" in reasons(result, "maxsim")[0]


# ---- Softmax => TwoPassSoftmax -----------------------------------------------------------------


LONG = MIN_ROW_LENGTH  # the shortest row the rule rewrites by default


def softmax_model(n, axis=-1, opset=18):
    nodes = [helper.make_node("Softmax", ["X"], ["P"], axis=axis)]
    return make_model(nodes, [tensor("X", F, ["B", n])], [tensor("P", F, None)], opset)


def test_two_pass_softmax_is_on_by_default_and_can_be_turned_off():
    assert "two-pass-softmax" in DEFAULT_RULES
    assert optimize(softmax_model(LONG)).counts["two-pass-softmax"] == 1
    result = optimize(softmax_model(LONG), rules=["softmax-topk"])
    assert "two-pass-softmax" not in result.counts
    assert custom_ops(result.model) == []


@pytest.mark.parametrize("opset", [17, 18, 20])
def test_two_pass_softmax_on_long_last_axis_rows(opset):
    result = optimize(softmax_model(LONG, opset=opset), rules=["two-pass-softmax"])
    assert result.counts["two-pass-softmax"] == 1
    assert custom_ops(result.model) == ["TwoPassSoftmax"]
    assert result.ok


@pytest.mark.parametrize(
    ("n", "axis", "reason"),
    [
        (100, -1, f"row length 100 < min_row_length {MIN_ROW_LENGTH}"),
        (LONG, 0, "not the last axis"),
        ("N", -1, "not static"),
    ],
)
def test_two_pass_softmax_reports_why_it_did_not_fire(n, axis, reason):
    result = optimize(softmax_model(n, axis), rules=["two-pass-softmax"])
    assert result.counts["two-pass-softmax"] == 0
    assert any(reason in r for r in reasons(result, "two-pass-softmax")), reasons(result, "two-pass-softmax")


def test_softmax_feeding_topk_goes_to_softmax_topk_first():
    result = optimize(softmax_topk_model(18), rules=["two-pass-softmax", "softmax-topk"], two_pass_min_row=1)
    assert result.counts == {"softmax-topk": 1, "two-pass-softmax": 0}


# ---- NonMaxSuppression => SoftNMS --------------------------------------------------------------


def nms_model(max_out=3, iou=0.5, score=0.1, center_point_box=0, opset=18):
    names = ["boxes", "scores"]
    inits = []
    for name, value, dtype in (("max_out", max_out, np.int64), ("iou", iou, np.float32), ("score", score, np.float32)):
        if value is None:
            names.append("")
        else:
            names.append(name)
            inits.append(numpy_helper.from_array(np.array([value], dtype), name))
    while names[-1] == "":
        names.pop()
    node = helper.make_node("NonMaxSuppression", names, ["selected"], center_point_box=center_point_box)
    return make_model(
        [node],
        [tensor("boxes", F, [2, 40, 4]), tensor("scores", F, [2, 3, 40])],
        [tensor("selected", TensorProto.INT64, None)],
        opset,
        inits,
    )


def nms_feeds(seed=0):
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 10, (2, 40, 2)).astype(np.float32)
    size = rng.uniform(1, 4, (2, 40, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + size], axis=-1)  # [y1, x1, y2, x2]
    scores = rng.permutation(2 * 3 * 40).reshape(2, 3, 40).astype(np.float32) / 240  # distinct
    return {"boxes": boxes, "scores": scores}


def test_nms_is_rewritten_only_on_request():
    assert "nms-to-softnms" not in DEFAULT_RULES
    result = optimize(nms_model(), feeds=nms_feeds())
    assert custom_ops(result.model) == []
    result = optimize(nms_model(), nms_to_softnms=True, feeds=nms_feeds())
    assert result.counts["nms-to-softnms"] == 1 and custom_ops(result.model) == ["SoftNMS"]


@pytest.mark.parametrize("opset", [17, 18, 20])
@pytest.mark.parametrize(("max_out", "iou", "score"), [(3, 0.5, 0.1), (100, 0.3, 0.0), (5, None, 0.2)])
def test_nms_to_hard_softnms_reproduces_nms(opset, max_out, iou, score):
    model = nms_model(max_out, iou, score, opset=opset)
    feeds = nms_feeds()
    result = optimize(model, rules=["nms-to-softnms"], feeds=feeds)
    assert result.counts == {"nms-to-softnms": 1}
    assert custom_ops(result.model) == ["SoftNMS"]
    want = Session(model, kernels="portable").run(feeds)[0]
    for backend in ("native", "portable"):
        got = Session(result.model, kernels=backend).run(feeds)[0]
        np.testing.assert_array_equal(got, want)


def test_nms_score_threshold_is_strict_after_the_rewrite():
    feeds = nms_feeds(1)
    feeds["scores"][0, 0, :5] = 0.25  # exactly at the threshold: NonMaxSuppression drops them
    model = nms_model(10, 0.5, 0.25)
    result = optimize(model, rules=["nms-to-softnms"], feeds=feeds)
    got = Session(result.model, kernels="native").run(feeds)[0]
    np.testing.assert_array_equal(got, Session(model, kernels="portable").run(feeds)[0])


def test_nms_center_point_box_is_kept():
    feeds = nms_feeds(2)
    b = feeds["boxes"]
    feeds["boxes"] = np.concatenate([(b[..., :2] + b[..., 2:]) / 2, b[..., 2:] - b[..., :2]], axis=-1)[
        ..., [1, 0, 3, 2]
    ]
    model = nms_model(4, 0.4, 0.05, center_point_box=1)
    result = optimize(model, rules=["nms-to-softnms"], feeds=feeds)
    assert result.counts["nms-to-softnms"] == 1


def test_nms_max_output_zero_means_no_output():
    for max_out in (0, None):
        model = nms_model(max_out, 0.5, 0.1)
        result = optimize(model, rules=["nms-to-softnms"], feeds=nms_feeds())
        assert result.counts["nms-to-softnms"] == 1
        (got,) = Session(result.model, kernels="native").run(nms_feeds())
        assert got.shape == (0, 3) and got.dtype == np.int64


@pytest.mark.parametrize(("score", "reason"), [(None, "no score_threshold"), (-0.5, "< 0")])
def test_nms_without_an_exact_translation_is_reported(score, reason):
    result = optimize(nms_model(3, 0.5, score), rules=["nms-to-softnms"], feeds=nms_feeds())
    assert result.counts["nms-to-softnms"] == 0
    assert any(reason in r for r in reasons(result, "nms-to-softnms"))


def nms_model_with_inputs(dynamic=("max_out", "iou", "score"), max_out=3, iou=0.5, score=0.1):
    """NonMaxSuppression whose ``dynamic`` settings are graph inputs ([1]) and the others initializers."""
    inputs = [tensor("boxes", F, [2, 40, 4]), tensor("scores", F, [2, 3, 40])]
    inits = []
    for name, value, elem, dtype in (
        ("max_out", max_out, TensorProto.INT64, np.int64),
        ("iou", iou, F, np.float32),
        ("score", score, F, np.float32),
    ):
        if name in dynamic:
            inputs.append(tensor(name, elem, [1]))
        else:
            inits.append(numpy_helper.from_array(np.array([value], dtype), name))
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score"], ["selected"])
    return make_model([node], inputs, [tensor("selected", TensorProto.INT64, None)], 18, inits)


def test_optimize_verifies_nms_with_threshold_inputs_on_valid_random_feeds():
    # Standard-normal thresholds made onnxruntime refuse the original ("iou_threshold must be in range [0, 1]").
    result = optimize(nms_model_with_inputs())  # default rules: nothing rewritten, verified on random feeds
    assert result.verification and result.ok
    from softdeploy.export.rewrites.pipeline import random_feeds

    feeds = random_feeds(nms_model_with_inputs())
    boxes = feeds["boxes"]
    assert (boxes[..., 2:] > boxes[..., :2]).all()  # corner boxes of positive size
    assert 0 <= feeds["iou"][0] <= 1 and 0 <= feeds["score"][0] < 1 and feeds["max_out"][0] > 0
    assert ((feeds["scores"] >= 0) & (feeds["scores"] < 1)).all()


def test_optimize_says_that_feeds_are_needed_when_random_ones_are_not_valid():
    # The threshold reaches NonMaxSuppression through an Identity: its meaning is not known, so the
    # random value is out of range; the error says what to do instead of onnxruntime's message alone.
    model = nms_model_with_inputs(("iou",))
    model.graph.node[0].input[3] = "iou_copy"
    model.graph.node.insert(0, helper.make_node("Identity", ["iou"], ["iou_copy"]))
    with pytest.raises(ExportError, match=r"fails on random inputs .*iou_threshold.*pass --feeds inputs.npz"):
        optimize(model)


@pytest.mark.parametrize(
    "dynamic", [("max_out",), ("iou",), ("score",), ("max_out", "iou", "score")], ids=lambda d: "+".join(d)
)
def test_nms_to_softnms_takes_settings_that_are_graph_inputs(dynamic):
    model = nms_model_with_inputs(dynamic)
    result = optimize(model, rules=["nms-to-softnms"], feeds={**nms_feeds(), **_settings(3, 0.5, 0.1, dynamic)})
    assert result.counts == {"nms-to-softnms": 1}, result.to_text()
    assert "SoftNMS" in str(result.model.graph)  # in the graph, or in the If's branch
    sessions = {k: Session(result.model, kernels=k) for k in ("native", "portable")}
    original = Session(model, kernels="portable")
    # Every run-time value class: no output (max <= 0), a limit, no limit; thresholds at the edges;
    # a negative score threshold (run by the original op in the If's else branch); boxes tied at t.
    for max_out in (-1, 0, 1, 100):
        for iou in (0.0, 0.3, 1.0):
            for score in (-0.5, 0.0, 0.25, 0.6):
                feeds = nms_feeds(max_out % 3)
                feeds["scores"][0, 0, :5] = 0.25  # exactly t for score=0.25: NonMaxSuppression drops them
                feeds.update(_settings(max_out, iou, score, dynamic))
                want = original.run(feeds)[0]
                for backend, session in sessions.items():
                    got = session.run(feeds)[0]
                    threshold = score if "score" in dynamic else 0.1
                    if max_out == 100 and threshold < 0.25:  # ties among candidates: the set is exact, not the order
                        got, want = np.unique(got, axis=0), np.unique(want, axis=0)
                    np.testing.assert_array_equal(got, want, err_msg=f"{backend} {max_out=} {iou=} {score=}")


def _settings(max_out, iou, score, dynamic):
    values = {
        "max_out": np.array([max_out], np.int64),
        "iou": np.array([iou], np.float32),
        "score": np.array([score], np.float32),
    }
    return {k: v for k, v in values.items() if k in dynamic}


def test_an_unknown_dim_name_is_refused_naming_the_known_ones():
    from softdeploy import ArgumentError

    with pytest.raises(ArgumentError, match=r"--dim \['b'\]: not a symbolic dimension .* they are \['B'\]"):
        optimize(softmax_topk_model(18), dims={"b": 3})


# ---- pipeline ----------------------------------------------------------------------------------


def test_unknown_rule_is_an_error():
    with pytest.raises(ExportError, match="unknown rewrite rule"):
        optimize(softmax_model(10), rules=["fuse-everything"])


def test_function_bodies_are_not_rewritten():
    once = optimize(softmax_model(LONG), rules=["two-pass-softmax"]).model
    again = optimize(once, rules=["two-pass-softmax"])
    assert again.counts["two-pass-softmax"] == 0
    assert reasons(again, "two-pass-softmax") == []


def test_cli_optimize_reports_and_refuses_to_overwrite(tmp_path, run_cli):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(softmax_topk_model(18), src)
    cmd = ["optimize", str(src), str(dst), "--dim", "B=3"]
    out = run_cli(*cmd)
    assert out.returncode == 0, out.stderr
    assert "softmax-topk" in out.stdout and "agrees" in out.stdout
    assert custom_ops(onnx.load(dst)) == ["SoftmaxTopK"]
    again = run_cli(*cmd)
    assert again.returncode == 2 and "--overwrite" in again.stderr


# ---- MatMul -> (Mul/Div) -> (Add) -> Softpick -> MatMul ------------------------------------------


def softpick_attention_model(
    scale_op="Mul", mask=True, transpose=True, rank4=True, extra_use=False, axis=-1, scale=8**-0.5, mask_shape=None
):
    """Softpick attention written out: Q [B, 4, 5, 8], K [B, 4, 7, 8] (rank 3: [N, T, 8]), V like K."""
    shp = (lambda t: ["B", 4, t, 8]) if rank4 else (lambda t: ["N", t, 8])
    perm = [0, 1, 3, 2] if rank4 else [0, 2, 1]
    nodes, inits = [], []
    if transpose:
        nodes.append(helper.make_node("Transpose", ["K"], ["Kt"], perm=perm))
    nodes.append(helper.make_node("MatMul", ["Q", "Kt" if transpose else "K"], ["S"]))
    cur = "S"
    if scale_op:
        c = scale if scale_op == "Mul" else 1 / scale
        inits.append(numpy_helper.from_array(np.array(c, np.float32), "c"))
        nodes.append(helper.make_node(scale_op, [cur, "c"], ["S2"]))
        cur = "S2"
    if mask:
        nodes.append(helper.make_node("Add", ["M", cur], ["S3"]))
        cur = "S3"
    nodes.append(helper.make_node("Softpick", [cur], ["W"], domain=DOMAIN, axis=axis, eps=1e-6))
    nodes.append(helper.make_node("MatMul", ["W", "V"], ["O"]))
    k_shape = shp(7) if transpose else (["B", 4, 8, 7] if rank4 else ["N", 8, 7])
    inputs = [tensor("Q", F, shp(5)), tensor("K", F, k_shape), tensor("V", F, shp(7))]
    if mask:
        inputs.append(tensor("M", F, mask_shape or (["B", 1, 1, 7] if rank4 else [1, 7])))
    outputs = [tensor("O", F, None)] + ([tensor("W", F, None)] if extra_use else [])
    graph = helper.make_graph(nodes, "softpick_attention", inputs, outputs, initializer=inits)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"scale_op": "Div"}, {"scale_op": None, "mask": False}, {"rank4": False}, {"transpose": False}],
    ids=["mul_mask", "div_mask", "plain", "rank3", "no_transpose"],
)
def test_softpick_attention_fires_and_agrees(kwargs):
    dims = {"B": 2} if kwargs.get("rank4", True) else {"N": 3}
    result = optimize(softpick_attention_model(**kwargs), dims=dims)
    assert result.counts["softpick-attention"] == 1
    assert custom_ops(result.model) == ["SoftpickAttention"]
    node = next(n for n in result.model.graph.node if n.op_type == "SoftpickAttention")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["scale"] == pytest.approx(8**-0.5 if kwargs.get("scale_op", "Mul") else 1.0, rel=1e-6)
    assert attrs["causal"] == 0 and attrs["eps"] == pytest.approx(1e-6)
    # the mask is the Add's other input; an omitted one gets attach_function_bodies' zero fill (the kernel drops it)
    assert (node.input[3] == "M") == kwargs.get("mask", True)
    if kwargs.get("transpose", True):  # the Transpose that made Kt is folded away
        assert "Transpose" not in [n.op_type for n in result.model.graph.node]
    assert result.ok and {v.backend for v in result.verification} == {"native", "portable"}
    onnx.checker.check_model(result.model, full_check=True)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"extra_use": True}, "Softpick weights are also used elsewhere"),
        ({"axis": 2}, "Softpick over axis 2, not the last"),
        ({"scale": 0.0}, "must be finite and non-zero"),
        ({"mask_shape": [2, "B", 4, 5, 7]}, "mask rank 5 above the scores' 4"),
    ],
)
def test_softpick_attention_reports_why_it_did_not_fire(kwargs, reason):
    model = softpick_attention_model(**kwargs)
    result = optimize(model, dims={"B": 2}, verify=False)
    assert result.counts["softpick-attention"] == 0
    assert any(reason in r for r in reasons(result, "softpick-attention")), reasons(result, "softpick-attention")


def test_softpick_attention_ignores_other_matmuls():
    """A plain MatMul (a Linear layer) is no candidate: nothing is reported for it."""
    nodes = [helper.make_node("MatMul", ["X", "Wt"], ["Y"])]
    inits = [numpy_helper.from_array(np.ones((8, 3), np.float32), "Wt")]
    model = make_model(nodes, [tensor("X", F, ["B", 8])], [tensor("Y", F, None)], 18, inits)
    result = optimize(model, dims={"B": 2})
    assert result.counts["softpick-attention"] == 0 and reasons(result, "softpick-attention") == []


# ---- the softpick authors' expression ---------------------------------------------------------


def authors_softpick_nodes(x, out, eps=True, where=True, sum_axis=-1):
    """``softpick`` of zaydzuhri/softpick-attention as torch.onnx (dynamo) exports it."""
    nodes = [
        helper.make_node("ReduceMax", [x, "ax"], ["m"], keepdims=1),
        helper.make_node("Neg", ["m"], ["nm"]),
        helper.make_node("Exp", ["nm"], ["enm"]),
        helper.make_node("Sub", [x, "m"], ["xm"]),
        helper.make_node("Exp", ["xm"], ["exm"]),
        helper.make_node("Sub", ["exm", "enm"], ["e"]),
        helper.make_node("Relu", ["e"], ["r"]),
        helper.make_node("IsInf", [x], ["inf"]),
        helper.make_node("Not", ["inf"], ["ninf"]),
        helper.make_node("IsNaN", [x], ["nan"]),
        helper.make_node("Not", ["nan"], ["nnan"]),
        helper.make_node("And", ["ninf", "nnan"], ["fin"]),
        helper.make_node("Abs", ["e"], ["a"]),
    ]
    if where:
        nodes.append(helper.make_node("Where", ["fin", "a", "zero"], ["wa"]))
    nodes.append(helper.make_node("ReduceSum", ["wa" if where else "a", "sax"], ["tot"], keepdims=1))
    if eps:
        nodes.append(helper.make_node("Add", ["tot", "eps"], ["den"]))
    nodes.append(helper.make_node("Div", ["r", "den" if eps else "tot"], [out]))
    inits = [
        ints("ax", [-1]),
        ints("sax", [sum_axis]),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
    ]
    return nodes, inits


@pytest.mark.parametrize("eps", [True, False])
def test_authors_softpick_becomes_softpick(eps):
    nodes, inits = authors_softpick_nodes("X", "Y", eps=eps)
    model = make_model(nodes, [tensor("X", F, ["B", 40])], [tensor("Y", F, None)], 18, inits)
    x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
    x[0, :5] = -np.inf  # masked entries: left out of the denominator on both sides
    result = optimize(model, feeds={"X": x})
    assert result.counts["softpick"] == 1 and custom_ops(result.model) == ["Softpick"]
    node = next(n for n in result.model.graph.node if n.op_type == "Softpick")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["axis"] == 1 and attrs["eps"] == pytest.approx(1e-6 if eps else 0.0)
    assert result.ok


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"sum_axis": 0}, "ReduceMax over axis -1 but ReduceSum over axis 0"),
        ({"where": False, "sum_axis": 0}, "ReduceMax over axis -1 but ReduceSum over axis 0"),
    ],
)
def test_authors_softpick_reports_why_it_did_not_fire(kwargs, reason):
    nodes, inits = authors_softpick_nodes("X", "Y", **kwargs)
    model = make_model(nodes, [tensor("X", F, [4, 40])], [tensor("Y", F, None)], 18, inits)
    result = optimize(model, verify=False)
    assert result.counts["softpick"] == 0
    assert any(reason in r for r in reasons(result, "softpick")), reasons(result, "softpick")


@pytest.mark.parametrize("eps", [True, False])
def test_paper_softpick_becomes_softpick_with_masked_entries_as_the_formula_counts_them(eps):
    """The paper's formula (a plain Abs sum): a -inf entry adds exp(-m) to the sum, as the formula says."""
    nodes, inits = authors_softpick_nodes("X", "Y", eps=eps, where=False)
    model = make_model(nodes, [tensor("X", F, ["B", 40])], [tensor("Y", F, None)], 18, inits)
    x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
    x[0, :5] = -np.inf
    result = optimize(model, feeds={"X": x})
    assert result.counts["softpick"] == 1 and custom_ops(result.model) == ["Softpick"]
    assert result.ok
    want = Session(model, kernels="portable").run({"X": x})[0]
    got = Session(result.model, kernels="native").run({"X": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    with np.errstate(divide="ignore"):  # the masked row's sum holds 5 x exp(-m) beside the finite entries'
        m = x[0].max()
        e = np.exp(x[0].astype(np.float64) - m) - np.exp(-m)
    np.testing.assert_allclose(got[0], np.maximum(e, 0) / (np.abs(e).sum() + (1e-6 if eps else 0)), rtol=1e-5)


def test_naive_softpick_attn_becomes_one_softpick_attention():
    """naive_softpick_attn (head_first, causal: masked_fill of tril == 0 with -inf) as exported: the softpick rule,
    then softpick-attention with the masked_fill as an additive mask; nothing of the scores is left."""
    t = 6
    tril = np.tril(np.ones((t, t), np.float32))
    nodes = [
        helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["Q", "Kt"], ["S"]),
        helper.make_node("Mul", ["S", "c"], ["S2"]),
        helper.make_node("Equal", ["tril", "zerof"], ["hide"]),
        helper.make_node("Where", ["hide", "minus_inf", "S2"], ["S3"]),
    ]
    sp, sp_inits = authors_softpick_nodes("S3", "W")
    nodes += [*sp, helper.make_node("MatMul", ["W", "V"], ["O"])]
    inits = [
        *sp_inits,
        numpy_helper.from_array(np.array(8 ** (-0.5), np.float32), "c"),
        numpy_helper.from_array(tril, "tril"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zerof"),
        numpy_helper.from_array(np.array(-np.inf, np.float32), "minus_inf"),
    ]
    inputs = [tensor(n, F, ["B", 2, t, 8]) for n in ("Q", "K", "V")]
    model = make_model(nodes, inputs, [tensor("O", F, None)], 18, inits)
    result = optimize(model, dims={"B": 2})
    assert result.counts["softpick"] == 1 and result.counts["softpick-attention"] == 1
    assert custom_ops(result.model) == ["SoftpickAttention"]
    ops = [n.op_type for n in result.model.graph.node]
    assert "MatMul" not in ops and "Mul" not in ops and "Transpose" not in ops  # the scores are gone
    assert result.ok
