// AdaptiveTemperatureSoftmax's vector passes for AVX2: ops/adaptive_temperature_softmax_kernels.h
// instantiated with the Avx2 traits. Compiled with the AVX2 flags and -ffp-contract=off
// (CMakeLists.txt); called only after the run-time ISA check of ops/adaptive_temperature_softmax.cc.
#include "adaptive_temperature_softmax_kernels.h"

namespace sd {
namespace ats {

Stats1 Pass1Avx2(const float* x, int64_t n) { return Pass1<vec::Avx2>(x, n); }
Stats2 Pass2Avx2(const float* x, int64_t n, float m, float beta_hat, float log_eps_d) {
  return Pass2<vec::Avx2>(x, n, m, beta_hat, log_eps_d);
}
void WriteAvx2(const float* x, float* y, int64_t n, float m, float beta, float inv, bool stream) {
  Write<vec::Avx2>(x, y, n, m, beta, inv, stream);
}

}  // namespace ats
}  // namespace sd
