// Softpick -- rectified softmax replacement (Zuhri, Fuadi & Aji 2025, arXiv 2504.20966).
//
//   m = max of the finite x_j,   e_j = exp(x_j - m) - exp(-m)
//   y_i = max(e_i, 0) / (sum_{j: x_j finite} |e_j| + eps)          along `axis`
//
// Python half (the contract, the +inf/NaN reading, the float64 oracle): softdeploy/ops/softpick.py;
// docs/ops/Softpick.md.
//
// The kernel evaluates the same value in the unshifted form (numerator and denominator times e^m):
//   y_i = [x_i > 0] * expm1(x_i) / (T + eps * e^m),        T = sum_{finite j} |expm1(x_j)|
// which needs no max before the sum and has no cancellation: expm1 comes from a range-reduced
// polynomial q(t) = expm1(t) (|t| <= ln2/2) as 2^n * q + (2^n - 1), accurate for x near 0 where
// exp(x - m) - exp(-m) would lose digits. Every term is carried as expm1(x) * 2^-R for a per-row
// power-of-two scale R: R = 0 unless a logit exceeds ~69 (kMaxTermExponent * ln2); then R grows so
// that terms stay below 2^101 and the float sums cannot overflow. A very negative m needs nothing
// special: all terms are in [-1, 0] and every numerator is exactly 0 (no exp(-m) is ever formed).
//
// Pass 1 (statistics; reads x once), per block of kBlock elements: computes the terms, adds |term|
//   of finite entries into per-lane float sums (the block's sum then into a double total), tracks the
//   finite max m, and stages the numerators in y: the term where x > 0 and finite, x itself where x
//   is NaN or +inf, 0 elsewhere. When a block's max needs a larger R, the total and the staged prefix
//   are rescaled by 2^(R_old - R_new) and the block is redone (only rows with logits > ~69).
// Pass 2 (output; reads y once, in cache): y *= 1 / (T * 2^-R + eps * e^(m - R ln2)). Staged NaN,
//   +inf and exact 0 pass through unchanged. Skipped when m <= 0: every numerator is then 0.
// Computing the terms once (instead of again in pass 2, as an online softmax does) halves the
// transcendental work; it costs a read-modify-write of y, which is still in L2/L3 for rows up to
// ~1 MB.
//
// What must stay true:
//  * Non-finite entries add nothing to T or m; -inf outputs 0, NaN outputs NaN, +inf outputs +inf;
//    a row with no finite entry is all zeros. Entries with x <= 0 output exactly 0.
//  * Rows whose finite max exceeds kFastMaxLogit (2^16) go to RowExact (double precision; reads the
//    row three times): past that, float32 range reduction loses the bits of t.
//  * Rows are independent: threads split rows (MapRows), never a row; results do not depend on the
//    thread count.
#include <cfloat>
#include <cmath>
#include <cstring>

#include "common/kernel.h"
#include "common/simd_math.h"

namespace sd {
namespace {

constexpr const char* kOp = "Softpick";

constexpr int64_t kBlock = 1024;          // elements per block of the two-level summation
constexpr float kMaxTermExponent = 100;   // terms stay below 2^(kMaxTermExponent + 1) at scale 2^-R
constexpr float kFastMaxLogit = 65536.0f;  // finite max above this -> RowExact
constexpr float kMinX = -104.0f;          // exp(-104) is 0 in float: expm1(x) = -1 below
constexpr float kLn2 = 0x1.62E430p-1f;
constexpr double kLn2Double = 0x1.62E42FEFA39EFp-1;

// expm1(t) = t + t^2 * (k0 + t*(k1 + t*(k2 + t*(k3 + t*k4)))) on |t| <= 0.4: relative error 1.0e-7
// in float32 (coefficients fitted for relative error of expm1, not of exp, so small t stays exact).
constexpr float kQ0 = 0x1.fffffep-2f;
constexpr float kQ1 = 0x1.55543p-3f;
constexpr float kQ2 = 0x1.55575p-5f;
constexpr float kQ3 = 0x1.1283d6p-7f;
constexpr float kQ4 = 0x1.6bddfep-10f;

// ---- the exact fallback, and the end of a row (all variants) -------------------------------------

// |e_j| * e^m = exp(max(x, 0) - m) * -expm1(-|x|), in double.
double MagnitudeExact(double x, double m) { return std::exp(std::max(x, 0.0) - m) * -std::expm1(-std::fabs(x)); }

// Output of a non-finite entry in a row that has a finite one: -inf -> 0, NaN and +inf -> themselves.
inline float NonFiniteOutput(float x) { return x == -INFINITY ? 0.0f : x; }

// The shifted formula in double precision for rows beyond the float32 fast path (|logits| > 2^16).
void RowExact(const float* x, float* y, int64_t n, float eps) {
  double m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isfinite(x[j])) m = std::max<double>(m, x[j]);
  }
  if (m == -INFINITY) {
    std::memset(y, 0, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  double d = eps;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isfinite(x[j])) d += MagnitudeExact(x[j], m);
  }
  for (int64_t j = 0; j < n; ++j) {
    if (!std::isfinite(x[j])) y[j] = NonFiniteOutput(x[j]);
    else y[j] = x[j] > 0.0f ? static_cast<float>(MagnitudeExact(x[j], m) / d) : 0.0f;
  }
}

// Multiplies the staged prefix y[0, count) by 2^shift (shift < 0) after R grew; non-finite staged
// values (NaN, +inf) must not meet a factor that underflows to 0.
void RescaleStaged(float* y, int64_t count, float shift) {
  const double f = std::ldexp(1.0, static_cast<int>(std::max(shift, -1100.0f)));
  for (int64_t j = 0; j < count; ++j) {
    if (std::isfinite(y[j])) y[j] = static_cast<float>(y[j] * f);
  }
}

// What pass 2 must do with a row whose pass 1 found finite max m, total T * 2^-R and scale R.
struct Finish {
  enum Kind { kZeros, kDone, kScale, kDivide } kind;
  float inv = 0.0f;  // kScale: y *= inv
  double d = 0.0;    // kDivide: y = y / d in double (denominator below the float normal range)
};

Finish PlanFinish(float m, double total, float r, float eps) {
  if (m == -INFINITY) return {Finish::kZeros};
  if (!(m > 0.0f)) return {Finish::kDone};  // every finite x <= 0: numerators are exact 0 already
  // eps * e^m at the row's scale 2^-R, in double: m - R ln2 cancels (both ~m, up to 2^16), so in float
  // the rounding of R * ln2 (ulp(m) / 2 = 1e-3 at m = 2.77e4) and float ln2's own error (R * 6e-9)
  // would land in the exponent: relative error up to ~1e-3 in the eps term (2e-4 in y for eps = 0.388,
  // against the contract's 1e-6). In double both are ~1e-12. Once per row, so the cost is nil.
  const double d =
      eps == 0.0f ? total : total + static_cast<double>(eps) * std::exp(static_cast<double>(m) - r * kLn2Double);
  const float inv = static_cast<float>(1.0 / d);
  if (d >= FLT_MIN && std::isfinite(inv)) return {Finish::kScale, inv};
  return {Finish::kDivide, 0.0f, d};
}

// Pass 2 for the cases without a vector loop (and the tails of the vector ones).
void FinishScalar(const Finish& f, float* y, int64_t n) {
  switch (f.kind) {
    case Finish::kZeros: std::memset(y, 0, static_cast<size_t>(n) * sizeof(float)); break;
    case Finish::kDone: break;
    case Finish::kScale:
      for (int64_t j = 0; j < n; ++j) y[j] *= f.inv;
      break;
    case Finish::kDivide:
      for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(y[j] / f.d);
      break;
  }
}

// ---- portable -----------------------------------------------------------------------------------

// expm1(x) * 2^-r for finite x (c = 2^-r).
inline float TermScalar(float x, float r, float c) {
  const float xc = std::max(x, kMinX);
  const float n = std::nearbyint(xc * simd::kLog2e);
  float t = std::fma(n, simd::kMinusLn2Hi, xc);
  t = std::fma(n, simd::kMinusLn2Lo, t);
  float p = kQ4;
  p = std::fma(p, t, kQ3);
  p = std::fma(p, t, kQ2);
  p = std::fma(p, t, kQ1);
  p = std::fma(p, t, kQ0);
  const float q = std::fma(t * t, p, t);
  const float s = simd::Scale2(1.0f, n - r);
  return std::fma(s, q, s - c);
}

void RowPortable(const float* x, float* y, int64_t n, float eps) {
  float r = 0.0f, c = 1.0f, m = -INFINITY;
  float limit = kMaxTermExponent * kLn2;  // rescale when a finite x exceeds this
  double total = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const float v = x[j];
    if (!std::isfinite(v)) {
      y[j] = NonFiniteOutput(v);
      continue;
    }
    if (v > limit) {
      if (v > kFastMaxLogit) return RowExact(x, y, n, eps);
      const float r_new = std::nearbyint(v * simd::kLog2e);
      total = std::ldexp(total, static_cast<int>(std::max(r - r_new, -1100.0f)));
      RescaleStaged(y, j, r - r_new);
      r = r_new;
      c = simd::Scale2(1.0f, -r);
      limit = (r + kMaxTermExponent) * kLn2;
    }
    const float term = TermScalar(v, r, c);
    total += std::fabs(term);
    m = std::max(m, v);
    y[j] = v > 0.0f ? term : 0.0f;
  }
  FinishScalar(PlanFinish(m, total, r, eps), y, n);
}

// ---- AVX-512 ------------------------------------------------------------------------------------

SD_TARGET_AVX512 inline __m512 Term512(__m512 x, __m512 minus_r, __m512 c) {
  const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(kMinX));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(simd::kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 t = _mm512_fmadd_ps(n, _mm512_set1_ps(simd::kMinusLn2Hi), xc);
  t = _mm512_fmadd_ps(n, _mm512_set1_ps(simd::kMinusLn2Lo), t);
  __m512 p = _mm512_set1_ps(kQ4);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kQ3));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kQ2));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kQ1));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kQ0));
  const __m512 q = _mm512_fmadd_ps(_mm512_mul_ps(t, t), p, t);
  const __m512 s = _mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(n, minus_r));
  return _mm512_fmadd_ps(s, q, _mm512_sub_ps(s, c));  // 2^-r * (2^n * (1 + q) - 1)
}

// fpclass categories: QNaN 0x01, +inf 0x08, -inf 0x10, SNaN 0x80.
constexpr int kNonFinite = 0x01 | 0x08 | 0x10 | 0x80;
constexpr int kNanOrPosInf = 0x01 | 0x08 | 0x80;

// One vector of pass 1 on the lanes in `valid`: stages numerators at y, adds |term| of finite lanes
// to acc, folds finite lanes into the running max.
SD_TARGET_AVX512 inline void Stage512(const float* x, float* y, __mmask16 valid, __m512 minus_r, __m512 c,
                                      __m512& acc, __m512& vmax) {
  const __m512 v = _mm512_maskz_loadu_ps(valid, x);
  const __mmask16 finite = _mm512_kandn(_mm512_fpclass_ps_mask(v, kNonFinite), valid);
  const __mmask16 keep = _mm512_fpclass_ps_mask(v, kNanOrPosInf) & valid;
  const __mmask16 pos = _mm512_mask_cmp_ps_mask(finite, v, _mm512_setzero_ps(), _CMP_GT_OQ);
  const __m512 term = Term512(v, minus_r, c);
  acc = _mm512_mask_add_ps(acc, finite, acc, _mm512_abs_ps(term));
  vmax = _mm512_mask_max_ps(vmax, finite, vmax, v);
  _mm512_mask_storeu_ps(y, valid, _mm512_mask_mov_ps(_mm512_maskz_mov_ps(pos, term), keep, v));
}

SD_TARGET_AVX512 void RowAvx512(const float* x, float* y, int64_t n, float eps) {
  float r = 0.0f;
  float limit = kMaxTermExponent * kLn2;
  __m512d total_lo = _mm512_setzero_pd(), total_hi = _mm512_setzero_pd();
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  float m = -INFINITY;
  for (int64_t b = 0; b < n;) {
    const int64_t block_end = std::min(n, b + kBlock);
    const __m512 minus_r = _mm512_set1_ps(-r), c = _mm512_set1_ps(simd::Scale2(1.0f, -r));
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m512 bmax = vmax;
    int64_t j = b;
    for (; j + 64 <= block_end; j += 64) {
      Stage512(x + j, y + j, 0xFFFF, minus_r, c, a0, bmax);
      Stage512(x + j + 16, y + j + 16, 0xFFFF, minus_r, c, a1, bmax);
      Stage512(x + j + 32, y + j + 32, 0xFFFF, minus_r, c, a2, bmax);
      Stage512(x + j + 48, y + j + 48, 0xFFFF, minus_r, c, a3, bmax);
    }
    for (; j < block_end; j += 16) {
      const __mmask16 valid = simd::TailMask16(block_end - j);
      Stage512(x + j, y + j, valid, minus_r, c, a0, bmax);
    }
    const float block_max = _mm512_reduce_max_ps(bmax);
    if (block_max > limit) {  // terms may have reached 2^(kMaxTermExponent + 1): raise R, redo
      if (block_max > kFastMaxLogit) return RowExact(x, y, n, eps);
      const float r_new = std::nearbyint(block_max * simd::kLog2e);
      const __m512d f = _mm512_set1_pd(std::ldexp(1.0, static_cast<int>(std::max(r - r_new, -1100.0f))));
      total_lo = _mm512_mul_pd(total_lo, f);
      total_hi = _mm512_mul_pd(total_hi, f);
      RescaleStaged(y, b, r - r_new);
      r = r_new;
      limit = (r + kMaxTermExponent) * kLn2;
      continue;  // same b
    }
    vmax = bmax;
    m = block_max;
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
    total_lo = _mm512_add_pd(total_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(sum)));
    total_hi = _mm512_add_pd(total_hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1))));
    b = block_end;
  }
  const Finish f = PlanFinish(m, _mm512_reduce_add_pd(_mm512_add_pd(total_lo, total_hi)), r, eps);
  if (f.kind != Finish::kScale) return FinishScalar(f, y, n);
  const __m512 inv = _mm512_set1_ps(f.inv);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_loadu_ps(y + j), inv));
  if (j < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(y + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + j), inv));
  }
}

// ---- AVX2 ---------------------------------------------------------------------------------------

// 2^e for integer-valued e, clamped to [-127, 127]; e <= -127 gives 0 (terms that small are below
// the float range relative to the row's largest term).
SD_TARGET_AVX2 inline __m256 Pow2Clamped(__m256 e) {
  const __m256 ec = _mm256_min_ps(_mm256_max_ps(e, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_add_ps(ec, _mm256_set1_ps(127.0f))), 23));
}

SD_TARGET_AVX2 inline __m256 Term256(__m256 x, __m256 minus_r, __m256 c) {
  const __m256 xc = _mm256_max_ps(x, _mm256_set1_ps(kMinX));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(simd::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 t = _mm256_fmadd_ps(n, _mm256_set1_ps(simd::kMinusLn2Hi), xc);
  t = _mm256_fmadd_ps(n, _mm256_set1_ps(simd::kMinusLn2Lo), t);
  __m256 p = _mm256_set1_ps(kQ4);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kQ3));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kQ2));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kQ1));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kQ0));
  const __m256 q = _mm256_fmadd_ps(_mm256_mul_ps(t, t), p, t);
  const __m256 s = Pow2Clamped(_mm256_add_ps(n, minus_r));
  return _mm256_fmadd_ps(s, q, _mm256_sub_ps(s, c));
}

SD_TARGET_AVX2 inline void Stage256(const float* x, float* y, int64_t count, __m256 minus_r, __m256 c, __m256& acc,
                                    __m256& vmax) {
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const bool full = count >= 8;
  const __m256i lanes = simd::TailMask8(count);
  const __m256 v = full ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, lanes);
  const __m256 abs_v = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
  // Lanes past the tail load as 0 (finite): `valid` removes them.
  const __m256 valid = _mm256_castsi256_ps(lanes);
  const __m256 finite = _mm256_and_ps(_mm256_cmp_ps(abs_v, inf, _CMP_LT_OQ), valid);
  const __m256 keep = _mm256_or_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), _mm256_cmp_ps(v, inf, _CMP_EQ_OQ));
  const __m256 pos = _mm256_and_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ), finite);
  const __m256 term = Term256(v, minus_r, c);
  acc = _mm256_add_ps(acc, _mm256_and_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), term), finite));
  vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, finite));
  const __m256 out = _mm256_blendv_ps(_mm256_and_ps(term, pos), v, keep);
  if (full) _mm256_storeu_ps(y, out);
  else _mm256_maskstore_ps(y, lanes, out);
}

SD_TARGET_AVX2 void RowAvx2(const float* x, float* y, int64_t n, float eps) {
  float r = 0.0f;
  float limit = kMaxTermExponent * kLn2;
  __m256d total_lo = _mm256_setzero_pd(), total_hi = _mm256_setzero_pd();
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  float m = -INFINITY;
  for (int64_t b = 0; b < n;) {
    const int64_t block_end = std::min(n, b + kBlock);
    const __m256 minus_r = _mm256_set1_ps(-r), c = _mm256_set1_ps(simd::Scale2(1.0f, -r));
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 bmax = vmax;
    int64_t j = b;
    for (; j + 32 <= block_end; j += 32) {
      Stage256(x + j, y + j, 8, minus_r, c, a0, bmax);
      Stage256(x + j + 8, y + j + 8, 8, minus_r, c, a1, bmax);
      Stage256(x + j + 16, y + j + 16, 8, minus_r, c, a2, bmax);
      Stage256(x + j + 24, y + j + 24, 8, minus_r, c, a3, bmax);
    }
    for (; j < block_end; j += 8) Stage256(x + j, y + j, block_end - j, minus_r, c, a0, bmax);
    const float block_max = simd::ReduceMax8(bmax);
    if (block_max > limit) {
      if (block_max > kFastMaxLogit) return RowExact(x, y, n, eps);
      const float r_new = std::nearbyint(block_max * simd::kLog2e);
      const __m256d f = _mm256_set1_pd(std::ldexp(1.0, static_cast<int>(std::max(r - r_new, -1100.0f))));
      total_lo = _mm256_mul_pd(total_lo, f);
      total_hi = _mm256_mul_pd(total_hi, f);
      RescaleStaged(y, b, r - r_new);
      r = r_new;
      limit = (r + kMaxTermExponent) * kLn2;
      continue;
    }
    vmax = bmax;
    m = block_max;
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    total_lo = _mm256_add_pd(total_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(sum)));
    total_hi = _mm256_add_pd(total_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(sum, 1)));
    b = block_end;
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(total_lo, total_hi));
  const Finish f = PlanFinish(m, (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]), r, eps);
  if (f.kind != Finish::kScale) return FinishScalar(f, y, n);
  const __m256 inv = _mm256_set1_ps(f.inv);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(y + j), inv));
  for (; j < n; ++j) y[j] *= f.inv;
}

struct SoftpickKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}};

  int64_t axis;
  float eps;
  Isa isa;

  explicit SoftpickKernel(const Attrs& attrs)
      : axis(attrs.Int("axis", -1)), eps(attrs.Float("eps", 1e-6f)), isa(SelectIsa()) {
    if (!(std::isfinite(eps) && eps >= 0.0f)) {
      Fail(kOp, "eps ", eps, " is not a finite number >= 0 (rule: 0 <= eps < inf)");
    }
  }

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    T* y = AllocOutput<T>(ctx, 0, x.shape);
    if (x.rank() == 0) Fail(kOp, "input must have rank >= 1, got a scalar");
    const AxisLayout l = AxisLayout::Of(x.shape, NormalizeAxis(kOp, axis, x.rank()));
    if (x.size() == 0) return;
    const float e = eps;
    switch (isa) {
      case Isa::kAvx512:
        MapRows<T>(ctx, x.data, y, l, [e](const float* a, float* b, int64_t n) { RowAvx512(a, b, n, e); });
        break;
      case Isa::kAvx2:
        MapRows<T>(ctx, x.data, y, l, [e](const float* a, float* b, int64_t n) { RowAvx2(a, b, n, e); });
        break;
      default:
        MapRows<T>(ctx, x.data, y, l, [e](const float* a, float* b, int64_t n) { RowPortable(a, b, n, e); });
    }
  }
};

}  // namespace

SD_REGISTER_KERNEL(Softpick, SoftpickKernel)

}  // namespace sd
