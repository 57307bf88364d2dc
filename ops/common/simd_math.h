// Vectorised exp building blocks shared by the softmax-family kernels, and the lane masks and
// horizontal reductions every kernel's tails need (one definition here, not one per kernel).
//
// Both follow XNNPACK's f32 exp kernels (see shared notes/algorithms.md section 2):
//   n = round_to_nearest_even(x * log2(e))            (kept in float: no exponent-range overflow)
//   t = x - n*ln2_hi - n*ln2_lo                       (Cody-Waite range reduction, |t| <= ln2/2)
//   m = 1 + t*(c1 + t*(c2 + t*(c3 + t*(c4 + t*c5))))  (degree-5 minimax polynomial, m in [0.7, 1.42])
// so that exp(x) = m * 2^n. "ExtExp" stops there and returns the (m, n) pair -- the trick of the
// two-pass softmax; Exp multiplies back by 2^n.
//
// What must stay true: -inf maps to exactly 0 (masks); +inf and NaN propagate as non-finite values so
// the callers' NaN checks see them.
//
// Range of ExtExp (float reduction): accurate while |x log2(e)| < 2^22 (|x| < ~2.9e6). Beyond, the
// rounded product makes n miss round(x / ln2) by up to ulp/2, so |t| exceeds ln2/2 and the polynomial
// leaves its interval (relative error 1e-5 at |x| ~ 3e6, 1e-1 at 5.6e7; for |x| >~ 1e9 m can be
// negative), and for |x| > 2.36e38 x log2(e) overflows: inf - inf = NaN. A caller that can see such
// |x| must reduce in double or clamp first (MultiMax does the former: ops/multi_max.cc).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/cpu.h"

namespace sd::simd {

constexpr float kLog2e = 0x1.715476p+0f;
constexpr float kMinusLn2Hi = -0x1.62E43p-1f;
constexpr float kMinusLn2Lo = 0x1.05C61p-29f;
constexpr float kC1 = 0x1.FFFFF6p-1f;
constexpr float kC2 = 0x1.FFFDC6p-2f;
constexpr float kC3 = 0x1.555A80p-3f;
constexpr float kC4 = 0x1.573A1Ap-5f;
constexpr float kC5 = 0x1.0F9F9Cp-7f;
// Exponent used for exp(-inf) = 0 * 2^kNoExponent: finite, so differences of exponents stay finite.
constexpr float kNoExponent = -FLT_MAX;

// ---- scalar (portable variants and tails) -------------------------------------------------------
// Internal linkage: per-ISA translation units may call these too (see ops/common/vec.h on why).
namespace {

inline float Poly5(float t) {
  float p = kC5;
  p = std::fma(p, t, kC4);
  p = std::fma(p, t, kC3);
  p = std::fma(p, t, kC2);
  p = std::fma(p, t, kC1);
  return std::fma(p, t, 1.0f);
}

// exp(x) = *m * 2^(*n).
inline void ExtExp(float x, float* m, float* n) {
  if (x == -INFINITY) {
    *m = 0.0f;
    *n = kNoExponent;
    return;
  }
  const float nn = std::nearbyint(x * kLog2e);
  float t = std::fma(nn, kMinusLn2Hi, x);
  t = std::fma(nn, kMinusLn2Lo, t);
  *m = Poly5(t);
  *n = nn;
}

// v * 2^e for an integer-valued e (clamped to the float range so that ldexp's int argument is safe).
inline float Scale2(float v, float e) {
  if (std::isnan(e)) return NAN;
  if (e < -300.0f) return v * 0.0f;
  if (e > 300.0f) return v * INFINITY;
  return std::ldexp(v, static_cast<int>(e));
}

// ---- AVX-512 ----------------------------------------------------------------------------------

// The first min(left, 16) lanes (left >= 0): the mask of a row's last, partial vector.
SD_TARGET_AVX512 inline __mmask16 TailMask16(int64_t left) {
  return static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
}

SD_TARGET_AVX512 inline void ExtExp(__m512 x, __m512* m, __m512* n) {
  const __m512 nn = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 t = _mm512_fmadd_ps(nn, _mm512_set1_ps(kMinusLn2Hi), x);
  t = _mm512_fmadd_ps(nn, _mm512_set1_ps(kMinusLn2Lo), t);
  __m512 p = _mm512_set1_ps(kC5);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kC4));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kC3));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kC2));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kC1));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
  const __mmask16 neg_inf = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
  *m = _mm512_mask_blend_ps(neg_inf, p, _mm512_setzero_ps());
  *n = _mm512_mask_blend_ps(neg_inf, nn, _mm512_set1_ps(kNoExponent));
}

// exp(x); exact 0 below the float range, -inf -> 0, +inf -> +inf, NaN -> NaN.
SD_TARGET_AVX512 inline __m512 Exp(__m512 x) {
  // Clamp so that n stays small enough for scalef; exp(-104) is already 0 in float.
  const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  __m512 m, n;
  ExtExp(xc, &m, &n);
  __m512 y = _mm512_scalef_ps(m, n);
  // max_ps(NaN, c) returns c, so re-inject NaN inputs; -inf was clamped to -104 -> 0 already.
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// ---- AVX2 -------------------------------------------------------------------------------------

// The first min(left, 8) lanes (left >= 0) as an all-ones/zero lane mask, for maskload/maskstore
// (as __m256i) and blendv/and (cast to __m256).
SD_TARGET_AVX2 inline __m256i TailMask8(int64_t left) {
  const int count = static_cast<int>(std::min<int64_t>(left, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

SD_TARGET_AVX2 inline float ReduceMax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

SD_TARGET_AVX2 inline float ReduceAdd8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 2^e for integer-valued e <= 0 (AVX2 has no scalef): e below -126 flushes to 0, as in XNNPACK's
// AVX2 kernels. Values 2^e with e > 0 never occur in the callers (exponents are relative to a max).
SD_TARGET_AVX2 inline __m256 Exp2NonPositive(__m256 e) {
  const __m256 ec = _mm256_max_ps(e, _mm256_set1_ps(-127.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_add_ps(ec, _mm256_set1_ps(127.0f))), 23);
  return _mm256_castsi256_ps(bits);
}

SD_TARGET_AVX2 inline void ExtExp(__m256 x, __m256* m, __m256* n) {
  const __m256 nn = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 t = _mm256_fmadd_ps(nn, _mm256_set1_ps(kMinusLn2Hi), x);
  t = _mm256_fmadd_ps(nn, _mm256_set1_ps(kMinusLn2Lo), t);
  __m256 p = _mm256_set1_ps(kC5);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kC1));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f));
  const __m256 neg_inf = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
  *m = _mm256_blendv_ps(p, _mm256_setzero_ps(), neg_inf);
  *n = _mm256_blendv_ps(nn, _mm256_set1_ps(kNoExponent), neg_inf);
}

// exp(x) for x <= 0 (the "x - max" of softmax): below -87.3 (the float normal range) it flushes to
// 0; NaN propagates. Inputs > 0 are not supported (2^n with n > 0 is not formed).
SD_TARGET_AVX2 inline __m256 ExpNonPositive(__m256 x) {
  const __m256 xc = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
  __m256 m, n;
  ExtExp(xc, &m, &n);
  const __m256 y = _mm256_mul_ps(m, Exp2NonPositive(n));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

}  // namespace
}  // namespace sd::simd
