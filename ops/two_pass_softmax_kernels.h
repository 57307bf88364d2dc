// TwoPassSoftmax's vector row, written once over the vector traits of ops/common/vec.h and instantiated
// per ISA translation unit (ops/two_pass_softmax_avx2.cc, ops/two_pass_softmax_avx512.cc); the design
// is described in ops/two_pass_softmax.cc. The variants differ only where the ISA does, which the
// per-ISA Policy below states: how 2^k scales a value (AVX-512 vscalefps, exact down to subnormals;
// AVX2 a product with 2^k formed in the exponent field, flushing k < -126 to 0), the one-fma range
// reduction of blocks with small logits and the two-step pass 2 for subnormal factors (AVX-512 only),
// and where NaN and +inf are caught. Each variant gives the results its former hand-written twin gave,
// bit for bit (same operations in the same order, -ffp-contract=off from CMakeLists.txt).
//
// What must stay true: -inf gives exactly 0; rows with NaN, +inf, no finite entry or |max| >= 2.9e6
// return false (the caller then takes RowSafe); a block lane that saw only -inf never enters the row's
// exponent (kNoExponent, not nb = 0).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/vec.h"
#include "two_pass_softmax_row.h"

namespace sd {
namespace two_pass {

constexpr float kOneStepMax = 16.0f;    // see ExpRelative
constexpr float kNoExponent = -FLT_MAX;  // simd::kNoExponent: exp(-inf) = 0 * 2^kNoExponent
constexpr float kLog2e = 0x1.715476p+0f;
constexpr float kMinusLn2Hi = -0x1.62E43p-1f;
constexpr float kMinusLn2Lo = 0x1.05C61p-29f;
constexpr float kC1 = 0x1.FFFFF6p-1f;
constexpr float kC2 = 0x1.FFFDC6p-2f;
constexpr float kC3 = 0x1.555A80p-3f;
constexpr float kC4 = 0x1.573A1Ap-5f;
constexpr float kC5 = 0x1.0F9F9Cp-7f;

namespace {  // internal linkage on purpose: see ops/common/vec.h

template <class V>
struct Policy;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
template <>
struct Policy<vec::Avx512> {
  using F = __m512;
  static constexpr bool kOneStep = true;       // blocks with |max| <= kOneStepMax: one-fma reduction
  static constexpr bool kTwoStepScale = true;  // pass 2 in two steps where 2^shift / v is subnormal
  static constexpr bool kNanInMaxLoop = false;  // NaN caught by the block sum
  static constexpr bool kInfInBlockSum = false;  // +inf caught by the final sum
  static constexpr bool kBiasedExponent = false;  // exp's 2^(n - nb) by vscalefps
  static SD_VEC_INLINE F scale2(F v, F e) { return _mm512_scalef_ps(v, e); }  // v * 2^e
  static SD_VEC_INLINE void accumulate(F& v, F& e, F bv, F be) {
    const F max_e = _mm512_max_ps(e, be);
    v = _mm512_add_ps(_mm512_scalef_ps(v, _mm512_sub_ps(e, max_e)), _mm512_scalef_ps(bv, _mm512_sub_ps(be, max_e)));
    e = max_e;
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
template <>
struct Policy<vec::Avx2> {
  using F = __m256;
  static constexpr bool kOneStep = false;
  static constexpr bool kTwoStepScale = false;
  static constexpr bool kNanInMaxLoop = true;  // max_ps may drop a NaN: recorded while the maxima are taken
  static constexpr bool kInfInBlockSum = true;
  // exp's 2^(n - nb) from the bits of the fma that rounds x log2e (see ExpRelative): 3 ops fewer per vector
  static constexpr bool kBiasedExponent = true;
  // vn = 0x1.8p23 + (n - nb + 127) (an integer in [2^23, 2^24): its low mantissa bits hold k = n - nb + 127 <= 127,
  // since x <= the block maximum). Shifted left by 23, k lands in the exponent field: 2^(n - nb). k <= 0 (n - nb
  // < -126) clamps to the field 0, i.e. +0 -- what pow2 gives (same bits for every k).
  static SD_VEC_INLINE F pow2_biased(F vn) {
    const F vc = _mm256_max_ps(vn, _mm256_set1_ps(0x1.8p23f));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(vc), 23));
  }
  // 2^e for integer-valued e <= 0: e below -126 flushes to 0 (simd::Exp2NonPositive, as in XNNPACK's
  // AVX2 kernels: outputs below ~2e-38 come out as 0, within the contract's absolute tolerance).
  static SD_VEC_INLINE F pow2(F e) {
    const F ec = _mm256_max_ps(e, _mm256_set1_ps(-127.0f));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_add_ps(ec, _mm256_set1_ps(127.0f))), 23));
  }
  static SD_VEC_INLINE F scale2(F v, F e) { return _mm256_mul_ps(v, pow2(e)); }
  static SD_VEC_INLINE void accumulate(F& v, F& e, F m, F n) {
    const F max_e = _mm256_max_ps(e, n);
    v = _mm256_fmadd_ps(m, pow2(_mm256_sub_ps(n, max_e)), _mm256_mul_ps(v, pow2(_mm256_sub_ps(e, max_e))));
    e = max_e;
  }
};
#endif

// m * 2^(n - nb) = exp(x) / 2^nb for x >= floor (x below floor is clamped there: it comes out below
// 2^-158, i.e. exactly 0). NaN propagates (max returns its 2nd operand on NaN).
// kExact: t = x - n ln2 in two steps (Cody-Waite, ln2 = hi + lo), exact to float rounding for any n.
// Otherwise one fma with ln2 rounded to float, whose error (1.9e-9) is multiplied by n: blocks whose
// lanes all have |max| <= kOneStepMax take that path, where every term that can reach an output
// above 1e-37 has |x| <= kOneStepMax + 85, |n| <= 147, so t is off by <= 2.8e-7 -- inside the
// contract's 1e-6 with the polynomial's 1.2e-7 -- for one fma less of the ~9 that bound pass 1.
//
// kBiasedExponent (AVX2): the rounding fma adds bias = 0x1.8p23 + 127 - nb instead of 0x1.8p23, so its result vn
// holds n - nb + 127 in its low mantissa bits and 2^(n - nb) is one shift of vn (Policy::pow2_biased), XNNPACK's
// "magic bias" exp; n = vn - bias is the same integer as round(x log2e) with the plain magic (vn stays in
// [2^23, 2^24): x log2e - nb is within [-160, 1]; a tie x log2e = k + 1/2, where the two biases' parities could
// round apart, needs |x| > 4e6, outside the rows this path takes). Bit-identical to scale2(p, n - nb).
template <class V, bool kExact>
SD_VEC_INLINE typename V::F ExpRelative(typename V::F x, typename V::F floor, typename V::F nb, typename V::F bias) {
  using F = typename V::F;
  x = V::max(floor, x);
  const F magic = V::set1(0x1.8p23f);  // round-to-nearest for |x log2e| < 2^22
  F vn, nn;
  if constexpr (Policy<V>::kBiasedExponent) {
    vn = V::fma(x, V::set1(kLog2e), bias);
    nn = V::sub(vn, bias);
  } else {
    vn = V::fma(x, V::set1(kLog2e), magic);
    nn = V::sub(vn, magic);
  }
  F t;
  if constexpr (kExact) {
    t = V::fma(nn, V::set1(kMinusLn2Hi), x);
    t = V::fma(nn, V::set1(kMinusLn2Lo), t);
  } else {
    t = V::fma(nn, V::set1(-0x1.62E430p-1f), x);  // -ln2 rounded to float
  }
  F p = V::set1(kC5);
  p = V::fma(p, t, V::set1(kC4));
  p = V::fma(p, t, V::set1(kC3));
  p = V::fma(p, t, V::set1(kC2));
  p = V::fma(p, t, V::set1(kC1));
  p = V::fma(p, t, V::set1(1.0f));
  if constexpr (Policy<V>::kBiasedExponent) return V::mul(p, Policy<V>::pow2_biased(vn));
  else return Policy<V>::scale2(p, V::sub(nn, nb));
}

// Pass 1 over one block: y[j] = exp(x[j]) / 2^nb; returns the per-lane sums.
template <class V, bool kExact>
SD_VEC_INLINE typename V::F ExpBlock(const float* x, float* y, int64_t j0, int64_t j1, typename V::F floor,
                                     typename V::F nb) {
  using F = typename V::F;
  constexpr int L = V::kLanes;
  const F bias = V::add(V::set1(0x1.8p23f), V::sub(V::set1(127.0f), nb));  // exact: integers below 2^24
  F a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = j0;
  for (; j + 4 * L <= j1; j += 4 * L) {
    const F e0 = ExpRelative<V, kExact>(V::loadu(x + j), floor, nb, bias);
    const F e1 = ExpRelative<V, kExact>(V::loadu(x + j + L), floor, nb, bias);
    const F e2 = ExpRelative<V, kExact>(V::loadu(x + j + 2 * L), floor, nb, bias);
    const F e3 = ExpRelative<V, kExact>(V::loadu(x + j + 3 * L), floor, nb, bias);
    V::storeu(y + j, e0);
    V::storeu(y + j + L, e1);
    V::storeu(y + j + 2 * L, e2);
    V::storeu(y + j + 3 * L, e3);
    a0 = V::add(a0, e0);
    a1 = V::add(a1, e1);
    a2 = V::add(a2, e2);
    a3 = V::add(a3, e3);
  }
  for (; j < j1; j += L) {
    const int count = j1 - j >= L ? L : static_cast<int>(j1 - j);
    const typename V::M k = V::tail_mask(count);
    const F e0 = V::select(k, V::zero(), ExpRelative<V, kExact>(V::loadu_fill(x + j, count, -INFINITY), floor, nb, bias));
    V::storeu_tail(y + j, count, e0);
    a0 = V::add(a0, e0);
  }
  return V::add(V::add(a0, a1), V::add(a2, a3));
}

// Pass 2 over one block: y[j] *= 2^shift / v, as one multiply by factor = 2^shift / v (kOneFactor) or
// in two steps (y * inv, then scaled by shift).
template <class V, bool kOneFactor>
SD_VEC_INLINE typename V::F Scaled(typename V::F t, typename V::F inv, typename V::F shift, typename V::F factor) {
  if constexpr (kOneFactor) return V::mul(t, factor);
  else return Policy<V>::scale2(V::mul(t, inv), shift);
}

template <class V, bool kOneFactor>
SD_VEC_INLINE void ScaleBlock(float* y, int64_t j0, int64_t j1, typename V::F inv, typename V::F shift,
                              typename V::F factor) {
  constexpr int L = V::kLanes;
  int64_t j = j0;
  for (; j + L <= j1; j += L) V::storeu(y + j, Scaled<V, kOneFactor>(V::loadu(y + j), inv, shift, factor));
  if (j < j1) {
    const int count = static_cast<int>(j1 - j);
    V::storeu_tail(y + j, count, Scaled<V, kOneFactor>(V::loadu_tail(y + j, count), inv, shift, factor));
  }
}

// The hint for the 64-byte line holding *p.
SD_VEC_INLINE void HintNonTemporal(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_NTA); }

// Both passes over a row; lane_exponents holds (n + kBlock - 1) / kBlock * V::kLanes floats (the
// caller's per-thread scratch). Returns false for the rows RowSafe handles.
template <class V, bool kNonTemporalX>
bool Row(const float* x, float* y, int64_t n, float* lane_exponents) {
  using F = typename V::F;
  using M = typename V::M;
  using P = Policy<V>;
  constexpr int L = V::kLanes;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const F neg_inf = V::set1(-INFINITY);
  const F magic = V::set1(0x1.8p23f);
  F sum_v = V::zero(), sum_e = V::set1(kNoExponent);
  M bad = V::none();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = n < j0 + kBlock ? n : j0 + kBlock;
    F bm0 = neg_inf, bm1 = neg_inf;
    int64_t j = j0;
    for (; j + 2 * L <= j1; j += 2 * L) {
      if constexpr (kNonTemporalX) {
        HintNonTemporal(x + j);
        HintNonTemporal(x + j + L);
      }
      const F xa = V::loadu(x + j), xb = V::loadu(x + j + L);
      if constexpr (P::kNanInMaxLoop) bad = V::mask_or(bad, V::unord(xa, xb));
      bm0 = V::max(bm0, xa);
      bm1 = V::max(bm1, xb);
    }
    for (; j < j1; j += L) {
      const int count = j1 - j >= L ? L : static_cast<int>(j1 - j);
      const F xa = V::loadu_fill(x + j, count, -INFINITY);
      if constexpr (P::kNanInMaxLoop) bad = V::mask_or(bad, V::isnan(xa));
      bm0 = V::max(bm0, xa);
    }
    const F bm = V::max(bm0, bm1);
    // A lane that saw only -inf in this block gets nb = 0 and floor -110: its terms are all 0.
    const M live = V::neq(bm, neg_inf);
    bad = V::mask_or(bad, V::mask_and(live, V::nlt(V::abs(bm), V::set1(2.9e6f))));
    const F live_bm = V::select(live, V::zero(), bm);
    const F nb = V::sub(V::fma(live_bm, V::set1(kLog2e), magic), magic);
    const F floor = V::sub(live_bm, V::set1(110.0f));
    // A dead lane's terms are exactly 0, but its nb = 0 must not enter the row's exponent: the row sum
    // would be scaled to 2^(nb_live - 0) -- for a row whose only finite entry is <= -87.3, a subnormal
    // whose reciprocal overflows (y = inf); on AVX2 the live blocks' factors 2^(nb - 0) flushed below
    // 2^-126 to 0 (outputs of 3e-30 came out 0). Its exponent is kNoExponent for the sum and pass 2.
    const F lane_e = V::select(live, V::set1(kNoExponent), nb);
    V::storeu(lane_exponents + blk * L, lane_e);
    F block_sum;
    if constexpr (P::kOneStep) {
      const bool one_step = V::bits(V::mask_and(live, V::gt(V::abs(bm), V::set1(kOneStepMax)))) == 0;
      block_sum = one_step ? ExpBlock<V, false>(x, y, j0, j1, floor, nb) : ExpBlock<V, true>(x, y, j0, j1, floor, nb);
    } else {
      block_sum = ExpBlock<V, true>(x, y, j0, j1, floor, nb);
    }
    bad = V::mask_or(bad, V::isnan(block_sum));  // NaN (or, on AVX2, +inf) in the block
    if constexpr (P::kInfInBlockSum) bad = V::mask_or(bad, V::eq(block_sum, V::set1(INFINITY)));
    P::accumulate(sum_v, sum_e, block_sum, lane_e);
  }
  if (V::bits(bad) != 0) return false;
  const float e = V::reduce_max(sum_e);
  const float v = V::reduce_add(P::scale2(sum_v, V::sub(sum_e, V::set1(e))));
  if (!(v > 0.0f) || !std::isfinite(v)) return false;  // no finite entry
  const F inv = V::set1(1.0f / v);
  const F minus_e = V::set1(-e);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = n < j0 + kBlock ? n : j0 + kBlock;
    const F lane_e = V::loadu(lane_exponents + blk * L);
    const F shift = V::add(lane_e, minus_e);  // dead lanes (y = 0 there): -FLT_MAX, factor 0
    const F factor = P::scale2(inv, shift);
    if constexpr (P::kTwoStepScale) {
      // While 2^shift / v is a normal float, one multiply by it is exact to one rounding; a subnormal
      // factor would lose bits, so that block scales in two steps.
      const M live = V::neq(lane_e, V::set1(kNoExponent));
      if (V::bits(V::mask_and(live, V::lt(factor, V::set1(FLT_MIN)))) == 0) {
        ScaleBlock<V, true>(y, j0, j1, inv, shift, factor);
      } else {
        ScaleBlock<V, false>(y, j0, j1, inv, shift, factor);
      }
    } else {
      ScaleBlock<V, true>(y, j0, j1, inv, shift, factor);
    }
  }
  return true;
}

}  // namespace
}  // namespace two_pass
}  // namespace sd
