"""SoftpickAttention: properties the generic conformance tests cannot know (docs/ops/SoftpickAttention.md;
softdeploy/ops/softpick_attention.py; ops/softpick_attention.cc).

Kernel runs go through onnxruntime with our library, in every ISA variant this CPU has."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from softdeploy import conformance
from softdeploy.ops import REGISTRY, Sample
from softdeploy.runtime import Session

OP = REGISTRY["SoftpickAttention"]
ISAS = conformance.available_isas()
RTOL, ATOL = OP.tolerance["float32"]
ROOT = Path(__file__).resolve().parents[2]
isa_param = pytest.mark.parametrize("isa", ISAS)


@functools.cache
def _session(isa: str, with_mask: bool, causal: int, scale: float, eps: float) -> Session:
    tiny = np.zeros((1, 1, 1, 1), np.float32)
    inputs = (tiny, tiny, tiny, tiny if with_mask else None)
    model = OP.make_model(Sample("s", inputs, {"causal": causal, "scale": scale, "eps": eps}))
    with conformance.forced_isa(isa):
        return Session(model, kernels="native")


def kernel(q, k, v, mask=None, isa: str = ISAS[-1], *, causal: int = 0, scale: float = 0.0, eps: float = 1e-6):
    feeds = {"Q": q, "K": k, "V": v}
    if mask is not None:
        feeds["Mask"] = mask
    return _session(isa, mask is not None, causal, scale, eps).run(feeds)[0]


def reference(q, k, v, mask=None, **attrs):
    return OP.reference(q, k, v, mask, **attrs)[0]


def authors_naive(q, k, v, causal: bool, eps: float) -> np.ndarray:
    """naive_softpick_attn of zaydzuhri/softpick-attention (head_first layout), float64, finite inputs:
    causal mask tril(ones(Tk, Tk))[Tk - Tq:Tk, :Tk] with -inf, softpick with non-finite entries left out
    of the denominator."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    tq, tk = q.shape[2], k.shape[2]
    # 1/sqrt(D) as the op's FLOAT attribute holds it (float32-rounded)
    s = q @ np.swapaxes(k, -1, -2) * np.float64(np.float32(1 / np.sqrt(q.shape[-1])))
    if causal:
        s = np.where(np.tril(np.ones((tk, tk)))[tk - tq : tk, :tk] == 1, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - m) - np.exp(-m)
    w = np.maximum(e, 0) / (np.sum(np.where(np.isfinite(s), np.abs(e), 0), axis=-1, keepdims=True) + eps)
    return w @ v


@st.composite
def problems(draw):
    b = draw(st.integers(0, 2))
    hk = draw(st.integers(1, 2))
    h = hk * draw(st.integers(1, 3))
    tq, tk = draw(st.integers(1, 70)), draw(st.integers(0, 140))
    d, dv = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    causal = draw(st.integers(0, 1))
    mask_kind = draw(st.sampled_from(["none", "padding", "full"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    # sum_d |q_d k_d| scale <= ~12: inside the conditioning the tolerance was derived for
    s = 1.5 / max(1.0, (d / 16) ** 0.25)
    q = (rng.standard_normal((b, h, tq, d)) * s).astype(np.float32)
    k = (rng.standard_normal((b, hk, tk, d)) * s).astype(np.float32)
    v = rng.standard_normal((b, hk, tk, dv)).astype(np.float32)
    mask = None
    if mask_kind == "padding":
        mask = np.where(rng.random((b, 1, 1, tk)) < 0.2, -np.inf, 0.0).astype(np.float32)
    elif mask_kind == "full":
        mask = np.where(rng.random((b, h, tq, tk)) < 0.3, -np.inf, rng.standard_normal((b, h, tq, tk)))
        mask = mask.astype(np.float32)
    return q, k, v, mask, causal


# ---- hypothesis properties ---------------------------------------------------------------------


@isa_param
@given(problem=problems())
def test_kernel_matches_reference_on_random_problems(isa, problem):
    q, k, v, mask, causal = problem
    got = kernel(q, k, v, mask, isa, causal=causal)
    want = reference(q, k, v, mask, causal=causal)
    assert got.shape == want.shape == (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@isa_param
@given(problem=problems())
def test_grouped_heads_equal_repeated_key_value_heads(isa, problem):
    """H != Hk: query head h reads key/value head h // (H / Hk), exactly as if K and V were repeated."""
    q, k, v, mask, causal = problem
    g = q.shape[1] // k.shape[1]
    grouped = kernel(q, k, v, mask, isa, causal=causal)
    repeated = kernel(q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1), mask, isa, causal=causal)
    np.testing.assert_array_equal(grouped, repeated)


@given(problem=problems(), eps=st.sampled_from([0.0, 1e-8, 1e-6, 1.0]))
def test_reference_is_the_authors_naive_attention(problem, eps):
    q, k, v, _, causal = problem
    if q.size == 0 or k.size == 0 or (causal and q.shape[2] > k.shape[2]):
        return  # their causal mask slices tril(ones(Tk, Tk)) from row Tk - Tq: it needs Tq <= Tk
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        want = authors_naive(q, k, v, bool(causal), eps)
    # their formula gives NaN for a row that sees no key (x - m = -inf - -inf); ours gives 0
    sees_nothing = np.isnan(want).all(axis=-1, keepdims=True)
    got = reference(q, k, v, causal=causal, eps=eps)
    np.testing.assert_allclose(got, np.where(sees_nothing, 0.0, want), rtol=1e-9, atol=1e-12)


# ---- the online rescaling ------------------------------------------------------------------------


@isa_param
@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e3])
def test_late_large_score_rescales_the_running_sums(isa, eps):
    """Keys 0..299 score ~1, key 300 (third 128-key block) scores ~60 and key 500 ~90: the kernel's
    running scale 2^-R grows twice mid-row, rescaling l and o computed at the old scale; eps joins
    at the end as eps e^(m - R ln2). A wrong rescale or eps scaling shows as a relative error ~1."""
    rng = np.random.default_rng(3)
    d, tk = 16, 600
    q = np.zeros((1, 1, 4, d), np.float32)
    q[..., 0] = 4.0
    k = (rng.standard_normal((1, 1, tk, d)) * 0.2).astype(np.float32)
    k[0, 0, 300, 0], k[0, 0, 500, 0] = 60.0, 90.0
    q[0, 0, 1, 0] = 1.0  # scores ~15 and ~22 on those keys: R moves once
    q[0, 0, 2, 0] = -4.0  # large negative: all weights tiny or 0
    v = rng.standard_normal((1, 1, tk, 8)).astype(np.float32)
    got, want = kernel(q, k, v, isa=isa, eps=eps), reference(q, k, v, eps=eps)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    # eps matters here: with eps = 1e3 the outputs of the ~15-score row shrink
    if eps == 1e3:
        assert not np.allclose(want[0, 0, 3], reference(q, k, v, eps=0.0)[0, 0, 3], rtol=1e-3)


@isa_param
@pytest.mark.parametrize("layout", ["padding", "per_row", "key_scalar"])
def test_key_blocks_the_mask_hides_everywhere_are_skipped_exactly(isa, layout):
    """Key blocks (128 keys) whose Mask is -inf for every row of a tile are skipped by the kernel: the result must
    equal the reference, also where only some rows hide a block (per_row) and for a Mask with one value per row
    (key_scalar, [B, H, Tq, 1]: a row of -inf hides every block)."""
    rng = np.random.default_rng(11)
    tq, tk = 100, 400
    q, k = (rng.standard_normal((1, 2, t, 16)).astype(np.float32) for t in (tq, tk))
    v = rng.standard_normal((1, 2, tk, 6)).astype(np.float32)
    if layout == "padding":  # keys 150.. hidden: block 1 partly, blocks 2 and 3 entirely
        mask = np.where(np.arange(tk) < 150, 0.0, -np.inf).astype(np.float32).reshape(1, 1, 1, tk)
    elif layout == "per_row":  # rows < 60 hide keys >= 128; the others see everything
        mask = np.zeros((1, 2, tq, tk), np.float32)
        mask[:, :, :60, 128:] = -np.inf
    else:
        mask = np.where(rng.random((1, 2, tq, 1)) < 0.3, -np.inf, 0.5).astype(np.float32)
    got, want = kernel(q, k, v, mask, isa=isa), reference(q, k, v, mask)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@isa_param
@pytest.mark.parametrize("dv", [8, 24, 64, 72])
@pytest.mark.parametrize("mode", ["none", "padding", "causal"])
def test_full_key_blocks_sum_p_v_over_nonzero_numerators_only(isa, dv, mode):
    """The vector kernels may form P V of a full 128-key block over P's nonzero entries only (P is 0 wherever
    a score is <= 0: about half of them here), with Dv = 1..8 vectors of outputs per row in registers (8, 24,
    64; 72 exceeds that on AVX2 and takes the GEMM). Two full blocks and a tail, rows whose scores are all
    negative, all positive, and mixed: every row must match the reference as the dense GEMM does."""
    rng = np.random.default_rng(17)
    tq, tk, d = 50, 300, 32
    q = rng.standard_normal((1, 2, tq, d)).astype(np.float32)
    k = rng.standard_normal((1, 2, tk, d)).astype(np.float32)
    k[..., 0] = np.abs(k[..., 0]) + 2.0  # feature 0 pushes a row's scores by its sign
    q[:, :, 0, 0], q[:, :, 1, 0] = -20.0, 20.0  # row 0: no positive score; row 1: every score positive
    v = rng.standard_normal((1, 2, tk, dv)).astype(np.float32)
    mask = None
    if mode == "padding":
        mask = np.where(np.arange(tk) < 220, 0.0, -np.inf).astype(np.float32).reshape(1, 1, 1, tk)
    causal = int(mode == "causal")
    got, want = kernel(q, k, v, mask, isa=isa, causal=causal), reference(q, k, v, mask, causal=causal)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    if mode != "causal":
        assert np.all(got[0, :, 0] == 0.0)


@isa_param
def test_zero_output_where_no_score_is_positive(isa):
    rng = np.random.default_rng(4)
    q = -np.abs(rng.standard_normal((1, 2, 9, 8))).astype(np.float32)
    k = np.abs(rng.standard_normal((1, 2, 70, 8))).astype(np.float32)
    v = rng.standard_normal((1, 2, 70, 5)).astype(np.float32)
    assert np.all(kernel(q, k, v, isa=isa) == 0.0)


@isa_param
def test_causal_rows_that_see_no_key_are_zero_and_the_rest_see_bottom_right(isa):
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 1, 40, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, 9, 8)).astype(np.float32)
    v = rng.standard_normal((1, 1, 9, 4)).astype(np.float32)
    got = kernel(q, k, v, isa=isa, causal=1)
    assert np.all(got[0, 0, :31] == 0.0)  # query t sees keys <= t + 9 - 40 < 0
    # row 31 sees key 0 only: weight of one key
    np.testing.assert_allclose(got[0, 0, 31:], reference(q, k, v, causal=1)[0, 0, 31:], rtol=RTOL, atol=ATOL)
    # and changing hidden keys' values never changes a row that cannot see them
    v2 = v.copy()
    v2[0, 0, 5:] += 100.0
    np.testing.assert_array_equal(kernel(q, k, v2, isa=isa, causal=1)[0, 0, :36], got[0, 0, :36])


# ---- memory: never the [Tq, Tk] matrix ----------------------------------------------------------

_PEAK = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from softdeploy.ops import REGISTRY, Sample
    from softdeploy.runtime import Session
    def hwm_kb():  # VmHWM: this process's peak RSS (ru_maxrss would carry the parent's peak over fork)
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    op = REGISTRY["SoftpickAttention"]
    tiny = np.zeros((1, 1, 1, 1), np.float32)
    sess = Session(op.make_model(Sample("s", (tiny, tiny, tiny), {"causal": int(sys.argv[2])})), kernels="native")
    rng = np.random.default_rng(0)
    small = [rng.standard_normal((1, 1, 64, 16)).astype(np.float32) for _ in range(3)]
    sess.run(dict(zip("QKV", small)))
    t = int(sys.argv[1])
    big = [rng.standard_normal((1, 1, t, 16)).astype(np.float32) for _ in range(3)]
    before = hwm_kb()
    sess.run(dict(zip("QKV", big)))
    after = hwm_kb()
    print(json.dumps({"growth_kb": after - before}))
    """
)


@pytest.mark.parametrize("causal", [0, 1])
def test_peak_memory_does_not_hold_the_score_matrix(causal):
    """T = 8192, one head: the [T, T] float32 scores would be 256 MB; the kernel's extra memory is
    O(T (D + Dv)) (packed K, output) plus per-task tiles: a few MB."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, "8192", str(causal)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    growth_mb = json.loads(out.stdout.strip().splitlines()[-1])["growth_kb"] / 1024
    assert growth_mb < 32, f"peak RSS grew {growth_mb:.0f} MB at T = 8192 (the score matrix is 256 MB)"
