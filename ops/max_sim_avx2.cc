// MaxSim / SignedMaxSim tiles for AVX2 + FMA (and AVX-VNNI where the CPU has it). This translation
// unit is compiled with -mavx2 -mfma -ffp-contract=off (CMakeLists.txt) and only ever called after
// the run-time check in ops/max_sim_core.h; it includes no onnxruntime and no std containers (see
// ops/common/vec.h on why).
//
// int8 without VNNI (Zen 1-3, Intel before Alder Lake): Q and D as int16 pairs and vpmaddwd, whose
// two int16 x int16 products and their sum are exact in int32 for any int8 values. vpmaddubsw
// (u8 x s8 -> saturating int16 pair sums) is not used: with Q + 128 in u8 a pair reaches
// 2 * 255 * 128 = 65280 > 32767 and saturates, and the sign-transfer form (|q| x sign(q) * d) is
// exact only without -128 yet costs the same three p0/p1 uops per 32 products as vpmaddwd's two.
// Measured on Golden Cove (bench/micro/maxsim_i8_forms.cc; bench/results/maxsim.md): every form exact
// for all int8 runs 1.2-1.4x our float32 tile, as this one does; the plain vpmaddubsw form, exact
// only for D in [-64, 63], 1.8x.
// D is widened to int16 once per document (into L1/L2 scratch), so the inner loop broadcasts an
// int16 pair straight from memory.
//
// Documents whose every entry lies in [-64, 63] (7-bit codes: quantize_tokens(bits=7), the default where the CPU
// has no VNNI) take the vpmaddubsw form instead, exact there: the document as u8 = D + 64 in [0, 127] (checked and
// written once per document: Bias64I8Avx2), Q as s8, a pair at most 2 * 127 * 128 = 32512, so vpmaddubsw never
// saturates; vpmaddwd with ones sums two pairs into int32, and the bias 64 * sum_k Q[i, k] (per query lane,
// once per call) comes off the start of the sums. Zen 4, R = 4: 2.06x our float32 tile in the probe (the
// vpmaddwd tile: 1.37x); any document with an entry outside the range keeps the vpmaddwd tile.
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

struct StepUbs {  // four u8 (b: the document, D + 64) x s8 (q) products per 32-bit lane, in two steps
  static constexpr int kBlock = 4;  // 8 accumulators (R = 6 spilled: 192-211 vs 212-229 GOP/s at R = 4)
  static SD_VEC_INLINE __m256i dot(__m256i acc, __m256i q, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(b, q), _mm256_set1_epi16(1)));
  }
};

// The document as u8 = D + bias (mod 256) in rows of dim4 * 4 bytes, 0 past dim (Q is 0 there: the product is 0
// whatever the byte). kSevenBit: false as soon as a token holds an entry outside [-64, 63], checked per token so
// that an 8-bit document stops at its first one (it then takes the vpmaddwd tile).
template <bool kSevenBit>
bool BiasRows(const int8_t* d, int64_t Ld, int64_t dim, uint8_t* out, int8_t bias) {
  const int64_t row = (dim + 3) / 4 * 4;
  const __m256i vbias = _mm256_set1_epi8(bias);
  __m256i lo = _mm256_setzero_si256(), hi = lo;
  bool tail_in_range = true;
  for (int64_t j = 0; j < Ld; ++j) {
    const int8_t* src = d + j * dim;
    uint8_t* dst = out + j * row;
    int64_t k = 0;
    for (; k + 32 <= dim; k += 32) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k));
      if constexpr (kSevenBit) {
        lo = _mm256_min_epi8(lo, x);
        hi = _mm256_max_epi8(hi, x);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), _mm256_add_epi8(x, vbias));
    }
    for (; k < dim; ++k) {
      if constexpr (kSevenBit) tail_in_range &= src[k] >= -64 && src[k] <= 63;
      dst[k] = static_cast<uint8_t>(src[k] + bias);
    }
    for (; k < row; ++k) dst[k] = 0;
    if constexpr (kSevenBit) {
      const __m256i out_of_range =
          _mm256_or_si256(_mm256_cmpgt_epi8(_mm256_set1_epi8(-64), lo), _mm256_cmpgt_epi8(hi, _mm256_set1_epi8(63)));
      if (!_mm256_testz_si256(out_of_range, out_of_range) || !tail_in_range) return false;
    }
  }
  return true;
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
  // bias[l] = 64 * sum_k Q[l, k]: sum_k (D + 64) Q - bias = sum_k D Q. Padding lanes have bias 0.
  const __m256i init[2] = {V::subi(V::zeroi(), V::loadui(a.bias)), V::subi(V::zeroi(), V::loadui(a.bias + 8))};
  TileInt<V, StepUbs>(a, (a.dim + 3) / 4, init, doc, out);
}

bool Bias64I8Avx2(const int8_t* d, int64_t Ld, int64_t dim, uint8_t* out) {
  return BiasRows<true>(d, Ld, dim, out, 64);
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

void BiasI8Avx2(const int8_t* d, int64_t Ld, int64_t dim, uint8_t* out) {
  BiasRows<false>(d, Ld, dim, out, -128);  // + 128 mod 256
}

}  // namespace maxsim
}  // namespace sd
