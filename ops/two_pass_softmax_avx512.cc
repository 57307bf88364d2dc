// TwoPassSoftmax's vector row for AVX-512: ops/two_pass_softmax_kernels.h instantiated with the Avx512
// traits. Compiled with the AVX-512 flags and -ffp-contract=off (CMakeLists.txt); called only after the
// run-time ISA check of ops/two_pass_softmax.cc.
#include "two_pass_softmax_kernels.h"

namespace sd {
namespace two_pass {

bool RowAvx512(const float* x, float* y, int64_t n, float* lane_exponents, bool non_temporal_x) {
  return non_temporal_x ? Row<vec::Avx512, true>(x, y, n, lane_exponents)
                        : Row<vec::Avx512, false>(x, y, n, lane_exponents);
}

}  // namespace two_pass
}  // namespace sd
