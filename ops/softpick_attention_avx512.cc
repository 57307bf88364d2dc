// SoftpickAttention's vector kernels for AVX-512: ops/softpick_attention_kernels.h instantiated with the
// Avx512 traits. Compiled with the AVX-512 flags and -ffp-contract=off (CMakeLists.txt); called only after the
// run-time ISA check of ops/softpick_attention.cc.
#include "softpick_attention_kernels.h"

namespace sd {
namespace softpick_attention {

void GemmAvx512(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
                int64_t rows, int64_t cols, bool accumulate) {
  tile::Gemm<vec::Avx512>(a, lda, b, ldb, kdim, c, ldc, rows, cols, accumulate);
}

float RowAvx512(const float* s, float* pr, int64_t n, const float* mrow, int64_t msk, int64_t hidden, float r,
                float* block_max) {
  return Row<vec::Avx512>(s, pr, n, mrow, msk, hidden, r, block_max);
}

void ScoresTermsAvx512(const float* qs, int64_t D, const float* kt, int64_t rows, const float* cr, const float* mr,
                       const float* thr, float* pbuf, float* lacc, float* vmx, uint8_t* flag) {
  ScoresTerms<vec::Avx512>(qs, D, kt, rows, cr, mr, thr, pbuf, lacc, vmx, flag);
}

}  // namespace softpick_attention
}  // namespace sd
