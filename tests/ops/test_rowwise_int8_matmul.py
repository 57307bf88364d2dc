"""RowwiseInt8MatMul beyond the registry-wide tests: the kernel's creation-time packing of a constant B gives the
bits of the per-call path; the lane bound's weights keep every int16 lane exact (hypothesis); and the bound is a
speed condition only: weights past it (every form) still give the reference's integers on every variant."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper

from softdeploy import DOMAIN, OPSET_VERSION, conformance
from softdeploy.ops import REGISTRY, Sample
from softdeploy.ops.rowwise_int8_matmul import lane_bounded_weights, lane_groups, lane_set_sums
from softdeploy.runtime import Session

OP = REGISTRY["RowwiseInt8MatMul"]


def _model(b: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, levels: int, *, constant: bool):
    """One node; B, BScale and Bias as initializers (constant) or as graph inputs."""
    names = ["A", "B", "BScale"] + (["Bias"] if bias is not None else [])
    values = {"B": b, "BScale": scale, "Bias": bias}
    k = b.shape[0]
    inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["m", k])]
    inits = []
    for name in names[1:]:
        v = values[name]
        if constant:
            inits.append(numpy_helper.from_array(v, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)))
    node = OP.make_node(names, ["Y"], levels=levels)
    graph = helper.make_graph(
        [node], "rowwise", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)], ir_version=10
    )


@pytest.mark.parametrize("isa", conformance.available_isas())
@pytest.mark.parametrize(("levels", "bound"), [(127, 20), (255, 20), (255, 128)])
def test_constant_weights_packed_at_creation_give_the_per_call_bits(isa, levels, bound):
    """A constant B is packed (and its lane bound found) once, at kernel creation; a B fed at run time on every
    call. Both must give the same bits, and the reference's values, on every variant and form (groups 4, 2, 0)."""
    rng = np.random.default_rng(levels + bound)
    b = rng.integers(-bound, bound + 1, size=(70, 45)).astype(np.int8)
    scale = rng.uniform(0.001, 0.02, 45).astype(np.float32)
    bias = rng.uniform(50, 60, 45).astype(np.float32)
    a = rng.standard_normal((19, 70)).astype(np.float32)
    want = OP.reference(a, b, scale, bias, levels=levels)[0]
    with conformance.forced_isa(isa):
        packed = Session(_model(b, scale, bias, levels, constant=True), kernels="native")
        per_call = Session(_model(b, scale, bias, levels, constant=False), kernels="native")
    got_packed = packed.run({"A": a})[0]
    got_call = per_call.run({"A": a, "B": b, "BScale": scale, "Bias": bias})[0]
    np.testing.assert_array_equal(got_packed, got_call)
    rtol, atol = OP.tolerance["float32"]
    np.testing.assert_allclose(got_packed, want, rtol=rtol, atol=atol)


def test_every_variant_gives_the_same_bits():
    """The VNNI tile (the avx512 variant on a CPU with VNNI), the AVX2 tile and the portable loop compute the same
    integers and the same float32 epilogue."""
    for sample in OP.samples(np.random.default_rng(3)):
        outs = [conformance.run(OP, sample, "kernel", isa=isa)[0] for isa in conformance.available_isas()]
        for other in outs[1:]:
            np.testing.assert_array_equal(outs[0], other, err_msg=sample.name)


@given(
    w=hnp.arrays(np.float64, st.tuples(st.integers(1, 40), st.integers(1, 12)), elements=st.floats(-4, 4)),
    levels=st.sampled_from([255, 127]),
    groups=st.sampled_from([0, 1, 2, 4]),
)
def test_lane_bounded_weights_keep_every_lane_exact(w, levels, groups):
    """lane_bounded_weights: int8 on the 8-bit grid whose every lane set, per sign, sums to at most 32767 // levels
    (so the kernel may sum `groups` vpmaddubsw results in int16), with a step no smaller than the 8-bit one; groups 0
    is the 8-bit grid itself (every column with a float32 step reaches 127)."""
    q, step = lane_bounded_weights(w, levels, groups)
    assert q.dtype == np.int8 and step.dtype == np.float32 and q.shape == w.shape
    assert lane_groups(q, levels) >= groups
    if groups:  # 0: the plain 8-bit grid (the VNNI tile's), no bound
        assert int(lane_set_sums(q, groups).max(initial=0)) * levels <= 32767
    else:
        scaled = (np.abs(w).max(axis=0) / 127).astype(np.float32) > 0  # others (0, ~1e-45) get step 1 and q = 0
        assert np.all(np.abs(q.astype(np.int32)).max(axis=0)[scaled] == 127)
    eight_bit = np.abs(w).max(axis=0) / 127
    assert np.all(step >= np.float32(eight_bit) * (1 - 1e-6))
    # the dequantized weights are the float ones within half a step
    assert np.all(np.abs(q.astype(np.float64) * step - w) <= step.astype(np.float64) * (0.5 + 1e-6))


@pytest.mark.parametrize("isa", conformance.available_isas())
@pytest.mark.parametrize(("k", "n"), [(1, 1), (5, 16), (20, 17), (33, 32), (16, 33), (7, 49), (64, 80)])
def test_tile_edges_every_row_count(isa, k, n):
    """Every row count around the tiles' heights (AVX2: 6; VNNI: 8) against panel counts around their widths (16
    columns; the VNNI tile takes two panels at a time, then one), with full-range weights (the AVX2 variant's exact
    path) and lane-bounded ones (its int16 tile): the reference's values and the portable variant's bits."""
    rng = np.random.default_rng(k * 100 + n)
    scale = rng.uniform(0.001, 0.02, n).astype(np.float32)
    # one with a Bias clear of the products (the tolerance assumes no cancellation: the op's docstring), one without
    full = (rng.integers(-128, 128, size=(k, n)).astype(np.int8), None)
    bounded = (rng.integers(-15, 16, size=(k, n)).astype(np.int8), rng.uniform(50, 60, n).astype(np.float32))
    for b, bias in (full, bounded):
        with conformance.forced_isa(isa):
            session = Session(_model(b, scale, bias, 255, constant=True), kernels="native")
        with conformance.forced_isa("portable"):
            portable = Session(_model(b, scale, bias, 255, constant=True), kernels="native")
        for m in [*range(1, 18), 24, 25]:
            a = rng.standard_normal((m, k)).astype(np.float32)
            got = session.run({"A": a})[0]
            np.testing.assert_array_equal(got, portable.run({"A": a})[0], err_msg=f"m={m}")
            rtol, atol = OP.tolerance["float32"]
            np.testing.assert_allclose(got, OP.reference(a, b, scale, bias, levels=255)[0], rtol=rtol, atol=atol)


def test_weights_past_the_bound_take_the_exact_path():
    """Full-range weights at levels 255 saturate even single vpmaddubsw pairs (2 x 255 x 127 > 32767): the kernel
    must not run the int16 form on them. The worst case, every pair at 127 and every activation at 255, has the
    reference's exact sums on every variant."""
    b = np.full((64, 20), 127, np.int8)
    b[::3] = -128
    a = np.full((7, 64), 255.0, np.float32)
    a[:, 0] = 0.0  # lo = 0, s = 1: q = 255 exactly
    sample = Sample("saturating", (a, b, np.full(20, 1.0, np.float32)))
    assert lane_groups(b, 255) == 0
    want = conformance.run(OP, sample, "reference")
    for isa in conformance.available_isas():
        got = conformance.run(OP, sample, "kernel", isa=isa)
        np.testing.assert_array_equal(got[0], want[0].astype(np.float32), err_msg=isa)


def test_threads_share_one_session_with_packed_weights():
    """The weights packed at creation are the kernel's only state: 8 threads running one session (2 intra-op
    threads, several panel tasks) get the serial run's bits."""
    import threading

    rng = np.random.default_rng(7)
    b = rng.integers(-20, 21, size=(96, 100)).astype(np.int8)
    scale = rng.uniform(0.001, 0.02, 100).astype(np.float32)
    a = rng.standard_normal((64, 96)).astype(np.float32)
    session = Session(_model(b, scale, None, 127, constant=True), kernels="native", threads=2)
    want = session.run({"A": a})[0].tobytes()
    bad: list[int] = []

    def worker() -> None:
        for _ in range(50):
            if session.run({"A": a})[0].tobytes() != want:
                bad.append(1)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


_NO_VNNI_SCRIPT = """
import numpy as np
from softdeploy import conformance
from softdeploy.ops import REGISTRY
from softdeploy.runtime import library_status

info = library_status().info
assert info.isa_detected == "avx512" and not info.avx512_vnni, (info.isa_detected, info.avx512_vnni)
op = REGISTRY["RowwiseInt8MatMul"]
for sample in op.samples(np.random.default_rng(3)):
    got = conformance.run(op, sample, "kernel", isa="avx512")
    want = conformance.run(op, sample, "kernel", isa="portable")
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w, err_msg=sample.name)
print("bw tile: same bits as the portable variant on", sum(1 for _ in op.samples(np.random.default_rng(3))), "samples")
"""


def test_avx512_without_vnni_runs_the_zmm_lane_tile(cpuid_shim):
    """On an AVX-512 CPU without VNNI the avx512 variant runs the AVX2 tile's form on zmm (ops/rowwise_int8_matmul
    _avx512.cc). On a host with VNNI that path is reached through bench/cpuid_avx2.c with SD_CPUID_MASK=vnni (CPUID
    faulting: only the VNNI bits hidden, as the kernels read them); every sample must give the portable variant's
    bits. (On a CPU without VNNI the registry-wide tests run this path natively; an AVX2-only CPU has no avx512.)"""
    from softdeploy.runtime import library_status

    info = library_status().info
    if info is None or info.isa_detected != "avx512" or not info.avx512_vnni:
        pytest.skip("needs an AVX-512 CPU with VNNI to emulate one without it (without VNNI: the other tests run it)")
    done = cpuid_shim.run(_NO_VNNI_SCRIPT, mask="vnni", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "bw tile: same bits" in done.stdout


def _shape_chain_model(a_dims: list) -> object:
    """A -> RowwiseInt8MatMul -> Y, and Shape(Y) -> S: the chain attention's reshape after a projection has."""
    rng = np.random.default_rng(5)
    b = rng.integers(-128, 128, (8, 6)).astype(np.int8)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(np.ones(6, np.float32), "BScale")]
    nodes = [OP.make_node(["A", "B", "BScale"], ["Y"]), helper.make_node("Shape", ["Y"], ["S"])]
    graph = helper.make_graph(
        nodes,
        "shape_chain",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, a_dims)],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("S", TensorProto.INT64, None),
        ],
        inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


@pytest.mark.parametrize(("a_dims", "folded"), [([2, 5, 8], True), (["batch", 8], False), ([8], True)])
def test_onnxruntime_knows_the_output_shape(tmp_path, a_dims, folded):
    """The kernel's shape rule (RowwiseInt8MatMulKernel::InferOutputShape): onnxruntime's optimizer folds Shape(Y) to a
    constant where Y's shape is static -- a custom op's output shape is unknown to it otherwise -- and keeps the
    Shape node where a dimension is symbolic."""
    import onnx
    import onnxruntime as ort

    from softdeploy.runtime.library import library_path

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    so.register_custom_ops_library(str(library_path()))
    model = _shape_chain_model(a_dims)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])  # noqa: TID251
    kinds = [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
    assert ("Shape" not in kinds) == folded, kinds
    a = np.ones([2 if d == "batch" else d for d in a_dims], np.float32)
    y, s = sess.run(None, {"A": a})
    np.testing.assert_array_equal(s, [*a.shape[:-1], 6])
    assert y.shape == (*a.shape[:-1], 6)
