// SoftpickAttention's vector kernels for AVX2: ops/softpick_attention_kernels.h instantiated with the Avx2
// traits. Compiled with the AVX2 flags and -ffp-contract=off (CMakeLists.txt); called only after the run-time
// ISA check of ops/softpick_attention.cc.
#include "softpick_attention_kernels.h"

namespace sd {
namespace softpick_attention {

void GemmAvx2(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
              int64_t rows, int64_t cols, bool accumulate) {
  tile::Gemm<vec::Avx2>(a, lda, b, ldb, kdim, c, ldc, rows, cols, accumulate);
}

void PvSparseAvx2(const float* p, const float* v, int64_t Dv, float* o, int64_t rows) {
  PvSparse<vec::Avx2>(p, v, Dv, o, rows);
}

float RowAvx2(const float* s, float* pr, int64_t n, const float* mrow, int64_t msk, int64_t hidden, float r,
              float* block_max) {
  return Row<vec::Avx2>(s, pr, n, mrow, msk, hidden, r, block_max);
}

void ScoresTermsAvx2(const float* qs, int64_t D, const float* kt, int64_t rows, const float* cr, const float* mr,
                     const float* thr, float* pbuf, float* lacc, float* vmx, uint8_t* flag) {
  ScoresTerms<vec::Avx2>(qs, D, kt, rows, cr, mr, thr, pbuf, lacc, vmx, flag);
}

}  // namespace softpick_attention
}  // namespace sd
