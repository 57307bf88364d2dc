// SoftTokenEmbedding's per-ISA pieces for Avx512: ops/soft_token_embedding_kernels.h (and SoftmaxTopK's
// row with the entropy sum) instantiated with the Avx512 traits. Compiled with the AVX-512 flags (CMakeLists.txt);
// called only after the run-time ISA check in ops/soft_token_embedding.cc.
#include "soft_token_embedding_kernels.h"

namespace sd {
namespace soft_token_embedding {

bool FastRowAvx512(const float* x, int64_t n, int64_t k, float s, const softmax_topk::Candidates& buf, double* sum,
                 double* sum_u, int64_t* count) {
  return softmax_topk::FastRowEntropy<vec::Avx512>(x, n, k, s, buf, sum, sum_u, count);
}

void WeightedRowsAvx512(const float* table, int64_t e, const int64_t* ids, const float* w, int64_t k, float* out) {
  WeightedRows<vec::Avx512>(table, e, ids, w, k, out);
}

}  // namespace soft_token_embedding
}  // namespace sd
