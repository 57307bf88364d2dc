// RowwiseInt8MatMul for AVX-VNNI (VEX vpdpbusd on ymm: Alder Lake and later Intel cores without AVX-512, Zen 5): the
// tile's sums. Compiled with -mavx2 -mfma -mavxvnni -ffp-contract=off (CMakeLists.txt: _avxvnni_sources) and only
// called after the run-time check in ops/rowwise_int8_matmul.cc (the avx2 variant on a CPU with AVX-VNNI). The
// tiling and the epilogue: ops/rowwise_int8_matmul_ymm.h. The size sweep also compiles this file with vpdpbusd's
// EVEX encoding (ops/common/avxvnni.h), so CPUs with AVX-512 VNNI sweep this tile too.
//
// Why this form: vpdpbusd adds four uint8 x int8 products into each int32 lane exactly, so every int8 B runs here
// (no lane bound, unlike the vpmaddubsw tile) at 32 products per instruction against vpmaddubsw + vpmaddwd + vpaddd
// (or 2.25 ops for groups = 4) for the same 32 -- and 8-bit weights (rowwise-8-bit) keep their accuracy.
//
// What must stay true: the integer sums are exact (|acc| <= K * 255 * 128 < 2^31 for K <= 65536, the op's rule); the
// packing is the AVX2 tile's (the 32 bytes at panel + 16 k + 32 h are B[k..k+3, 8h..8h+7], four per lane).
#include "common/avxvnni.h"
#include "rowwise_int8_matmul_ymm.h"

namespace sd {
namespace rowwise_int8 {
namespace {

struct VnniYmmSums {
  // acc[r][h] = sum over kp of xq[r, k] * the panel's B[k, 8h + j], one vpdpbusd per 4 k, row and half.
  template <int MR>
  static inline void Run(const uint8_t* xq, int64_t kp, const int8_t* panel, __m256i out[MR][2]) {
    __m256i acc[MR][2];  // local: GCC keeps it in registers (6 x 2 accumulators, two weights, a broadcast)
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t k = 0; k < kp; k += 4) {
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + 16 * k));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + 16 * k + 32));
      for (int r = 0; r < MR; ++r) {
        const __m256i x = Broadcast4(xq + r * kp + k);
        acc[r][0] = SD_DPBUSD_YMM(acc[r][0], x, b0);
        acc[r][1] = SD_DPBUSD_YMM(acc[r][1], x, b1);
      }
    }
    for (int r = 0; r < MR; ++r) out[r][0] = acc[r][0], out[r][1] = acc[r][1];
  }
};

}  // namespace

void SD_AVXVNNI_NAME(GemmAvxVnni)(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za,
                                  int64_t M, const float* sb, const float* bias, float* y, int64_t ldy,
                                  Activation act, const float* residual) {
  GemmYmm<VnniYmmSums>(w, xq, sa, za, M, sb, bias, y, ldy, act, residual);
}

}  // namespace rowwise_int8
}  // namespace sd
