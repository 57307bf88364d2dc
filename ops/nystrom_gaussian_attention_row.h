// NystromGaussianAttention's vector kernels as the per-ISA translation units export them
// (ops/nystrom_gaussian_attention_kernels.h, compiled in ops/nystrom_gaussian_attention_avx2.cc and _avx512.cc
// with their own flags), for ops/nystrom_gaussian_attention.cc, which chooses a variant at run time.
#pragma once

#include <cstdint>

namespace sd {
namespace nystrom {

// C[rows x cols] = A[rows x kdim] B[kdim x cols] (Dist*: sums of (a - b)^2), ops/common/vec_gemm.h's
// arguments: a, lda, b, ldb, kdim, c, ldc, rows, cols, accumulate.
void GemmAvx2(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
              int64_t rows, int64_t cols, bool accumulate);
void DistAvx2(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
              int64_t rows, int64_t cols, bool accumulate);
// x <- exp(-x * c)
void NegExpAvx2(float* x, int64_t n, float c);
// C[rows x cols] = A[rows x kdim] B[kdim x cols] in float64, row-major (Gemm64Body in the kernels header).
void Gemm64Avx2(const double* a, const double* b, double* c, int64_t rows, int64_t kdim, int64_t cols);

void GemmAvx512(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
                int64_t rows, int64_t cols, bool accumulate);
void DistAvx512(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
                int64_t rows, int64_t cols, bool accumulate);
void NegExpAvx512(float* x, int64_t n, float c);
void Gemm64Avx512(const double* a, const double* b, double* c, int64_t rows, int64_t kdim, int64_t cols);

}  // namespace nystrom
}  // namespace sd
