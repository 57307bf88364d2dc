"""RowwiseInt8MatMul on TVM (softdeploy/tvm/ops/rowwise_int8_matmul.py): equal to the C++ kernel bit for bit on every
sample, for each weight layout this host can run; each target gets its layout and its instruction (read from the
generated assembly, so that a layout for a CPU this host lacks, AVX-VNNI on an AVX-512 machine, is still checked);
a model imported for one target and built for another still computes the right values."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

pytest.importorskip("tvm", reason="the TVM backend is optional: pip install 'softdeploy[tvm]'")

from onnx import TensorProto, helper, numpy_helper

from softdeploy import DOMAIN, OPSET_VERSION, conformance
from softdeploy.ops import REGISTRY
from softdeploy.ops.functions import attach_function_bodies
from softdeploy.runtime import Session
from softdeploy.tvm.errors import ScheduleWarning
from softdeploy.tvm.ops import rowwise_int8_matmul as tir
from softdeploy.tvm.session import TVMSession
from softdeploy.tvm.target import host_target, make_target, target_has

pytestmark = pytest.mark.tvm  # for `-m` selection; without the `tvm` extra the module skips at import

OP = REGISTRY["RowwiseInt8MatMul"]
# a CPU of each layout (LLVM -mcpu names); the AVX-VNNI one runs only on such a CPU
TARGET_CPUS = {
    tir.AVX512_VNNI: "znver4",
    tir.AVX_VNNI: "alderlake",
    tir.AVX512_BW: "skylake-avx512",
    tir.AVX2: "znver3",
}
INSTRUCTION = {
    tir.AVX512_VNNI: r"vpdpbusd\s+%zmm",
    tir.AVX_VNNI: r"\{vex\}\s+vpdpbusd\s+%ymm",  # VEX: runs on AVX-VNNI cores, which have no EVEX
    tir.AVX512_BW: r"vpmaddwd\s+%zmm",
    tir.AVX2: r"vpmaddwd\s+%ymm",
}
# the lane layouts (lane-bounded weights): per base layout and number of sets
LANES = [(base, sets) for base in (tir.AVX512_BW, tir.AVX2) for sets in (4, 2, 1)]
LANE_INSTRUCTION = {tir.AVX512_BW: r"vpmaddubsw\s+%zmm", tir.AVX2: r"vpmaddubsw\s+%ymm"}


def _runnable_here(layout) -> bool:
    with make_target(host_target()):
        return target_has(layout.features)


def _layout_of(mcpu: str):
    with make_target(host_target(mcpu)):
        return tir.target_layout()


def _shapes(sample) -> dict[str, list[int]]:
    return {p.name: list(np.shape(v)) for p, v in zip(OP.inputs, sample.inputs, strict=False) if v is not None}


def _initializer_model(m: int, b: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None, levels: int = 255):
    """A [m, K] the one input; B, BScale (and Bias) initializers: B is packed at import, as in a quantized model."""
    k, n = b.shape
    names = ["A", "B", "BScale"] + (["Bias"] if bias is not None else [])
    inits = [
        numpy_helper.from_array(v, name) for v, name in ((b, "B"), (scale, "BScale"), (bias, "Bias")) if v is not None
    ]
    node = helper.make_node(OP.name, names, ["Y"], domain=DOMAIN, levels=levels)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
    return attach_function_bodies(helper.make_model(graph, opset_imports=opsets))


def _weights_model(m: int, k: int, n: int, rng: np.random.Generator):
    """Full-range int8 weights, a scale and a bias, as initializers."""
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    scale = (rng.random(n) * 0.01 + 1e-3).astype(np.float32)
    return _initializer_model(m, b, scale, rng.standard_normal(n).astype(np.float32))


def test_each_target_gets_its_layout():
    assert {layout: _layout_of(mcpu) for layout, mcpu in TARGET_CPUS.items()} == {x: x for x in TARGET_CPUS}
    with make_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}):
        assert tir.target_layout() == tir.GENERIC


def _gemm_asm(layout, mcpu: str) -> str:
    """The assembly of the GEMM kernel for ``layout``, built (not run) for -mcpu ``mcpu``."""
    import tvm
    from tvm import te, tirx

    from softdeploy.tvm.ops import try_schedules

    target = make_target(host_target(mcpu))
    m, k, n = 20, 64, 96
    with target:
        q = te.placeholder((tir.rows_padded(m, layout), k), "uint8", name="q")
        params = te.placeholder((m, 2), "float32", name="params")
        packed = te.placeholder(tir.packed_shape(k, n, layout), layout.dtype, name="packed")
        colsum, scale = te.placeholder((n,), "int32", name="colsum"), te.placeholder((n,), "float32", name="scale")
        y = tir.gemm(q, params, packed, colsum, scale, None)
        scheduled, rule, errors = try_schedules(te.create_prim_func([q, params, packed, colsum, scale, y]))
    assert rule == "RowwiseInt8MatMul" and errors == {}
    return tirx.build(tvm.IRModule({"main": scheduled}), target=target).inspect_source("asm")


@pytest.mark.parametrize("layout", list(TARGET_CPUS), ids=lambda x: TARGET_CPUS[x])
def test_the_gemm_runs_the_layouts_instruction(layout):
    """Built (not run) for a CPU of each layout: the tensor intrinsic was applied and LLVM emitted its instruction."""
    asm = _gemm_asm(layout, TARGET_CPUS[layout])
    assert re.search(INSTRUCTION[layout], asm), f"no {INSTRUCTION[layout]} in the {TARGET_CPUS[layout]} kernel"


@pytest.mark.parametrize(("base", "sets"), LANES, ids=lambda x: TARGET_CPUS.get(x, str(x)))
def test_lane_layouts_run_vpmaddubsw(base, sets):
    asm = _gemm_asm(tir.LANE_LAYOUTS[base][sets], TARGET_CPUS[base])
    assert re.search(LANE_INSTRUCTION[base], asm)


def _layouts_here() -> list:
    return [x for x in TARGET_CPUS if _runnable_here(x)]


@pytest.mark.slow
@pytest.mark.parametrize("layout", _layouts_here(), ids=lambda x: TARGET_CPUS[x])
def test_every_sample_equals_the_cpp_kernel_bit_for_bit(layout):
    """Both quantize with the contract's float32 steps and sum exactly; the epilogue is one FMA in both (TVM's LLVM
    contracts ``x * y + b``), so the outputs are the same floats. Every sample, B a graph input (packed by the pack
    kernel), on each layout this CPU runs. GELU is the exception: TVM's erf is not the kernel's rational one, so a
    GELU sample matches the reference within the tolerance of every backend but the kernel (conformance.tolerance)."""
    target = host_target(TARGET_CPUS[layout])
    tol = conformance.tolerance(OP, "float32", "tvm")
    for sample in OP.samples(np.random.default_rng(0)):
        with warnings.catch_warnings():
            warnings.simplefilter("error", ScheduleWarning)  # the hand schedules, not dlight's
            session = TVMSession(OP.make_model(sample), shapes=_shapes(sample), target=target)
        got = session.run(OP.feeds(sample))[0]
        if sample.attrs.get("activation", "none") == "gelu":
            want = OP.reference(*sample.inputs, **sample.attrs)
            conformance.compare(OP, sample, (got,), want, *tol)
            continue
        kernel = Session(OP.make_model(sample), kernels="native")
        want = kernel.run(OP.feeds(sample))[0]
        np.testing.assert_array_equal(got, want, err_msg=f"{sample.name} on {TARGET_CPUS[layout]}")


def test_activation_and_residual_follow_the_gemm():
    """A node with GELU, a Bias and a Residual (the kernel's epilogue; Relax operators after the GEMM here) gives the
    reference's values within the op's tolerance, and the residual alone the C++ kernel's bits."""
    samples = {s.name: s for s in OP.samples(np.random.default_rng(0))}
    tol = conformance.tolerance(OP, "float32", "tvm")
    for name in ("gelu_bias_residual", "residual", "residual_one_element"):
        sample = samples[name]
        session = TVMSession(OP.make_model(sample), shapes=_shapes(sample), target=host_target())
        got = session.run(OP.feeds(sample))[0]
        conformance.compare(OP, sample, (got,), OP.reference(*sample.inputs, **sample.attrs), *tol)
        if name != "gelu_bias_residual":
            want = Session(OP.make_model(sample), kernels="native").run(OP.feeds(sample))[0]
            np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("layout", _layouts_here(), ids=lambda x: TARGET_CPUS[x])
def test_weight_initializers_are_packed_at_import(layout):
    """B, BScale and Bias initializers: B packed once, in NumPy, as constants; two kernels run, both hand-scheduled,
    and their output equals the C++ kernel's."""
    rng = np.random.default_rng(1)
    m, k, n = 37, 200, 70  # rows, k and columns that fill no tile: the padding paths
    model = _weights_model(m, k, n, rng)
    a = {"A": (rng.standard_normal((m, k)) * 2).astype(np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleWarning)
        session = TVMSession(model, shapes={"A": [m, k]}, target=host_target(TARGET_CPUS[layout]))
    hand = {name: how for name, how in session.report.schedules.items() if name.startswith("rowwise_int8_matmul")}
    assert hand == {
        "rowwise_int8_matmul_quantize": "hand (RowwiseInt8MatMul)",
        "rowwise_int8_matmul": "hand (RowwiseInt8MatMul)",
    }, session.report.summary()
    np.testing.assert_array_equal(session.run(a)[0], Session(model, kernels="native").run(a)[0])


@pytest.mark.parametrize("built_for", [c for c in ("znver3", "skylake-avx512") if _runnable_here(_layout_of(c))])
def test_a_model_imported_for_another_target_still_computes_right(built_for):
    """Weights packed for AVX-512 VNNI (full-range int8, not lane-bounded), the kernel built for a CPU without
    vpdpbusd: the GEMM falls back to int32 vector lanes, slower and exact. On the AVX-512 BW target the same T, G and
    type are a lane layout's with S = 1, whose vpmaddubsw would saturate on these weights: lane packings are 5-D so
    that this cannot be mistaken for one."""
    import tvm
    from tvm import relax

    from softdeploy.tvm.build import build
    from softdeploy.tvm.frontend import import_model, prepare

    rng = np.random.default_rng(2)
    m, k, n = 16, 64, 32
    model = _weights_model(m, k, n, rng)
    mod = import_model(prepare(model, {"A": [m, k]}), host_target("znver4"))
    executable, report = build(mod, target=host_target(built_for))
    assert report.schedules["rowwise_int8_matmul"] == "hand (RowwiseInt8MatMul)"

    vm = relax.VirtualMachine(executable, tvm.cpu())
    a = (rng.standard_normal((m, k))).astype(np.float32)
    got = vm["main"](tvm.runtime.tensor(a)).numpy()
    np.testing.assert_array_equal(got, Session(model, kernels="native").run({"A": a})[0])


def test_pack_weights_matches_the_pack_kernel_layout():
    rng = np.random.default_rng(3)
    b = rng.integers(-128, 128, (7, 19)).astype(np.int8)
    for layout in (tir.AVX512_VNNI, tir.AVX2, tir.LANE_LAYOUTS[tir.AVX2][4], tir.LANE_LAYOUTS[tir.AVX512_BW][2]):
        packed, colsum = tir.pack_weights(b, layout)
        assert packed.shape == tir.packed_shape(7, 19, layout) and packed.dtype == np.dtype(layout.dtype)
        for kk in range(7):
            for nn in range(19):
                assert packed[tir.packed_index(nn, kk, packed.shape)] == b[kk, nn]
        assert np.count_nonzero(packed) == np.count_nonzero(b)  # the padding is zeros
        np.testing.assert_array_equal(colsum, b.astype(np.int64).sum(axis=0))


def test_shape_arithmetic_after_the_node_imports():
    """Attention's reshape of a projection: Shape(Y) -> Gather -> Concat -> Reshape. onnxruntime's folding (in
    ``prepare``) turns the chain into a constant only because the kernel gives onnxruntime Y's shape; left in the
    graph, TVM's importer refuses the Concat of a shape and tensors."""
    rng = np.random.default_rng(4)
    b = rng.integers(-128, 128, (8, 6)).astype(np.int8)
    inits = [
        numpy_helper.from_array(b, "B"),
        numpy_helper.from_array(np.full(6, 0.01, np.float32), "BScale"),
        numpy_helper.from_array(np.array([0, 1], np.int64), "lead"),
        numpy_helper.from_array(np.array([2, 3], np.int64), "heads"),
    ]
    nodes = [
        helper.make_node(OP.name, ["A", "B", "BScale"], ["Y"], domain=DOMAIN),
        helper.make_node("Shape", ["Y"], ["S"]),
        helper.make_node("Gather", ["S", "lead"], ["L"]),
        helper.make_node("Concat", ["L", "heads"], ["new_shape"], axis=0),
        helper.make_node("Reshape", ["Y", "new_shape"], ["Z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["batch", 4, 8])],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)],
        inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
    model = attach_function_bodies(helper.make_model(graph, opset_imports=opsets))
    a = rng.standard_normal((1, 4, 8)).astype(np.float32)
    session = TVMSession(model, shapes={"A": [1, 4, 8]})
    assert session.tir_ops == (OP.name,)
    got = session.run({"A": a})[0]
    assert got.shape == (1, 4, 2, 3)
    np.testing.assert_array_equal(got, Session(model, kernels="native").run({"A": a})[0])


def _lane_model(m: int, k: int, n: int, levels: int, sets: int, rng: np.random.Generator):
    """A model whose weights are lane-bounded for ``sets`` (softdeploy.ops.rowwise_int8_matmul.lane_bounded_weights)."""
    from softdeploy.ops.rowwise_int8_matmul import lane_bounded_weights, lane_groups

    q, step = lane_bounded_weights(rng.standard_normal((k, n)), levels, sets)
    assert lane_groups(q, levels) >= sets
    return _initializer_model(m, q, step, levels=levels), q


@pytest.mark.parametrize(
    "base", [x for x in (tir.AVX512_BW, tir.AVX2) if _runnable_here(x)], ids=lambda x: TARGET_CPUS[x]
)
@pytest.mark.parametrize(("levels", "sets"), [(255, 4), (255, 2), (127, 4), (255, 1)])
def test_lane_bounded_weights_take_the_lane_layout_and_equal_the_kernel(base, levels, sets):
    """Without VNNI, lane-bounded weights are packed for vpmaddubsw (the sets their bound allows) and the output
    equals the C++ kernel's bit for bit; rows, k and columns that fill no tile."""
    from softdeploy.ops.rowwise_int8_matmul import lane_groups
    from softdeploy.tvm.frontend import import_model, prepare

    rng = np.random.default_rng(7 + sets)
    m, k, n = 29, 72, 40
    model, q = _lane_model(m, k, n, levels, sets, rng)
    target = host_target(TARGET_CPUS[base])
    chosen = tir.LANE_LAYOUTS[base][lane_groups(q, levels)]
    mod = import_model(prepare(model, {"A": [m, k]}), target)
    consts = [c for c in _constants(mod) if c.dtype == "int8"]
    assert [c.shape for c in consts] == [tir.packed_shape(k, n, chosen)]
    session = TVMSession(model, shapes={"A": [m, k]}, target=target)
    assert session.report.schedules["rowwise_int8_matmul"] == "hand (RowwiseInt8MatMul)"
    a = {"A": (rng.standard_normal((m, k)) * 3).astype(np.float32)}
    np.testing.assert_array_equal(session.run(a)[0], Session(model, kernels="native").run(a)[0])


def _constants(mod) -> list[np.ndarray]:
    """The tensor constants of a Relax module's main function."""
    from tvm import relax
    from tvm.ir.expr import Constant

    found: list[np.ndarray] = []

    def visit(expr) -> None:
        if isinstance(expr, Constant) and hasattr(expr.value, "numpy"):  # (not a scalar PrimValue)
            found.append(expr.value.numpy())

    relax.analysis.post_order_visit(mod["main"], visit)
    return found
