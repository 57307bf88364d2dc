// Issue 13 probe: can an int8 GEMM on AVX2 without VNNI beat onnxruntime's (MLAS u8s8, vpmaddubsw +
// vpmaddwd per 32 products) by the 1.19x that MiniLM int8 needs for 1.8x fp32? A benchmark-only prototype, not a
// library kernel (this header; used by the custom op in int8_gemm_ort/):
// Y[M, N] = X[M, K] W[K, N] + bias in float32 with
//   X  float32, quantized per row (one asymmetric range per token, 0 included: DynamicQuantizeLinear's rule on
//      each row, on 0..L with L = 255 or 127) inside the call: xq = clip(round(x * (1 / sa)) + za, 0, L);
//   W  int8, symmetric per column (sb), packed once (outside the call) in 16-column panels, bounded so that the
//      int16 lane sums below cannot saturate (the positive weights of a lane's group summing to at most 32767 / L,
//      the negative ones to at least -32767 / L), which makes every sum exact;
//   Y  = sa[m] sb[n] (sum_k xq[m, k] q[k, n] - za[m] colsum_n(q)) + bias[n].
// One inner loop over kGroups vpmaddubsw results (2 products per int16 lane each) summed in int16 with vpaddw
// before one vpmaddwd(ones) + vpaddd into int32, all else (packing, tiles, epilogue) shared:
//   1  vpmaddubsw + vpmaddwd + vpaddd per 32 products: MLAS's AVX2 form (3 vector ops)
//   2  "paired": 64 products in 5 ops (lanes sum 4 products: L = 255 with their weights' same-sign sums <= 128)
//   4  "octet": 128 products in 9 ops (lanes sum 8 products: L = 127 with same-sign sums <= 258)
// A lane sums the products of k = 16i + 4g + {0, 1} (or {2, 3}) over the groups g it adds: the weight rule applies
// to those groups (bench/minilm_int8_paired_accuracy.py measures it on exactly them).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace i8gemm {

constexpr int kNR = 16;  // columns per panel: two ymm of eight int32 lanes
constexpr int kMR = 6;   // rows per tile: 6 x 2 int32 accumulators + ones + a broadcast + products (W read in place)

inline int64_t Round16(int64_t k) { return (k + 15) / 16 * 16; }

// Per row: the range (0 included), scale and zero point, and the row as uint8 (K padded to 16 with the zero point,
// whose product with the padded weights (0) adds nothing).
inline void QuantizeRows(const float* x, int64_t M, int64_t K, int levels, uint8_t* xq, float* sa, int32_t* za) {
  const int64_t kp = Round16(K);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      const __m256 v = _mm256_loadu_ps(row + k);
      lo = _mm256_min_ps(lo, v);
      hi = _mm256_max_ps(hi, v);
    }
    alignas(32) float l8[8], h8[8];
    _mm256_store_ps(l8, lo);
    _mm256_store_ps(h8, hi);
    float mn = 0.f, mx = 0.f;
    for (int i = 0; i < 8; ++i) mn = std::min(mn, l8[i]), mx = std::max(mx, h8[i]);
    for (; k < K; ++k) mn = std::min(mn, row[k]), mx = std::max(mx, row[k]);
    const float top = static_cast<float>(levels);
    float scale = (mx - mn) / top;
    if (!(scale > 0.f)) scale = 1.f;
    const float zp = std::nearbyint(std::min(top, std::max(0.f, -mn / scale)));
    sa[m] = scale;
    za[m] = static_cast<int32_t>(zp);
    const __m256 inv = _mm256_set1_ps(1.f / scale), vzp = _mm256_set1_ps(zp);
    uint8_t* dst = xq + m * kp;
    k = 0;
    for (; k + 16 <= K; k += 16) {  // round half to even (the default MXCSR mode), then saturate to 0..255
      const __m256i a = _mm256_cvtps_epi32(_mm256_add_ps(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(row + k), inv),
                                                                          _MM_FROUND_TO_NEAREST_INT |
                                                                              _MM_FROUND_NO_EXC),
                                                         vzp));
      const __m256i b = _mm256_cvtps_epi32(_mm256_add_ps(
          _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(row + k + 8), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
          vzp));
      const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);  // 16 x int16 in order
      const __m128i u = _mm_min_epu8(_mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)),
                                     _mm_set1_epi8(static_cast<char>(levels)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + k), u);
    }
    for (; k < K; ++k) {
      const float q = std::nearbyint(row[k] / scale) + zp;
      dst[k] = static_cast<uint8_t>(std::min(top, std::max(0.f, q)));
    }
    for (; k < kp; ++k) dst[k] = static_cast<uint8_t>(zp);
  }
}

inline __m256i Bcast4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// acc[r][h] (int32 x 8) += rows r of xq times the panel's columns 8h..8h+7, over kp (a multiple of 16). Per block of
// 16 k the panel holds four groups g of two vectors h (columns 8h..8h+7; lane j = the 4 bytes k = 16i + 4g .. +3 of
// column j); kGroups of them are summed in int16 before one vpmaddwd(ones) + vpaddd.
template <int MR, int kGroups>
void Tile(const uint8_t* xq, int64_t kp, const int8_t* panel, __m256i out[MR][2]) {
  static_assert(kGroups == 1 || kGroups == 2 || kGroups == 4, "groups per int16 sum");
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[MR][2];  // local, not `out`: GCC keeps a local array in registers, the caller's it stores per step
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  for (int64_t k = 0; k < kp; k += 16, panel += 8 * 32) {
    for (int g0 = 0; g0 < 4; g0 += kGroups) {
      for (int r = 0; r < MR; ++r) {
        // one row at a time, both halves together: live are the broadcast, two int16 sums and a product
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int g = g0; g < g0 + kGroups; ++g) {
          const __m256i a = Bcast4(xq + r * kp + k + 4 * g);
          const __m256i p0 = _mm256_maddubs_epi16(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + 64 * g)));
          const __m256i p1 =
              _mm256_maddubs_epi16(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + 64 * g + 32)));
          s0 = g == g0 ? p0 : _mm256_add_epi16(s0, p0);
          s1 = g == g0 ? p1 : _mm256_add_epi16(s1, p1);
        }
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(s0, ones));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(s1, ones));
      }
    }
  }
  for (int r = 0; r < MR; ++r) out[r][0] = acc[r][0], out[r][1] = acc[r][1];
}

template <int MR>
void Epilogue(__m256i acc[MR][2], const float* sa, const int32_t* za, const float* sb, const int32_t* colsum,
              const float* bias, float* y, int64_t ldy, int64_t ncols) {
  for (int r = 0; r < MR; ++r) {
    alignas(32) float out[16];
    float* dst = ncols == 16 ? y + r * ldy : out;  // a full panel straight to y, an edge one through `out`
    for (int h = 0; h < 2; ++h) {
      const __m256i corr =
          _mm256_mullo_epi32(_mm256_set1_epi32(za[r]), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(colsum + 8 * h)));
      const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][h], corr));
      const __m256 s = _mm256_mul_ps(_mm256_set1_ps(sa[r]), _mm256_loadu_ps(sb + 8 * h));
      _mm256_storeu_ps(dst + 8 * h, _mm256_fmadd_ps(v, s, _mm256_loadu_ps(bias + 8 * h)));
    }
    if (ncols != 16) std::memcpy(y + r * ldy, out, sizeof(float) * ncols);
  }
}

// The packed weights (bench/minilm_int8_rowwise.py's pack_weights writes the same layout): per 16-column panel and block
// of 16 k, eight vectors [group g = k / 4 % 4][half h = columns 8h..8h+7], lane j = the 4 bytes k = 16i + 4g .. +3
// of column 8h + j; K padded to kp (16) and N to np (16) with 0; sb, colsum and bias of np entries (0 past N).
struct Weights {
  const int8_t* panels;
  const float* sb;
  const int32_t* colsum;
  const float* bias;
  int64_t K, N, kp, np;
};

// Per-call scratch of one thread: the quantized rows and their scales and zero points.
struct Scratch {
  std::vector<uint8_t> xq;
  std::vector<float> sa;
  std::vector<int32_t> za;
};

// One tile of MR rows at (m, n0): the int32 sums, then the epilogue into y.
template <int MR, int kGroups>
void TileAndStore(const Weights& p, const uint8_t* xq, const float* sa, const int32_t* za, int64_t m, int64_t n0,
                  float* y) {
  __m256i acc[MR][2];
  Tile<MR, kGroups>(xq + m * p.kp, p.kp, p.panels + n0 * p.kp, acc);
  Epilogue<MR>(acc, sa + m, za + m, p.sb + n0, p.colsum + n0, p.bias + n0, y + m * p.N + n0, p.N,
               std::min<int64_t>(kNR, p.N - n0));
}

// Y[M, N] (row stride N) = the formula above for X[M, K] (row stride K), activations on 0..levels.
template <int kGroups>
void Gemm(const Weights& p, const float* x, int64_t M, int levels, float* y, Scratch& scratch) {
  scratch.xq.resize(static_cast<size_t>(M * p.kp));
  scratch.sa.resize(M);
  scratch.za.resize(M);
  uint8_t* xq = scratch.xq.data();
  QuantizeRows(x, M, p.K, levels, xq, scratch.sa.data(), scratch.za.data());
  const float* sa = scratch.sa.data();
  const int32_t* za = scratch.za.data();
  const int64_t full = M / kMR * kMR;
  static_assert(kMR == 6, "the remainder switch below covers 1..5 rows");
  // The next panel is prefetched (into L1: measured better than L2 here) while this one runs, a share per row tile:
  // in a model the weights are read once per call from L3 or DRAM, which cost ~10% of the GEMM's time without it
  // (bench/results/minilm_int8_options.md).
  const int64_t panel_lines = p.kp * kNR / 64, tiles = std::max<int64_t>(1, full / kMR);
  const int64_t per_tile = (panel_lines + tiles - 1) / tiles;
  for (int64_t n0 = 0; n0 < p.np; n0 += kNR) {
    const char* next = reinterpret_cast<const char*>(p.panels + (n0 + kNR) * p.kp);
    const bool prefetch = n0 + kNR < p.np;
    for (int64_t m = 0, t = 0; m < full; m += kMR, ++t) {
      if (prefetch) {
        for (int64_t l = t * per_tile; l < std::min(panel_lines, (t + 1) * per_tile); ++l)
          _mm_prefetch(next + 64 * l, _MM_HINT_T0);
      }
      TileAndStore<kMR, kGroups>(p, xq, sa, za, m, n0, y);
    }
    switch (M - full) {  // the last rows in one tile of their own height
      case 5: TileAndStore<5, kGroups>(p, xq, sa, za, full, n0, y); break;
      case 4: TileAndStore<4, kGroups>(p, xq, sa, za, full, n0, y); break;
      case 3: TileAndStore<3, kGroups>(p, xq, sa, za, full, n0, y); break;
      case 2: TileAndStore<2, kGroups>(p, xq, sa, za, full, n0, y); break;
      case 1: TileAndStore<1, kGroups>(p, xq, sa, za, full, n0, y); break;
      default: break;
    }
  }
}

inline void GemmGroups(const Weights& p, const float* x, int64_t M, int levels, float* y, int groups, Scratch& scratch) {
  if (groups == 4) Gemm<4>(p, x, M, levels, y, scratch);
  else if (groups == 2) Gemm<2>(p, x, M, levels, y, scratch);
  else Gemm<1>(p, x, M, levels, y, scratch);
}

}  // namespace i8gemm
