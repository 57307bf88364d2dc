// SoftmaxTopK's fast row for AVX-512: ops/softmax_topk_kernels.h instantiated with the AVX-512
// traits. Compiled with the AVX-512 flags and -ffp-contract=off (CMakeLists.txt); called only after
// the run-time ISA check in ops/softmax_topk.cc.
#include "softmax_topk_kernels.h"

namespace sd {
namespace softmax_topk {

bool FastRowAvx512(const float* x, int64_t n, int64_t k, float s, const Candidates& buf, double* sum, int64_t* count) {
  return FastRow<vec::Avx512>(x, n, k, s, buf, sum, count);
}

}  // namespace softmax_topk
}  // namespace sd
