// TwoPassSoftmax's vector row, written once over the vector traits of ops/common/vec.h and instantiated
// per ISA translation unit (ops/two_pass_softmax_avx2.cc, ops/two_pass_softmax_avx512.cc); the design
// is described in ops/two_pass_softmax.cc. The variants differ only where the ISA does, which the
// per-ISA Policy below states: the exp (AVX-512: degree-5 polynomial on [-ln2/2, ln2/2], 2^k by vscalefps, exact
// down to subnormals; AVX2: an 8-entry table and a degree-3 polynomial, 2^k formed in the exponent field, flushing
// terms below 2^-127 to 0), the two-step pass 2 for subnormal factors (AVX-512 only), the largest |max| the fast
// path takes, and where +inf is caught. The AVX-512 variant gives the results of the hand-written row it replaced
// but for the order of the block sums (one accumulator, see ExpBlock); -ffp-contract=off comes from CMakeLists.txt.
//
// What must stay true: -inf gives exactly 0; rows with NaN, +inf, no finite entry or |max| >= Policy::kMaxAbs
// return false (the caller then takes RowSafe); a block lane that saw only -inf never enters the row's
// exponent (kNoExponent, not nb = 0).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/simd_math.h"
#include "common/vec.h"
#include "two_pass_softmax_row.h"

namespace sd {
namespace two_pass {

constexpr float kOneStepMax = 16.0f;    // see ExpRelative
// Entries up to kAhead above a block's reference m (see Row) keep every term below 2^115 (79 log2e < 114) and a
// block's sums below 2^125: finite floats.
constexpr float kAhead = 79.0f;
// The exp polynomial of ops/common/simd_math.h, one definition (kNoExponent: exp(-inf) = 0 * 2^kNoExponent).
using simd::kLog2e;
using simd::kMinusLn2Hi;
using simd::kMinusLn2Lo;
using simd::kNoExponent;
// exp(t) ~ 1 + t (1 + t (kT2 + t kT3)) on [-ln2/16, ln2/16] (kTableExp): minimax relative error (Lawson
// iterations on 4001 Chebyshev nodes, linear coefficient held at 1), coefficients rounded to float
constexpr float kT2 = 0x1.00087Ep-1f;
constexpr float kT3 = 0x1.5548EAp-3f;

namespace {  // internal linkage on purpose: see ops/common/vec.h

template <class V>
struct Policy;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
template <>
struct Policy<vec::Avx512> {
  using F = __m512;
  static constexpr bool kInfInBlockSum = false;  // +inf caught by the final sum
  static constexpr bool kTableExp = false;  // exp's 2^(n - nb) by vscalefps, degree-5 polynomial
  static constexpr float kMaxAbs = 2.9e6f;  // rows with |max| >= kMaxAbs take RowSafe (exact magic rounding)
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
  static constexpr bool kInfInBlockSum = true;
  // exp from an 8-entry table of 2^(j/8) and a degree-3 polynomial (see ExpRelative): 2 fma fewer per vector
  static constexpr bool kTableExp = true;
  static constexpr float kMaxAbs = 3.5e5f;  // the table exp's bias is exact while |8 nb| < 2^22
  // 2^e for integer-valued e <= 0: e below -126 flushes to 0 (simd::ExpScale<Avx2>, as in XNNPACK's
  // AVX2 kernels: outputs below ~2e-38 come out as 0, within the contract's absolute tolerance).
  static SD_VEC_INLINE F pow2(F e) {
    const F ec = _mm256_max_ps(e, _mm256_set1_ps(-127.0f));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_add_ps(ec, _mm256_set1_ps(127.0f))), 23));
  }
  // v * 2^e for integer-valued e >= -252 (below, 0), as two products: pass 2 scales a block whose reference was
  // far below the row's maximum by a factor 2^e below 2^-126 (see Row), which one product would flush.
  static SD_VEC_INLINE F scale2(F v, F e) {
    const F e1 = _mm256_max_ps(e, _mm256_set1_ps(-126.0f));
    return _mm256_mul_ps(_mm256_mul_ps(v, pow2(e1)), pow2(_mm256_sub_ps(e, e1)));
  }
  // scale2, not pow2: a block sum relative to its reference can reach 2^125 (see Row), and flushing its factor
  // below 2^-126 would drop up to 2^-1 of the row sum; below 2^-252 it is < 2^-127 of it.
  static SD_VEC_INLINE void accumulate(F& v, F& e, F m, F n) {
    const F max_e = _mm256_max_ps(e, n);
    v = _mm256_add_ps(scale2(m, _mm256_sub_ps(n, max_e)), scale2(v, _mm256_sub_ps(e, max_e)));
    e = max_e;
  }
};
#endif

// m * 2^(n - nb) = exp(x) / 2^nb for x >= floor (x below floor is clamped there: it comes out below
// 2^-158, i.e. exactly 0). NaN propagates (max returns its 2nd operand on NaN).
// kExact: t = x - n ln2 in two steps (Cody-Waite, ln2 = hi + lo), exact to float rounding for any n.
// Otherwise one fma with ln2 rounded to float, whose error (1.9e-9) is multiplied by n: blocks whose
// reference (or, on the lane-maxima route, every lane maximum) has |m| <= kOneStepMax take that path.
// Every term there that can reach an output above 1e-37 has |x| <= kOneStepMax + 85 (entries lie below
// m + 79, and those below m - 85 cannot), |n| <= 147, so t is off by <= 2.8e-7 -- inside the
// contract's 1e-6 with the polynomial's 1.2e-7 (AVX2: 8.6e-8 and the table's 6e-8; ln2/8 and 8n scale
// the same error) -- for one fma less of the ~8 that bound pass 1.
//
// kTableExp (AVX2, where there is no vscalefps and two fma fewer per vector pay most): the grid is ln2/8
// instead of ln2. The rounding fma adds bias = 0x1.8p23 + 8 (127 - nb), so vn = 0x1.8p23 + I with
// I = round(8 x log2e) + 8 (127 - nb) = 8 (n - nb + 127) + j, j in [0, 8) (vn stays in [2^23, 2^24): x log2e - nb is
// within [-160, 1]). Then exp(x) / 2^nb = 2^(n - nb) 2^(j/8) exp(t), t = x - (8n + j) ln2/8, |t| <= ln2/16:
//  * 2^(n - nb) 2^(j/8) is one integer add: bits(vn) << 20 = ((n - nb + 127) << 23) + (j << 20) (the bits of
//    0x1.8p23 shift out), and table[j] = bits(2^(j/8)) - (127 << 23) - (j << 20), read by one vpermps on the low 3
//    bits (XNNPACK's lut8 exp: vec::Exp2Table<8, 127>, SoftmaxTopK's table less the exponent bias). I < 0 is clamped
//    to 0, which gives +0: terms below 2^(nb - 127) flush to 0, as the shift of the former AVX2 row did (I in
//    [1, 8), n - nb = -127, come out subnormal, off by < 2^-126 absolute);
//  * exp(t) ~ 1 + t (1 + t (c2 + t c3)): minimax relative error 2.5e-8 on [-ln2/16, ln2/16], 8.6e-8 evaluated
//    in float (was degree 5 on [-ln2/2, ln2/2]: 1.2e-7).
// t is Cody-Waite with ln2/8 = (hi + lo)/8 as before: x - (8n + j) hi/8 is exact (a multiple of 2^-24 below 0.05).
// The bias is exact while |8 nb| < 2^22, i.e. |max| < 3.6e5 (Policy::kMaxAbs); larger rows take RowSafe.
template <class V, bool kExact>
SD_VEC_INLINE typename V::F ExpRelative(typename V::F x, typename V::F floor, typename V::F nb, typename V::F bias,
                                        typename V::F table) {
  using F = typename V::F;
  x = V::max(floor, x);
  if constexpr (Policy<V>::kTableExp) {
    const F vn = V::fma(x, V::set1(8.0f * kLog2e), bias);
    const F nn = V::sub(vn, bias);
    F t;
    if constexpr (kExact) {
      t = V::fma(nn, V::set1(0.125f * kMinusLn2Hi), x);
      t = V::fma(nn, V::set1(0.125f * kMinusLn2Lo), t);
    } else {
      t = V::fma(nn, V::set1(0.125f * -0x1.62E430p-1f), x);  // -ln2/8 rounded to float
    }
    const typename V::I bits = V::maxi(V::as_int(vn), V::set1i(0x4B400000));  // I >= 0 (bits of 0x1.8p23)
    const F s = V::as_float(V::addi(V::as_int(V::lookup(table, bits)), V::template slli<20>(bits)));
    F p = V::fma(V::set1(kT3), t, V::set1(kT2));
    p = V::fma(p, t, V::set1(1.0f));
    p = V::fma(p, t, V::set1(1.0f));
    return V::mul(s, p);
  } else {
    const F magic = V::set1(0x1.8p23f);  // round-to-nearest for |x log2e| < 2^22
    const F vn = V::fma(x, V::set1(kLog2e), magic);
    const F nn = V::sub(vn, magic);
    F t;
    if constexpr (kExact) {
      t = V::fma(nn, V::set1(kMinusLn2Hi), x);
      t = V::fma(nn, V::set1(kMinusLn2Lo), t);
    } else {
      t = V::fma(nn, V::set1(-0x1.62E430p-1f), x);  // -ln2 rounded to float
    }
    return Policy<V>::scale2(simd::Poly5<V>(t), V::sub(nn, nb));
  }
}

// Pass 1 over one block: y[j] = exp(x[j]) / 2^nb; returns the per-lane sums. kCheck: *over is set when an entry
// exceeds `limit` (the block must then be redone from its lane maxima, see Row).
template <class V, bool kExact, bool kCheck>
SD_VEC_INLINE typename V::F ExpBlock(const float* x, float* y, int64_t j0, int64_t j1, typename V::F floor,
                                     typename V::F nb, typename V::F limit, bool* over) {
  using F = typename V::F;
  constexpr int L = V::kLanes;
  // kTableExp: the rounding fma's bias (exact: an integer below 2^24) and the table
  const F bias = V::fma(V::sub(V::set1(127.0f), nb), V::set1(8.0f), V::set1(0x1.8p23f));
  F table = bias;  // unused without kTableExp
  if constexpr (Policy<V>::kTableExp) {
    static const vec::Exp2Table<8, 127> table8;
    table = V::loadu(table8.v);
  }
  // One accumulator fed by a tree of each step's four terms: four would not fit AVX2's 16 registers beside
  // the exp's constants (they were spilled to the stack: a load and a store per vector).
  F acc = V::zero();
  F top = V::set1(-INFINITY);  // kCheck: the block's lane maxima (one max per vector where a compare and an
                               // or would take two; a NaN it drops reaches the sum through the exp)
  int64_t j = j0;
  for (; j + 4 * L <= j1; j += 4 * L) {
    const F x0 = V::loadu(x + j), x1 = V::loadu(x + j + L), x2 = V::loadu(x + j + 2 * L), x3 = V::loadu(x + j + 3 * L);
    if constexpr (kCheck) top = V::max(V::max(top, V::max(x0, x1)), V::max(x2, x3));
    const F e0 = ExpRelative<V, kExact>(x0, floor, nb, bias, table);
    const F e1 = ExpRelative<V, kExact>(x1, floor, nb, bias, table);
    const F e2 = ExpRelative<V, kExact>(x2, floor, nb, bias, table);
    const F e3 = ExpRelative<V, kExact>(x3, floor, nb, bias, table);
    V::storeu(y + j, e0);
    V::storeu(y + j + L, e1);
    V::storeu(y + j + 2 * L, e2);
    V::storeu(y + j + 3 * L, e3);
    acc = V::add(acc, V::add(V::add(e0, e1), V::add(e2, e3)));
  }
  for (; j < j1; j += L) {
    const int count = j1 - j >= L ? L : static_cast<int>(j1 - j);
    const typename V::M k = V::tail_mask(count);
    const F x0 = V::loadu_fill(x + j, count, -INFINITY);
    if constexpr (kCheck) top = V::max(top, x0);
    const F e0 = V::select(k, V::zero(), ExpRelative<V, kExact>(x0, floor, nb, bias, table));
    V::storeu_tail(y + j, count, e0);
    acc = V::add(acc, e0);
  }
  if constexpr (kCheck) *over = V::bits(V::gt(top, limit)) != 0;
  return acc;
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
  float ref = -INFINITY;  // the largest block reference or lane maximum so far: an entry of the row, or -inf
  bool reference_failed = false;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = n < j0 + kBlock ? n : j0 + kBlock;
    // The block's exponent from a reference instead of a max pass over it: m = max(ref, its first 2L entries), an
    // entry of the row. Every term is then exp(x) / 2^nb with nb = round(m log2e) for all lanes: an entry more
    // than kAhead above m would overflow the float sums, so ExpBlock checks each entry against m + kAhead and
    // such a block is redone from its lane maxima below (as is the rest of the row: a row whose first entries
    // are a mask's large negatives pays one block twice). Entries below m - 110 come out 0 as before.
    // (Saves the block-max pass: 64 x 1000 in L2, 1 thread, Zen 4: 0.85x the row time on either variant.)
    if (!kNonTemporalX && !reference_failed) {
      const int head = j1 - j0 >= 2 * L ? 2 * L : static_cast<int>(j1 - j0);
      const F h0 = V::loadu_fill(x + j0, head < L ? head : L, -INFINITY);
      const F h1 = head > L ? V::loadu_fill(x + j0 + L, head - L, -INFINITY) : neg_inf;
      const float m = std::max(ref, V::reduce_max(V::max(h0, h1)));  // NaN dropped here is caught by the exp
      if (std::fabs(m) < P::kMaxAbs) {  // false for -inf, +inf, NaN and huge entries: the max pass takes those
        const F vm = V::set1(m);
        const F nb = V::sub(V::fma(vm, V::set1(kLog2e), magic), magic);
        const F floor = V::sub(vm, V::set1(110.0f));
        const F limit = V::add(vm, V::set1(kAhead));
        bool over = false;
        // kOneStepMax: every term that can reach an output above 1e-37 has |x| <= kOneStepMax + 88 (see ExpRelative)
        const F block_sum = std::fabs(m) <= kOneStepMax
                                ? ExpBlock<V, false, true>(x, y, j0, j1, floor, nb, limit, &over)
                                : ExpBlock<V, true, true>(x, y, j0, j1, floor, nb, limit, &over);
        if (!over) {
          ref = m;
          V::storeu(lane_exponents + blk * L, nb);
          bad = V::mask_or(bad, V::isnan(block_sum));  // NaN in the block (the exp propagates it)
          P::accumulate(sum_v, sum_e, block_sum, nb);
          continue;
        }
        reference_failed = true;
      }
    }
    F bm0 = neg_inf, bm1 = neg_inf;
    int64_t j = j0;
    for (; j + 2 * L <= j1; j += 2 * L) {
      if constexpr (kNonTemporalX) {
        HintNonTemporal(x + j);
        HintNonTemporal(x + j + L);
      }
      const F xa = V::loadu(x + j), xb = V::loadu(x + j + L);
      bm0 = V::max(bm0, xa);
      bm1 = V::max(bm1, xb);
    }
    for (; j < j1; j += L) {
      const int count = j1 - j >= L ? L : static_cast<int>(j1 - j);
      const F xa = V::loadu_fill(x + j, count, -INFINITY);
      bm0 = V::max(bm0, xa);
    }
    const F bm = V::max(bm0, bm1);
    // A lane that saw only -inf in this block gets nb = 0 and floor -110: its terms are all 0.
    const M live = V::neq(bm, neg_inf);
    bad = V::mask_or(bad, V::mask_and(live, V::nlt(V::abs(bm), V::set1(P::kMaxAbs))));
    const F live_bm = V::select(live, V::zero(), bm);
    const F nb = V::sub(V::fma(live_bm, V::set1(kLog2e), magic), magic);
    const F floor = V::sub(live_bm, V::set1(110.0f));
    // A dead lane's terms are exactly 0, but its nb = 0 must not enter the row's exponent: the row sum
    // would be scaled to 2^(nb_live - 0) -- for a row whose only finite entry is <= -87.3, a subnormal
    // whose reciprocal overflows (y = inf); on AVX2 the live blocks' factors 2^(nb - 0) flushed below
    // 2^-126 to 0 (outputs of 3e-30 came out 0). Its exponent is kNoExponent for the sum and pass 2.
    const F lane_e = V::select(live, V::set1(kNoExponent), nb);
    V::storeu(lane_exponents + blk * L, lane_e);
    // blocks with |max| <= kOneStepMax: the one-fma range reduction (see ExpRelative)
    const bool one_step = V::bits(V::mask_and(live, V::gt(V::abs(bm), V::set1(kOneStepMax)))) == 0;
    const F block_sum = one_step ? ExpBlock<V, false, false>(x, y, j0, j1, floor, nb, neg_inf, nullptr)
                                 : ExpBlock<V, true, false>(x, y, j0, j1, floor, nb, neg_inf, nullptr);
    bad = V::mask_or(bad, V::isnan(block_sum));  // NaN in the block: max may drop it, the exp does not
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
    // While 2^shift / v is a normal float, one multiply by it is exact to one rounding; a subnormal (or, on AVX2,
    // flushed) factor would lose bits, so that block scales in two steps.
    const M live = V::neq(lane_e, V::set1(kNoExponent));
    if (V::bits(V::mask_and(live, V::lt(factor, V::set1(FLT_MIN)))) == 0) {
      ScaleBlock<V, true>(y, j0, j1, inv, shift, factor);
    } else {
      ScaleBlock<V, false>(y, j0, j1, inv, shift, factor);
    }
  }
  return true;
}

}  // namespace
}  // namespace two_pass
}  // namespace sd
