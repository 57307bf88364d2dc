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
#include "softpick_row.h"

namespace sd {
namespace {

using namespace softpick;  // NOLINT: this file's own helpers

constexpr const char* kOp = "Softpick";

// ---- portable -----------------------------------------------------------------------------------

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
      const float r_new = std::nearbyint(v * kLog2e);
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
