// RowwiseInt8MatMul's zmm GEMM driver, shared by the two AVX-512 units: ops/rowwise_int8_matmul_avx512vnni.cc
// (vpdpbusd) and ops/rowwise_int8_matmul_avx512.cc (AVX-512 BW without VNNI: vpmaddubsw summed in int16 under the
// lane bound). Each unit supplies only how a tile's int32 sums are formed (its `Sums` policy); the tiling, the
// prefetch, the row remainders and the float32 epilogue are this header's, written once.
//
// The packing is the AVX2 tile's (ops/rowwise_int8_matmul_kernels.h): per panel and block of 16 k, the 64 bytes at
// offset 64 g are group g's four weights B[16 i + 4 g + t, n0 + c] (t = 0..3) of the 16 columns c, in lane c -- one
// zmm in column order. A tile is MR = 8 rows x NP (1 or 2) panels: NP zmm accumulators per row.
//
// Include only from a translation unit compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq (CMakeLists.txt);
// everything here has internal linkage (see ops/common/vec.h on why).
//
// What must stay true: the epilogue is fma(float(acc - z * colsum), sa * sb, bias), then the activation
// (ops/common/simd_math.h's GeluErf) and the residual's float add, as in the portable and AVX2 variants, so every
// variant gives the same bits; lanes past N are never read from sb, bias, colsum or the residual (masked loads) nor
// written to y.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "common/simd_math.h"
#include "common/vec.h"
#include "rowwise_int8_matmul_kernels.h"

namespace sd {
namespace rowwise_int8 {
namespace {

constexpr int kMRZmm = 8;  // 8 rows x 2 panels = 16 accumulators; the policies' temporaries fit the other 16 zmm

inline int64_t MinZmm(int64_t a, int64_t b) { return a < b ? a : b; }

inline __m512i Broadcast4Zmm(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows [m, m + MR) of xq times NP consecutive panels from column n0 (the last may be partial); stores y after the
// activation and the residual add (nullptr: none; Y's row stride).
template <class Sums, int MR, int NP>
inline void TileZmm(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t m, int64_t n0,
                    const float* sb, const float* bias, float* y, int64_t ldy, Activation act,
                    const float* residual) {
  const int8_t* panel[NP];
  // (w.width: bytes per weight and per activation, 2 on the widened packing)
  for (int p = 0; p < NP; ++p) panel[p] = w.panels + (n0 + p * kNR) * w.kp * w.width;
  __m512i acc[MR][NP];  // local: GCC keeps it in registers
  Sums::template Run<MR, NP>(xq + m * w.kp * w.width, w.kp, panel, acc);
  for (int p = 0; p < NP; ++p) {
    const int64_t c0 = n0 + p * kNR;
    const __mmask16 mask = static_cast<__mmask16>((1u << MinZmm(kNR, w.N - c0)) - 1u);  // 1..16 columns
    const __m512i colsum = _mm512_maskz_loadu_epi32(mask, w.colsum + c0);
    const __m512 scale_b = _mm512_maskz_loadu_ps(mask, sb + c0);
    const __m512 bias_v = bias == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, bias + c0);
    for (int r = 0; r < MR; ++r) {
      const __m512i corr = _mm512_mullo_epi32(_mm512_set1_epi32(za[m + r]), colsum);
      // (maskz: the plain form trips GCC 12's -Wuninitialized inside its own header; lanes past N are not stored)
      const __m512 v = _mm512_maskz_cvtepi32_ps(mask, _mm512_sub_epi32(acc[r][p], corr));
      const __m512 s = _mm512_mul_ps(_mm512_set1_ps(sa[m + r]), scale_b);
      __m512 o = _mm512_fmadd_ps(v, s, bias_v);
      if (act == Activation::kGelu) o = simd::GeluErf<vec::Avx512>(o);
      if (residual != nullptr) o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(mask, residual + (m + r) * ldy + c0));
      _mm512_mask_storeu_ps(y + (m + r) * ldy + c0, mask, o);
    }
  }
}

template <class Sums, int NP>
void PanelsZmm(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M, int64_t n0,
               const float* sb, const float* bias, float* y, int64_t ldy, Activation act, const float* residual) {
  const int64_t full = M / kMRZmm * kMRZmm;
  static_assert(kMRZmm == 8, "the remainder switch below covers 1..7 rows");
  // The next NP panels are prefetched while these run, a share per row tile (as in the AVX2 unit: in a model the
  // weights come from L3 or DRAM once per call).
  const int64_t next_n0 = n0 + NP * kNR;
  const int64_t next_lines =
      next_n0 < w.readable_np ? MinZmm(w.readable_np - next_n0, NP * kNR) * w.kp * w.width / 64 : 0;
  const int64_t tiles = full / kMRZmm > 1 ? full / kMRZmm : 1;
  const int64_t per_tile = (next_lines + tiles - 1) / tiles;
  const char* next = reinterpret_cast<const char*>(w.panels + next_n0 * w.kp * w.width);
  for (int64_t m = 0, t = 0; m < full; m += kMRZmm, ++t) {
    for (int64_t l = t * per_tile; l < MinZmm(next_lines, (t + 1) * per_tile); ++l)
      _mm_prefetch(next + 64 * l, _MM_HINT_T0);
    TileZmm<Sums, kMRZmm, NP>(w, xq, sa, za, m, n0, sb, bias, y, ldy, act, residual);
  }
  switch (M - full) {  // the last rows in one tile of their own height
    case 7: TileZmm<Sums, 7, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy, act, residual); break;
    case 6: TileZmm<Sums, 6, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy, act, residual); break;
    case 5: TileZmm<Sums, 5, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy, act, residual); break;
    case 4: TileZmm<Sums, 4, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy, act, residual); break;
    case 3: TileZmm<Sums, 3, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy, act, residual); break;
    case 2: TileZmm<Sums, 2, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy, act, residual); break;
    case 1: TileZmm<Sums, 1, NP>(w, xq, sa, za, full, n0, sb, bias, y, ldy, act, residual); break;
    default: break;
  }
}

// The whole packing (or a task's range of its panels): pairs of panels, then a last single one.
template <class Sums>
void GemmZmm(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M, const float* sb,
             const float* bias, float* y, int64_t ldy, Activation act, const float* residual) {
  int64_t n0 = 0;
  for (; n0 + 2 * kNR <= w.np; n0 += 2 * kNR) PanelsZmm<Sums, 2>(w, xq, sa, za, M, n0, sb, bias, y, ldy, act, residual);
  if (n0 < w.np) PanelsZmm<Sums, 1>(w, xq, sa, za, M, n0, sb, bias, y, ldy, act, residual);
}

}  // namespace
}  // namespace rowwise_int8
}  // namespace sd
