// Softpick's pieces shared by ops/softpick.cc (portable row, binding) and the per-ISA translation
// units of the vector row (ops/softpick_kernels.h, compiled in ops/softpick_avx2.cc and
// ops/softpick_avx512.cc with their own flags). The functions are defined, out of line, in
// ops/softpick_common.cc (baseline x86-64 code: safe to call from any variant).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/simd_math.h"

namespace sd {
namespace softpick {

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
// The range reduction of the exp polynomial (ops/common/simd_math.h), one definition.
using simd::kLog2e;
using simd::kMinusLn2Hi;
using simd::kMinusLn2Lo;

// The shifted formula in double precision for rows beyond the float32 fast path (|logits| > 2^16).
void RowExact(const float* x, float* y, int64_t n, float eps);
// Multiplies the staged prefix y[0, count) by 2^shift (shift < 0) after R grew; non-finite staged
// values (NaN, +inf) must not meet a factor that underflows to 0.
void RescaleStaged(float* y, int64_t count, float shift);
// 2^e for an integer-valued e (simd::Scale2(1, e)).
float Pow2(float e);
// Output of a non-finite entry in a row that has a finite one: -inf -> 0, NaN and +inf -> themselves.
float NonFiniteOutput(float x);

// What pass 2 must do with a row whose pass 1 found finite max m, total T * 2^-R and scale R.
struct Finish {
  enum Kind { kZeros, kDone, kScale, kDivide } kind;
  float inv = 0.0f;  // kScale: y *= inv
  double d = 0.0;    // kDivide: y = y / d in double (denominator below the float normal range)
};
Finish PlanFinish(float m, double total, float r, float eps);
// Pass 2 for the cases without a vector loop (and the tails of the vector ones).
void FinishScalar(const Finish& f, float* y, int64_t n);

namespace {  // internal linkage: see ops/common/vec.h

// expm1(x) * 2^-r for finite x (c = 2^-r), the scalar form of the vector rows' Term (ops/softpick_kernels.h):
// 2^(n-r) q + (2^(n-r) - 2^-r) with expm1(t) = q on the reduced t. Softpick's portable row and
// SoftpickAttention's portable variant share it.
inline float TermScalar(float x, float r, float c) {
  const float xc = std::max(x, kMinX);
  const float n = std::nearbyint(xc * kLog2e);
  float t = std::fma(n, kMinusLn2Hi, xc);
  t = std::fma(n, kMinusLn2Lo, t);
  float p = kQ4;
  p = std::fma(p, t, kQ3);
  p = std::fma(p, t, kQ2);
  p = std::fma(p, t, kQ1);
  p = std::fma(p, t, kQ0);
  const float q = std::fma(t * t, p, t);
  const float s = simd::Scale2(1.0f, n - r);
  return std::fma(s, q, s - c);
}

}  // namespace

// The vector rows (pass 1 and 2 of ops/softpick.cc's header, over the traits).
void RowAvx2(const float* x, float* y, int64_t n, float eps);
void RowAvx512(const float* x, float* y, int64_t n, float eps);

}  // namespace softpick
}  // namespace sd
