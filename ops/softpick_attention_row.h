// SoftpickAttention's pieces shared by ops/softpick_attention.cc (the design, the tasks, the portable
// variant, the binding) and the per-ISA translation units of its vector kernels
// (ops/softpick_attention_kernels.h, compiled in ops/softpick_attention_avx2.cc and _avx512.cc with their
// own flags).
#pragma once

#include <cstdint>

namespace sd {
namespace softpick_attention {

constexpr int64_t kBlockK = 128;  // keys per block (64 and 256 measured 5% slower at T = 2048)

// C[rows x cols] (+)= A[rows x kdim] B[kdim x cols] (ops/common/vec_gemm.h): a, lda, b, ldb, kdim, c, ldc,
// rows, cols, accumulate.
using GemmFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, int64_t, int64_t,
                        bool);
// The softpick terms of one row's key block (RowPortable in ops/softpick_attention.cc says what): s, pr, n,
// mrow, msk, hidden, r, block_max; returns sum |term|.
using RowFn = float (*)(const float*, float*, int64_t, const float*, int64_t, int64_t, float, float*);
// Full unmasked key blocks with the terms fused into the scores' GEMM (ScoresTerms in
// ops/softpick_attention_kernels.h): qs, D, kt, rows, cr, mr, thr, pbuf, lacc, vmx, flag.
using FusedFn = void (*)(const float*, int64_t, const float*, int64_t, const float*, const float*, const float*,
                         float*, float*, float*, uint8_t*);

// o[rows x Dv] += P[rows x kBlockK] V[kBlockK x Dv] over P's nonzero entries (PvSparse in
// ops/softpick_attention_kernels.h): p, v, Dv, o, rows; Dv a multiple of the lanes, at most 8 vectors.
using PvFn = void (*)(const float*, const float*, int64_t, float*, int64_t);

void PvSparseAvx2(const float* p, const float* v, int64_t Dv, float* o, int64_t rows);
void GemmAvx2(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
              int64_t rows, int64_t cols, bool accumulate);
float RowAvx2(const float* s, float* pr, int64_t n, const float* mrow, int64_t msk, int64_t hidden, float r,
              float* block_max);
void ScoresTermsAvx2(const float* qs, int64_t D, const float* kt, int64_t rows, const float* cr, const float* mr,
                     const float* thr, float* pbuf, float* lacc, float* vmx, uint8_t* flag);

void GemmAvx512(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
                int64_t rows, int64_t cols, bool accumulate);
float RowAvx512(const float* s, float* pr, int64_t n, const float* mrow, int64_t msk, int64_t hidden, float r,
                float* block_max);
void ScoresTermsAvx512(const float* qs, int64_t D, const float* kt, int64_t rows, const float* cr, const float* mr,
                       const float* thr, float* pbuf, float* lacc, float* vmx, uint8_t* flag);

}  // namespace softpick_attention
}  // namespace sd
