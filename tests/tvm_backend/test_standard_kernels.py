"""Standard ops that the TVM backend schedules by hand: MatMul (+ its bias and residual adds) through the
"MatMul" rule (softdeploy/tvm/ops/matmul.py), and ai.onnx Softmax over the last axis imported as
TwoPassSoftmax's compute (softdeploy/tvm/frontend.py). Each: the kernel gets its hand schedule (which a
value test alone would not notice: dlight's default computes the same values 40-90x slower), the
values match a float64 NumPy reference and onnxruntime, and the shapes the rule is not for keep the
stock path. The shipped tuning records are left out (they would schedule the kernels first)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("tvm", reason="the TVM backend is optional: pip install 'softdeploy[tvm]'")

from onnx import TensorProto, helper

from softdeploy.runtime import Session
from softdeploy.tvm.build import build
from softdeploy.tvm.errors import ScheduleWarning
from softdeploy.tvm.frontend import import_model, prepare

pytestmark = pytest.mark.tvm  # for `-m` selection; without the `tvm` extra the module skips at import


def _model(nodes, inputs, outputs, initializers=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _value(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _const(name, array):
    return helper.make_tensor(name, TensorProto.FLOAT, list(array.shape), array.astype(np.float32).ravel())


def _run_tvm(model, feeds):
    """(outputs, build report) of a build without the shipped records (hand schedules and dlight only)."""
    from tvm import relax

    from softdeploy.tvm.target import import_tvm

    tvm = import_tvm()
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleWarning)  # no hand rule may raise on the way
        executable, report = build(import_model(prepare(model, shapes)), shipped_records=False)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[k], tvm.cpu()) for k in shapes])
    return [out.numpy()], report  # every model here has one output


def _projection(m, k, n, *, batch=(), residual=False, seed=0):
    """(model, feeds, float64 reference) of y = x @ w + b (+ x when residual), x [*batch, m, k]."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*batch, m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32) / np.sqrt(k)
    b = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"])]
    ref = x.astype(np.float64) @ w.astype(np.float64) + b
    if residual:
        nodes.append(helper.make_node("Add", ["hb", "x"], ["y"]))
        ref = ref + x
    else:
        nodes.append(helper.make_node("Identity", ["hb"], ["y"]))
    model = _model(nodes, [_value("x", x.shape)], [_value("y", ref.shape)], [_const("w", w), _const("b", b)])
    return model, {"x": x}, ref


@pytest.mark.parametrize(
    ("m", "k", "n", "batch", "residual"),
    [
        (128, 384, 384, (1,), True),  # MiniLM's output projection and residual
        (13, 40, 32, (), False),  # rows not a multiple of the 6-row tile: a partial last tile
        (2, 7, 16, (), False),  # two rows (a partial tile), one column tile
        (7, 24, 48, (2, 3), False),  # batched activations
    ],
)
def test_matmul_gets_the_hand_schedule_and_matches_the_reference(m, k, n, batch, residual):
    model, feeds, ref = _projection(m, k, n, batch=batch, residual=residual)
    (got,), report = _run_tvm(model, feeds)
    gemm = [name for name in report.schedules if "matmul" in name]
    assert gemm and all(report.schedules[name] == "hand (MatMul)" for name in gemm), report.summary()
    # float32 sums of k products of magnitude ~1: rounding grows ~ sqrt(k) * eps
    atol = 8 * np.sqrt(k) * np.finfo(np.float32).eps * 4
    np.testing.assert_allclose(got, ref, rtol=0, atol=atol)
    (ort,) = Session(model).run(feeds)
    np.testing.assert_allclose(got, ort, rtol=0, atol=atol)


def test_batched_matmul_of_two_activations_gets_the_hand_schedule():
    """Attention's scores: [b, h, q, d] @ [b, h, d, k] with no weight."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 4, 20, 32)).astype(np.float32)
    bm = rng.standard_normal((1, 4, 32, 48)).astype(np.float32)
    model = _model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        [_value("a", a.shape), _value("b", bm.shape)],
        [_value("y", (1, 4, 20, 48))],
    )
    (got,), report = _run_tvm(model, {"a": a, "b": bm})
    assert [how for name, how in report.schedules.items() if "matmul" in name] == ["hand (MatMul)"], report.summary()
    np.testing.assert_allclose(got, a.astype(np.float64) @ bm.astype(np.float64), rtol=0, atol=1e-5)


def test_matmul_whose_columns_do_not_fill_a_tile_keeps_dlight():
    model, feeds, ref = _projection(9, 12, 20)  # 20 columns: not a multiple of 16
    (got,), report = _run_tvm(model, feeds)
    gemm = [name for name in report.schedules if "matmul" in name]
    assert gemm and all(report.schedules[name] == "dlight" for name in gemm), report.summary()
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)


def _softmax_ref(x, axis=-1):
    x = x.astype(np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)
        return e / e.sum(axis=axis, keepdims=True)


def test_last_axis_softmax_is_imported_as_two_pass_softmax_with_special_values():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 3, 4, 32)) * 4).astype(np.float32)
    x[0, 0, 0, 5] = -np.inf  # an entry: exactly 0
    x[0, 0, 1, :] = -np.inf  # no finite entry: NaN (ai.onnx.Softmax)
    x[0, 1, 0, 7] = np.inf  # +inf: NaN row
    x[1, 2, 3, 9] = np.nan  # NaN row
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [_value("x", x.shape)], [_value("y", x.shape)])
    (got,), report = _run_tvm(model, {"x": x})
    assert report.schedules == {"softmax": "hand (TwoPassSoftmax)"}, report.summary()
    ref = _softmax_ref(x)
    ref[0, 1, 0, :] = np.nan
    assert got[0, 0, 0, 5] == 0.0
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    # exp(x - m) with x - m rounded to float32: relative error |x - m| * 2^-24 (|x - m| < 30 here) on top
    # of the op's 1e-6
    rtol = 1e-6 + 30 * 2.0**-24
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=1e-30)
    (ort,) = Session(model).run({"x": x})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ort))
    np.testing.assert_allclose(got, ort, rtol=2 * rtol, atol=1e-30)


@pytest.mark.parametrize(
    ("shape", "axis", "opset"),
    [
        ((3, 32, 5), 1, 18),  # not the last axis
        ((4, 20), -1, 18),  # last axis not a multiple of the vector width
        ((2, 3, 32), 1, 11),  # opset < 13: flattens axes 1.. (not a last-axis softmax)
    ],
)
def test_other_softmaxes_keep_the_stock_converter(shape, axis, opset):
    x = (np.random.default_rng(6).standard_normal(shape) * 3).astype(np.float32)
    model = _model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=axis)], [_value("x", shape)], [_value("y", shape)], opset=opset
    )
    (got,), report = _run_tvm(model, {"x": x})
    # the stock softmax (opset 11's flattening reshapes around it may take the Injective rule)
    assert "hand (TwoPassSoftmax)" not in report.schedules.values(), report.summary()
    (ort,) = Session(model).run({"x": x})
    np.testing.assert_allclose(got, ort, rtol=1e-5, atol=1e-7)


def test_opset_11_softmax_over_the_last_axis_is_imported_as_two_pass_softmax():
    x = (np.random.default_rng(7).standard_normal((3, 48)) * 3).astype(np.float32)
    model = _model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=1)], [_value("x", x.shape)], [_value("y", x.shape)], opset=11
    )
    (got,), report = _run_tvm(model, {"x": x})
    assert report.schedules == {"softmax": "hand (TwoPassSoftmax)"}, report.summary()
    np.testing.assert_allclose(got, _softmax_ref(x), rtol=1e-6 + 30 * 2.0**-24, atol=1e-30)  # as above


def test_matmul_followed_by_a_layout_change_is_scheduled_or_declined_never_raises():
    """MatMul -> Transpose: fusion puts the transpose in the GEMM's kernel; the rule folds it into the tile's
    write-back or leaves the kernel to dlight, without raising (_run_tvm turns a ScheduleWarning into an error)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 12, 20)).astype(np.float32)
    w = rng.standard_normal((20, 32)).astype(np.float32)
    model = _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Transpose", ["h"], ["y"], perm=[0, 2, 1])],
        [_value("x", x.shape)],
        [_value("y", (2, 32, 12))],
        [_const("w", w)],
    )
    (got,), report = _run_tvm(model, {"x": x})
    assert report.schedule_errors == {}, report.summary()
    want = np.transpose(x.astype(np.float64) @ w.astype(np.float64), (0, 2, 1))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("mcpu", "n", "want"),
    [
        ("znver3", 1536, (6, 16, 8)),  # AVX2: 12 ymm accumulators
        ("haswell", 48, (6, 16, 8)),
        ("znver4", 1536, (8, 32, 16)),  # AVX-512: 16 zmm accumulators
        ("skylake-avx512", 64, (8, 32, 16)),
        ("znver4", 48, (14, 16, 16)),  # n not a multiple of 32: the narrow AVX-512 tile
    ],
)
def test_matmul_tile_follows_the_target(mcpu, n, want):
    """The MatMul rule's register tile comes from the target being built, not the host: code generation only,
    so every case runs on any x86-64 CI machine."""
    from softdeploy.tvm.build import make_target
    from softdeploy.tvm.ops.matmul import AVX2_TILE, tile_for
    from softdeploy.tvm.target import host_target

    with make_target(host_target(mcpu, 1)):
        assert tile_for(n) == want
    assert tile_for(n) == AVX2_TILE  # outside a target context


@pytest.mark.parametrize(
    ("shape", "heads"),
    [
        ((1, 128, 384), 12),  # MiniLM's head split: reshape -> transpose -> scale, 16-lane rows
        ((2, 5, 6), 2),  # rows of 3: not vectorised, still parallel
    ],
)
def test_kernels_without_a_reduction_get_the_injective_rule(shape, heads):
    """A transformer's head split (Reshape -> Transpose -> Mul), which neither dlight's CPU rules nor ours took: it ran
    TVM's default loop nest, 9x slower than with the rule (56 against 6 us at MiniLM's shape, Zen 4, 1 thread)."""
    b, t, d = shape
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    split = helper.make_tensor("split", TensorProto.INT64, [4], [b, t, heads, d // heads])
    nodes = [
        helper.make_node("Reshape", ["x", "split"], ["r"]),
        helper.make_node("Transpose", ["r"], ["h"], perm=[0, 2, 1, 3]),
        helper.make_node("Mul", ["h", "scale"], ["y"]),
    ]
    out = (b, heads, t, d // heads)
    model = _model(nodes, [_value("x", shape)], [_value("y", out)], [split, _const("scale", np.array(0.17))])
    (got,), report = _run_tvm(model, {"x": x})
    kernels = {name: how for name, how in report.schedules.items() if "transpose" in name}
    assert kernels and set(kernels.values()) == {"hand (Injective)"}, report.summary()
    want = x.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) * np.float32(0.17)
    np.testing.assert_array_equal(got, want)
