// MaxSim / SignedMaxSim tiles for AVX2 + FMA (and AVX-VNNI where the CPU has it). This translation
// unit is compiled with -mavx2 -mfma -ffp-contract=off (CMakeLists.txt) and only ever called after
// the run-time check in ops/max_sim_core.h; it includes no onnxruntime and no std containers (see
// ops/common/vec.h on why).
//
// int8 without VNNI (Zen 1-3, Intel before Alder Lake), for any int8 values: Q and D as int16 pairs and vpmaddwd,
// whose two int16 x int16 products and their sum are exact in int32. vpmaddubsw (u8 x s8 -> saturating int16
// pair sums) cannot take every int8 input: with Q + 128 in u8 a pair reaches 2 * 255 * 128 = 65280 > 32767 and
// saturates, and the sign-transfer form (|q| x sign(q) * d) is exact only without -128 yet costs the same three
// p0/p1 uops per 32 products as vpmaddwd's two (bench/micro/maxsim_i8_forms.cc; bench/results/maxsim.md).
// D is widened to int16 once per document (into L1/L2 scratch), so the inner loop broadcasts an
// int16 pair straight from memory.
//
// Documents whose every entry lies in [-64, 63] (7-bit codes: quantize_tokens(bits=7), the default where the CPU
// has no VNNI) take the vpmaddubsw form instead, exact there and read in place (no per-document copy): Q is the
// unsigned side, packed once per call as u8 = Q + c, the document's raw bytes the signed side; the accumulators
// start at -c * sum_k D[j, k] (DocSums7Avx2, which also checks the range, one read of the document). Two forms:
//   TileI8Avx2Ubs   any int8 Q, c = 128: a pair at most 2 * 255 * 64 = 32640, vpmaddubsw never saturates;
//                   vpmaddwd(ones) + vpaddd take it to int32: 32 products per 2 multiply-port uops.
//   TileI8Avx2Ubs2  Q also 7-bit, c = 64: two groups' vpmaddubsw summed in int16 (four products at most
//                   4 * 127 * 64 = 32512) before one vpmaddwd(ones): 64 products per 3 multiply-port uops.
// Measured on Zen 4 against our float32 tile (bench/micro/maxsim_i8_forms.cc, hot document; bench/results/maxsim.md):
// the vpmaddwd tile 1.37-1.42x; the single-group and paired forms' bare loops 2.05x and 2.27-2.29x, these tiles
// with their per-document pass 1.70x and 2.00-2.03x; end to end (bench/maxsim.py, N = 10,000) 1.72-1.78x and
// 1.84-1.99x our float32 kernel. A query row with -128 keeps these for 7-bit documents (the single-group form) and
// the vpmaddwd tile for the others.
//
// 8-bit documents against query rows without -128 (quantize_tokens' codes) take the sign-table tile (TileI8Avx2Tab)
// instead of the vpmaddwd one: |D| (u8) x Q * sign(D) (s8, from a per-call table of Q under the 16 sign patterns of
// a 4-byte group, picked per token and group by the document's pattern; PrepTabAvx2 writes |D| and the patterns once
// per document), a pair at most 2 * 128 * 127 = 32512: 3 vector ops per 32 products (vpmaddubsw, vpmaddwd(ones),
// vpaddd) against vpmaddwd + vpaddd's 4, and no int16 copy of the document. Not for 7-bit documents: its paired
// form (two groups per int16, |sum| <= 4 * 64 * 127) has the op count of TileI8Avx2Ubs2 but loads a table row per
// token and group, and measured no faster than the single-group biased form above (bench/results/maxsim_int8_avx2.md).
// The table is 1 KiB per group per tile, so the groups run in chunks of 16 (16 KiB) with int32 partial sums between.
//
// int8 with AVX-VNNI: ops/max_sim_avxvnni.cc (its own -mavxvnni translation unit).
#include "max_sim_kernels.h"

namespace sd {
namespace maxsim {
namespace {

using V = vec::Avx2;

struct StepI16 {  // two int16 products per 32-bit lane
  // 12 accumulators + 2 Q + broadcast + the product's temporary = all 16 ymm (vpmaddwd does not
  // accumulate); GCC keeps them in registers only with -fno-tree-pre (CMakeLists.txt).
  static constexpr int kBlock = 6;
  static SD_VEC_INLINE __m256i dot(__m256i acc, __m256i q, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(q, b));
  }
};

// A block of R document tokens, read in place (s8, every entry in [-64, 63]), against the tile's two vectors of
// Q + c (u8): the vpmaddubsw forms above. kPair: two 4-byte groups per int16 sum (Q in [-64, 63], c = 64);
// otherwise one (any Q, c = 128). dsum: sum_k D[j, k] of the document's tokens.
template <int R, bool kPair, bool kDeferred>
SD_VEC_INLINE void BlockUbs(const uint8_t* qp, const int8_t* d, int64_t dim, int64_t j0, const int32_t* dsum,
                            const Doc& doc, State<V>& st) {
  constexpr int L = V::kLanes;
  constexpr int32_t kC = kPair ? 64 : 128;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_set1_epi32(-kC * dsum[j0 + r]);
  const int8_t* drow = d + j0 * dim;
  auto one = [&](const __m256i& q, const __m256i& b) { return _mm256_madd_epi16(_mm256_maddubs_epi16(q, b), ones); };
  const int64_t full = dim / 4;  // whole 4-byte groups of a row
  // The same block of the NEXT document goes to L2 while this one computes (R * 4 bytes per group covers the
  // block in `full` groups), so that DocSums7Avx2 then finds it there; prefetches never fault past the end.
  const char* next = reinterpret_cast<const char*>(drow + doc.stride);
  int64_t g = 0;
  if constexpr (kPair) {
    for (; g + 2 <= full; g += 2) {
      _mm_prefetch(next + g * (R * 4), _MM_HINT_T1);
      const __m256i q00 = V::loadi(qp + g * 8 * L), q01 = V::loadi(qp + g * 8 * L + 4 * L);
      const __m256i q10 = V::loadi(qp + g * 8 * L + 8 * L), q11 = V::loadi(qp + g * 8 * L + 12 * L);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i b0 = V::broadcast4(drow + r * dim + g * 4), b1 = V::broadcast4(drow + r * dim + g * 4 + 4);
        const __m256i s0 = _mm256_add_epi16(_mm256_maddubs_epi16(q00, b0), _mm256_maddubs_epi16(q10, b1));
        const __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(q01, b0), _mm256_maddubs_epi16(q11, b1));
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(s0, ones));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(s1, ones));
      }
    }
  }
  for (; g < full; ++g) {
    _mm_prefetch(next + g * (R * 4), _MM_HINT_T1);
    const __m256i q0 = V::loadi(qp + g * 8 * L), q1 = V::loadi(qp + g * 8 * L + 4 * L);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i b = V::broadcast4(drow + r * dim + g * 4);
      acc[r][0] = _mm256_add_epi32(acc[r][0], one(q0, b));
      acc[r][1] = _mm256_add_epi32(acc[r][1], one(q1, b));
    }
  }
  if (full * 4 < dim) {  // the last 1..3 k: the missing D bytes read as 0
    const __m256i q0 = V::loadi(qp + full * 8 * L), q1 = V::loadi(qp + full * 8 * L + 4 * L);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t w = 0;
      std::memcpy(&w, drow + r * dim + full * 4, static_cast<size_t>(dim - full * 4));
      const __m256i b = _mm256_set1_epi32(w);
      acc[r][0] = _mm256_add_epi32(acc[r][0], one(q0, b));
      acc[r][1] = _mm256_add_epi32(acc[r][1], one(q1, b));
    }
  }
  __m256 facc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) facc[r][0] = V::cvt(acc[r][0]), facc[r][1] = V::cvt(acc[r][1]);
  if constexpr (kDeferred) FoldDeferred<V, R>(facc, j0, doc, st);
  else Fold<V, R, false>(facc, j0, doc, st);
}

// The sign-table form: Q without -128 against a block of R document tokens prepared by PrepTabAvx2 as |D| (u8) and,
// per 4-byte group, the pattern of its four signs. |D| is vpmaddubsw's unsigned side and Q * sign(D) its signed
// side, loaded from the tile's table of Q under each of the 16 sign patterns of a group (qp: [dim4][16][lanes][4]
// s8, built once per call; the pattern bytes are pattern * 16, so a table row is qp + g * 16 * 64 + byte * 4).
// Exact for any document: |pair| <= 2 * 128 * 127 = 32512, widened by vpmaddwd(ones) per group; no bias.
// Groups [g0, g1) of a block: the accumulators start at 0 (first) or at the partial sums of the previous groups and
// end folded into the running max (last) or stored back as partial sums (see TileTab on why the groups are split).
template <int R, bool kDeferred>
SD_VEC_INLINE void BlockTab(const uint8_t* qp, const uint8_t* absd, const uint8_t* pat, int64_t dim4, int64_t g0,
                            int64_t g1, bool first, bool last, int32_t* partial, int64_t j0, const Doc& doc,
                            State<V>& st) {
  constexpr int64_t kRow = 16 * 64;  // table bytes per group: 16 patterns x 16 lanes x 4 bytes
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][2];
  int32_t* part = partial + j0 * 16;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    acc[r][0] = first ? V::zeroi() : V::loadi(part + r * 16);
    acc[r][1] = first ? V::zeroi() : V::loadi(part + r * 16 + 8);
  }
  const uint8_t* arow = absd + j0 * dim4 * 4;
  const uint8_t* prow = pat + j0 * dim4;
  auto row = [&](int r, int64_t g) { return qp + g * kRow + int64_t{prow[r * dim4 + g]} * 4; };
  for (int64_t g = g0; g < g1; ++g) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i b = V::broadcast4(arow + r * dim4 * 4 + g * 4);
      const uint8_t* t = row(r, g);
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(b, V::loadi(t)), ones));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(b, V::loadi(t + 32)), ones));
    }
  }
  if (!last) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(part + r * 16), acc[r][0]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(part + r * 16 + 8), acc[r][1]);
    }
    return;
  }
  __m256 facc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) facc[r][0] = V::cvt(acc[r][0]), facc[r][1] = V::cvt(acc[r][1]);
  if constexpr (kDeferred) FoldDeferred<V, R>(facc, j0, doc, st);
  else Fold<V, R, false>(facc, j0, doc, st);
}

template <int R, bool kDeferred>
SD_VEC_INLINE void TailTab(int64_t rem, const uint8_t* qp, const uint8_t* absd, const uint8_t* pat, int64_t dim4,
                           int64_t g0, int64_t g1, bool first, bool last, int32_t* partial, int64_t j0, const Doc& doc,
                           State<V>& st) {
  if constexpr (R > 0) {
    if (rem == R) BlockTab<R, kDeferred>(qp, absd, pat, dim4, g0, g1, first, last, partial, j0, doc, st);
    else TailTab<R - 1, kDeferred>(rem, qp, absd, pat, dim4, g0, g1, first, last, partial, j0, doc, st);
  }
}

// The table is 1 KiB per group (16 KiB per 64 dimensions), loaded at random by pattern: past 64 dimensions it
// leaves L1 (Zen 4 under the avx2 variant: 8-bit documents at dim 64 ran 1.48x onnxruntime's int8, at dim 128
// 1.10x before the split), so the groups run in chunks of kChunk, every token of the document per chunk, the int32
// partial sums kept in doc-sized scratch between chunks (exact: the same integer sums, regrouped).
template <int R, bool kDeferred>
void TileTab(const TileArgs& a, const Doc& doc, TileResult* out) {
  constexpr int64_t kChunk = 16;  // groups per chunk: 16 KiB of table (8: no faster, bench/results/maxsim_int8_avx2.md)
  State<V> st;
  Init(st, doc, a);
  const uint8_t* qp = static_cast<const uint8_t*>(a.qp);
  const uint8_t* absd = static_cast<const uint8_t*>(doc.data);
  const int64_t dim4 = (a.dim + 3) / 4;
  const uint8_t* pat = absd + a.Ld * dim4 * 4;
  int32_t* partial = TabPartials(absd, a.Ld, dim4);
  const int64_t chunks = dim4 > kChunk ? (dim4 + kChunk - 1) / kChunk : 1;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t g0 = c * kChunk, g1 = c + 1 == chunks ? dim4 : g0 + kChunk;
    const bool first = c == 0, last = c + 1 == chunks;
    int64_t j = 0;
    for (; j + R <= a.Ld; j += R) BlockTab<R, kDeferred>(qp, absd, pat, dim4, g0, g1, first, last, partial, j, doc, st);
    TailTab<R - 1, kDeferred>(a.Ld - j, qp, absd, pat, dim4, g0, g1, first, last, partial, j, doc, st);
  }
  if constexpr (kDeferred) FinishDeferred(st);
  Store(st, out);
}

template <int R, bool kPair, bool kDeferred>
SD_VEC_INLINE void TailUbs(int64_t rem, const uint8_t* qp, const int8_t* d, int64_t dim, int64_t j0, const int32_t* dsum,
                           const Doc& doc, State<V>& st) {
  if constexpr (R > 0) {
    if (rem == R) BlockUbs<R, kPair, kDeferred>(qp, d, dim, j0, dsum, doc, st);
    else TailUbs<R - 1, kPair, kDeferred>(rem, qp, d, dim, j0, dsum, doc, st);
  }
}

// R: 4 tokens for the single-group form (8 accumulators; R = 6 spilled), 3 for the paired one (6 accumulators +
// 4 Q vectors + 2 broadcasts + ones + the int16 sums: R = 4 spills, 1.97 vs 2.3x in the probe).
template <int R, bool kPair, bool kDeferred>
void TileUbs(const TileArgs& a, const Doc& doc, TileResult* out) {
  State<V> st;
  Init(st, doc, a);
  const uint8_t* qp = static_cast<const uint8_t*>(a.qp);
  const int8_t* d = static_cast<const int8_t*>(doc.data);
  int64_t j = 0;
  for (; j + R <= a.Ld; j += R) BlockUbs<R, kPair, kDeferred>(qp, d, a.dim, j, a.bias, doc, st);
  TailUbs<R - 1, kPair, kDeferred>(a.Ld - j, qp, d, a.dim, j, a.bias, doc, st);
  if constexpr (kDeferred) FinishDeferred(st);
  Store(st, out);
}

}  // namespace

void TileF32Avx2(const TileArgs& a, bool argmax, const Doc& doc, TileResult* out) {
  if (argmax) TileF32<V, true>(a, doc, out);
  else TileF32<V, false>(a, doc, out);
}

void TileI8Avx2I16(const TileArgs& a, const Doc& doc, TileResult* out) {
  const __m256i init[2] = {V::zeroi(), V::zeroi()};
  TileInt<V, StepI16>(a, (a.dim + 1) / 2, init, doc, out);
}

void TileI8Avx2Ubs(const TileArgs& a, const Doc& doc, TileResult* out) {
  if (Deferred(a, doc)) TileUbs<4, false, true>(a, doc, out);
  else TileUbs<4, false, false>(a, doc, out);
}

void TileI8Avx2Tab(const TileArgs& a, const Doc& doc, TileResult* out) {
  constexpr int R = 3;  // 6 accumulators; 4 was no faster (bench/results/maxsim_int8_avx2.md)
  if (Deferred(a, doc)) TileTab<R, true>(a, doc, out);
  else TileTab<R, false>(a, doc, out);
}

// The document as the sign-table tile reads it: |D| in rows of dim4 * 4 bytes (0 past dim), then per token and
// group the pattern of its signs (bit c: D[4g + c] < 0) times 16.
void PrepTabAvx2(const int8_t* d, int64_t Ld, int64_t dim, uint8_t* out) {
  const int64_t dim4 = (dim + 3) / 4;
  uint8_t* pat = out + Ld * dim4 * 4;
  for (int64_t j = 0; j < Ld; ++j) {
    const int8_t* src = d + j * dim;
    uint8_t* a = out + j * dim4 * 4;
    uint8_t* p = pat + j * dim4;
    int64_t k = 0;
    for (; k + 32 <= dim; k += 32) {
      // the next document to L2 while this one computes (the sign-table tile reads only the prepared copy)
      _mm_prefetch(reinterpret_cast<const char*>(src + Ld * dim + k), _MM_HINT_T1);
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + k), _mm256_abs_epi8(x));
      // the 32 sign bits, nibble i (group i) spread to byte i, times 16
      uint64_t t = static_cast<uint32_t>(_mm256_movemask_epi8(x));
      t = (t | (t << 16)) & 0x0000FFFF0000FFFFull;
      t = (t | (t << 8)) & 0x00FF00FF00FF00FFull;
      t = (t | (t << 4)) & 0x0F0F0F0F0F0F0F0Full;
      t <<= 4;
      std::memcpy(p + k / 4, &t, 8);
    }
    for (; k < dim4 * 4; k += 4) {  // the last groups, the missing bytes 0 (positive)
      unsigned bits = 0;
      for (int c = 0; c < 4; ++c) {
        const int8_t v = k + c < dim ? src[k + c] : int8_t{0};
        a[k + c] = static_cast<uint8_t>(v < 0 ? -int32_t{v} : v);  // |-128| = 128
        bits |= static_cast<unsigned>(v < 0) << c;
      }
      p[k / 4] = static_cast<uint8_t>(bits << 4);
    }
  }
}

void TileI8Avx2Ubs2(const TileArgs& a, const Doc& doc, TileResult* out) {
  if (Deferred(a, doc)) TileUbs<3, true, true>(a, doc, out);
  else TileUbs<3, true, false>(a, doc, out);
}

// One read of the document: per token the sum of its entries and whether all lie in [-64, 63], i.e. whether every
// x + 64 has its top bit clear (then sadbw of x + 64 against 0 counts sum + 64 per byte); checked per token so that
// an 8-bit document stops at its first one (it takes the vpmaddwd tile). Four ops per 32 bytes: this pass costs
// ~9% of a 7-bit call at N = 10,000 (perf) with the eight of a separate min / max check.
bool DocSums7Avx2(const int8_t* d, int64_t Ld, int64_t dim, int32_t* out) {
  const __m256i bias = _mm256_set1_epi8(64), zero = _mm256_setzero_si256();
  for (int64_t j = 0; j < Ld; ++j) {
    const int8_t* src = d + j * dim;
    __m256i sum = zero, top = zero;
    int64_t k = 0;
    for (; k + 32 <= dim; k += 32) {
      const __m256i x = _mm256_add_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k)), bias);
      top = _mm256_or_si256(top, x);
      sum = _mm256_add_epi64(sum, _mm256_sad_epu8(x, zero));
    }
    bool in_range = _mm256_movemask_epi8(top) == 0;
    const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    int64_t total = _mm_cvtsi128_si64(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2))) - 64 * k;
    for (; k < dim; ++k) {
      in_range &= src[k] >= -64 && src[k] <= 63;
      total += src[k];
    }
    if (!in_range) return false;
    out[j] = static_cast<int32_t>(total);
  }
  return true;
}

void WidenI8Avx2(const int8_t* d, int64_t Ld, int64_t dim, int16_t* out) {
  const int64_t row = (dim + 1) / 2 * 2;
  for (int64_t j = 0; j < Ld; ++j) {
    const int8_t* src = d + j * dim;
    int16_t* dst = out + j * row;
    int64_t k = 0;
    for (; k + 16 <= dim; k += 16) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), _mm256_cvtepi8_epi16(x));
    }
    for (; k < dim; ++k) dst[k] = src[k];
    for (; k < row; ++k) dst[k] = 0;  // the odd k's partner: 0 x q adds nothing
  }
}

// (Here, not in ops/max_sim_core.h: no onnxruntime type, so the size-sweep tester links the same code.)
__attribute__((target("f16c"))) void WidenF16Avx2(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  }
  for (; i < n; ++i) y[i] = _cvtsh_ss(x[i]);
}

// The document as u8 = D + 128 (mod 256) in rows of dim4 * 4 bytes, 0 past dim (Q is 0 there: the product is 0
// whatever the byte).
void BiasI8Avx2(const int8_t* d, int64_t Ld, int64_t dim, uint8_t* out) {
  const int64_t row = (dim + 3) / 4 * 4;
  const __m256i vbias = _mm256_set1_epi8(-128);
  for (int64_t j = 0; j < Ld; ++j) {
    const int8_t* src = d + j * dim;
    uint8_t* dst = out + j * row;
    int64_t k = 0;
    for (; k + 32 <= dim; k += 32) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), _mm256_add_epi8(x, vbias));
    }
    for (; k < dim; ++k) dst[k] = static_cast<uint8_t>(src[k] + 128);
    for (; k < row; ++k) dst[k] = 0;
  }
}

}  // namespace maxsim
}  // namespace sd
