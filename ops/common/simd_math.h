// The exp polynomial shared by the softmax-family and attention kernels, one definition: its constants, the
// scalar forms (portable variants and tails) and the vector forms over the traits of ops/common/vec.h.
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
//
// GELU (erf form), for epilogues: gelu(v) = h + h * erf(v / sqrt(2)), h = 0.5 v, with erf the rational
// approximation of Eigen's and XLA's float32 erf (x clamped to [-4, 4], x P(x^2) / Q(x^2), P of degree 6 and
// Q of degree 4 in x^2; Q < 0 everywhere, so no division by 0): |erf error| <= 3.4e-7 over all floats and
// |gelu error| <= 2.0e-7 |v| (measured against float64 erf on a 2e6-point grid of [-6, 6]; the clamp is exact
// past it); past |v| = 5.66 it returns v or -0 (kGeluTail). The scalar and vector forms run the same float32
// operations (fma where fma), so they give the same bits; max(x, c) and min(x, c) are written as the vector
// instructions behave (a NaN x gives c), and a NaN v still gives NaN through h.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/vec.h"

namespace sd::simd {

constexpr float kLog2e = 0x1.715476p+0f;
constexpr float kMinusLn2Hi = -0x1.62E43p-1f;
constexpr float kMinusLn2Lo = 0x1.05C61p-29f;
constexpr float kC1 = 0x1.FFFFF6p-1f;
constexpr float kC2 = 0x1.FFFDC6p-2f;
constexpr float kC3 = 0x1.555A80p-3f;
constexpr float kC4 = 0x1.573A1Ap-5f;
constexpr float kC5 = 0x1.0F9F9Cp-7f;
// erf's rational approximation: erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (highest coefficient first).
constexpr float kErfAlpha[7] = {-2.72614225801306e-10f, 2.77068142495902e-08f,  -2.10102402082508e-06f,
                                -5.69250639462346e-05f, -7.34990630326855e-04f, -2.95459980854025e-03f,
                                -1.60960333262415e-02f};
constexpr float kErfBeta[5] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f,
                               -7.37332916720468e-03f, -1.42647390514189e-02f};
constexpr float kErfClamp = 4.0f;
constexpr float kRsqrt2 = 0x1.6a09e6p-1f;  // 1 / sqrt(2) rounded to float32
// Past |v| = 5.66, 1 -+ erf(v / sqrt(2)) < 1.6e-8: gelu(v) is v (v > 5.66) or within 4.4e-8 of -0 (v < -5.66), which
// GeluErf returns, exactly and with no inf * 0 at +-inf.
constexpr float kGeluTail = 5.66f;
// Exponent used for exp(-inf) = 0 * 2^kNoExponent: finite, so differences of exponents stay finite.
constexpr float kNoExponent = -FLT_MAX;

// ---- scalar (portable variants and tails) -------------------------------------------------------
// Internal linkage: per-ISA translation units call these too (see ops/common/vec.h on why).
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

// erf(x) by the rational approximation above.
inline float Erf(float x) {
  float t = x > -kErfClamp ? x : -kErfClamp;  // as vmaxps / vminps: a NaN x gives the constant
  t = t < kErfClamp ? t : kErfClamp;
  const float t2 = t * t;
  float p = kErfAlpha[0];
  for (int i = 1; i < 7; ++i) p = std::fma(t2, p, kErfAlpha[i]);
  p = t * p;
  float q = kErfBeta[0];
  for (int i = 1; i < 5; ++i) q = std::fma(t2, q, kErfBeta[i]);
  return p / q;
}

// gelu(v) = h + h erf(v / sqrt(2)), h = v / 2 (one fma: no separate 1 + erf rounding); v or -0 past the tails.
inline float GeluErf(float v) {
  const float h = 0.5f * v;
  const float g = std::fma(h, Erf(v * kRsqrt2), h);
  return v > kGeluTail ? v : (-kGeluTail > v ? -0.0f : g);  // NaN: g (NaN through h)
}

// ---- vectors, over the traits of ops/common/vec.h --------------------------------------------------

// Erf above, per lane.
template <class V>
SD_VEC_INLINE typename V::F Erf(typename V::F x) {
  using F = typename V::F;
  const F t = V::min(V::max(x, V::set1(-kErfClamp)), V::set1(kErfClamp));
  const F t2 = V::mul(t, t);
  F p = V::set1(kErfAlpha[0]);
  for (int i = 1; i < 7; ++i) p = V::fma(t2, p, V::set1(kErfAlpha[i]));
  p = V::mul(t, p);
  F q = V::set1(kErfBeta[0]);
  for (int i = 1; i < 5; ++i) q = V::fma(t2, q, V::set1(kErfBeta[i]));
  return V::div(p, q);
}

// GeluErf above, per lane.
template <class V>
SD_VEC_INLINE typename V::F GeluErf(typename V::F v) {
  using F = typename V::F;
  const F h = V::mul(V::set1(0.5f), v);
  const F g = V::fma(h, Erf<V>(V::mul(v, V::set1(kRsqrt2))), h);
  const F upper = V::select(V::gt(v, V::set1(kGeluTail)), g, v);  // select(m, a, b): m ? b : a
  return V::select(V::gt(V::set1(-kGeluTail), v), upper, V::set1(-0.0f));
}

// exp(t) on the reduced |t| <= ln2/2: the polynomial m above, per lane (Poly5 of the scalar forms).
template <class V>
SD_VEC_INLINE typename V::F Poly5(typename V::F t) {
  typename V::F p = V::set1(kC5);
  p = V::fma(p, t, V::set1(kC4));
  p = V::fma(p, t, V::set1(kC3));
  p = V::fma(p, t, V::set1(kC2));
  p = V::fma(p, t, V::set1(kC1));
  return V::fma(p, t, V::set1(1.0f));
}

// exp(x) = p * 2^n for finite x with |x log2(e)| < 2^22 (range above): returns p, *n_out = n. No special
// values: the callers clamp first (Exp below) or handle them.
template <class V>
SD_VEC_INLINE typename V::F ExtExpPoly(typename V::F x, typename V::F* n_out) {
  using F = typename V::F;
  const F nn = V::round(V::mul(x, V::set1(kLog2e)));
  F t = V::fma(nn, V::set1(kMinusLn2Hi), x);
  t = V::fma(nn, V::set1(kMinusLn2Lo), t);
  *n_out = nn;
  return Poly5<V>(t);
}

// p * 2^n for the exps below, per ISA.
template <class V>
struct ExpScale;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
template <>
struct ExpScale<vec::Avx512> {
  // vscalefps: one rounding, exact down to the subnormals, then 0.
  static SD_VEC_INLINE __m512 apply(__m512 p, __m512 n) { return _mm512_scalef_ps(p, n); }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
template <>
struct ExpScale<vec::Avx2> {
  // 2^n formed in the exponent field for integer-valued n <= 0 (no scalef on AVX2): n below -126 flushes
  // 2^n to 0, as in XNNPACK's AVX2 kernels; n > 0 never occurs in the callers (exponents relative to a max,
  // or exps of x <= 0).
  static SD_VEC_INLINE __m256 apply(__m256 p, __m256 n) {
    const __m256 ec = _mm256_max_ps(n, _mm256_set1_ps(-127.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_add_ps(ec, _mm256_set1_ps(127.0f))), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  }
};
#endif

// exp(x): -inf -> 0 and NaN -> NaN on every variant; AVX-512: exact 0 below the float range, +inf -> +inf;
// AVX2: for x <= 0 only (the "x - max" of a softmax, -d of a Gaussian kernel), flushing to 0 below -87.3.
template <class V>
SD_VEC_INLINE typename V::F Exp(typename V::F x) {
  // Clamp so that n stays small enough for the scaling; exp(-104) is already 0 in float. max(NaN, c) is
  // c, so NaN inputs are put back after.
  typename V::F n;
  const typename V::F p = ExtExpPoly<V>(V::max(x, V::set1(-104.0f)), &n);
  return V::select(V::isnan(x), ExpScale<V>::apply(p, n), x);
}

}  // namespace
}  // namespace sd::simd
