// TwoPassSoftmax -- softmax without a max pass (Dukhan & Ablavatski 2020, arXiv 2001.04438).
//
//   y_i = exp(x_i) / sum_j exp(x_j)       along `axis` (same values as ai.onnx.Softmax-13)
//
// Python half, the contract and the float64 oracle: softdeploy/ops/two_pass_softmax.py; docs/ops/TwoPassSoftmax.md.
//
// Two reads of x, no max pass, no overflow, for any |x| up to ~2.9e6 (larger rows take RowSafe):
//  * AVX-512 and AVX2: pass 1 reads x, writes exp(x_j) / 2^nb into y and accumulates the row sum
//    as a (mantissa, exponent) pair; nb is the rounded exponent of the block's maximum per SIMD lane.
//    Pass 2 rescales y in place (one multiply per element). See the AVX-512 section.
//  * portable: the paper's algorithm verbatim -- pass 1 accumulates sum_j exp(x_j) as a
//    (mantissa v, exponent e) pair with e' = max(e, n_j), v' = v 2^(e - e') + m_j 2^(n_j - e'),
//    pass 2 recomputes y_j = (m_j / v) 2^(n_j - e).
// Every term is formed as exp(x) = m 2^n with n = round(x log2 e) and t = x - n ln2 (Cody-Waite),
// so only integer exponent differences are taken: full float precision even for |x| ~ 1e4.
//
// What must stay true:
//  * -inf inputs give exactly 0 (masks); a row with no finite entry, or with +inf or NaN, is
//    recomputed by the reference three-pass loop (RowSafe) so that it matches ai.onnx.Softmax / torch
//    in which entries are NaN.
//  * Sums are accumulated in blocks (kBlock elements, then merged) to keep the float32 summation
//    error of long rows (V = 256000) near 1e-7 relative.
//  * Rows are independent: threads split rows (MapRows), never a row.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/kernel.h"
#include "common/simd_math.h"

namespace sd {
namespace {

constexpr const char* kOp = "TwoPassSoftmax";

// Reference three-pass softmax for the rows the fast path does not handle (all -inf, +inf, NaN).
void RowSafe(const float* x, float* y, int64_t n) {
  float m = -INFINITY;
  bool has_nan = false;
  for (int64_t j = 0; j < n; ++j) {
    has_nan |= std::isnan(x[j]);
    m = std::max(m, x[j]);
  }
  if (has_nan || m == -INFINITY || m == INFINITY) {
    // NaN anywhere, all -inf (0/0) or +inf (inf - inf): the whole row is NaN, as in ai.onnx.Softmax.
    for (int64_t j = 0; j < n; ++j) y[j] = NAN;
    return;
  }
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(static_cast<double>(x[j]) - m);
  for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(std::exp(static_cast<double>(x[j]) - m) / s);
}

// ---- portable -----------------------------------------------------------------------------------

void AccumulatePortable(float& v, float& e, float m, float n) {
  const float max_e = std::max(e, n);
  v = simd::Scale2(v, e - max_e) + simd::Scale2(m, n - max_e);
  e = max_e;
}

void RowPortable(const float* x, float* y, int64_t n) {
  // Three-level summation (blocks of 64 terms, groups of 64 blocks, the row): one scalar accumulator
  // would otherwise carry ~n/64 rounding errors into rows of 256000 (2.5e-6 relative, over the
  // contract's 1e-6).
  constexpr int64_t kBlock = 64, kGroup = 64 * kBlock;
  float acc_v = 0.0f, acc_e = simd::kNoExponent;
  for (int64_t j = 0; j < n;) {
    const int64_t group_end = std::min(n, j + kGroup);
    float gv = 0.0f, ge = simd::kNoExponent;
    while (j < group_end) {
      const int64_t block_end = std::min(group_end, j + kBlock);
      float v = 0.0f, e = simd::kNoExponent;
      for (; j < block_end; ++j) {
        // ExtExp's float reduction is accurate for |x| < ~2.9e6 only (common/simd_math.h); beyond, the
        // row takes RowSafe, as the vector variants do (9.5e-2 relative error at |x| ~ 5.6e7 before).
        if (std::fabs(x[j]) >= 2.9e6f && std::isfinite(x[j])) return RowSafe(x, y, n);
        float m, ne;
        simd::ExtExp(x[j], &m, &ne);
        if (std::isnan(m) || std::isnan(ne)) return RowSafe(x, y, n);
        AccumulatePortable(v, e, m, ne);
      }
      AccumulatePortable(gv, ge, v, e);
    }
    AccumulatePortable(acc_v, acc_e, gv, ge);
  }
  if (!(acc_v > 0.0f) || !std::isfinite(acc_v)) return RowSafe(x, y, n);
  const float inv = 1.0f / acc_v;
  for (int64_t j = 0; j < n; ++j) {
    float m, e;
    simd::ExtExp(x[j], &m, &e);
    y[j] = simd::Scale2(m * inv, e - acc_e);
  }
}

constexpr int64_t kBlock = 1024;  // elements per block of the two-level summation

// AVX-512 rows of at least this many elements, in tensors of at least kStreamBytes, read x with a
// non-temporal hint: prefetchnta on each line as the block-max loop first touches it. x is read from
// DRAM once per block and reread from L1 by the block's exps, never again, while y (written by pass 1,
// rescaled by pass 2) must survive in L2 until pass 2: the hint keeps x from evicting it there (Zen 4:
// L2 1 MB; a 128000-entry row is 0.5 MB of x and 0.5 MB of y). 64 rows, one thread, each variant in its
// own process (bench/micro/two_pass_softmax_rows.cc --rows64 <variant>), three alternations in each
// of two batches: 64 x 128000 3.42-3.81 -> 2.50-2.63 ms and 3.17-3.89 -> 3.04-3.27 ms, 64 x 256000
// 8.41-8.65 -> 6.48-7.09 ms and 7.29-7.43 -> 6.82-7.12 ms (this shared machine's DRAM bandwidth moves
// between batches); in onnxruntime with bound buffers 64 x 128000 3.09-3.22 -> 2.63-2.89 ms. The
// AVX2 variant measured the same with and without it (2.96-3.19 vs 3.06-3.12 ms at 64 x 128000), so
// it has none. A smaller tensor may be
// cache-resident on entry, where the hint would send x back to DRAM for its next reader (1 x 128000
// measured 0-10% slower with it), hence the tensor threshold; rows of 32000 stay in L2 either way.
constexpr int64_t kNonTemporalMinElements = 65536;

// The hint for the 64-byte line holding *p (SSE: every x86-64 variant has it).
inline void HintNonTemporal(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_NTA); }

// ---- AVX-512 ------------------------------------------------------------------------------------
//
// Pass 1 reads x once and writes exp(x_j) / 2^nb into y, where nb is the rounded base-2 exponent of
// the block's maximum in that SIMD lane (blocks of kBlock elements; the lane maxima come from a
// quick max over the block while it sits in L1). Each term is formed exactly as in the two-pass
// paper -- exp(x) = m * 2^n with n = round(x log2 e) and t = x - n ln2 by Cody-Waite -- so only the
// integer exponent difference n - nb is taken, never the rounded difference x - max that limits a
// three-pass softmax to ~|x - max| * 2^-24 relative error. The sum is accumulated as the paper's
// (mantissa, exponent) pair per lane, merged once per block.
// Pass 2 scales y in place by 2^(nb - E) / V, (V, E) being the row sum.
// Compared with the paper's pass 2 (recompute exp from x), rescaling y costs one multiply per
// element instead of a second exp: on Zen 4 the exp, not memory, bounds rows that fit in L2.

// m * 2^(n - nb) = exp(x) / 2^nb for x >= floor (x below floor is clamped there: it comes out
// below 2^-158, i.e. exactly 0). NaN propagates (max_ps returns its 2nd operand on NaN).
// kExact: t = x - n ln2 in two steps (Cody-Waite, ln2 = hi + lo), exact to float rounding for any n.
// Otherwise one fma with ln2 rounded to float, whose error (1.9e-9) is multiplied by n: blocks whose
// lanes all have |max| <= kOneStepMax take that path, where every term that can reach an output
// above 1e-37 has |x| <= kOneStepMax + 85, |n| <= 147, so t is off by <= 2.8e-7 -- inside the
// contract's 1e-6 with the polynomial's 1.2e-7 -- for one fma less of the ~9 that bound pass 1.
constexpr float kOneStepMax = 16.0f;

template <bool kExact>
SD_TARGET_AVX512 inline __m512 ExpRelative(__m512 x, __m512 floor, __m512 nb) {
  x = _mm512_max_ps(floor, x);
  const __m512 magic = _mm512_set1_ps(0x1.8p23f);  // round-to-nearest for |x log2e| < 2^22
  const __m512 nn = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(simd::kLog2e), magic), magic);
  __m512 t;
  if constexpr (kExact) {
    t = _mm512_fmadd_ps(nn, _mm512_set1_ps(simd::kMinusLn2Hi), x);
    t = _mm512_fmadd_ps(nn, _mm512_set1_ps(simd::kMinusLn2Lo), t);
  } else {
    t = _mm512_fmadd_ps(nn, _mm512_set1_ps(-0x1.62E430p-1f), x);  // -ln2 rounded to float
  }
  __m512 p = _mm512_set1_ps(simd::kC5);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(simd::kC4));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(simd::kC3));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(simd::kC2));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(simd::kC1));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, _mm512_sub_ps(nn, nb));
}

// Pass 1 over one block: y[j] = exp(x[j]) / 2^nb; returns the per-lane sums.
template <bool kExact>
SD_TARGET_AVX512 inline __m512 ExpBlock(const float* x, float* y, int64_t j0, int64_t j1, __m512 floor, __m512 nb) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = j0;
  for (; j + 64 <= j1; j += 64) {
    const __m512 e0 = ExpRelative<kExact>(_mm512_loadu_ps(x + j), floor, nb);
    const __m512 e1 = ExpRelative<kExact>(_mm512_loadu_ps(x + j + 16), floor, nb);
    const __m512 e2 = ExpRelative<kExact>(_mm512_loadu_ps(x + j + 32), floor, nb);
    const __m512 e3 = ExpRelative<kExact>(_mm512_loadu_ps(x + j + 48), floor, nb);
    _mm512_storeu_ps(y + j, e0);
    _mm512_storeu_ps(y + j + 16, e1);
    _mm512_storeu_ps(y + j + 32, e2);
    _mm512_storeu_ps(y + j + 48, e3);
    a0 = _mm512_add_ps(a0, e0);
    a1 = _mm512_add_ps(a1, e1);
    a2 = _mm512_add_ps(a2, e2);
    a3 = _mm512_add_ps(a3, e3);
  }
  for (; j < j1; j += 16) {
    const __mmask16 k = simd::TailMask16(j1 - j);
    const __m512 e0 = ExpRelative<kExact>(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + j), floor, nb);
    _mm512_mask_storeu_ps(y + j, k, e0);
    a0 = _mm512_add_ps(a0, _mm512_maskz_mov_ps(k, e0));
  }
  return _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
}

SD_TARGET_AVX512 inline void Accumulate(__m512& v, __m512& e, __m512 bv, __m512 be) {
  const __m512 max_e = _mm512_max_ps(e, be);
  v = _mm512_add_ps(_mm512_scalef_ps(v, _mm512_sub_ps(e, max_e)), _mm512_scalef_ps(bv, _mm512_sub_ps(be, max_e)));
  e = max_e;
}

// Pass 2 over one block: y[j] *= 2^shift / v, as one multiply by factor = 2^shift / v (kOneFactor) or in
// two steps (y * inv, then scalef by shift).
template <bool kOneFactor>
SD_TARGET_AVX512 inline __m512 Scaled(__m512 t, __m512 inv, __m512 shift, __m512 factor) {
  return kOneFactor ? _mm512_mul_ps(t, factor) : _mm512_scalef_ps(_mm512_mul_ps(t, inv), shift);
}

template <bool kOneFactor>
SD_TARGET_AVX512 inline void ScaleBlock(float* y, int64_t j0, int64_t j1, __m512 inv, __m512 shift, __m512 factor) {
  int64_t j = j0;
  for (; j + 16 <= j1; j += 16) _mm512_storeu_ps(y + j, Scaled<kOneFactor>(_mm512_loadu_ps(y + j), inv, shift, factor));
  if (j < j1) {
    const __mmask16 k = simd::TailMask16(j1 - j);
    _mm512_mask_storeu_ps(y + j, k, Scaled<kOneFactor>(_mm512_maskz_loadu_ps(k, y + j), inv, shift, factor));
  }
}

// Returns false (the caller then takes RowSafe) for rows with NaN, +inf, no finite entry, or
// |max| >= 2.9e6, beyond which the magic-bias rounding of x log2e is no longer exact.
// y is written in place by both passes, deliberately: pass 1's stores, which miss the cache for
// large tensors, overlap its exp work, and pass 2 then finds y in L2/L3. Writing pass 1 to a cached
// scratch row and y in pass 2 (streaming or not) was 1.4-2x slower at 64 x 128000 / 256000 on
// Zen 4 (64 rows through RowAvx512, one thread): pass 2 has too little work to hide the misses. So was
// (1.0-1.6x slower) a pipeline over rows, pass 1 of row r into a cached scratch row while pass 2 of
// row r - 1 streams its scratch to y: two DRAM transfers per element instead of three, but this
// machine's streaming stores do not overlap with the loads.
template <bool kNonTemporalX>
SD_TARGET_AVX512 bool RowAvx512(const float* x, float* y, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  thread_local std::vector<float> block_exponents;  // nb per (block, lane); ORT pool threads reuse it
  block_exponents.resize(static_cast<size_t>(blocks) * 16);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  const __m512 magic = _mm512_set1_ps(0x1.8p23f);
  __m512 sum_v = _mm512_setzero_ps(), sum_e = _mm512_set1_ps(simd::kNoExponent);
  __mmask16 bad = 0;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = std::min(n, j0 + kBlock);
    __m512 bm0 = neg_inf, bm1 = neg_inf;
    int64_t j = j0;
    for (; j + 32 <= j1; j += 32) {
      if constexpr (kNonTemporalX) {
        HintNonTemporal(x + j);
        HintNonTemporal(x + j + 16);
      }
      bm0 = _mm512_max_ps(bm0, _mm512_loadu_ps(x + j));
      bm1 = _mm512_max_ps(bm1, _mm512_loadu_ps(x + j + 16));
    }
    for (; j < j1; j += 16) bm0 = _mm512_max_ps(bm0, _mm512_mask_loadu_ps(neg_inf, simd::TailMask16(j1 - j), x + j));
    const __m512 bm = _mm512_max_ps(bm0, bm1);
    // A lane that saw only -inf in this block gets nb = 0 and floor -110: its terms are all 0.
    const __mmask16 live = _mm512_cmp_ps_mask(bm, neg_inf, _CMP_NEQ_OQ);
    bad |= _mm512_mask_cmp_ps_mask(live, _mm512_abs_ps(bm), _mm512_set1_ps(2.9e6f), _CMP_NLT_UQ);
    const __m512 live_bm = _mm512_maskz_mov_ps(live, bm);
    const __m512 nb = _mm512_sub_ps(_mm512_fmadd_ps(live_bm, _mm512_set1_ps(simd::kLog2e), magic), magic);
    const __m512 floor = _mm512_sub_ps(live_bm, _mm512_set1_ps(110.0f));
    // A dead lane's terms are exactly 0, but its nb = 0 must not enter the row's exponent: the row sum
    // would be scaled to 2^(nb_live - 0) -- for a row whose only finite entry is <= -87.3, a subnormal
    // whose reciprocal overflows (y = inf). Its exponent is kNoExponent for the sum and for pass 2.
    const __m512 lane_e = _mm512_mask_mov_ps(_mm512_set1_ps(simd::kNoExponent), live, nb);
    _mm512_storeu_ps(block_exponents.data() + blk * 16, lane_e);
    const bool one_step = _mm512_mask_cmp_ps_mask(live, _mm512_abs_ps(bm), _mm512_set1_ps(kOneStepMax), _CMP_GT_OQ) == 0;
    const __m512 block_sum =
        one_step ? ExpBlock<false>(x, y, j0, j1, floor, nb) : ExpBlock<true>(x, y, j0, j1, floor, nb);
    bad |= _mm512_cmp_ps_mask(block_sum, block_sum, _CMP_UNORD_Q);  // NaN or +inf in the block
    Accumulate(sum_v, sum_e, block_sum, lane_e);
  }
  if (bad) return false;
  const float e = _mm512_reduce_max_ps(sum_e);
  const float v = _mm512_reduce_add_ps(_mm512_scalef_ps(sum_v, _mm512_sub_ps(sum_e, _mm512_set1_ps(e))));
  if (!(v > 0.0f) || !std::isfinite(v)) return false;  // no finite entry
  const __m512 inv = _mm512_set1_ps(1.0f / v);
  const __m512 minus_e = _mm512_set1_ps(-e);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = std::min(n, j0 + kBlock);
    const __m512 lane_e = _mm512_loadu_ps(block_exponents.data() + blk * 16);
    const __mmask16 live = _mm512_cmp_ps_mask(lane_e, _mm512_set1_ps(simd::kNoExponent), _CMP_NEQ_OQ);
    const __m512 shift = _mm512_add_ps(lane_e, minus_e);  // dead lanes (y = 0 there): -FLT_MAX, factor 0
    const __m512 factor = _mm512_scalef_ps(inv, shift);
    // While 2^shift / v is a normal float, one multiply by it is exact to one rounding; a subnormal
    // factor would lose bits, so that block scales in two steps.
    if (_mm512_mask_cmp_ps_mask(live, factor, _mm512_set1_ps(FLT_MIN), _CMP_LT_OQ) == 0) {
      ScaleBlock<true>(y, j0, j1, inv, shift, factor);
    } else {
      ScaleBlock<false>(y, j0, j1, inv, shift, factor);
    }
  }
  return true;
}

// ---- AVX2 ---------------------------------------------------------------------------------------

SD_TARGET_AVX2 inline void Accumulate(__m256& v, __m256& e, __m256 m, __m256 n) {
  const __m256 max_e = _mm256_max_ps(e, n);
  v = _mm256_fmadd_ps(m, simd::Exp2NonPositive(_mm256_sub_ps(n, max_e)),
                      _mm256_mul_ps(v, simd::Exp2NonPositive(_mm256_sub_ps(e, max_e))));
  e = max_e;
}

// AVX2 has the AVX-512 variant's structure on 8 lanes: per-lane block exponents nb, pass 1 writes
// exp(x_j) / 2^nb into y, pass 2 multiplies by 2^(nb - E) / V. Without vscalefps, 2^k is formed in
// the exponent field (Exp2NonPositive), which flushes k < -126 to 0: terms more than 2^126 below
// their block's maximum, and outputs below 2^-125 (~2e-38), come out as 0 (as in XNNPACK's AVX2
// kernels) -- within the contract's absolute tolerance.


// exp(x) / 2^nb for x >= floor (x below is clamped there: it comes out as exactly 0). NaN propagates.
SD_TARGET_AVX2 inline __m256 ExpRelative(__m256 x, __m256 floor, __m256 nb) {
  x = _mm256_max_ps(floor, x);  // max_ps returns its 2nd operand when one is NaN
  const __m256 magic = _mm256_set1_ps(0x1.8p23f);
  const __m256 nn = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(simd::kLog2e), magic), magic);
  __m256 t = _mm256_fmadd_ps(nn, _mm256_set1_ps(simd::kMinusLn2Hi), x);
  t = _mm256_fmadd_ps(nn, _mm256_set1_ps(simd::kMinusLn2Lo), t);
  __m256 p = _mm256_set1_ps(simd::kC5);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(simd::kC4));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(simd::kC3));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(simd::kC2));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(simd::kC1));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f));
  return _mm256_mul_ps(p, simd::Exp2NonPositive(_mm256_sub_ps(nn, nb)));
}

// Returns false (the caller then takes RowSafe) in the cases RowAvx512 does.
SD_TARGET_AVX2 bool RowAvx2(const float* x, float* y, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  thread_local std::vector<float> block_exponents;  // nb per (block, lane)
  block_exponents.resize(static_cast<size_t>(blocks) * 8);
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  const __m256 magic = _mm256_set1_ps(0x1.8p23f);
  __m256 sum_v = _mm256_setzero_ps(), sum_e = _mm256_set1_ps(simd::kNoExponent);
  __m256 bad = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = std::min(n, j0 + kBlock);
    // Block maxima per lane; a NaN is recorded here, since max_ps may drop it.
    __m256 bm0 = neg_inf, bm1 = neg_inf;
    int64_t j = j0;
    for (; j + 16 <= j1; j += 16) {
      const __m256 xa = _mm256_loadu_ps(x + j), xb = _mm256_loadu_ps(x + j + 8);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(xa, xb, _CMP_UNORD_Q));
      bm0 = _mm256_max_ps(bm0, xa);
      bm1 = _mm256_max_ps(bm1, xb);
    }
    for (; j < j1; j += 8) {
      const __m256 k = _mm256_castsi256_ps(simd::TailMask8(j1 - j));
      const __m256 xa = _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(x + j, _mm256_castps_si256(k)), k);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(xa, xa, _CMP_UNORD_Q));
      bm0 = _mm256_max_ps(bm0, xa);
    }
    const __m256 bm = _mm256_max_ps(bm0, bm1);
    // A lane that saw only -inf in this block gets nb = 0 and floor -110: its terms are all 0.
    const __m256 live = _mm256_cmp_ps(bm, neg_inf, _CMP_NEQ_OQ);
    const __m256 abs_bm = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), bm);
    bad = _mm256_or_ps(bad, _mm256_and_ps(live, _mm256_cmp_ps(abs_bm, _mm256_set1_ps(2.9e6f), _CMP_NLT_UQ)));
    const __m256 live_bm = _mm256_and_ps(live, bm);
    const __m256 nb = _mm256_sub_ps(_mm256_fmadd_ps(live_bm, _mm256_set1_ps(simd::kLog2e), magic), magic);
    const __m256 floor = _mm256_sub_ps(live_bm, _mm256_set1_ps(110.0f));
    _mm256_storeu_ps(block_exponents.data() + blk * 8, nb);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (j = j0; j + 32 <= j1; j += 32) {
      const __m256 e0 = ExpRelative(_mm256_loadu_ps(x + j), floor, nb);
      const __m256 e1 = ExpRelative(_mm256_loadu_ps(x + j + 8), floor, nb);
      const __m256 e2 = ExpRelative(_mm256_loadu_ps(x + j + 16), floor, nb);
      const __m256 e3 = ExpRelative(_mm256_loadu_ps(x + j + 24), floor, nb);
      _mm256_storeu_ps(y + j, e0);
      _mm256_storeu_ps(y + j + 8, e1);
      _mm256_storeu_ps(y + j + 16, e2);
      _mm256_storeu_ps(y + j + 24, e3);
      a0 = _mm256_add_ps(a0, e0);
      a1 = _mm256_add_ps(a1, e1);
      a2 = _mm256_add_ps(a2, e2);
      a3 = _mm256_add_ps(a3, e3);
    }
    for (; j < j1; j += 8) {
      const __m256 k = _mm256_castsi256_ps(simd::TailMask8(j1 - j));
      const __m256i ki = _mm256_castps_si256(k);
      const __m256 xa = _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(x + j, ki), k);
      const __m256 e0 = _mm256_and_ps(k, ExpRelative(xa, floor, nb));
      _mm256_maskstore_ps(y + j, ki, e0);
      a0 = _mm256_add_ps(a0, e0);
    }
    const __m256 block_sum = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(block_sum, block_sum, _CMP_UNORD_Q));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(block_sum, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ));
    Accumulate(sum_v, sum_e, block_sum, nb);
  }
  if (_mm256_movemask_ps(bad) != 0) return false;
  const float e = simd::ReduceMax8(sum_e);
  const float v = simd::ReduceAdd8(_mm256_mul_ps(sum_v, simd::Exp2NonPositive(_mm256_sub_ps(sum_e, _mm256_set1_ps(e)))));
  if (!(v > 0.0f) || !std::isfinite(v)) return false;  // no finite entry
  const __m256 inv = _mm256_set1_ps(1.0f / v);
  const __m256 minus_e = _mm256_set1_ps(-e);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = std::min(n, j0 + kBlock);
    const __m256 shift = _mm256_add_ps(_mm256_loadu_ps(block_exponents.data() + blk * 8), minus_e);
    const __m256 factor = _mm256_mul_ps(inv, simd::Exp2NonPositive(shift));
    int64_t j = j0;
    for (; j + 8 <= j1; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(y + j), factor));
    if (j < j1) {
      const __m256i ki = simd::TailMask8(j1 - j);
      _mm256_maskstore_ps(y + j, ki, _mm256_mul_ps(_mm256_maskload_ps(y + j, ki), factor));
    }
  }
  return true;
}

struct TwoPassSoftmaxKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}};

  int64_t axis;
  Isa isa;

  explicit TwoPassSoftmaxKernel(const Attrs& attrs) : axis(attrs.Int("axis", -1)), isa(SelectIsa()) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    T* y = AllocOutput<T>(ctx, 0, x.shape);
    if (x.rank() == 0) Fail(kOp, "input must have rank >= 1, got a scalar");
    const AxisLayout l = AxisLayout::Of(x.shape, NormalizeAxis(kOp, axis, x.rank()));
    if (x.size() == 0) return;
    // Only rows read in place (float32, last axis): MapRows hands any other row over in a cached scratch.
    const bool hint = std::is_same_v<T, float> && l.inner == 1 && l.n >= kNonTemporalMinElements &&
                      x.size() * int64_t{sizeof(float)} >= kStreamBytes;
    switch (isa) {
      case Isa::kAvx512:
        MapRows<T>(ctx, x.data, y, l, [hint](const float* a, float* b, int64_t n) {
          if (!(hint ? RowAvx512<true>(a, b, n) : RowAvx512<false>(a, b, n))) RowSafe(a, b, n);
        });
        break;
      case Isa::kAvx2:
        MapRows<T>(ctx, x.data, y, l, [](const float* a, float* b, int64_t n) {
          if (!RowAvx2(a, b, n)) RowSafe(a, b, n);
        });
        break;
      default:
        MapRows<T>(ctx, x.data, y, l, RowPortable);
    }
  }
};

}  // namespace

SD_REGISTER_KERNEL(TwoPassSoftmax, TwoPassSoftmaxKernel)

}  // namespace sd
