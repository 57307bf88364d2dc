// The SoftmaxTopK fast row written once over the vector traits (ops/softmax_topk_kernels.h) and
// compiled per ISA translation unit (ops/softmax_topk_avx2.cc, ops/softmax_topk_avx512.cc): its interface
// to ops/softmax_topk.cc.
// Plain types only (no std containers cross it; see ops/common/vec.h on why).
#pragma once

#include <algorithm>
#include <cstdint>

namespace sd {
namespace softmax_topk {

// The candidate buffer, structure of arrays (the cut counts keys a vector at a time); each array holds
// CandidateCapacity(k) entries. int32 indices: rows of 2^31 entries or more take the generic path.
struct Candidates {
  float* values;
  int32_t* indices;
  int32_t* keys;  // scratch of the cut
};

// The buffer is cut back to the k best (ops/softmax_topk_kernels.h) when it holds more than
// k + CutSlack(k); it is checked once per group of up to kGroup appends, and the cut reads whole vectors
// of up to 16 lanes. The slack trades cuts against appends: the threshold only rises at a cut, so a
// larger slack lets more groups of entries through the candidate path (~120 cycles each, AVX2). kSlack
// 48 at k >= 48 (micro-benchmark, AVX2, k = 50, V = 1000: 32 -> 1.14, 48 -> 0.96, 64 -> 0.92 ns per
// entry). Small k cut at k + k, at least 8: a cut of a few vectors is cheap, and at V = 32000 (N(0, 2^2)
// logits, 32-entry groups) k = 5 sends 42 groups per row through the candidate path instead of 82; k = 1
// cuts at every group (slack 0; the cut is then a maximum, no bisection) and sends 9 instead of 46.
constexpr int64_t kSlack = 48;
constexpr int64_t kGroup = 64;
inline int64_t CutSlack(int64_t k) { return k == 1 ? 0 : std::clamp<int64_t>(k, 8, kSlack); }
inline int64_t CandidateCapacity(int64_t k) { return k + kSlack + kGroup + 16; }

// A finite row's top k among buf's first *count entries (k <= *count <= k + CutSlack(k), exactly k for the
// AVX-512 row; in index order; the top are the first k by the contract's order, larger value then
// lower index) and
// *sum = sum_j 2^((x_j - M) * s), M the row's maximum. Returns false when the row is not one the fast
// path handles (a NaN or +inf entry, no finite entry, scaled logits beyond its range): the caller then
// computes it with the generic double-precision row. buf holds CandidateCapacity(k) entries.
bool FastRowAvx2(const float* x, int64_t n, int64_t k, float s, const Candidates& buf, double* sum, int64_t* count);
// The same for AVX-512 (ops/softmax_topk_avx512.cc).
bool FastRowAvx512(const float* x, int64_t n, int64_t k, float s, const Candidates& buf, double* sum, int64_t* count);

}  // namespace softmax_topk
}  // namespace sd
