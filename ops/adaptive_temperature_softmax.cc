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
//          (k = the cumulants of z under w). |delta| <= 2.53 * 1e-9 n / 2 (2.53: max |poly'| where
//          poly > 1); while |delta| <= 4e-4 (rows up to ~300k entries) the truncation is below
//          1e-10, else pass 2 runs once more at the exact beta.
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
#include "adaptive_temperature_softmax_row.h"

namespace sd {
namespace {

using ats::kFloor;
using ats::Stats1;
using ats::Stats2;

constexpr const char* kOp = "AdaptiveTemperatureSoftmax";
constexpr double kEps = 1e-9;
constexpr double kGate = 0.5;
constexpr double kPolyArgMax = 4.41240187;  // the polynomial's only critical point (its maximum, 2.42)
constexpr double kTaylorMaxDelta = 4e-4;
constexpr double kEntropyTol = 1e-6;  // allowance for float rounding in H0 when deciding "beta is 1"

double Poly(double h) { return (((-0.037 * h + 0.481) * h - 2.3) * h + 4.917) * h - 1.791; }
double Beta(double h) { return h > kGate ? std::max(Poly(h), 1.0) : 1.0; }

// True when beta(H) == 1 for every H in [lo, hi].
bool BetaIsOneOn(double lo, double hi) {
  if (hi <= kGate) return true;
  const double a = std::max(lo, kGate);
  return Poly(a) <= 1.0 && Poly(hi) <= 1.0 && !(a <= kPolyArgMax && kPolyArgMax <= hi);
}

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
    ats::WriteScalar(x, y, n, m, beta, inv);  // ops/adaptive_temperature_softmax_common.cc
  }
};

// ---- AVX-512 and AVX2 (ops/adaptive_temperature_softmax_kernels.h) ----------------------------------

struct Avx512 {
  static Stats1 Pass1(const float* x, int64_t n) { return ats::Pass1Avx512(x, n); }
  static Stats2 Pass2(const float* x, int64_t n, float m, float beta_hat, float log_eps_d) {
    return ats::Pass2Avx512(x, n, m, beta_hat, log_eps_d);
  }
  static void Write(const float* x, float* y, int64_t n, float m, float beta, float inv, bool stream) {
    ats::WriteAvx512(x, y, n, m, beta, inv, stream);
  }
};

struct Avx2 {
  static Stats1 Pass1(const float* x, int64_t n) { return ats::Pass1Avx2(x, n); }
  static Stats2 Pass2(const float* x, int64_t n, float m, float beta_hat, float log_eps_d) {
    return ats::Pass2Avx2(x, n, m, beta_hat, log_eps_d);
  }
  static void Write(const float* x, float* y, int64_t n, float m, float beta, float inv, bool stream) {
    ats::WriteAvx2(x, y, n, m, beta, inv, stream);
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
