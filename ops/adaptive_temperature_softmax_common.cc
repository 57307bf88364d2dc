// AdaptiveTemperatureSoftmax's portable writer, shared by the portable row
// (ops/adaptive_temperature_softmax.cc) and the AVX2 output pass's tail
// (ops/adaptive_temperature_softmax_kernels.h): declared in ops/adaptive_temperature_softmax_row.h.
// Baseline x86-64 code with no onnxruntime, so the size-sweep tester (tests/native/sweep.cc) links the
// same tail the library runs.
#include <cmath>

#include "adaptive_temperature_softmax_row.h"

namespace sd {
namespace ats {

void WriteScalar(const float* x, float* y, int64_t n, float m, float beta, float inv) {
  for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(std::exp(static_cast<double>(beta) * (x[j] - m)) * inv);
}

}  // namespace ats
}  // namespace sd
