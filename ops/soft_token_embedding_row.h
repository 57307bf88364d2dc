// SoftTokenEmbedding's per-ISA pieces (ops/soft_token_embedding_avx2.cc, ops/soft_token_embedding_avx512.cc):
// their interface to ops/soft_token_embedding.cc. Plain types only (see ops/common/vec.h).
//
//   p       = softmax(Logits[b] / T),  Entropy = -sum_j p_j ln p_j
//   Ids     = the max_topk entries ranked by logit (ties: lower id), kept = a prefix (top_k, top_p, min_p)
//   Weights = p renormalised over the kept slots (0 past them), optionally Gumbel-perturbed and re-sorted
//   Mixed   = sum_k Weights_k Embedding[Ids_k]
// (the full statement: softdeploy/ops/soft_token_embedding.py, docs/ops/SoftTokenEmbedding.md)
#pragma once

#include <cstdint>

#include "softmax_topk_row.h"

namespace sd {
namespace soft_token_embedding {

// SoftmaxTopK's fast row (ops/softmax_topk_kernels.h) with the entropy's sum fused into the same read:
// the top k candidates (buf, *count of them, unsorted), *sum = sum_j 2^((x_j - M) s) and
// *sum_u = sum_j 2^((x_j - M) s) (x_j - M) s, M the row maximum; false: the caller's generic row.
bool FastRowAvx2(const float* x, int64_t n, int64_t k, float s, const softmax_topk::Candidates& buf, double* sum,
                 double* sum_u, int64_t* count);
bool FastRowAvx512(const float* x, int64_t n, int64_t k, float s, const softmax_topk::Candidates& buf, double* sum,
                   double* sum_u, int64_t* count);

// out[0, e) = sum_{i < k} w[i] * table[ids[i] * e + (0, e)], in float, the slots in order (one fma per
// slot and column: 0 * inf is NaN, as the equation says).
void WeightedRowsAvx2(const float* table, int64_t e, const int64_t* ids, const float* w, int64_t k, float* out);
void WeightedRowsAvx512(const float* table, int64_t e, const int64_t* ids, const float* w, int64_t k, float* out);

}  // namespace soft_token_embedding
}  // namespace sd
