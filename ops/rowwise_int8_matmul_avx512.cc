// RowwiseInt8MatMul for AVX-512 with VNNI (Ice Lake and later, Zen 4 and later): the GEMM tile on vpdpbusd zmm.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -ffp-contract=off (CMakeLists.txt) and only
// called after the run-time check in ops/rowwise_int8_matmul.cc (the avx512 variant and avx512vnni). No onnxruntime,
// no std containers (see ops/common/vec.h on why).
//
// Why this form: vpdpbusd adds four uint8 x int8 products into each int32 lane exactly, so every int8 B runs here
// (no lane bound, unlike the AVX2 tile) at 64 products per instruction. The packing is the AVX2 tile's
// (ops/rowwise_int8_matmul_kernels.h): per panel, the 64 bytes at offset 16 k (k a multiple of 4) are the 16
// columns' four weights B[k..k+3, n0 + c] in lane c -- one zmm, in column order. A tile is MR rows x NP panels
// (NP zmm accumulators per row); the activations' four bytes are broadcast from xq.
//
// What must stay true: the integer sums are exact (|acc| <= K * 255 * 128 < 2^31 for K <= 65536, the op's rule);
// the epilogue is fma(float(acc - z * colsum), sa * sb, bias), as in the portable and AVX2 variants, so all three give
// the same bits.
#include <immintrin.h>

#include <cstring>

#include "rowwise_int8_matmul_kernels.h"

namespace sd {
namespace rowwise_int8 {
namespace {

constexpr int kMR512 = 8;  // 8 rows x 2 panels = 16 accumulators, + 2 weight vectors + a broadcast: 19 of 32 zmm

inline int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline __m512i Broadcast4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows [m, m + MR) of xq times NP consecutive panels starting at column n0; stores y (the last panel may be partial:
// ncols_last columns of it).
template <int MR, int NP>
inline void Tile(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t m, int64_t n0,
                 const float* sb, const float* bias, float* y, int64_t ldy) {
  const int64_t kp = w.kp;
  const int8_t* panel[NP];
  for (int p = 0; p < NP; ++p) panel[p] = w.panels + (n0 + p * kNR) * kp;
  const uint8_t* a = xq + m * kp;
  __m512i acc[MR][NP];  // local: GCC keeps it in registers
  for (int r = 0; r < MR; ++r) {
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_si512();
  }
  for (int64_t k = 0; k < kp; k += 4) {
    __m512i b[NP];
    for (int p = 0; p < NP; ++p) b[p] = _mm512_loadu_si512(panel[p] + 16 * k);
    for (int r = 0; r < MR; ++r) {
      const __m512i x = Broadcast4(a + r * kp + k);
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_dpbusd_epi32(acc[r][p], x, b[p]);
    }
  }
  for (int p = 0; p < NP; ++p) {
    const int64_t c0 = n0 + p * kNR;
    const int64_t ncols = Min64(kNR, w.N - c0);
    const __mmask16 mask = static_cast<__mmask16>((1u << ncols) - 1u);  // ncols in 1..16
    // Past N the scales, bias and column sums are never read (masked loads), nor y written.
    const __m512i colsum = _mm512_maskz_loadu_epi32(mask, w.colsum + c0);
    const __m512 scale_b = _mm512_maskz_loadu_ps(mask, sb + c0);
    const __m512 bias_v = bias == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, bias + c0);
    for (int r = 0; r < MR; ++r) {
      const __m512i corr = _mm512_mullo_epi32(_mm512_set1_epi32(za[m + r]), colsum);
      // (maskz: the plain form trips GCC 12's -Wuninitialized inside its own header; lanes past N are not stored)
      const __m512 v = _mm512_maskz_cvtepi32_ps(mask, _mm512_sub_epi32(acc[r][p], corr));
      const __m512 s = _mm512_mul_ps(_mm512_set1_ps(sa[m + r]), scale_b);
      _mm512_mask_storeu_ps(y + (m + r) * ldy + c0, mask, _mm512_fmadd_ps(v, s, bias_v));
    }
  }
}

template <int NP>
void Panels(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M, int64_t n0,
            const float* sb, const float* bias, float* y, int64_t ldy) {
  const int64_t full = M / kMR512 * kMR512;
  static_assert(kMR512 == 8, "the remainder switch below covers 1..7 rows");
  // The next NP panels are prefetched while these run, a share per row tile (as in the AVX2 unit: in a model the
  // weights come from L3 or DRAM once per call).
  const int64_t next_n0 = n0 + NP * kNR;
  const int64_t next_lines = next_n0 < w.np ? Min64(w.np - next_n0, NP * kNR) * w.kp / 64 : 0;
  const int64_t tiles = full / kMR512 > 1 ? full / kMR512 : 1;
  const int64_t per_tile = (next_lines + tiles - 1) / tiles;
  const char* next = reinterpret_cast<const char*>(w.panels + next_n0 * w.kp);
  for (int64_t m = 0, t = 0; m < full; m += kMR512, ++t) {
    for (int64_t l = t * per_tile; l < Min64(next_lines, (t + 1) * per_tile); ++l)
      _mm_prefetch(next + 64 * l, _MM_HINT_T0);
    Tile<kMR512, NP>(w, xq, sa, za, m, n0, sb, bias, y, ldy);
  }
  switch (M - full) {  // the last rows in one tile of their own height
    case 7: Tile<7, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy); break;
    case 6: Tile<6, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy); break;
    case 5: Tile<5, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy); break;
    case 4: Tile<4, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy); break;
    case 3: Tile<3, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy); break;
    case 2: Tile<2, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy); break;
    case 1: Tile<1, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy); break;
    default: break;
  }
}

}  // namespace

void GemmAvx512Vnni(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M,
                    const float* sb, const float* bias, float* y, int64_t ldy) {
  int64_t n0 = 0;
  for (; n0 + 2 * kNR <= w.np; n0 += 2 * kNR) Panels<2>(w, xq, sa, za, M, n0, sb, bias, y, ldy);
  if (n0 < w.np) Panels<1>(w, xq, sa, za, M, n0, sb, bias, y, ldy);
}

}  // namespace rowwise_int8
}  // namespace sd
