// AdaptiveTemperatureSoftmax -- softmax sharpened by an entropy-chosen inverse temperature
// (Velickovic et al. 2024, "softmax is not enough", arXiv 2410.01104).
//
//   p = softmax(x),  H = -sum_j p_j log(p_j + 1e-9),
//   beta = max(-0.037 H^4 + 0.481 H^3 - 2.3 H^2 + 4.917 H - 1.791, 1) if H > 0.5 else 1,
//   Y = softmax(beta * x)                                     along `axis`
//
// Python half, the contract and the float64 oracle: softdeploy/ops/adaptive_temperature_softmax.py
// (its docstring derives the passes below); docs/ops/AdaptiveTemperatureSoftmax.md.
//
// Per row, with m = max x, z_j = x_j - m, e_j = exp(z_j), d = sum e_j:
//   pass 1 (read 1): m, d, S = sum e_j z_j online -- per-lane running max; a lane whose max grows
//          rescales its sums by f = exp(m_old - m_new): S' = f (S + (m_old - m_new) d), d' = f d.
//          H0 = log d - S/d is the entropy without the epsilon.
//   The epsilon: H = H0 - 1e-9 * G, G = sum_j g(v_j) in [0, n], g(v) = log1p(e^v) e^-v,
//          v_j = log(1e-9 d) - z_j. If beta is 1 on all of [H0 - 1e-9 n, H0] (BetaIsOneOn), G is
//          not needed and the output pass writes e_j / d: 2 reads in all.
//   pass 2 (read 2): G and W_k = sum_j w_j z_j^k (k = 0..3), w_j = exp(beta_hat z_j), at
//          beta_hat = beta(H0 - 1e-9 n / 2). With beta = beta(H0 - 1e-9 G), delta = beta - beta_hat,
//          log sum_j exp(beta z_j) = log W0 + delta k1 + delta^2 k2 / 2 + delta^3 k3 / 6 + O(delta^4)
//          (k = the cumulants of z under w). |delta| <= 2.53 * 1e-9 n / 2; while |delta| <= 4e-4
//          (rows up to ~300k entries) the truncation is below 1e-10, else pass 2 runs once more at
//          the exact beta.
//   output pass (read 3): y_j = exp(beta z_j) / sum.
//
// What must stay true:
//  * Sums are float within short blocks (kFold vectors per lane) and double across blocks: H's error
//    is amplified ~|beta'(H)| * |z| (up to ~100x) in the output.
//  * A row holding NaN or +inf, or only -inf, is all NaN; -inf entries give exactly 0.
//  * Rows are split across threads (MapRows), never a row; nothing throws inside ParallelFor.
#include <cmath>

#include "common/kernel.h"
#include "common/simd_math.h"

namespace sd {
namespace {

constexpr const char* kOp = "AdaptiveTemperatureSoftmax";
constexpr double kEps = 1e-9;
constexpr double kGate = 0.5;
constexpr double kPolyArgMax = 4.41240187;  // the polynomial's only critical point (its maximum, 2.42)
constexpr double kBetaSlope = 2.53;         // max |poly'| where poly > 1
constexpr double kTaylorMaxDelta = 4e-4;
constexpr double kEntropyTol = 1e-6;  // allowance for float rounding in H0 when deciding "beta is 1"
constexpr int kFold = 16;             // vectors per lane summed in float before folding into double
constexpr float kFloor = -200.0f;     // exp(-200) == 0 in float: z below it contributes nothing

double Poly(double h) { return (((-0.037 * h + 0.481) * h - 2.3) * h + 4.917) * h - 1.791; }
double Beta(double h) { return h > kGate ? std::max(Poly(h), 1.0) : 1.0; }

// True when beta(H) == 1 for every H in [lo, hi].
bool BetaIsOneOn(double lo, double hi) {
  if (hi <= kGate) return true;
  const double a = std::max(lo, kGate);
  return Poly(a) <= 1.0 && Poly(hi) <= 1.0 && !(a <= kPolyArgMax && kPolyArgMax <= hi);
}

struct Stats1 {
  float m;   // row max
  double d;  // sum exp(x - m)
  double s;  // sum exp(x - m) (x - m)
  bool bad;  // NaN seen
};

struct Stats2 {
  double g;               // sum g(v_j)
  double w0, w1, w2, w3;  // sum w z^k
};

// g(v) = log1p(e^v) e^-v, from t = e^-|v| and log1p(t)/t = 2/(2+t) * atanh(s)/s, s = t/(2+t) <= 1/3
// (series to s^10: relative error < 2e-7).
inline float GScalar(float v) {
  const double t = std::exp(-std::fabs(static_cast<double>(v)));
  const double ratio = t > 0 ? std::log1p(t) / t : 1.0;
  return static_cast<float>(v < 0 ? ratio : (v + ratio * t) * t);
}

// ---- portable -----------------------------------------------------------------------------------

struct Portable {
  static Stats1 Pass1(const float* x, int64_t n) {
    float m = -INFINITY;
    double d = 0, s = 0;
    bool bad = false;
    for (int64_t j = 0; j < n; ++j) {
      bad |= std::isnan(x[j]);
      if (x[j] == -INFINITY) continue;  // contributes exactly 0 (and -inf - -inf would be NaN)
      if (x[j] > m) {
        const double delta = std::max(static_cast<double>(m) - x[j], double{kFloor});
        const double f = std::exp(delta);
        s = f * (s + delta * d);
        d = f * d;
        m = x[j];
      }
      const double z = std::max(static_cast<double>(x[j]) - m, double{kFloor});
      const double e = std::exp(z);
      d += e;
      s += e * z;
    }
    return {m, d, s, bad};
  }
  static Stats2 Pass2(const float* x, int64_t n, float m, float beta_hat, float log_eps_d) {
    Stats2 r{};
    for (int64_t j = 0; j < n; ++j) {
      const double z = std::max(static_cast<double>(x[j]) - m, -1e4);
      const double w = std::exp(beta_hat * z);
      r.w0 += w;
      r.w1 += w * z;
      r.w2 += w * z * z;
      r.w3 += w * z * z * z;
      r.g += GScalar(static_cast<float>(log_eps_d - z));
    }
    return r;
  }
  static void Write(const float* x, float* y, int64_t n, float m, float beta, float inv, bool /*stream*/) {
    for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(std::exp(static_cast<double>(beta) * (x[j] - m)) * inv);
  }
};

// ---- AVX-512 ------------------------------------------------------------------------------------

// (maskz forms: the plain ones trip gcc 12's -Wuninitialized inside its own headers)
SD_TARGET_AVX512 inline __m512d Lo(__m512 v) { return _mm512_maskz_cvtps_pd(0xFF, _mm512_maskz_extractf32x8_ps(0xFF, v, 0)); }
SD_TARGET_AVX512 inline __m512d Hi(__m512 v) {
  return _mm512_maskz_cvtps_pd(0xFF, _mm512_maskz_extractf32x8_ps(0xFF, v, 1));
}
// acc[0..1] += v as doubles.
SD_TARGET_AVX512 inline void Fold(__m512d* acc, __m512 v) {
  acc[0] = _mm512_add_pd(acc[0], Lo(v));
  acc[1] = _mm512_add_pd(acc[1], Hi(v));
}
SD_TARGET_AVX512 inline double Sum(const __m512d* acc) {
  alignas(64) double t[8];
  _mm512_store_pd(t, _mm512_add_pd(acc[0], acc[1]));
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

struct Avx512 {
  SD_TARGET_AVX512 static Stats1 Pass1(const float* x, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY), d = _mm512_setzero_ps(), s = d;
    __m512d dd[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()}, sd[2] = {dd[0], dd[0]};
    __mmask16 nan = 0;
    const __m512 floor = _mm512_set1_ps(kFloor);
    int fold = 0;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = simd::TailMask16(n - j);
      const __m512 xv = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + j);
      nan |= _mm512_fpclass_ps_mask(xv, 0x81);
      const __mmask16 grow = _mm512_cmp_ps_mask(xv, m, _CMP_GT_OQ);
      if (grow) {  // rare after the first vectors: rescale the lanes whose max grows
        const __m512 mn = _mm512_mask_mov_ps(m, grow, xv);
        const __m512 delta = _mm512_max_ps(_mm512_sub_ps(m, mn), floor);  // -inf - -inf = NaN -> floor
        const __m512 f = simd::Exp(delta);
        s = _mm512_mul_ps(f, _mm512_fmadd_ps(delta, d, s));
        d = _mm512_mul_ps(f, d);
        const __m512d flo = Lo(f), fhi = Hi(f), dlo = Lo(delta), dhi = Hi(delta);
        sd[0] = _mm512_mul_pd(flo, _mm512_fmadd_pd(dlo, dd[0], sd[0]));
        sd[1] = _mm512_mul_pd(fhi, _mm512_fmadd_pd(dhi, dd[1], sd[1]));
        dd[0] = _mm512_mul_pd(flo, dd[0]);
        dd[1] = _mm512_mul_pd(fhi, dd[1]);
        m = mn;
      }
      const __m512 z = _mm512_max_ps(_mm512_sub_ps(xv, m), floor);  // -inf and NaN -> floor
      const __m512 e = simd::Exp(z);
      d = _mm512_add_ps(d, e);
      s = _mm512_fmadd_ps(e, z, s);
      if (++fold == kFold) {
        Fold(dd, d);
        Fold(sd, s);
        d = s = _mm512_setzero_ps();
        fold = 0;
      }
    }
    Fold(dd, d);
    Fold(sd, s);
    alignas(64) float ml[16];
    alignas(64) double dl[16], sl[16];
    _mm512_store_ps(ml, m);
    _mm512_store_pd(dl, dd[0]);
    _mm512_store_pd(dl + 8, dd[1]);
    _mm512_store_pd(sl, sd[0]);
    _mm512_store_pd(sl + 8, sd[1]);
    return Merge(ml, dl, sl, 16, nan != 0);
  }

  SD_TARGET_AVX512 static Stats2 Pass2(const float* x, int64_t n, float m, float beta_hat, float log_eps_d) {
    const __m512 mv = _mm512_set1_ps(m), bh = _mm512_set1_ps(beta_hat), lv = _mm512_set1_ps(log_eps_d);
    const __m512 zfloor = _mm512_set1_ps(-1e4f), one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 g = _mm512_setzero_ps(), w0 = g, w1 = g, w2 = g, w3 = g;
    __m512d acc[5][2];
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_pd();
    int fold = 0;
    for (int64_t j = 0; j < n; j += 16) {
      const __m512 xv = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), simd::TailMask16(n - j), x + j);
      const __m512 z = _mm512_max_ps(_mm512_sub_ps(xv, mv), zfloor);
      const __m512 w = simd::Exp(_mm512_mul_ps(bh, z));
      const __m512 wz = _mm512_mul_ps(w, z), wzz = _mm512_mul_ps(wz, z);
      w0 = _mm512_add_ps(w0, w);
      w1 = _mm512_add_ps(w1, wz);
      w2 = _mm512_add_ps(w2, wzz);
      w3 = _mm512_fmadd_ps(wzz, z, w3);
      const __m512 v = _mm512_sub_ps(lv, z);
      const __m512 t = simd::Exp(_mm512_or_ps(v, sign));  // exp(-|v|)
      const __m512 r = _mm512_div_ps(one, _mm512_add_ps(two, t));
      const __m512 sv = _mm512_mul_ps(t, r), q = _mm512_mul_ps(sv, sv);
      __m512 p = _mm512_fmadd_ps(q, _mm512_set1_ps(1.0f / 11), _mm512_set1_ps(1.0f / 9));
      p = _mm512_fmadd_ps(p, q, _mm512_set1_ps(1.0f / 7));
      p = _mm512_fmadd_ps(p, q, _mm512_set1_ps(1.0f / 5));
      p = _mm512_fmadd_ps(p, q, _mm512_set1_ps(1.0f / 3));
      p = _mm512_fmadd_ps(p, q, one);
      const __m512 ratio = _mm512_mul_ps(_mm512_mul_ps(two, p), r);  // log1p(t) / t
      const __m512 pos = _mm512_mul_ps(_mm512_fmadd_ps(ratio, t, v), t);
      g = _mm512_add_ps(g, _mm512_mask_mov_ps(pos, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ), ratio));
      if (++fold == kFold) {
        Fold(acc[0], g), Fold(acc[1], w0), Fold(acc[2], w1), Fold(acc[3], w2), Fold(acc[4], w3);
        g = w0 = w1 = w2 = w3 = _mm512_setzero_ps();
        fold = 0;
      }
    }
    Fold(acc[0], g), Fold(acc[1], w0), Fold(acc[2], w1), Fold(acc[3], w2), Fold(acc[4], w3);
    return {Sum(acc[0]), Sum(acc[1]), Sum(acc[2]), Sum(acc[3]), Sum(acc[4])};
  }

  SD_TARGET_AVX512 static void Write(const float* x, float* y, int64_t n, float m, float beta, float inv, bool stream) {
    const __m512 mv = _mm512_set1_ps(m), bv = _mm512_set1_ps(beta), iv = _mm512_set1_ps(inv);
    auto out = [&](int64_t at, __mmask16 k) SD_TARGET_AVX512 {
      const __m512 xv = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + at);
      return _mm512_mul_ps(simd::Exp(_mm512_mul_ps(bv, _mm512_sub_ps(xv, mv))), iv);
    };
    int64_t j = 0;
    if (stream) {
      const int64_t peel = std::min<int64_t>(n, ((64 - (reinterpret_cast<uintptr_t>(y) & 63)) & 63) / 4);
      if (peel > 0) _mm512_mask_storeu_ps(y, simd::TailMask16(peel), out(0, simd::TailMask16(peel)));
      for (j = peel; j + 16 <= n; j += 16) _mm512_stream_ps(y + j, out(j, 0xFFFF));
      _mm_sfence();
    } else {
      for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, out(j, 0xFFFF));
    }
    if (j < n) _mm512_mask_storeu_ps(y + j, simd::TailMask16(n - j), out(j, simd::TailMask16(n - j)));
  }

  // Merges per-lane (max, d, S) into the row's.
  static Stats1 Merge(const float* ml, const double* dl, const double* sl, int lanes, bool nan) {
    float m = -INFINITY;
    for (int i = 0; i < lanes; ++i) m = std::max(m, ml[i]);
    Stats1 r{m, 0.0, 0.0, nan};
    if (!std::isfinite(m)) return r;
    for (int i = 0; i < lanes; ++i) {
      if (ml[i] == -INFINITY) continue;  // a lane that saw only -inf holds nothing
      const double delta = static_cast<double>(ml[i]) - m, f = std::exp(delta);
      r.d += f * dl[i];
      r.s += f * (sl[i] + delta * dl[i]);
    }
    return r;
  }
};

// ---- AVX2 ---------------------------------------------------------------------------------------

SD_TARGET_AVX2 inline void Fold2(__m256d* acc, __m256 v) {
  acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}
SD_TARGET_AVX2 inline double Sum2(const __m256d* acc) {
  alignas(32) double t[4];
  _mm256_store_pd(t, _mm256_add_pd(acc[0], acc[1]));
  return (t[0] + t[1]) + (t[2] + t[3]);
}
// 8 floats at x + j; lanes past n are -inf.
SD_TARGET_AVX2 inline __m256 Load8(const float* x, int64_t j, int64_t n) {
  if (j + 8 <= n) return _mm256_loadu_ps(x + j);
  alignas(32) float t[8];
  for (int i = 0; i < 8; ++i) t[i] = j + i < n ? x[j + i] : -INFINITY;
  return _mm256_load_ps(t);
}

struct Avx2 {
  SD_TARGET_AVX2 static Stats1 Pass1(const float* x, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY), d = _mm256_setzero_ps(), s = d, nan = d;
    __m256d dd[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()}, sd[2] = {dd[0], dd[0]};
    const __m256 floor = _mm256_set1_ps(kFloor);
    int fold = 0;
    for (int64_t j = 0; j < n; j += 8) {
      const __m256 xv = Load8(x, j, n);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(xv, xv, _CMP_UNORD_Q));
      const __m256 grow = _mm256_cmp_ps(xv, m, _CMP_GT_OQ);
      if (_mm256_movemask_ps(grow)) {
        const __m256 mn = _mm256_blendv_ps(m, xv, grow);
        // max_ps returns its second operand when either is NaN: -inf - -inf -> floor.
        const __m256 delta = _mm256_max_ps(_mm256_sub_ps(m, mn), floor);
        const __m256 f = simd::ExpNonPositive(delta);
        s = _mm256_mul_ps(f, _mm256_fmadd_ps(delta, d, s));
        d = _mm256_mul_ps(f, d);
        const __m256d flo = _mm256_cvtps_pd(_mm256_castps256_ps128(f)), fhi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
        const __m256d dlo = _mm256_cvtps_pd(_mm256_castps256_ps128(delta)),
                      dhi = _mm256_cvtps_pd(_mm256_extractf128_ps(delta, 1));
        sd[0] = _mm256_mul_pd(flo, _mm256_fmadd_pd(dlo, dd[0], sd[0]));
        sd[1] = _mm256_mul_pd(fhi, _mm256_fmadd_pd(dhi, dd[1], sd[1]));
        dd[0] = _mm256_mul_pd(flo, dd[0]);
        dd[1] = _mm256_mul_pd(fhi, dd[1]);
        m = mn;
      }
      const __m256 z = _mm256_max_ps(_mm256_sub_ps(xv, m), floor);
      const __m256 e = simd::ExpNonPositive(z);
      d = _mm256_add_ps(d, e);
      s = _mm256_fmadd_ps(e, z, s);
      if (++fold == kFold) {
        Fold2(dd, d);
        Fold2(sd, s);
        d = s = _mm256_setzero_ps();
        fold = 0;
      }
    }
    Fold2(dd, d);
    Fold2(sd, s);
    alignas(32) float ml[8];
    alignas(32) double dl[8], sl[8];
    _mm256_store_ps(ml, m);
    _mm256_store_pd(dl, dd[0]);
    _mm256_store_pd(dl + 4, dd[1]);
    _mm256_store_pd(sl, sd[0]);
    _mm256_store_pd(sl + 4, sd[1]);
    return Avx512::Merge(ml, dl, sl, 8, _mm256_movemask_ps(nan) != 0);
  }

  SD_TARGET_AVX2 static Stats2 Pass2(const float* x, int64_t n, float m, float beta_hat, float log_eps_d) {
    const __m256 mv = _mm256_set1_ps(m), bh = _mm256_set1_ps(beta_hat), lv = _mm256_set1_ps(log_eps_d);
    const __m256 zfloor = _mm256_set1_ps(-1e4f), one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 g = _mm256_setzero_ps(), w0 = g, w1 = g, w2 = g, w3 = g;
    __m256d acc[5][2];
    for (auto& a : acc) a[0] = a[1] = _mm256_setzero_pd();
    int fold = 0;
    for (int64_t j = 0; j < n; j += 8) {
      const __m256 z = _mm256_max_ps(_mm256_sub_ps(Load8(x, j, n), mv), zfloor);
      const __m256 w = simd::ExpNonPositive(_mm256_mul_ps(bh, z));
      const __m256 wz = _mm256_mul_ps(w, z), wzz = _mm256_mul_ps(wz, z);
      w0 = _mm256_add_ps(w0, w);
      w1 = _mm256_add_ps(w1, wz);
      w2 = _mm256_add_ps(w2, wzz);
      w3 = _mm256_fmadd_ps(wzz, z, w3);
      const __m256 v = _mm256_sub_ps(lv, z);
      const __m256 t = simd::ExpNonPositive(_mm256_or_ps(v, sign));
      const __m256 r = _mm256_div_ps(one, _mm256_add_ps(two, t));
      const __m256 sv = _mm256_mul_ps(t, r), q = _mm256_mul_ps(sv, sv);
      __m256 p = _mm256_fmadd_ps(q, _mm256_set1_ps(1.0f / 11), _mm256_set1_ps(1.0f / 9));
      p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(1.0f / 7));
      p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(1.0f / 5));
      p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(1.0f / 3));
      p = _mm256_fmadd_ps(p, q, one);
      const __m256 ratio = _mm256_mul_ps(_mm256_mul_ps(two, p), r);
      const __m256 pos = _mm256_mul_ps(_mm256_fmadd_ps(ratio, t, v), t);
      g = _mm256_add_ps(g, _mm256_blendv_ps(pos, ratio, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ)));
      if (++fold == kFold) {
        Fold2(acc[0], g), Fold2(acc[1], w0), Fold2(acc[2], w1), Fold2(acc[3], w2), Fold2(acc[4], w3);
        g = w0 = w1 = w2 = w3 = _mm256_setzero_ps();
        fold = 0;
      }
    }
    Fold2(acc[0], g), Fold2(acc[1], w0), Fold2(acc[2], w1), Fold2(acc[3], w2), Fold2(acc[4], w3);
    return {Sum2(acc[0]), Sum2(acc[1]), Sum2(acc[2]), Sum2(acc[3]), Sum2(acc[4])};
  }

  SD_TARGET_AVX2 static void Write(const float* x, float* y, int64_t n, float m, float beta, float inv, bool stream) {
    const __m256 mv = _mm256_set1_ps(m), bv = _mm256_set1_ps(beta), iv = _mm256_set1_ps(inv);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 r =
          _mm256_mul_ps(simd::ExpNonPositive(_mm256_mul_ps(bv, _mm256_sub_ps(_mm256_loadu_ps(x + j), mv))), iv);
      if (stream && (reinterpret_cast<uintptr_t>(y + j) & 31) == 0) _mm256_stream_ps(y + j, r);
      else _mm256_storeu_ps(y + j, r);
    }
    if (stream) _mm_sfence();
    Portable::Write(x + j, y + j, n - j, m, beta, inv, false);
  }
};

// ---- the row driver -----------------------------------------------------------------------------

template <class P>
void Row(const float* x, float* y, int64_t n, bool stream) {
  const Stats1 st = P::Pass1(x, n);
  if (st.bad || !std::isfinite(st.m)) {  // NaN, +inf, or only -inf: softmax(x) is NaN, so is Y
    for (int64_t j = 0; j < n; ++j) y[j] = NAN;
    return;
  }
  const double h0 = std::log(st.d) - st.s / st.d;
  const double width = kEps * static_cast<double>(n);
  if (BetaIsOneOn(h0 - width - kEntropyTol, h0 + kEntropyTol)) {
    return P::Write(x, y, n, st.m, 1.0f, static_cast<float>(1.0 / st.d), stream);
  }
  const float log_eps_d = static_cast<float>(std::log(kEps * st.d));
  const double beta_hat = Beta(h0 - width / 2);
  const Stats2 s2 = P::Pass2(x, n, st.m, static_cast<float>(beta_hat), log_eps_d);
  const double beta = Beta(h0 - kEps * s2.g);
  const double delta = beta - beta_hat;
  double log_norm;
  if (std::fabs(delta) <= kTaylorMaxDelta) {
    const double m1 = s2.w1 / s2.w0, m2 = s2.w2 / s2.w0, m3 = s2.w3 / s2.w0;
    const double k2 = m2 - m1 * m1, k3 = m3 - 3 * m1 * m2 + 2 * m1 * m1 * m1;
    log_norm = std::log(s2.w0) + delta * m1 + delta * delta * k2 / 2 + delta * delta * delta * k3 / 6;
  } else {  // rows longer than ~300k: one more read at the exact beta
    log_norm = std::log(P::Pass2(x, n, st.m, static_cast<float>(beta), log_eps_d).w0);
  }
  P::Write(x, y, n, st.m, static_cast<float>(beta), static_cast<float>(std::exp(-log_norm)), stream);
}

struct AdaptiveTemperatureSoftmaxKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}};

  int64_t axis;
  Isa isa;

  explicit AdaptiveTemperatureSoftmaxKernel(const Attrs& attrs) : axis(attrs.Int("axis", -1)), isa(SelectIsa()) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    if (x.rank() == 0) Fail(kOp, "input must have rank >= 1, got a scalar");
    const AxisLayout l = AxisLayout::Of(x.shape, NormalizeAxis(kOp, axis, x.rank()));
    T* y = AllocOutput<T>(ctx, 0, x.shape);
    if (x.size() == 0) return;
    const bool stream = x.size() * static_cast<int64_t>(sizeof(float)) >= kStreamBytes;
    switch (isa) {
      case Isa::kAvx512:
        MapRows<T>(ctx, x.data, y, l, [stream](const float* a, float* b, int64_t n) { Row<Avx512>(a, b, n, stream); });
        break;
      case Isa::kAvx2:
        MapRows<T>(ctx, x.data, y, l, [stream](const float* a, float* b, int64_t n) { Row<Avx2>(a, b, n, stream); });
        break;
      default:
        MapRows<T>(ctx, x.data, y, l, [](const float* a, float* b, int64_t n) { Row<Portable>(a, b, n, false); });
    }
  }
};

}  // namespace

SD_REGISTER_KERNEL(AdaptiveTemperatureSoftmax, AdaptiveTemperatureSoftmaxKernel)

}  // namespace sd
