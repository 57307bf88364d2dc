// Softpick's scalar pieces shared by the portable row (ops/softpick.cc) and the vector rows
// (ops/softpick_kernels.h): declared in ops/softpick_row.h. Baseline x86-64 code with no onnxruntime,
// so the size-sweep tester (tests/native/sweep.cc) links it as well.
#include <cfloat>
#include <cmath>
#include <cstring>

#include "common/simd_math.h"
#include "softpick_row.h"

namespace sd {
namespace softpick {

// ---- the exact fallback, and the end of a row (all variants) -------------------------------------

float Pow2(float e) { return simd::Scale2(1.0f, e); }

// |e_j| * e^m = exp(max(x, 0) - m) * -expm1(-|x|), in double.
static double MagnitudeExact(double x, double m) { return std::exp(std::max(x, 0.0) - m) * -std::expm1(-std::fabs(x)); }

float NonFiniteOutput(float x) { return x == -INFINITY ? 0.0f : x; }

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

void RescaleStaged(float* y, int64_t count, float shift) {
  const double f = std::ldexp(1.0, static_cast<int>(std::max(shift, -1100.0f)));
  for (int64_t j = 0; j < count; ++j) {
    if (std::isfinite(y[j])) y[j] = static_cast<float>(y[j] * f);
  }
}

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

}  // namespace softpick
}  // namespace sd
