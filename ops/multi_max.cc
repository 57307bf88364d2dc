// MultiMax -- softmax of sigma-modulated logits (Zhou, Fritz & Keuper, ICML 2024, arXiv 2406.01189).
//
//   sigma(x) = x + t0*relu(r0 - x) + t1*relu(x - r1) + t2*relu(r2 - x)^2 + t3*relu(x - r3)^2
//   Y = softmax(sigma(X) + Mask, axis)          (the additive Mask, broadcast to X, AFTER sigma)
//
// Python half, the contract, the special-value rules and the float64 oracle:
// softdeploy/ops/multi_max.py; docs/ops/MultiMax.md. sigma(+-inf) is sigma's limit (SigmaParams::Of), a non-finite
// parameter makes every output NaN, quadratic terms are (t*relu)*relu.
//
// z_j = sigma(x_j) + mask_j is evaluated in DOUBLE, as the reference does: softmax's output error is
// the absolute error of z, and float32 z carries |z| * 2^-24 of it (8.8e-6 relative at |z| ~ 56 with
// t0 = 1.7, against the 2e-6 contract), and float32 relu^2 overflows for |x| > 1.8e19 where the
// double value is finite. In double sigma never overflows for float inputs (|z| < 1e117).
//
// Per row, block by block (kBlock elements; a block's z fits in L1):
//   pass 1 computes the block's z into a double buffer (reading x and the mask once) and its max M_b,
//          then stages w_j = exp(z_j - M_b) in Y (float, from a double range reduction
//          n = round(d log2 e), t = d - n ln2 of d = z_j - M_b, and a float polynomial for exp(t)),
//          summing the w_j; the block sums are combined online in double, S = sum_b s_b e^(M_b - M);
//   pass 2 rescales each block of Y in place by e^(M_b - M) / S.
// sigma is evaluated once per element (not again in pass 2, as a two-pass softmax must), and no
// exponent ever leaves double before it is reduced. The former float scheme (sigma and
// round(z log2 e) in float, exponents carried in float) went wrong from |z| ~ 5.6e7 (n off by many
// units, |t| up to ~88, the polynomial negative or huge: NaN rows, e.g. [[2.1e9]]), and z log2 e
// overflowed to -inf for the Hugging Face mask finfo(float32).min: inf - inf = NaN rows.
//
// What must stay true:
//  * A row whose z holds NaN or +inf, or only -inf, is all NaN (softmax parity); -inf z gives 0.
//  * The Mask is read through strides: any shape broadcastable to X. Rows whose x and mask are
//    contiguous along the axis (or whose mask is constant along it, e.g. a [B, 1, 1, T] padding mask
//    against [B, H, Tq, T] scores, or an omitted mask) run in place; others are gathered.
//  * Validation happens before ParallelFor; nothing inside it throws. Rows are split across threads,
//    never a row, so results do not depend on the thread count.
#include <cmath>
#include <cstring>

#include "common/kernel.h"
#include "common/simd_math.h"

namespace sd {
namespace {

constexpr const char* kOp = "MultiMax";

constexpr double kLog2eD = 1.4426950408889634;
constexpr double kLn2D = 0.6931471805599453;

struct SigmaParams {
  double r[4], t[4];
  double neg, pos;  // sigma(-inf), sigma(+inf): the limits of sigma
  bool finite;      // every parameter finite (otherwise every output is NaN)

  static SigmaParams Of(const float* ranges, const float* ts) {
    SigmaParams p;
    p.finite = true;
    for (int k = 0; k < 4; ++k) {
      p.r[k] = ranges[k];
      p.t[k] = ts[k];
      p.finite &= std::isfinite(ranges[k]) && std::isfinite(ts[k]);
    }
    // x -> -inf: only the r0 and r2 terms are active, sigma ~ t2*x^2 + (1 - t0)*x + const.
    if (p.t[2] != 0) p.neg = p.t[2] > 0 ? INFINITY : -INFINITY;
    else p.neg = p.t[0] < 1 ? -INFINITY : (p.t[0] > 1 ? INFINITY : p.r[0]);
    // x -> +inf: only the r1 and r3 terms, sigma ~ t3*x^2 + (1 + t1)*x + const.
    if (p.t[3] != 0) p.pos = p.t[3] > 0 ? INFINITY : -INFINITY;
    else p.pos = p.t[1] > -1 ? INFINITY : (p.t[1] < -1 ? -INFINITY : p.r[1]);
    return p;
  }

  double operator()(double x) const {
    if (x == -INFINITY) return neg;
    if (x == INFINITY) return pos;
    const double a = std::max(r[0] - x, 0.0), b = std::max(x - r[1], 0.0);
    const double c = std::max(r[2] - x, 0.0), d = std::max(x - r[3], 0.0);
    // Plain multiply-add: std::fma is a libm call (~50 ns) on the portable x86-64 baseline.
    return x + t[0] * a + t[1] * b + (t[2] * c) * c + (t[3] * d) * d;  // NaN x stays NaN
  }
};

// A row: n elements of x (contiguous), the mask row (contiguous when mask_step == 1, one value
// repeated when mask_step == 0), the output, and room for one double per block (the blocks' maxima).
struct RowArgs {
  const float* x;
  const float* mask;
  int64_t mask_step;
  float* y;
  int64_t n;
  double* block_max;
};

void FillNan(float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = NAN;
}

// ---- portable ------------------------------------------------------------------------------------

// Everything in double: z, its max, exp(z - max) and the sum -- the reference's arithmetic.
void RowPortable(const RowArgs& a, const SigmaParams& p) {
  double zmax = -INFINITY;
  bool bad = false;
  for (int64_t j = 0; j < a.n; ++j) {
    const double z = p(a.x[j]) + a.mask[j * a.mask_step];
    bad |= std::isnan(z) || z == INFINITY;
    zmax = std::max(zmax, z);
  }
  if (bad || zmax == -INFINITY) return FillNan(a.y, a.n);
  double sum = 0;
  for (int64_t j = 0; j < a.n; ++j) sum += std::exp(p(a.x[j]) + a.mask[j * a.mask_step] - zmax);
  const double inv = 1.0 / sum;
  for (int64_t j = 0; j < a.n; ++j) {
    a.y[j] = static_cast<float>(std::exp(p(a.x[j]) + a.mask[j * a.mask_step] - zmax) * inv);
  }
}

constexpr int64_t kBlock = 1024;  // elements per block: its z buffer (8 KiB) stays in L1
// z - M_b below this is clamped to it: exp(-200) is 0 in float (so are -inf entries, exactly).
constexpr double kMinDiff = -200.0;

int64_t NumBlocks(int64_t n) { return (n + kBlock - 1) / kBlock; }

// Folds a block (max mb, sum sb of exp(z - mb)) into the row's running (M, S).
inline void FoldBlock(double mb, double sb, double* m, double* s) {
  if (mb == -INFINITY) return;  // an all -inf block adds nothing
  if (mb > *m) {
    *s = *s * std::exp(*m - mb) + sb;  // exp(-inf) = 0 for the first block
    *m = mb;
  } else {
    *s += sb * std::exp(mb - *m);
  }
}

// Pass 2: block b of y times exp(M_b - M) / S (0 for an all -inf block, whose staged values are 0).
inline float BlockScale(const RowArgs& a, int64_t b, double m, double s) {
  return a.block_max[b] == -INFINITY ? 0.0f : static_cast<float>(std::exp(a.block_max[b] - m) / s);
}

// ---- AVX-512 ------------------------------------------------------------------------------------

struct SigmaAvx512 {
  __m512d r0, r1, r2, r3, t0, t1, t2, t3, neg, pos;
  SD_TARGET_AVX512 explicit SigmaAvx512(const SigmaParams& p)
      : r0(_mm512_set1_pd(p.r[0])), r1(_mm512_set1_pd(p.r[1])), r2(_mm512_set1_pd(p.r[2])),
        r3(_mm512_set1_pd(p.r[3])), t0(_mm512_set1_pd(p.t[0])), t1(_mm512_set1_pd(p.t[1])),
        t2(_mm512_set1_pd(p.t[2])), t3(_mm512_set1_pd(p.t[3])), neg(_mm512_set1_pd(p.neg)),
        pos(_mm512_set1_pd(p.pos)) {}

  SD_TARGET_AVX512 __m512d operator()(__m512d x) const {
    const __m512d zero = _mm512_setzero_pd();
    // max_pd(NaN, 0) is 0, but x itself is the first addend, so sigma(NaN) stays NaN.
    const __m512d a = _mm512_max_pd(_mm512_sub_pd(r0, x), zero), b = _mm512_max_pd(_mm512_sub_pd(x, r1), zero);
    const __m512d c = _mm512_max_pd(_mm512_sub_pd(r2, x), zero), d = _mm512_max_pd(_mm512_sub_pd(x, r3), zero);
    __m512d s = _mm512_fmadd_pd(t0, a, x);
    s = _mm512_fmadd_pd(t1, b, s);
    s = _mm512_fmadd_pd(_mm512_mul_pd(t2, c), c, s);
    return _mm512_fmadd_pd(_mm512_mul_pd(t3, d), d, s);
  }
  // sigma with its limits at +-inf (the formula gives NaN there); only for vectors holding an inf.
  SD_TARGET_AVX512 __m512d WithLimits(__m512d x) const {
    const __m512d s = (*this)(x);
    const __m512d s1 = _mm512_mask_mov_pd(s, _mm512_cmp_pd_mask(x, _mm512_set1_pd(-INFINITY), _CMP_EQ_OQ), neg);
    return _mm512_mask_mov_pd(s1, _mm512_cmp_pd_mask(x, _mm512_set1_pd(INFINITY), _CMP_EQ_OQ), pos);
  }
};

SD_TARGET_AVX512 inline __m512 Poly512(__m512 t) {
  __m512 p = _mm512_set1_ps(simd::kC5);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(simd::kC4));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(simd::kC3));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(simd::kC2));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(simd::kC1));
  return _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
}

// exp(d) for 8 d = z - M_b <= 0 in double: (t, n) reduced in double, then float.
SD_TARGET_AVX512 inline void Reduce8(__m512d d, __m256* t, __m256* n) {
  d = _mm512_max_pd(d, _mm512_set1_pd(kMinDiff));  // -inf -> kMinDiff (NaN rows never get here)
  const __m512d nn = _mm512_roundscale_pd(_mm512_mul_pd(d, _mm512_set1_pd(kLog2eD)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  *t = _mm512_cvtpd_ps(_mm512_fnmadd_pd(nn, _mm512_set1_pd(kLn2D), d));
  *n = _mm512_cvtpd_ps(nn);
}

SD_TARGET_AVX512 inline __m512 Join(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

SD_TARGET_AVX512 void RowAvx512(const RowArgs& a, const SigmaParams& p) {
  const SigmaAvx512 s(p);
  const int64_t n = a.n;
  alignas(64) double zb[kBlock];
  const __m512d minus_inf = _mm512_set1_pd(-INFINITY);
  constexpr int kBad = 0x01 | 0x08 | 0x80;  // fpclass: QNaN | +inf | SNaN
  __mmask8 bad = 0;
  double row_m = -INFINITY, row_s = 0.0;
  for (int64_t j0 = 0, b = 0; j0 < n; j0 += kBlock, ++b) {
    const int64_t len = std::min(kBlock, n - j0);
    const float* x = a.x + j0;
    const float* mk = a.mask + j0 * a.mask_step;
    __m512d vmax = minus_inf;
    for (int64_t j = 0; j < len; j += 16) {
      const __mmask16 k = simd::TailMask16(len - j);
      const __mmask8 klo = static_cast<__mmask8>(k), khi = static_cast<__mmask8>(k >> 8);
      const __m512 xv = _mm512_maskz_loadu_ps(k, x + j);
      const __m512 mv = a.mask_step ? _mm512_maskz_loadu_ps(k, mk + j) : _mm512_set1_ps(a.mask[0]);
      const __m256 xhi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(xv), 1));
      const __m256 mhi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(mv), 1));
      const __m512d xlo_d = _mm512_cvtps_pd(_mm512_castps512_ps256(xv)), xhi_d = _mm512_cvtps_pd(xhi);
      __m512d slo, shi;
      if (_mm512_fpclass_ps_mask(xv, 0x08 | 0x10) == 0) {  // no +-inf (the common case)
        slo = s(xlo_d);
        shi = s(xhi_d);
      } else {
        slo = s.WithLimits(xlo_d);
        shi = s.WithLimits(xhi_d);
      }
      // Lanes past the row's end are -inf: they add nothing to the max and 0 to the sum.
      const __m512d zlo = _mm512_mask_add_pd(minus_inf, klo, slo, _mm512_cvtps_pd(_mm512_castps512_ps256(mv)));
      const __m512d zhi = _mm512_mask_add_pd(minus_inf, khi, shi, _mm512_cvtps_pd(mhi));
      bad |= _mm512_fpclass_pd_mask(zlo, kBad) | _mm512_fpclass_pd_mask(zhi, kBad);
      vmax = _mm512_max_pd(vmax, _mm512_max_pd(zlo, zhi));
      _mm512_store_pd(zb + j, zlo);
      _mm512_store_pd(zb + j + 8, zhi);
    }
    const double mb = _mm512_reduce_max_pd(vmax);
    a.block_max[b] = mb;
    float* y = a.y + j0;
    if (mb == -INFINITY || bad != 0) {  // an all -inf block stages 0 (a NaN row is refilled below)
      for (int64_t j = 0; j < len; j += 16) {
        _mm512_mask_storeu_ps(y + j, simd::TailMask16(len - j), _mm512_setzero_ps());
      }
      continue;
    }
    const __m512d mbv = _mm512_set1_pd(mb);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    for (int64_t j = 0; j < len; j += 16) {
      __m256 tlo, thi, nlo, nhi;
      Reduce8(_mm512_sub_pd(_mm512_load_pd(zb + j), mbv), &tlo, &nlo);
      Reduce8(_mm512_sub_pd(_mm512_load_pd(zb + j + 8), mbv), &thi, &nhi);
      const __m512 w = _mm512_scalef_ps(Poly512(Join(tlo, thi)), Join(nlo, nhi));  // lanes past the end: 0
      _mm512_mask_storeu_ps(y + j, simd::TailMask16(len - j), w);
      if ((j & 16) == 0) acc0 = _mm512_add_ps(acc0, w);
      else acc1 = _mm512_add_ps(acc1, w);
    }
    FoldBlock(mb, static_cast<double>(_mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))), &row_m, &row_s);
  }
  if (bad != 0 || row_m == -INFINITY) return FillNan(a.y, n);  // NaN / +inf z, or only -inf
  for (int64_t j0 = 0, b = 0; j0 < n; j0 += kBlock, ++b) {
    const int64_t len = std::min(kBlock, n - j0);
    const __m512 f = _mm512_set1_ps(BlockScale(a, b, row_m, row_s));
    float* y = a.y + j0;
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_loadu_ps(y + j), f));
    if (j < len) {
      const __mmask16 k = simd::TailMask16(len - j);
      _mm512_mask_storeu_ps(y + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + j), f));
    }
  }
}

// ---- AVX2 ---------------------------------------------------------------------------------------

struct SigmaAvx2 {
  __m256d r0, r1, r2, r3, t0, t1, t2, t3, neg, pos;
  SD_TARGET_AVX2 explicit SigmaAvx2(const SigmaParams& p)
      : r0(_mm256_set1_pd(p.r[0])), r1(_mm256_set1_pd(p.r[1])), r2(_mm256_set1_pd(p.r[2])),
        r3(_mm256_set1_pd(p.r[3])), t0(_mm256_set1_pd(p.t[0])), t1(_mm256_set1_pd(p.t[1])),
        t2(_mm256_set1_pd(p.t[2])), t3(_mm256_set1_pd(p.t[3])), neg(_mm256_set1_pd(p.neg)),
        pos(_mm256_set1_pd(p.pos)) {}

  SD_TARGET_AVX2 __m256d operator()(__m256d x) const {
    const __m256d zero = _mm256_setzero_pd();
    const __m256d a = _mm256_max_pd(_mm256_sub_pd(r0, x), zero), b = _mm256_max_pd(_mm256_sub_pd(x, r1), zero);
    const __m256d c = _mm256_max_pd(_mm256_sub_pd(r2, x), zero), d = _mm256_max_pd(_mm256_sub_pd(x, r3), zero);
    __m256d s = _mm256_fmadd_pd(t0, a, x);
    s = _mm256_fmadd_pd(t1, b, s);
    s = _mm256_fmadd_pd(_mm256_mul_pd(t2, c), c, s);
    return _mm256_fmadd_pd(_mm256_mul_pd(t3, d), d, s);
  }
  // sigma with its limits at +-inf (the formula gives NaN there); only for vectors holding an inf.
  SD_TARGET_AVX2 __m256d WithLimits(__m256d x) const {
    const __m256d s = (*this)(x);
    const __m256d s1 = _mm256_blendv_pd(s, neg, _mm256_cmp_pd(x, _mm256_set1_pd(-INFINITY), _CMP_EQ_OQ));
    return _mm256_blendv_pd(s1, pos, _mm256_cmp_pd(x, _mm256_set1_pd(INFINITY), _CMP_EQ_OQ));
  }
};

SD_TARGET_AVX2 inline __m256 Poly256(__m256 t) {
  __m256 p = _mm256_set1_ps(simd::kC5);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(simd::kC4));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(simd::kC3));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(simd::kC2));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(simd::kC1));
  return _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f));
}

// As Reduce8 (AVX-512), for 4 d = z - M_b.
SD_TARGET_AVX2 inline void Reduce4(__m256d d, __m128* t, __m128* n) {
  d = _mm256_max_pd(d, _mm256_set1_pd(kMinDiff));
  const __m256d nn = _mm256_round_pd(_mm256_mul_pd(d, _mm256_set1_pd(kLog2eD)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  *t = _mm256_cvtpd_ps(_mm256_fnmadd_pd(nn, _mm256_set1_pd(kLn2D), d));
  *n = _mm256_cvtpd_ps(nn);
}

SD_TARGET_AVX2 void RowAvx2(const RowArgs& a, const SigmaParams& p) {
  const SigmaAvx2 s(p);
  const int64_t n = a.n;
  alignas(32) double zb[kBlock];
  const __m256d minus_inf = _mm256_set1_pd(-INFINITY), inf = _mm256_set1_pd(INFINITY);
  __m256d bad = _mm256_setzero_pd();  // NaN or +inf z seen (AVX2's max_pd drops NaNs)
  double row_m = -INFINITY, row_s = 0.0;
  for (int64_t j0 = 0, b = 0; j0 < n; j0 += kBlock, ++b) {
    const int64_t len = std::min(kBlock, n - j0);
    const float* x = a.x + j0;
    const float* mk = a.mask + j0 * a.mask_step;
    __m256d vmax = minus_inf;
    for (int64_t j = 0; j < len; j += 8) {
      __m256 xv, mv;
      __m256d out_lo = _mm256_setzero_pd(), out_hi = out_lo;  // all-ones in lanes past the row's end
      if (j + 8 <= len) {
        xv = _mm256_loadu_ps(x + j);
        mv = a.mask_step ? _mm256_loadu_ps(mk + j) : _mm256_set1_ps(a.mask[0]);
      } else {
        const __m256i k = simd::TailMask8(len - j);
        xv = _mm256_maskload_ps(x + j, k);
        mv = a.mask_step ? _mm256_maskload_ps(mk + j, k) : _mm256_set1_ps(a.mask[0]);
        const __m256i outside = _mm256_xor_si256(k, _mm256_set1_epi32(-1));
        out_lo = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(outside)));
        out_hi = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(outside, 1)));
      }
      const __m256d xlo_d = _mm256_cvtps_pd(_mm256_castps256_ps128(xv));
      const __m256d xhi_d = _mm256_cvtps_pd(_mm256_extractf128_ps(xv, 1));
      __m256d slo, shi;
      const __m256 abs_x = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), xv);
      if (_mm256_movemask_ps(_mm256_cmp_ps(abs_x, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ)) == 0) {  // no +-inf
        slo = s(xlo_d);
        shi = s(xhi_d);
      } else {
        slo = s.WithLimits(xlo_d);
        shi = s.WithLimits(xhi_d);
      }
      __m256d zlo = _mm256_add_pd(slo, _mm256_cvtps_pd(_mm256_castps256_ps128(mv)));
      __m256d zhi = _mm256_add_pd(shi, _mm256_cvtps_pd(_mm256_extractf128_ps(mv, 1)));
      zlo = _mm256_blendv_pd(zlo, minus_inf, out_lo);
      zhi = _mm256_blendv_pd(zhi, minus_inf, out_hi);
      bad = _mm256_or_pd(bad, _mm256_or_pd(_mm256_cmp_pd(zlo, zhi, _CMP_UNORD_Q),
                                           _mm256_cmp_pd(_mm256_max_pd(zlo, zhi), inf, _CMP_EQ_OQ)));
      vmax = _mm256_max_pd(vmax, _mm256_max_pd(zlo, zhi));
      _mm256_store_pd(zb + j, zlo);
      _mm256_store_pd(zb + j + 4, zhi);
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, vmax);
    const double mb = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
    a.block_max[b] = mb;
    float* y = a.y + j0;
    if (mb == -INFINITY || _mm256_movemask_pd(bad) != 0) {  // all -inf: stage 0 (NaN rows are refilled)
      std::memset(y, 0, static_cast<size_t>(len) * sizeof(float));
      continue;
    }
    const __m256d mbv = _mm256_set1_pd(mb);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    for (int64_t j = 0; j < len; j += 8) {
      __m128 tlo, thi, nlo, nhi;
      Reduce4(_mm256_sub_pd(_mm256_load_pd(zb + j), mbv), &tlo, &nlo);
      Reduce4(_mm256_sub_pd(_mm256_load_pd(zb + j + 4), mbv), &thi, &nhi);
      // 2^n, n in [-289, 0], flushed to 0 below -126 (lanes past the end: -200 -> 0).
      const __m256 w =
          _mm256_mul_ps(Poly256(_mm256_set_m128(thi, tlo)), simd::Exp2NonPositive(_mm256_set_m128(nhi, nlo)));
      if (j + 8 <= len) _mm256_storeu_ps(y + j, w);
      else _mm256_maskstore_ps(y + j, simd::TailMask8(len - j), w);
      if ((j & 8) == 0) acc0 = _mm256_add_ps(acc0, w);
      else acc1 = _mm256_add_ps(acc1, w);
    }
    FoldBlock(mb, static_cast<double>(simd::ReduceAdd8(_mm256_add_ps(acc0, acc1))), &row_m, &row_s);
  }
  if (_mm256_movemask_pd(bad) != 0 || row_m == -INFINITY) return FillNan(a.y, n);
  for (int64_t j0 = 0, b = 0; j0 < n; j0 += kBlock, ++b) {
    const int64_t len = std::min(kBlock, n - j0);
    const __m256 f = _mm256_set1_ps(BlockScale(a, b, row_m, row_s));
    float* y = a.y + j0;
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(y + j), f));
    for (; j < len; ++j) y[j] *= _mm_cvtss_f32(_mm256_castps256_ps128(f));
  }
}

// ---- binding ------------------------------------------------------------------------------------

using RowFn = void (*)(const RowArgs&, const SigmaParams&);

struct MultiMaxKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kT}, {Elem::kT, /*optional=*/true}};
  static constexpr Port kOutputs[] = {{Elem::kT}};

  int64_t axis;
  Isa isa;

  explicit MultiMaxKernel(const Attrs& attrs) : axis(attrs.Int("axis", -1)), isa(SelectIsa()) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    const Input<T> ranges = GetInput<T>(ctx, 1);
    const Input<T> ts = GetInput<T>(ctx, 2);
    const Input<T> mask = GetInput<T>(ctx, 3);
    if (x.rank() == 0) Fail(kOp, "input must have rank >= 1, got a scalar");
    const int64_t ax = NormalizeAxis(kOp, axis, x.rank());
    if (ranges.shape != std::vector<int64_t>{4}) {
      Fail(kOp, "Ranges has shape ", ShapeStr(ranges.shape), " (rule: Ranges must have shape [4])");
    }
    if (ts.shape != std::vector<int64_t>{4}) Fail(kOp, "Ts has shape ", ShapeStr(ts.shape), " (rule: Ts must have shape [4])");
    // Mask strides aligned to X's dims (0 along broadcast dims).
    const int64_t rank = x.rank();
    std::vector<int64_t> mstride(static_cast<size_t>(rank), 0);
    if (mask.present) {
      bool ok = mask.rank() <= rank;
      for (int64_t k = 0; ok && k < mask.rank(); ++k) {
        const int64_t md = mask.shape[mask.rank() - 1 - k], xd = x.shape[rank - 1 - k];
        ok = md == 1 || md == xd;
      }
      if (!ok) {
        Fail(kOp, "Mask of shape ", ShapeStr(mask.shape), " is not broadcastable to X of shape ", ShapeStr(x.shape),
             " (rule: Mask rank <= X rank and each Mask dim equals X's or is 1)");
      }
      int64_t stride = 1;
      for (int64_t k = mask.rank() - 1; k >= 0; --k) {
        const int64_t xk = rank - mask.rank() + k;
        mstride[xk] = mask.shape[k] == 1 ? 0 : stride;
        stride *= mask.shape[k];
      }
    }
    T* y = AllocOutput<T>(ctx, 0, x.shape);
    if (x.size() == 0) return;

    float r[4], t[4];
    for (int k = 0; k < 4; ++k) {
      r[k] = ToFloat(ranges.data[k]);
      t[k] = ToFloat(ts.data[k]);
    }
    const SigmaParams params = SigmaParams::Of(r, t);
    const AxisLayout l = AxisLayout::Of(x.shape, ax);
    const RowFn row_fn = isa == Isa::kAvx512 ? RowAvx512 : (isa == Isa::kAvx2 ? RowAvx2 : RowPortable);
    const int64_t mask_axis_stride = mstride[static_cast<size_t>(ax)];
    static const float kZero = 0.0f;

    const int64_t rows = l.rows();
    const size_t tasks = NumTasks(rows, l.n * 4);
    ParallelFor(ctx, tasks, [&](size_t task) {
      int64_t r0, r1;
      TaskRange(task, tasks, rows, &r0, &r1);
      const bool direct_x = std::is_same_v<T, float> && l.inner == 1;
      const bool direct_mask = !mask.present || (std::is_same_v<T, float> && mask_axis_stride <= 1);
      std::vector<float> x_buf, y_buf, m_buf;
      std::vector<double> block_max(static_cast<size_t>(NumBlocks(l.n)));
      if (!direct_x) {
        x_buf.resize(static_cast<size_t>(l.n));
        y_buf.resize(static_cast<size_t>(l.n));
      }
      if (!direct_mask) m_buf.resize(static_cast<size_t>(mask_axis_stride == 0 ? 1 : l.n));
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t o = row / l.inner, i = row % l.inner;
        const int64_t base = o * l.n * l.inner + i;
        RowArgs a{};
        a.n = l.n;
        a.block_max = block_max.data();
        if (!params.finite) {
          for (int64_t j = 0; j < l.n; ++j) y[base + j * l.inner] = FromFloat<T>(NAN);
          continue;
        }
        if (direct_x) {
          a.x = reinterpret_cast<const float*>(x.data) + base;
          a.y = reinterpret_cast<float*>(y) + base;
        } else {
          for (int64_t j = 0; j < l.n; ++j) x_buf[j] = ToFloat(x.data[base + j * l.inner]);
          a.x = x_buf.data();
          a.y = y_buf.data();
        }
        if (!mask.present) {
          a.mask = &kZero;
          a.mask_step = 0;
        } else {
          // Offset of this row's first mask element: unravel (o, i) over X's dims.
          int64_t off = 0, rem_o = o, rem_i = i;
          for (int64_t k = rank - 1; k > ax; --k) {
            off += (rem_i % x.shape[k]) * mstride[k];
            rem_i /= x.shape[k];
          }
          for (int64_t k = ax - 1; k >= 0; --k) {
            off += (rem_o % x.shape[k]) * mstride[k];
            rem_o /= x.shape[k];
          }
          a.mask_step = mask_axis_stride == 0 ? 0 : 1;
          if (direct_mask) {
            a.mask = reinterpret_cast<const float*>(mask.data) + off;
          } else {
            for (size_t j = 0; j < m_buf.size(); ++j) m_buf[j] = ToFloat(mask.data[off + j * mask_axis_stride]);
            a.mask = m_buf.data();
          }
        }
        row_fn(a, params);
        if (!direct_x) {
          for (int64_t j = 0; j < l.n; ++j) y[base + j * l.inner] = FromFloat<T>(y_buf[j]);
        }
      }
    });
  }
};

}  // namespace

SD_REGISTER_KERNEL(MultiMax, MultiMaxKernel)

}  // namespace sd
