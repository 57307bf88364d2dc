"""Pair-bounded int8 weights (softdeploy.quant.pair_bounded): on a model of onnxruntime's vpmaddubsw kernel
(MLAS without VNNI: each even-aligned pair of u8 x s8 products saturated to int16, then summed in int32) they give
the exact integer product for every uint8 input, where plain 8-bit weights can clip; the step stays between the
8-bit and the 7-bit one; quantize() writes them into dynamic and static models and falls back to 7-bit weights,
saying why, where a GEMM weight is not a MatMul's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from onnx import TensorProto, helper, numpy_helper

from quant.tiny import mlp_with_custom_op
from softdeploy.quant import QuantConfig, quantize
from softdeploy.quant.pair_bounded import PAIR_LIMIT, max_same_sign_pair, pair_bounded_int8
from softdeploy.quant.quantize import QuantizationError


def vpmaddubsw_gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a`` (uint8 [M, K]) x ``b`` (int8 [K, N]) as MLAS's AVX2 u8s8 kernel computes it: ``vpmaddubsw`` adds the
    products of k = 2j and 2j + 1 into a saturated int16, ``vpmaddwd`` by ones and ``vpaddd`` sum those in int32."""
    k = a.shape[1]
    if k % 2:
        a = np.pad(a, ((0, 0), (0, 1)))
        b = np.pad(b, ((0, 1), (0, 0)))
    prod = a.astype(np.int32)[:, :, None] * b.astype(np.int32)[None, :, :]
    pairs = np.clip(prod[:, 0::2] + prod[:, 1::2], -32768, 32767)
    return pairs.sum(axis=1)


def exact_gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.int64) @ b.astype(np.int64)


def eight_bit(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime's symmetric per-column 8-bit weights ([-127, 127])."""
    scale = np.abs(w).max(axis=0) / 127.0
    scale = np.where(scale > 0, scale, 1.0)
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale


weights = arrays(
    np.float64,
    st.tuples(st.integers(1, 33), st.integers(1, 6)),
    elements=st.floats(-4.0, 4.0, allow_nan=False, width=32),
)


@given(w=weights, seed=st.integers(0, 2**16))
def test_pair_bounded_weights_never_saturate_and_stay_on_a_fine_grid(w, seed):
    q, scale = pair_bounded_int8(w)
    assert q.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (w.shape[1],)
    assert np.abs(q.astype(np.int32)).max() <= 127 and max_same_sign_pair(q) <= PAIR_LIMIT
    # rounding to the nearest step (float32 scale: a relative 1e-6 of slack)
    assert np.all(np.abs(w - q * scale.astype(np.float64)) <= scale * (0.5 + 1e-6))
    # the step lies between the 8-bit and the 7-bit one (at most twice the 8-bit step), where the 8-bit step is a
    # normal float32 (below that the step is the smallest normal float32)
    amax = np.abs(w).max(axis=0)
    live = amax / 127.0 >= np.finfo(np.float32).tiny
    assert np.all(scale >= np.finfo(np.float32).tiny)
    s8 = amax[live] / 127.0
    assert np.all(scale[live] >= s8 * (1 - 1e-6)) and np.all(scale[live] <= 2 * s8 * (1 + 1e-6))
    # the kernel model gives the exact product for the worst activations (all 255) and for random ones
    rng = np.random.default_rng(seed)
    for a in (np.full((1, w.shape[0]), 255, np.uint8), rng.integers(0, 256, (3, w.shape[0]), dtype=np.uint8)):
        np.testing.assert_array_equal(vpmaddubsw_gemm(a, q), exact_gemm(a, q))


def test_plain_8_bit_weights_do_saturate_the_kernel_model():
    """The check above can fail: two large same-sign weights side by side clip at 8 bits, not when pair-bounded."""
    w = np.array([[1.0, -0.2], [0.9, 0.3], [0.1, -1.0], [-0.2, 0.5]])
    a = np.full((1, 4), 255, np.uint8)
    q8, _ = eight_bit(w)
    assert max_same_sign_pair(q8) > PAIR_LIMIT
    assert not np.array_equal(vpmaddubsw_gemm(a, q8), exact_gemm(a, q8))
    qp, scale = pair_bounded_int8(w)
    np.testing.assert_array_equal(vpmaddubsw_gemm(a, qp), exact_gemm(a, qp))
    # column 0's largest same-sign pair (1.0 + 0.9) sets its step; column 1's largest weight (opposite-sign pairs)
    np.testing.assert_allclose(scale, [1.9 / 127, 1.0 / 127], rtol=1e-6)


def test_per_tensor_uses_one_step_for_every_column():
    w = np.array([[1.0, -0.2], [0.9, 0.3], [0.1, -1.0], [-0.2, 0.5]])
    q, scale = pair_bounded_int8(w, per_column=False)
    assert scale.shape == () and scale == np.float32(1.9 / 127) and max_same_sign_pair(q) <= PAIR_LIMIT


def test_subnormal_weights_keep_the_rules():
    """Found by the property above: weights near float32's subnormal range once made a zero float32 scale."""
    w = np.array([[1.4e-45, 1e-39], [1.4e-45, 1e-39]])
    q, scale = pair_bounded_int8(w)
    assert np.all(scale == np.finfo(np.float32).tiny) and max_same_sign_pair(q) <= PAIR_LIMIT
    assert np.all(np.abs(w - q * scale.astype(np.float64)) <= scale * 0.5)


def test_an_odd_reduction_length_and_zero_columns():
    w = np.zeros((5, 3))
    w[4, 1] = -2.0  # a lone last row has no partner: its weight alone bounds the step
    q, scale = pair_bounded_int8(w)
    assert scale.tolist() == [1.0, pytest.approx(2.0 / 127), 1.0] and q[4, 1] == -127
    with pytest.raises(ValueError, match="2-D"):
        pair_bounded_int8(np.zeros(4))


def _int8_matmul_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The int8 weights (not the zero points) by name."""
    return {
        t.name: numpy_helper.to_array(t)
        for t in model.graph.initializer
        if t.data_type == TensorProto.INT8 and t.name.endswith("_quantized")
    }


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_quantize_writes_pair_bounded_weights(tmp_path, mode):
    from softdeploy.runtime import Session

    src = tmp_path / "m.onnx"
    model = mlp_with_custom_op(with_function=True)
    onnx.save(model, src)
    rng = np.random.default_rng(0)
    feeds = [{"X": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(4)]
    kw = {"calibration": feeds} if mode == "static" else {}
    q = quantize(src, tmp_path / "q.onnx", QuantConfig(mode, weights="pair-bounded"), **kw)
    assert q.weights == "pair-bounded" and not q.reduce_range
    assert "pair-bounded weights as asked" in q.int8_format or "pair-bounded" in q.int8_format
    out = onnx.load(q.path)
    int8 = _int8_matmul_weights(out)
    assert len(int8) == 3  # W1, W2, W3
    floats = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    for name, w in int8.items():
        src_name = name.removesuffix("_quantized")
        want_q, want_scale = pair_bounded_int8(floats[src_name])
        np.testing.assert_array_equal(w, want_q)
        np.testing.assert_array_equal(inits[src_name + "_scale"].reshape(-1), want_scale)
    x = feeds[0]
    (ref,) = Session(src).run(x)
    (got,) = Session(q.path).run(x)
    cos = (ref * got).sum(-1) / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(got, axis=-1))
    assert cos.min() > 0.99


def conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["X", "W"], ["Y"], name="conv")],
        "conv",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4, 6, 6])],
        initializer=[numpy_helper.from_array(w, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_a_conv_weight_falls_back_to_7_bit_and_says_why(tmp_path):
    src = tmp_path / "c.onnx"
    onnx.save(conv_model(), src)
    q = quantize(src, tmp_path / "q.onnx", QuantConfig("dynamic", weights="pair-bounded"))
    assert q.weights == "7-bit" and q.reduce_range
    assert "7-bit weights instead of pair-bounded: int8 weights of GEMM-like ops other than MatMul" in q.int8_format
    (w,) = _int8_matmul_weights(onnx.load(q.path)).values()
    assert np.abs(w.astype(np.int32)).max() <= 64


def test_weights_and_reduce_range_must_agree():
    with pytest.raises(QuantizationError, match="contradicts reduce_range=True"):
        QuantConfig("dynamic", weights="8-bit", reduce_range=True).asked_weights()
    with pytest.raises(QuantizationError, match="weights '6-bit' is not one of"):
        QuantConfig("dynamic", weights="6-bit").asked_weights()
    assert QuantConfig("dynamic", reduce_range=True).asked_weights() == "7-bit"
    assert QuantConfig("dynamic", weights="7-bit", reduce_range=True).asked_weights() == "7-bit"
    assert QuantConfig("dynamic").asked_weights() is None
