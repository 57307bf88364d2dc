// RowwiseInt8MatMul for AVX-512 with VNNI (Ice Lake and later, Zen 4 and later): the tile's sums on vpdpbusd zmm.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -ffp-contract=off (CMakeLists.txt:
// _avx512vnni_sources) and only called after the run-time check in ops/rowwise_int8_matmul.cc (the avx512 variant
// on a CPU with AVX-512 VNNI). The tiling and the epilogue: ops/rowwise_int8_matmul_zmm.h.
//
// Why this form: vpdpbusd adds four uint8 x int8 products into each int32 lane exactly, so every int8 B runs here
// (no lane bound, unlike the vpmaddubsw tiles) at 64 products per instruction: 72-81% of the core's vpdpbusd peak at
// MiniLM's shapes, level with onnxruntime's VNNI int8 (bench/results/rowwise_int8_matmul.md).
//
// What must stay true: the integer sums are exact (|acc| <= K * 255 * 128 < 2^31 for K <= 65536, the op's rule).
#include "rowwise_int8_matmul_zmm.h"

namespace sd {
namespace rowwise_int8 {
namespace {

struct VnniSums {
  // acc[r][p] = sum over kp of xq[r, k] * panel p's B[k, c], one vpdpbusd per 4 k, row and panel.
  template <int MR, int NP>
  static inline void Run(const uint8_t* a, int64_t kp, const int8_t* const panel[NP], __m512i acc[MR][NP]) {
    __m512i sums[MR][NP];  // local: GCC keeps it in registers, the caller's array it would store per step
    for (int r = 0; r < MR; ++r) {
      for (int p = 0; p < NP; ++p) sums[r][p] = _mm512_setzero_si512();
    }
    for (int64_t k = 0; k < kp; k += 4) {
      __m512i b[NP];
      for (int p = 0; p < NP; ++p) b[p] = _mm512_loadu_si512(panel[p] + 16 * k);
      for (int r = 0; r < MR; ++r) {
        const __m512i x = Broadcast4Zmm(a + r * kp + k);
        for (int p = 0; p < NP; ++p) sums[r][p] = _mm512_dpbusd_epi32(sums[r][p], x, b[p]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int p = 0; p < NP; ++p) acc[r][p] = sums[r][p];
    }
  }
};

}  // namespace

void GemmAvx512Vnni(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M,
                    const float* sb, const float* bias, float* y, int64_t ldy, Activation act,
                    const float* residual) {
  GemmZmm<VnniSums>(w, xq, sa, za, M, sb, bias, y, ldy, act, residual);
}

}  // namespace rowwise_int8
}  // namespace sd
