// MultiMax's vector rows (ops/multi_max_kernels.h over the vector traits, compiled in
// ops/multi_max_avx2.cc and ops/multi_max_avx512.cc with their own flags): their interface to
// ops/multi_max.cc. Plain types only, no functions defined here (see ops/common/vec.h on why).
#pragma once

#include <cstdint>

namespace sd {
namespace multi_max {

constexpr int64_t kBlock = 1024;  // elements per block: its z buffer (8 KiB) stays in L1
// z - M_b below this is clamped to it: exp(-200) is 0 in float (so are -inf entries, exactly).
constexpr double kMinDiff = -200.0;
constexpr double kLog2eD = 1.4426950408889634;
constexpr double kLn2D = 0.6931471805599453;

// sigma's parameters as doubles, with its limits at -inf / +inf (ops/multi_max.cc's SigmaOf).
struct SigmaParams {
  double r[4], t[4];
  double neg, pos;  // sigma(-inf), sigma(+inf): the limits of sigma
  bool finite;      // every parameter finite (otherwise every output is NaN; no row is run)
};

// A row: n elements of x (contiguous), the mask row (contiguous when mask_step == 1, one value
// repeated when mask_step == 0), the output, and room for one double per block (the blocks' maxima).
struct RowArgs {
  const float* x;
  const float* mask;
  int64_t mask_step;
  float* y;
  int64_t n;
  double* block_max;
};

// The vector rows (called only with finite parameters, after the run-time ISA check).
void RowAvx2(const RowArgs& a, const SigmaParams& p);
void RowAvx512(const RowArgs& a, const SigmaParams& p);

}  // namespace multi_max
}  // namespace sd
