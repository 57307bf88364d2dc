// NystromGaussianAttention's vector kernels for AVX2: ops/nystrom_gaussian_attention_kernels.h instantiated with the
// Avx2 traits. Compiled with the AVX2 flags and -ffp-contract=off (CMakeLists.txt); called only after the run-time
// ISA check of ops/nystrom_gaussian_attention.cc.
#include "nystrom_gaussian_attention_kernels.h"

namespace sd {
namespace nystrom {

void GemmAvx2(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
              int64_t rows, int64_t cols, bool accumulate) {
  tile::Gemm<vec::Avx2, false>(a, lda, b, ldb, kdim, c, ldc, rows, cols, accumulate);
}

void DistAvx2(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
              int64_t rows, int64_t cols, bool accumulate) {
  tile::Gemm<vec::Avx2, true>(a, lda, b, ldb, kdim, c, ldc, rows, cols, accumulate);
}

void NegExpAvx2(float* x, int64_t n, float c) { NegExp<vec::Avx2>(x, n, c); }

void Gemm64Avx2(const double* a, const double* b, double* c, int64_t rows, int64_t kdim, int64_t cols) {
  Gemm64Body(a, b, c, rows, kdim, cols);
}

}  // namespace nystrom
}  // namespace sd
