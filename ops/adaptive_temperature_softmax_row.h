// AdaptiveTemperatureSoftmax's vector passes (ops/adaptive_temperature_softmax_kernels.h over the vector
// traits, compiled in ops/adaptive_temperature_softmax_avx2.cc and _avx512.cc with their own flags):
// their interface to ops/adaptive_temperature_softmax.cc. Plain types only (see ops/common/vec.h).
#pragma once

#include <cstdint>

namespace sd {
namespace ats {

constexpr int kFold = 16;          // vectors per lane summed in float before folding into double
constexpr float kFloor = -200.0f;  // exp(-200) == 0 in float: z below it contributes nothing

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

// y = exp(beta (x - m)) * inv in double, the portable writer (defined in
// ops/adaptive_temperature_softmax_common.cc; also the AVX2 output pass's tail).
void WriteScalar(const float* x, float* y, int64_t n, float m, float beta, float inv);

Stats1 Pass1Avx2(const float* x, int64_t n);
Stats2 Pass2Avx2(const float* x, int64_t n, float m, float beta_hat, float log_eps_d);
void WriteAvx2(const float* x, float* y, int64_t n, float m, float beta, float inv, bool stream);
Stats1 Pass1Avx512(const float* x, int64_t n);
Stats2 Pass2Avx512(const float* x, int64_t n, float m, float beta_hat, float log_eps_d);
void WriteAvx512(const float* x, float* y, int64_t n, float m, float beta, float inv, bool stream);

}  // namespace ats
}  // namespace sd
