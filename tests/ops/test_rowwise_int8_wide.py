"""RowwiseInt8MatMul with weights outside the lane bound (rowwise-8-bit's plain 8-bit grid, the VNNI class's format)
on every CPU class this machine can present: the AVX-512 VNNI tile (native), the avx2 variant's widened vpmaddwd tile
(SOFTDEPLOY_ISA=avx2, and an AVX2-only CPU through the CPUID shim), the AVX-512 variant without VNNI (the shim with
only the VNNI bits hidden) and the portable loops. Each must give the reference integers exactly.

The inputs are chosen so that the float32 epilogue is exact too: every row of A is integers spanning exactly 255 with
0 inside, so its scale is 1 and its zero point -min(A) (q = A - min A exactly); BScale is 1 and Bias is 0 or small
integers; every |sum| < 2^24. Y is then A @ B + Bias in integers, compared bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from softdeploy import DOMAIN, OPSET_VERSION, conformance
from softdeploy.ops import REGISTRY
from softdeploy.ops.rowwise_int8_matmul import lane_groups
from softdeploy.runtime import Session

OP = REGISTRY["RowwiseInt8MatMul"]
# MiniLM's projection, FFN up and FFN down shapes (K, N), and edges of the 16-k blocks and 16-column panels (odd K:
# the last pair of k half padding; N past a panel pair). K >= 2: a single weight is always inside the bound.
SHAPES = [(384, 384), (384, 1536), (1536, 384), (2, 1), (3, 17), (17, 33), (31, 16), (50, 47), (66, 80)]
ROWS = [1, 5, 6, 7, 8, 9, 13, 25]


def _model(b: np.ndarray, bias: np.ndarray | None) -> object:
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(np.ones(b.shape[1], np.float32), "BScale")]
    names = ["A", "B", "BScale"]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "Bias"))
        names.append("Bias")
    graph = helper.make_graph(
        [OP.make_node(names, ["Y"], levels=255)],
        "rowwise_wide",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["m", b.shape[0]])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)], ir_version=10
    )


def exact_case(m: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, want): A's rows are integers spanning 255 with 0 inside (scale 1, q = A - min A); B full-range int8
    (k >= 2) with pairs of -128 and of 127 (no vpmaddubsw form is exact at 8-bit rows); want = A @ B in int64."""
    rng = np.random.default_rng(seed)
    lo = rng.integers(-255, 1, size=(m, 1))
    a = lo + rng.integers(0, 256, size=(m, k))
    a[:, 0] = lo[:, 0]  # the row's min
    if k > 1:
        a[:, 1] = lo[:, 0] + 255  # and max: the range is exactly 255
    else:
        a[:, 0] = np.where(lo[:, 0] % 2 == 0, 255, -255)  # one entry: the range max(0, a) - min(0, a) is |a| = 255
    b = rng.integers(-128, 128, size=(k, n)).astype(np.int8)
    b[:2, -1] = -128
    b[:2, 0] = 127  # a pair of 127s (k = 0, 1): 2 x 255 x 127 > 32767 saturates even a single vpmaddubsw pair
    return a.astype(np.float32), b, a.astype(np.int64) @ b.astype(np.int64)


def check_exact(session: Session, a: np.ndarray, want: np.ndarray, bias: np.ndarray | None, what: str) -> None:
    got = session.run({"A": a})[0]
    expect = (want + (0 if bias is None else bias.astype(np.int64))).astype(np.float32)
    assert np.all(np.abs(want) < 2**24)
    np.testing.assert_array_equal(got, expect, err_msg=what)


@pytest.mark.parametrize("isa", conformance.available_isas())
@pytest.mark.parametrize(("k", "n"), SHAPES)
def test_weights_outside_the_lane_bound_give_the_reference_integers(isa, k, n):
    """Every variant this CPU runs (SOFTDEPLOY_ISA lowers it: avx2 is the widened vpmaddwd tile here, unless the CPU
    has AVX-VNNI), every row count around the tiles' heights, with and without a Bias."""
    rng = np.random.default_rng(k * 1000 + n)
    _, b, _ = exact_case(1, k, n, k + n)
    assert lane_groups(b, 255) == 0
    bias = rng.integers(-1000, 1000, size=n).astype(np.float32)
    with conformance.forced_isa(isa):
        sessions = {
            "bias": Session(_model(b, bias), kernels="native"),
            "none": Session(_model(b, None), kernels="native"),
        }
    for m in ROWS if k * n < 100_000 else [128, 7]:
        a, _, _ = exact_case(m, k, 1, m)
        want = a.astype(np.int64) @ b.astype(np.int64)
        check_exact(sessions["bias"], a, want, bias, f"{isa} m={m} k={k} n={n} bias")
        check_exact(sessions["none"], a, want, None, f"{isa} m={m} k={k} n={n}")


def test_worst_case_sums_on_the_widened_tile():
    """Every activation at 255 against columns of 127 and of -128 (the largest pair sums, 2 x 255 x 128 in one
    vpmaddwd lane): the reference integers on every variant."""
    k, n = 96, 40
    b = np.full((k, n), 127, np.int8)
    b[:, ::2] = -128
    a = np.full((9, k), 255.0, np.float32)
    a[:, 0] = 0.0  # lo = 0: scale 1, q = 255
    want = a.astype(np.int64) @ b.astype(np.int64)
    for isa in conformance.available_isas():
        with conformance.forced_isa(isa):
            session = Session(_model(b, None), kernels="native")
        check_exact(session, a, want, None, isa)


@pytest.mark.parametrize(("k", "n"), [(2, 1), (3, 16), (15, 17), (16, 15), (17, 33), (33, 16)])
def test_extreme_codes_and_weights_at_block_edges(k, n):
    """Codes 0 and 255 against weights -128 and 127, in the patterns that stress each pair of k: alternating codes
    against alternating weights (one product of each pair at its extreme, the other 0), every code 255 against every
    weight -128 (the most negative sums) and against 127 (the first code 0 there, so the row's scale stays 1), at K and
    N on either side of the 16-k blocks and 16-column panels (odd K: a half-padded last pair) and row counts around the
    tiles' heights; every variant, exactly."""
    codes = np.where(np.arange(k) % 2 == 0, 255.0, 0.0).astype(np.float32)
    alternating = np.where((np.arange(k)[:, None] + np.arange(n)[None, :]) % 2 == 0, 127, -128).astype(np.int8)
    cases = {
        "alternating": (alternating, codes),
        "all -128": (np.full((k, n), -128, np.int8), np.full(k, 255.0, np.float32)),
        "all 127": (np.full((k, n), 127, np.int8), np.full(k, 255.0, np.float32)),
    }
    for name, (b, row) in cases.items():
        for isa in conformance.available_isas():
            with conformance.forced_isa(isa):
                session = Session(_model(b, None), kernels="native")
            for m in (1, 5, 6, 7, 13):
                a = np.tile(row, (m, 1))
                if not (row == 0).any():
                    a[:, 0] = 0.0  # 0 and 255 in every row: scale 1, zero point 0, q = a
                want = a.astype(np.int64) @ b.astype(np.int64)
                check_exact(session, a, want, None, f"{name} {isa} m={m} k={k} n={n}")


_EMULATED_SCRIPT = """
import importlib.util
import numpy as np
spec = importlib.util.spec_from_file_location("rowwise_wide_cases", {path!r})
cases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cases)
SHAPES, _model, check_exact, exact_case = cases.SHAPES, cases._model, cases.check_exact, cases.exact_case
from softdeploy import conformance
from softdeploy.runtime import Session, library_status

info = library_status().info
print("cpu", info.isa_detected, "avx512_vnni", info.avx512_vnni, "avx_vnni", info.avx_vnni)
assert info.isa_detected == {isa!r} and not info.avx512_vnni and not info.avx_vnni
for k, n in SHAPES:
    _, b, _ = exact_case(1, k, n, k + n)
    with conformance.forced_isa({isa!r}):
        session = Session(_model(b, None), kernels="native")
    for m in (1, 7, 25, 128):
        a, _, _ = exact_case(m, k, 1, m)
        check_exact(session, a, a.astype(np.int64) @ b.astype(np.int64), None, f"m={{m}} k={{k}} n={{n}}")
print("widened tile: reference integers")
"""


@pytest.mark.parametrize(("mask", "isa"), [("vnni", "avx512"), (None, "avx2")])
def test_emulated_cpus_without_vnni(cpuid_shim, mask, isa):
    """An AVX-512 CPU without VNNI (the shim hides only the VNNI bits: the avx512 variant's zmm widened tile) and an
    AVX2-only CPU (the shim hides AVX-512 and VNNI: what the library detects, not only what it is told to select)."""
    from softdeploy.runtime import library_status

    info = library_status().info
    if info is None or info.isa_detected != "avx512":
        pytest.skip("needs an AVX-512 CPU to emulate these classes (elsewhere the other tests run them natively)")
    done = cpuid_shim.run(_EMULATED_SCRIPT.format(path=__file__, isa=isa), mask=mask, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "widened tile: reference integers" in done.stdout
