// NystromGaussianAttention's vector kernels, written once over the vector traits of ops/common/vec.h and
// instantiated per ISA translation unit (ops/nystrom_gaussian_attention_avx2.cc, _avx512.cc); the design
// and the per-head driver are in ops/nystrom_gaussian_attention.cc. The float32 GEMMs and squared distances
// are ops/common/vec_gemm.h's tiles, the exp is ops/common/simd_math.h's; what differs by ISA is stated by
// one Policy per variant: how NegExp treats the last, partial vector (AVX-512: masked lanes; AVX2: the
// scalar std::exp of the portable variant).
//
// Everything sits in an anonymous namespace (internal linkage: see ops/common/vec.h); -ffp-contract=off
// (CMakeLists.txt), so the FMAs are the written ones.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/simd_math.h"
#include "common/vec.h"
#include "common/vec_gemm.h"
#include "nystrom_gaussian_attention_row.h"

namespace sd {
namespace nystrom {
namespace {

template <class V>
struct Policy;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
template <>
struct Policy<vec::Avx512> {
  static constexpr bool kVectorTail = true;
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
template <>
struct Policy<vec::Avx2> {
  static constexpr bool kVectorTail = false;
};
#endif

// x <- exp(-x * c) (x: squared distances, so the argument is <= 0, -inf or NaN).
template <class V>
void NegExp(float* x, int64_t n, float c) {
  constexpr int L = V::kLanes;
  const typename V::F mc = V::set1(-c);
  int64_t i = 0;
  for (; i + L <= n; i += L) V::storeu(x + i, simd::Exp<V>(V::mul(V::loadu(x + i), mc)));
  if (i == n) return;
  if constexpr (Policy<V>::kVectorTail) {
    const int left = static_cast<int>(n - i);
    V::storeu_tail(x + i, left, simd::Exp<V>(V::mul(V::loadu_tail(x + i, left), mc)));
  } else {
    for (; i < n; ++i) x[i] = std::exp(-x[i] * c);
  }
}

// C[rows x cols] = A[rows x kdim] B[kdim x cols] in float64, row-major, the column loop innermost: every C
// element is the same sequential sum over k whatever the vector width the compiler picks, so the variants
// (and the portable one, which calls it from ops/nystrom_gaussian_attention.cc) agree bit for bit.
inline void Gemm64Body(const double* a, const double* b, double* c, int64_t rows, int64_t kdim, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    double* cr = c + r * cols;
    for (int64_t j = 0; j < cols; ++j) cr[j] = 0.0;
    for (int64_t kk = 0; kk < kdim; ++kk) {
      const double x = a[r * kdim + kk];
      const double* br = b + kk * cols;
      for (int64_t j = 0; j < cols; ++j) cr[j] += x * br[j];
    }
  }
}

}  // namespace
}  // namespace nystrom
}  // namespace sd
