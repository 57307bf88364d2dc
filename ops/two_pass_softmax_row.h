// TwoPassSoftmax's vector rows (ops/two_pass_softmax_kernels.h over the vector traits, compiled in
// ops/two_pass_softmax_avx2.cc and ops/two_pass_softmax_avx512.cc with their own flags): their interface
// to ops/two_pass_softmax.cc. Plain types only (see ops/common/vec.h on why).
#pragma once

#include <cstdint>

namespace sd {
namespace two_pass {

constexpr int64_t kBlock = 1024;  // elements per block of the two-level summation
constexpr int64_t kMaxLanes = 16;  // lanes of the widest variant: the scratch per block

// Both passes over a row of n floats; lane_exponents is the caller's scratch of
// (n + kBlock - 1) / kBlock * kMaxLanes floats. false: a row with NaN, +inf, no finite entry or
// |max| >= 2.9e6 (AVX2: 3.5e5), which the caller computes with RowSafe. non_temporal_x: prefetchnta on x (AVX-512
// only; see kNonTemporalMinElements in ops/two_pass_softmax.cc).
bool RowAvx2(const float* x, float* y, int64_t n, float* lane_exponents);
bool RowAvx512(const float* x, float* y, int64_t n, float* lane_exponents, bool non_temporal_x);

}  // namespace two_pass
}  // namespace sd
