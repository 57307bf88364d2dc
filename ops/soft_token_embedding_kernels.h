// SoftTokenEmbedding's per-ISA code, written once over the vector traits of ops/common/vec.h and
// instantiated per ISA translation unit (ops/soft_token_embedding_avx2.cc, _avx512.cc): the entropy row
// is SoftmaxTopK's (ops/softmax_topk_kernels.h, kEntropy), the weighted gather is here.
#pragma once

#include "common/vec.h"
#include "soft_token_embedding_row.h"
#include "softmax_topk_kernels.h"

namespace sd {
namespace soft_token_embedding {
namespace {  // internal linkage on purpose: see ops/common/vec.h

// out = sum_i w_i table[ids_i]: column blocks of 4 vectors, the k slots in order, one fma each (the
// portable loop in ops/soft_token_embedding.cc sums in the same order, one rounding per fma).
template <class V>
void WeightedRows(const float* table, int64_t e, const int64_t* ids, const float* w, int64_t k, float* out) {
  constexpr int L = V::kLanes;
  int64_t c = 0;
  for (; c + 4 * L <= e; c += 4 * L) {
    typename V::F a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
    for (int64_t i = 0; i < k; ++i) {
      const float* row = table + ids[i] * e + c;
      const typename V::F wi = V::set1(w[i]);
      a0 = V::fma(wi, V::loadu(row), a0);
      a1 = V::fma(wi, V::loadu(row + L), a1);
      a2 = V::fma(wi, V::loadu(row + 2 * L), a2);
      a3 = V::fma(wi, V::loadu(row + 3 * L), a3);
    }
    V::storeu(out + c, a0);
    V::storeu(out + c + L, a1);
    V::storeu(out + c + 2 * L, a2);
    V::storeu(out + c + 3 * L, a3);
  }
  for (; c < e; c += L) {
    const int left = e - c >= L ? L : static_cast<int>(e - c);
    typename V::F a = V::zero();
    for (int64_t i = 0; i < k; ++i) a = V::fma(V::set1(w[i]), V::loadu_tail(table + ids[i] * e + c, left), a);
    alignas(64) float lanes[L];
    V::storeu(lanes, a);
    for (int l = 0; l < left; ++l) out[c + l] = lanes[l];
  }
}

}  // namespace
}  // namespace soft_token_embedding
}  // namespace sd
