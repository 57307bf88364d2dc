// RowwiseInt8MatMul for AVX-512 without VNNI (Skylake-SP / Skylake-X, Cascade Lake's predecessors): the AVX2 tile's
// int16-summing form on zmm. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -ffp-contract=off
// (CMakeLists.txt: _avx512_sources; no VNNI) and only called after the run-time check in ops/rowwise_int8_matmul.cc
// (the avx512 variant on a CPU without AVX-512 VNNI, for weights inside the lane bound). The tiling and the epilogue:
// ops/rowwise_int8_matmul_zmm.h.
//
// Why this form: as in the AVX2 unit (its header has the measurements), `groups` vpmaddubsw results are summed in
// int16 (vpaddw) before one vpmaddwd(ones) + vpaddd into int32: 2.25 vector ops per 64 products for groups = 4,
// against the 3 of onnxruntime's u8s8 kernel for AVX-512 cores without VNNI. A zmm holds the AVX2 tile's two ymm
// halves (columns 0-7 and 8-15 of a panel) side by side, so the lane sets, and the lane bound Pack checks, are the
// AVX2 tile's.
//
// Weights outside the lane bound run WideSums on the widened packing (int16 weights and activations, vpmaddwd into
// int32), as the AVX2 unit does.
//
// What must stay true: every int16 sum is exact (groups from Pack's lane bound), so the integers, and with the shared
// epilogue the bits, are the other variants'.
#include "rowwise_int8_matmul_zmm.h"

namespace sd {
namespace rowwise_int8 {
namespace {

template <int kGroups>
struct LaneSums {
  static_assert(kGroups == 1 || kGroups == 2 || kGroups == 4, "groups per int16 sum");
  // acc[r][p] = sum over kp of xq[r, k] * panel p's B[k, c]: per block of 16 k, `kGroups` vpmaddubsw results summed
  // in int16, then vpmaddwd(ones) into int32.
  template <int MR, int NP>
  static inline void Run(const uint8_t* a, int64_t kp, const int8_t* const panel[NP], __m512i acc[MR][NP]) {
    const __m512i ones = _mm512_set1_epi16(1);
    __m512i sums[MR][NP];  // local: GCC keeps it in registers
    for (int r = 0; r < MR; ++r) {
      for (int p = 0; p < NP; ++p) sums[r][p] = _mm512_setzero_si512();
    }
    for (int64_t k = 0; k < kp; k += kKB) {
      for (int g0 = 0; g0 < 4; g0 += kGroups) {
        for (int r = 0; r < MR; ++r) {
          __m512i s[NP];
          for (int g = g0; g < g0 + kGroups; ++g) {
            const __m512i x = Broadcast4Zmm(a + r * kp + k + 4 * g);
            for (int p = 0; p < NP; ++p) {
              const __m512i prod = _mm512_maddubs_epi16(x, _mm512_loadu_si512(panel[p] + 16 * k + 64 * g));
              s[p] = g == g0 ? prod : _mm512_add_epi16(s[p], prod);
            }
          }
          for (int p = 0; p < NP; ++p) sums[r][p] = _mm512_add_epi32(sums[r][p], _mm512_madd_epi16(s[p], ones));
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int p = 0; p < NP; ++p) acc[r][p] = sums[r][p];
    }
  }
};

// The widened packing's sums (weights outside the lane bound; the AVX2 unit's WideSums on zmm): per pair of k, the
// int16 activations (q[k], q[k + 1]) broadcast and one vpmaddwd + vpaddd per row and panel, exact for every int8 B.
struct WideSums {
  template <int MR, int NP>
  static inline void Run(const uint8_t* xq, int64_t kp, const int8_t* const panel[NP], __m512i acc[MR][NP]) {
    const int16_t* a = reinterpret_cast<const int16_t*>(xq);
    __m512i sums[MR][NP];  // local: GCC keeps it in registers
    for (int r = 0; r < MR; ++r) {
      for (int p = 0; p < NP; ++p) sums[r][p] = _mm512_setzero_si512();
    }
    for (int64_t k = 0; k < kp; k += 2) {
      __m512i b[NP];
      for (int p = 0; p < NP; ++p) b[p] = _mm512_loadu_si512(panel[p] + 32 * k);  // 64 bytes per pair of k
      for (int r = 0; r < MR; ++r) {
        const __m512i x = Broadcast4Zmm(reinterpret_cast<const uint8_t*>(a + r * kp + k));
        for (int p = 0; p < NP; ++p) sums[r][p] = _mm512_add_epi32(sums[r][p], _mm512_madd_epi16(x, b[p]));
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int p = 0; p < NP; ++p) acc[r][p] = sums[r][p];
    }
  }
};

}  // namespace

void GemmAvx512Bw(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M,
                  const float* sb, const float* bias, float* y, int64_t ldy, Activation act, const float* residual) {
  if (w.width == 2) GemmZmm<WideSums>(w, xq, sa, za, M, sb, bias, y, ldy, act, residual);
  else if (w.groups == 4) GemmZmm<LaneSums<4>>(w, xq, sa, za, M, sb, bias, y, ldy, act, residual);
  else if (w.groups == 2) GemmZmm<LaneSums<2>>(w, xq, sa, za, M, sb, bias, y, ldy, act, residual);
  else GemmZmm<LaneSums<1>>(w, xq, sa, za, M, sb, bias, y, ldy, act, residual);
}

}  // namespace rowwise_int8
}  // namespace sd
