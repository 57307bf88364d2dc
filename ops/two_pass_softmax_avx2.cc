// TwoPassSoftmax's vector row for AVX2: ops/two_pass_softmax_kernels.h instantiated with the Avx2
// traits. Compiled with the AVX2 flags and -ffp-contract=off (CMakeLists.txt); called only after the
// run-time ISA check of ops/two_pass_softmax.cc.
#include "two_pass_softmax_kernels.h"

namespace sd {
namespace two_pass {

bool RowAvx2(const float* x, float* y, int64_t n, float* lane_exponents) {
  return Row<vec::Avx2, false>(x, y, n, lane_exponents);
}

}  // namespace two_pass
}  // namespace sd
