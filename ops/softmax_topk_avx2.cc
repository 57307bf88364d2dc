// SoftmaxTopK's fast row for AVX2 + FMA: ops/softmax_topk_kernels.h instantiated with the AVX2
// traits. Compiled with -mavx2 -mfma -ffp-contract=off (CMakeLists.txt); called only after the
// run-time ISA check in ops/softmax_topk.cc.
#include "softmax_topk_kernels.h"

namespace sd {
namespace softmax_topk {

bool FastRowAvx2(const float* x, int64_t n, int64_t k, float s, const Candidates& buf, double* sum, int64_t* count) {
  return FastRow<vec::Avx2>(x, n, k, s, buf, sum, count);
}

}  // namespace softmax_topk
}  // namespace sd
