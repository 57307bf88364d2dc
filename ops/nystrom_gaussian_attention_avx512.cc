// NystromGaussianAttention's vector kernels for AVX-512: ops/nystrom_gaussian_attention_kernels.h instantiated with the
// Avx512 traits. Compiled with the AVX-512 flags and -ffp-contract=off (CMakeLists.txt); called only after the run-time
// ISA check of ops/nystrom_gaussian_attention.cc.
#include "nystrom_gaussian_attention_kernels.h"

namespace sd {
namespace nystrom {

void GemmAvx512(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
              int64_t rows, int64_t cols, bool accumulate) {
  tile::Gemm<vec::Avx512, false>(a, lda, b, ldb, kdim, c, ldc, rows, cols, accumulate);
}

void DistAvx512(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
              int64_t rows, int64_t cols, bool accumulate) {
  tile::Gemm<vec::Avx512, true>(a, lda, b, ldb, kdim, c, ldc, rows, cols, accumulate);
}

void NegExpAvx512(float* x, int64_t n, float c) { NegExp<vec::Avx512>(x, n, c); }

void Gemm64Avx512(const double* a, const double* b, double* c, int64_t rows, int64_t kdim, int64_t cols) {
  Gemm64Body(a, b, c, rows, kdim, cols);
}

}  // namespace nystrom
}  // namespace sd
