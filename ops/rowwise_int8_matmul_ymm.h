// RowwiseInt8MatMul's ymm GEMM driver, shared by ops/rowwise_int8_matmul_avx2.cc (vpmaddubsw summed in int16 under
// the lane bound) and ops/rowwise_int8_matmul_avxvnni.cc (VEX vpdpbusd). Each unit supplies only how a tile's int32
// sums are formed (its `Sums` policy); the tiling, the prefetch, the row remainders and the float32 epilogue are this
// header's, written once (the zmm counterpart: ops/rowwise_int8_matmul_zmm.h).
//
// A tile is kMR = 6 rows x one 16-column panel: two ymm accumulators per row (columns 0-7 and 8-15), in the packing
// of ops/rowwise_int8_matmul_kernels.h. Sums::Run<MR>(a, kp, panel, acc) sets acc[r][h] to the int32 sums of rows
// r of the quantized activations `a` (row stride kp entries: uint8, or int16 on the widened packing) times the panel's
// columns 8h..8h+7.
//
// Include only from a translation unit compiled with at least -mavx2 -mfma (CMakeLists.txt); everything here has
// internal linkage (see ops/common/vec.h on why).
//
// What must stay true: the epilogue is fma(float(acc - z * colsum), sa * sb, bias), then the activation
// (ops/common/simd_math.h's GeluErf; a pass over each finished panel here, inside each tile in the zmm driver) and the
// residual's float add, as in the portable and zmm variants, so every variant gives the same bits; an edge panel's
// scales, bias and residual are padded (never read past N) and only its N - n0 columns are written.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "common/simd_math.h"
#include "common/vec.h"
#include "rowwise_int8_matmul_kernels.h"

namespace sd {
namespace rowwise_int8 {
namespace {

inline int64_t MinYmm(int64_t a, int64_t b) { return a < b ? a : b; }

inline __m256i Broadcast4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// An edge panel's row through a 16-entry buffer: its ncols entries of src, then zeros (never read past N; the padding
// lanes are not stored).
inline void CopyEdge(float* buf, const float* src, int64_t ncols) {
  std::memcpy(buf, src, sizeof(float) * ncols);
  std::memset(buf + ncols, 0, sizeof(float) * (kNR - ncols));
}

// y[r, 0..ncols) = fma(float(acc - za[r] colsum), sa[r] * sb, bias) + residual[r, 0..ncols) (nullptr: none; Y's row
// stride) for the MR rows of a tile; sb, colsum and bias hold 16 entries. A GELU goes between the two, so a node with
// one passes no residual here and GeluColumnsYmm adds it.
template <int MR>
inline void EpilogueYmm(__m256i acc[MR][2], const float* sa, const int32_t* za, const float* sb, const int32_t* colsum,
                        const float* bias, float* y, int64_t ldy, int64_t ncols, const float* residual) {
  for (int r = 0; r < MR; ++r) {
    alignas(32) float out[kNR], res[kNR];
    float* dst = ncols == kNR ? y + r * ldy : out;  // a full panel straight to y, an edge one through `out`
    const float* add = residual == nullptr ? nullptr : ncols == kNR ? residual + r * ldy : res;
    if (add == res) CopyEdge(res, residual + r * ldy, ncols);
    for (int h = 0; h < 2; ++h) {
      const __m256i corr = _mm256_mullo_epi32(
          _mm256_set1_epi32(za[r]), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(colsum + 8 * h)));
      const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][h], corr));
      const __m256 s = _mm256_mul_ps(_mm256_set1_ps(sa[r]), _mm256_loadu_ps(sb + 8 * h));
      __m256 o = _mm256_fmadd_ps(v, s, _mm256_loadu_ps(bias + 8 * h));
      if (add != nullptr) o = _mm256_add_ps(o, _mm256_loadu_ps(add + 8 * h));
      _mm256_storeu_ps(dst + 8 * h, o);
    }
    if (ncols != kNR) std::memcpy(y + r * ldy, out, sizeof(float) * ncols);
  }
}

// y[m, 0..ncols) = GeluErf(y[m, 0..ncols)) + residual[m, 0..ncols) (nullptr: none) for rows [0, M) of one panel
// (ncols <= 16; y and residual share the row stride ldy), after its tiles stored the epilogue's fma alone: the same
// float32 operations per element as one epilogue, so the same bits. A pass over the panel's rows (64 bytes a row,
// still in L1 or L2) measured faster in a model than the same operations at the end of each tile, and than a pass
// after each tile (bench/results/rowwise_int8_wide.md): here GeluErf's ~25 dependent operations pipeline across rows.
inline void GeluColumnsYmm(float* y, int64_t ldy, int64_t M, int64_t ncols, const float* residual) {
  for (int64_t m = 0; m < M; ++m) {
    float* row = y + m * ldy;
    alignas(32) float buf[kNR], res[kNR];
    float* dst = ncols == kNR ? row : buf;  // an edge panel through `buf`: never read or written past N
    const float* add = residual == nullptr ? nullptr : ncols == kNR ? residual + m * ldy : res;
    if (ncols != kNR) CopyEdge(buf, row, ncols);
    if (add == res) CopyEdge(res, residual + m * ldy, ncols);
    for (int h = 0; h < 2; ++h) {
      __m256 o = simd::GeluErf<vec::Avx2>(_mm256_loadu_ps(dst + 8 * h));
      if (add != nullptr) o = _mm256_add_ps(o, _mm256_loadu_ps(add + 8 * h));
      _mm256_storeu_ps(dst + 8 * h, o);
    }
    if (ncols != kNR) std::memcpy(row, buf, sizeof(float) * ncols);
  }
}

template <class Sums, int MR>
inline void TileAndStoreYmm(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t m,
                            int64_t n0, const float* sb, const float* bias, float* y, int64_t ldy,
                            const float* residual) {
  __m256i acc[MR][2];
  // (w.width: bytes per weight and per activation, 2 on the widened packing)
  Sums::template Run<MR>(xq + m * w.kp * w.width, w.kp, w.panels + n0 * w.kp * w.width, acc);
  EpilogueYmm<MR>(acc, sa + m, za + m, sb, w.colsum + n0, bias, y + m * ldy + n0, ldy, MinYmm(kNR, w.N - n0),
                  residual == nullptr ? nullptr : residual + m * ldy + n0);
}

// The whole packing (or a task's range of its panels), a panel at a time.
template <class Sums>
void GemmYmm(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M, const float* sb,
             const float* bias, float* y, int64_t ldy, Activation act, const float* residual) {
  const int64_t full = M / kMR * kMR;
  static_assert(kMR == 6, "the remainder switch below covers 1..5 rows");
  // The next panel is prefetched while this one runs, a share per row tile: in a model the weights are read once per
  // call from L3 or DRAM. Into L1 where a panel fits it with room to spare (the few row tiles of a small M then read
  // it from L1), else into L2: a widened K = 1536 panel (48 KB) exceeds L1, where each tile's burst of prefetches
  // evicted the panel it was reading. Past the range's last panel too (readable_np: with one thread the next task's
  // first panel is this core's next). bench/results/rowwise_int8_wide.md has the measurements.
  const int64_t panel_lines = w.kp * kNR * w.width / 64, tiles = full / kMR > 1 ? full / kMR : 1;
  const int64_t per_tile = (panel_lines + tiles - 1) / tiles;
  const bool into_l1 = panel_lines * 64 <= 16384;
  // GELU (and then the residual) runs over a panel's finished rows rather than inside each tile (GeluColumnsYmm).
  const float* tile_res = act == Activation::kGelu ? nullptr : residual;
  alignas(32) float sb_edge[kNR], bias_edge[kNR];
  alignas(32) static const float kZeros[kNR] = {};
  for (int64_t n0 = 0; n0 < w.np; n0 += kNR) {
    const float* sb_p = sb + n0;
    const float* bias_p = bias == nullptr ? kZeros : bias + n0;
    if (n0 + kNR > w.N) {  // the last, partial panel: its scales and bias padded to 16 (never read past N)
      for (int j = 0; j < kNR; ++j) {
        sb_edge[j] = n0 + j < w.N ? sb[n0 + j] : 0.f;
        bias_edge[j] = bias != nullptr && n0 + j < w.N ? bias[n0 + j] : 0.f;
      }
      sb_p = sb_edge;
      bias_p = bias_edge;
    }
    const char* next = reinterpret_cast<const char*>(w.panels + (n0 + kNR) * w.kp * w.width);
    const bool prefetch = n0 + kNR < w.readable_np;
    for (int64_t m = 0, t = 0; m < full; m += kMR, ++t) {
      if (prefetch) {
        for (int64_t l = t * per_tile; l < MinYmm(panel_lines, (t + 1) * per_tile); ++l)
          into_l1 ? _mm_prefetch(next + 64 * l, _MM_HINT_T0) : _mm_prefetch(next + 64 * l, _MM_HINT_T1);
      }
      TileAndStoreYmm<Sums, kMR>(w, xq, sa, za, m, n0, sb_p, bias_p, y, ldy, tile_res);
    }
    switch (M - full) {  // the last rows in one tile of their own height
      case 5: TileAndStoreYmm<Sums, 5>(w, xq, sa, za, full, n0, sb_p, bias_p, y, ldy, tile_res); break;
      case 4: TileAndStoreYmm<Sums, 4>(w, xq, sa, za, full, n0, sb_p, bias_p, y, ldy, tile_res); break;
      case 3: TileAndStoreYmm<Sums, 3>(w, xq, sa, za, full, n0, sb_p, bias_p, y, ldy, tile_res); break;
      case 2: TileAndStoreYmm<Sums, 2>(w, xq, sa, za, full, n0, sb_p, bias_p, y, ldy, tile_res); break;
      case 1: TileAndStoreYmm<Sums, 1>(w, xq, sa, za, full, n0, sb_p, bias_p, y, ldy, tile_res); break;
      default: break;
    }
    if (act == Activation::kGelu) {
      GeluColumnsYmm(y + n0, ldy, M, MinYmm(kNR, w.N - n0), residual == nullptr ? nullptr : residual + n0);
    }
  }
}

}  // namespace
}  // namespace rowwise_int8
}  // namespace sd
