// The compute pieces of the LoRAMixer kernel (ops/lora_mixer.cc), without onnxruntime: the dot tile
// (2 tokens x 8 rows), the up-projection (Delta rows += Bm_e^T c for 2 tokens), the transpose of Bm_e,
// the weights' finiteness scan and the routing of one token. Included by ops/lora_mixer.cc and by the
// size sweep (tests/native/sweep.cc), which checks each variant against float64 and the scalar fma
// chains at generated sizes. Each variant is a function with its own target attribute (one
// translation unit, run-time dispatch by ops/lora_mixer.cc); everything sits in an anonymous namespace
// (internal linkage: see ops/common/vec.h on why).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/cpu.h"

namespace sd {
namespace lora_mixer {
namespace {

constexpr int kRows = 8;  // rows of A_e / Router per dot tile

// ---- dot tiles: out[t][j] = rows[j] . x_t for 2 tokens x 8 rows ---------------------------------

// Portable: one accumulator per dot product, in i order.
void DotTilePortable(const float* x0, const float* x1, const float* const* rows, int64_t n, float* out0,
                     float* out1) {
  for (int j = 0; j < kRows; ++j) {
    float s0 = 0.0f, s1 = 0.0f;
    const float* w = rows[j];
    for (int64_t i = 0; i < n; ++i) {
      s0 = std::fma(w[i], x0[i], s0);
      s1 = std::fma(w[i], x1[i], s1);
    }
    out0[j] = s0;
    out1[j] = s1;
  }
}

// AVX-512: 16 accumulators (2 tokens x 8 rows) of 16 lanes, then one transposing reduction whose
// tree is the same for every accumulator (so equal rows give equal sums).
// (maskz forms with all lanes: GCC 12's plain shuffles and unpacks warn about an uninitialised
// temporary in its own headers; the same instructions)
SD_TARGET_AVX512 inline __m512 Reduce16(__m512 v[16]) {
  __m512 w[8], y[4], z[2];
  for (int m = 0; m < 8; ++m) {  // lanes i + (i + 8) of v[2m] | of v[2m+1]
    w[m] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, v[2 * m], v[2 * m + 1], 0x44),
                         _mm512_maskz_shuffle_f32x4(0xFFFF, v[2 * m], v[2 * m + 1], 0xEE));
  }
  for (int m = 0; m < 4; ++m) {  // quads: v[4m], v[4m+1], v[4m+2], v[4m+3], 4 partials each
    y[m] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, w[2 * m], w[2 * m + 1], 0x88),
                         _mm512_maskz_shuffle_f32x4(0xFFFF, w[2 * m], w[2 * m + 1], 0xDD));
  }
  for (int m = 0; m < 2; ++m) {
    z[m] = _mm512_add_ps(_mm512_maskz_unpacklo_ps(0xFFFF, y[2 * m], y[2 * m + 1]), _mm512_maskz_unpackhi_ps(0xFFFF, y[2 * m], y[2 * m + 1]));
  }
  // lane 4q + l holds the sum of v[4l + q]
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, _mm512_castps_pd(z[0]), _mm512_castps_pd(z[1]))),
                       _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, _mm512_castps_pd(z[0]), _mm512_castps_pd(z[1]))));
}

// The 16 accumulators are named locals (an array passed on by pointer made gcc keep them in memory,
// storing each one every step); they become an array only for the final reduction.
#define SD_LM_REG(v) __asm__("" : "+v"(v))
#define SD_LM_STEP512(m)                                                                   \
  do {                                                                                     \
    const __m512 xa = _mm512_maskz_loadu_ps(m, x0 + i), xb = _mm512_maskz_loadu_ps(m, x1 + i); \
    __m512 w;                                                                              \
    /* SD_LM_REG: keep each row vector in a register for both tokens' fmas (gcc otherwise folds  \
       the load into each fma: 18 loads per 16 fmas, and the loop becomes load-bound) */     \
    w = _mm512_maskz_loadu_ps(m, r0 + i); SD_LM_REG(w); a0 = _mm512_fmadd_ps(w, xa, a0); b0 = _mm512_fmadd_ps(w, xb, b0); \
    w = _mm512_maskz_loadu_ps(m, r1 + i); SD_LM_REG(w); a1 = _mm512_fmadd_ps(w, xa, a1); b1 = _mm512_fmadd_ps(w, xb, b1); \
    w = _mm512_maskz_loadu_ps(m, r2 + i); SD_LM_REG(w); a2 = _mm512_fmadd_ps(w, xa, a2); b2 = _mm512_fmadd_ps(w, xb, b2); \
    w = _mm512_maskz_loadu_ps(m, r3 + i); SD_LM_REG(w); a3 = _mm512_fmadd_ps(w, xa, a3); b3 = _mm512_fmadd_ps(w, xb, b3); \
    w = _mm512_maskz_loadu_ps(m, r4 + i); SD_LM_REG(w); a4 = _mm512_fmadd_ps(w, xa, a4); b4 = _mm512_fmadd_ps(w, xb, b4); \
    w = _mm512_maskz_loadu_ps(m, r5 + i); SD_LM_REG(w); a5 = _mm512_fmadd_ps(w, xa, a5); b5 = _mm512_fmadd_ps(w, xb, b5); \
    w = _mm512_maskz_loadu_ps(m, r6 + i); SD_LM_REG(w); a6 = _mm512_fmadd_ps(w, xa, a6); b6 = _mm512_fmadd_ps(w, xb, b6); \
    w = _mm512_maskz_loadu_ps(m, r7 + i); SD_LM_REG(w); a7 = _mm512_fmadd_ps(w, xa, a7); b7 = _mm512_fmadd_ps(w, xb, b7); \
  } while (0)

SD_TARGET_AVX512 void DotTileAvx512(const float* x0, const float* x1, const float* const* rows, int64_t n,
                                    float* out0, float* out1) {
  const float *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3];
  const float *r4 = rows[4], *r5 = rows[5], *r6 = rows[6], *r7 = rows[7];
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) SD_LM_STEP512(static_cast<__mmask16>(0xFFFF));
  if (i < n) SD_LM_STEP512(static_cast<__mmask16>((1u << (n - i)) - 1));
  __m512 acc[16] = {a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7};
  // Reduce16's lane 4q + l holds the sum of acc[4l + q]: one permute puts acc[n] in lane n (token 0's
  // 8 rows, then token 1's), stored as two halves (no scalar scatter through memory).
  const __m512i natural = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 sums = _mm512_maskz_permutexvar_ps(0xFFFF, natural, Reduce16(acc));
  _mm256_storeu_ps(out0, _mm512_maskz_extractf32x8_ps(0xFF, sums, 0));
  _mm256_storeu_ps(out1, _mm512_maskz_extractf32x8_ps(0xFF, sums, 1));
}
#undef SD_LM_STEP512
#undef SD_LM_REG

// AVX2: one token x 8 rows (8 accumulators: 16 would not fit the 16 ymm registers), same
// transposing-reduction idea.
SD_TARGET_AVX2 inline __m256 Reduce8(__m256 v[8]) {
  __m256 w[4], y[2];
  for (int m = 0; m < 4; ++m) {  // halves: v[2m] | v[2m+1], lanes i + (i + 4)
    w[m] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * m], v[2 * m + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * m], v[2 * m + 1], 0x31));
  }
  for (int m = 0; m < 2; ++m) {
    y[m] = _mm256_add_ps(_mm256_unpacklo_ps(w[2 * m], w[2 * m + 1]), _mm256_unpackhi_ps(w[2 * m], w[2 * m + 1]));
  }
  // lane 4q + l holds the sum of v[2l + q]
  return _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(y[0]), _mm256_castps_pd(y[1]))),
                       _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(y[0]), _mm256_castps_pd(y[1]))));
}

// Two tokens x 4 rows per pass (8 accumulators, 6 loads per 8 fmas: the fma units, not the loads,
// bound the loop), two passes for the 8 rows of a tile.
#define SD_LM_STEP256(LOAD)                                                                       \
  do {                                                                                            \
    const __m256 xa = LOAD(x0), xb = LOAD(x1);                                                    \
    __m256 w;                                                                                     \
    w = LOAD(q0); __asm__("" : "+x"(w)); a0 = _mm256_fmadd_ps(w, xa, a0); b0 = _mm256_fmadd_ps(w, xb, b0);               \
    w = LOAD(q1); __asm__("" : "+x"(w)); a1 = _mm256_fmadd_ps(w, xa, a1); b1 = _mm256_fmadd_ps(w, xb, b1);               \
    w = LOAD(q2); __asm__("" : "+x"(w)); a2 = _mm256_fmadd_ps(w, xa, a2); b2 = _mm256_fmadd_ps(w, xb, b2);               \
    w = LOAD(q3); __asm__("" : "+x"(w)); a3 = _mm256_fmadd_ps(w, xa, a3); b3 = _mm256_fmadd_ps(w, xb, b3);               \
  } while (0)

SD_TARGET_AVX2 void DotQuadAvx2(const float* x0, const float* x1, const float* const* rows, int64_t n, float* out0,
                                float* out1) {
  const float *q0 = rows[0], *q1 = rows[1], *q2 = rows[2], *q3 = rows[3];
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  int64_t i = 0;
#define SD_LM_FULL(p) _mm256_loadu_ps((p) + i)
  for (; i + 8 <= n; i += 8) SD_LM_STEP256(SD_LM_FULL);
#undef SD_LM_FULL
  if (i < n) {
    alignas(32) int32_t lanes[8];
    for (int k = 0; k < 8; ++k) lanes[k] = k < n - i ? -1 : 0;
    const __m256i m = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
#define SD_LM_TAIL(p) _mm256_maskload_ps((p) + i, m)
    SD_LM_STEP256(SD_LM_TAIL);
#undef SD_LM_TAIL
  }
  __m256 acc[8] = {a0, a1, a2, a3, b0, b1, b2, b3};
  alignas(32) float s[8];
  _mm256_store_ps(s, Reduce8(acc));  // lane 4q + l holds the sum of acc[2l + q]
  for (int k = 0; k < 4; ++k) {
    out0[k] = s[4 * (k % 2) + k / 2];
    out1[k] = s[4 * ((k + 4) % 2) + (k + 4) / 2];
  }
}
#undef SD_LM_STEP256

SD_TARGET_AVX2 void DotTileAvx2(const float* x0, const float* x1, const float* const* rows, int64_t n, float* out0,
                                float* out1) {
  DotQuadAvx2(x0, x1, rows, n, out0, out1);
  DotQuadAvx2(x0, x1, rows + 4, n, out0 + 4, out1 + 4);
}

using DotTileFn = void (*)(const float*, const float*, const float* const*, int64_t, float*, float*);

// out_t[j] = W[j] . x_t for all `m` rows of W [m, n] (row stride n), in tiles of 8 rows; the last
// tile repeats row m-1 (its extra results are dropped).
inline void DotRows(DotTileFn tile, const float* x0, const float* x1, const float* w, int64_t m, int64_t n,
                    float* out0, float* out1) {
  float t0[kRows], t1[kRows];
  const float* rows[kRows];
  if (m == kRows) {  // E = 8 router rows or r = 8 ranks, the usual case: straight into out
    for (int k = 0; k < kRows; ++k) rows[k] = w + k * n;
    tile(x0, x1, rows, n, out0, out1);
    return;
  }
  for (int64_t j0 = 0; j0 < m; j0 += kRows) {
    for (int k = 0; k < kRows; ++k) rows[k] = w + std::min<int64_t>(j0 + k, m - 1) * n;
    tile(x0, x1, rows, n, t0, t1);
    const int64_t cnt = std::min<int64_t>(kRows, m - j0);
    for (int64_t k = 0; k < cnt; ++k) {
      out0[j0 + k] = t0[k];
      out1[j0 + k] = t1[k];
    }
  }
}

// ---- up-projection: d_t += sum_j c_t[j] * BT[j, :] for 2 tokens (BT = Bm_e^T, [r, out]) ----------

// Outputs [begin, out) one element at a time: the fma chain j = 0..r-1 every vector lane also runs (the
// portable variant, and the vector variants' tails).
inline void AxpyScalar(const float* bt, int64_t r, int64_t out, int64_t begin, const float* c0, const float* c1,
                       float* d0, float* d1, bool fresh0, bool fresh1) {
  for (int64_t o = begin; o < out; ++o) {
    float a0 = fresh0 ? 0.0f : d0[o], a1 = fresh1 ? 0.0f : d1[o];
    for (int64_t j = 0; j < r; ++j) {
      a0 = std::fma(c0[j], bt[j * out + o], a0);
      a1 = std::fma(c1[j], bt[j * out + o], a1);
    }
    d0[o] = a0;
    d1[o] = a1;
  }
}

void AxpyPortable(const float* bt, int64_t r, int64_t out, const float* c0, const float* c1, float* d0, float* d1,
                  bool fresh0, bool fresh1) {
  AxpyScalar(bt, r, out, 0, c0, c1, d0, d1, fresh0, fresh1);
}

// The coefficients are broadcast once per chunk of 8 ranks and kept in registers across the out
// loop (16 zmm for 2 tokens): the loop then loads one Bm^T vector per 2 FMAs. Each output element
// gets the same fma chain over j = 0..r-1 in order, whatever the chunking.
SD_TARGET_AVX512 void AxpyAvx512(const float* bt, int64_t r, int64_t out, const float* c0, const float* c1, float* d0,
                                 float* d1, bool fresh0, bool fresh1) {
  for (int64_t j0 = 0; j0 < r; j0 += 8) {
    const int64_t nj = std::min<int64_t>(8, r - j0);
    __m512 b0[8], b1[8];
    for (int64_t j = 0; j < 8; ++j) {
      b0[j] = _mm512_set1_ps(j < nj ? c0[j0 + j] : 0.0f);
      b1[j] = _mm512_set1_ps(j < nj ? c1[j0 + j] : 0.0f);
    }
    const float* bj = bt + j0 * out;
    const bool z0 = fresh0 && j0 == 0, z1 = fresh1 && j0 == 0;  // first contribution: start from 0
    int64_t o = 0;
    // Two 16-wide blocks per step: four independent fma chains keep the FMA units busy (each chain is
    // r dependent fmas); every output element still gets the same chain j = 0..r-1.
    if (nj == 8) {
      for (; o + 32 <= out; o += 32) {
        __m512 a0 = z0 ? _mm512_setzero_ps() : _mm512_loadu_ps(d0 + o);
        __m512 a1 = z1 ? _mm512_setzero_ps() : _mm512_loadu_ps(d1 + o);
        __m512 a2 = z0 ? _mm512_setzero_ps() : _mm512_loadu_ps(d0 + o + 16);
        __m512 a3 = z1 ? _mm512_setzero_ps() : _mm512_loadu_ps(d1 + o + 16);
        for (int j = 0; j < 8; ++j) {
          __m512 b = _mm512_loadu_ps(bj + j * out + o), c = _mm512_loadu_ps(bj + j * out + o + 16);
          __asm__("" : "+v"(b), "+v"(c));  // one load per vector, not one per fma (as in DotTileAvx512)
          a0 = _mm512_fmadd_ps(b0[j], b, a0);
          a1 = _mm512_fmadd_ps(b1[j], b, a1);
          a2 = _mm512_fmadd_ps(b0[j], c, a2);
          a3 = _mm512_fmadd_ps(b1[j], c, a3);
        }
        _mm512_storeu_ps(d0 + o, a0);
        _mm512_storeu_ps(d1 + o, a1);
        _mm512_storeu_ps(d0 + o + 16, a2);
        _mm512_storeu_ps(d1 + o + 16, a3);
      }
    }
    for (; o < out; o += 16) {
      const __mmask16 m =
          out - o >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (out - o)) - 1);
      // Both loads before either store: d0 and d1 may be the same token (an odd token paired with itself).
      __m512 a0 = _mm512_maskz_loadu_ps(z0 ? 0 : m, d0 + o), a1 = _mm512_maskz_loadu_ps(z1 ? 0 : m, d1 + o);
      for (int64_t j = 0; j < nj; ++j) {
        __m512 b = _mm512_maskz_loadu_ps(m, bj + j * out + o);
        __asm__("" : "+v"(b));
        a0 = _mm512_fmadd_ps(b0[j], b, a0);
        a1 = _mm512_fmadd_ps(b1[j], b, a1);
      }
      _mm512_mask_storeu_ps(d0 + o, m, a0);
      _mm512_mask_storeu_ps(d1 + o, m, a1);
    }
  }
}

// 32 outputs x 2 tokens per step (8 ymm accumulators, 4 Bm^T loads and 2 coefficient broadcasts per
// rank: 0.75 loads per fma, where one 8-wide vector per step took 1.5 and left the loop load-bound),
// then 8-wide steps, then scalar; every element gets the same fma chain j = 0..r-1.
SD_TARGET_AVX2 void AxpyAvx2(const float* bt, int64_t r, int64_t out, const float* c0, const float* c1, float* d0,
                             float* d1, bool fresh0, bool fresh1) {
  int64_t o = 0;
  for (; o + 32 <= out; o += 32) {
    // Both tokens' loads before any store: d0 and d1 may be the same token (paired with itself).
    __m256 a[8];
    for (int v = 0; v < 4; ++v) {
      a[v] = fresh0 ? _mm256_setzero_ps() : _mm256_loadu_ps(d0 + o + 8 * v);
      a[4 + v] = fresh1 ? _mm256_setzero_ps() : _mm256_loadu_ps(d1 + o + 8 * v);
    }
    for (int64_t j = 0; j < r; ++j) {
      const float* b = bt + j * out + o;
      __m256 v0 = _mm256_loadu_ps(b), v1 = _mm256_loadu_ps(b + 8), v2 = _mm256_loadu_ps(b + 16),
             v3 = _mm256_loadu_ps(b + 24);
      __asm__("" : "+x"(v0), "+x"(v1), "+x"(v2), "+x"(v3));  // one load per vector, not one per fma
      const __m256 w0 = _mm256_set1_ps(c0[j]), w1 = _mm256_set1_ps(c1[j]);
      a[0] = _mm256_fmadd_ps(w0, v0, a[0]);
      a[1] = _mm256_fmadd_ps(w0, v1, a[1]);
      a[2] = _mm256_fmadd_ps(w0, v2, a[2]);
      a[3] = _mm256_fmadd_ps(w0, v3, a[3]);
      a[4] = _mm256_fmadd_ps(w1, v0, a[4]);
      a[5] = _mm256_fmadd_ps(w1, v1, a[5]);
      a[6] = _mm256_fmadd_ps(w1, v2, a[6]);
      a[7] = _mm256_fmadd_ps(w1, v3, a[7]);
    }
    for (int v = 0; v < 4; ++v) {
      _mm256_storeu_ps(d0 + o + 8 * v, a[v]);
      _mm256_storeu_ps(d1 + o + 8 * v, a[4 + v]);
    }
  }
  for (; o + 8 <= out; o += 8) {
    __m256 a0 = fresh0 ? _mm256_setzero_ps() : _mm256_loadu_ps(d0 + o);
    __m256 a1 = fresh1 ? _mm256_setzero_ps() : _mm256_loadu_ps(d1 + o);
    for (int64_t j = 0; j < r; ++j) {
      const __m256 b = _mm256_loadu_ps(bt + j * out + o);
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(c0[j]), b, a0);
      a1 = _mm256_fmadd_ps(_mm256_set1_ps(c1[j]), b, a1);
    }
    _mm256_storeu_ps(d0 + o, a0);
    _mm256_storeu_ps(d1 + o, a1);
  }
  AxpyScalar(bt, r, out, o, c0, c1, d0, d1, fresh0, fresh1);  // the same fma chain per element as the lanes
}

// Bm_e [out, r] -> Bm_e^T [r, out] (rows of the up-projection for AxpyXxx). The AVX-512 build of the
// same loop lets gcc vectorise it (gathers along out).
void TransposePortable(const float* src, int64_t out, int64_t r, float* dst) {
  for (int64_t q = 0; q < r; ++q)
    for (int64_t o = 0; o < out; ++o) dst[q * out + o] = src[o * r + q];
}

// Index vectors of one stage of the register-lane transpose: exchanging a register-index bit with lane
// bit `lb` for a pair (lo: register bit 0, hi: register bit 1) is lo' = permutex2var(lo, a, hi),
// hi' = permutex2var(lo, b, hi).
inline void SwapIndices(int lb, int32_t* ia, int32_t* ib) {
  const int bit = 1 << lb;
  for (int l = 0; l < 16; ++l) {
    ia[l] = (l & bit) ? 16 + (l & ~bit) : l;
    ib[l] = (l & bit) ? 16 + l : (l | bit);
  }
}

// Also returns whether the slice it read is all finite (the fused check of Bm_e: every register it
// loads is folded into one NaN-if-not-finite accumulator before the permutes; the rest by the plain
// scan).
SD_TARGET_AVX512 bool AllFiniteAvx512(const float* p, int64_t n);

SD_TARGET_AVX512 bool TransposeAvx512(const float* src, int64_t out, int64_t r, float* dst) {
  int64_t o = 0;
  const __m512 zero = _mm512_setzero_ps();
  __m512 chk = zero;  // stays +0 unless a NaN or +-inf was loaded (then NaN)
  if (r == 8 && out >= 16) {
    // the usual LoRA rank: a 16 x 8 block of Bm is 8 zmm (register k = rows 2k, 2k+1); three bit
    // exchanges between register and lane index and one lane permute give its 8 columns.
    alignas(64) int32_t idx[7][16];
    for (int rb = 0; rb < 3; ++rb) SwapIndices(rb, idx[2 * rb], idx[2 * rb + 1]);
    for (int row = 0; row < 16; ++row) idx[6][row] = ((row & 1) << 3) | (row >> 1);
    __m512i xa[3], xb[3];
    for (int rb = 0; rb < 3; ++rb) {
      xa[rb] = _mm512_load_si512(idx[2 * rb]);
      xb[rb] = _mm512_load_si512(idx[2 * rb + 1]);
    }
    const __m512i last = _mm512_load_si512(idx[6]);
    for (; o + 16 <= out; o += 16) {
      __m512 z[8];
      for (int k = 0; k < 8; ++k) {
        z[k] = _mm512_loadu_ps(src + (o + 2 * k) * 8);
        chk = _mm512_fmadd_ps(z[k], zero, chk);  // finite * 0 = +-0; NaN or +-inf * 0 = NaN (either fma port)
      }
      for (int rb = 2; rb >= 0; --rb) {
        const int step = 1 << rb;
        for (int k = 0; k < 8; ++k) {
          if (k & step) continue;
          const __m512 lo = _mm512_permutex2var_ps(z[k], xa[rb], z[k | step]);
          const __m512 hi = _mm512_permutex2var_ps(z[k], xb[rb], z[k | step]);
          z[k] = lo;
          z[k | step] = hi;
        }
      }
      for (int q = 0; q < 8; ++q) _mm512_storeu_ps(dst + q * out + o, _mm512_maskz_permutexvar_ps(0xFFFF, last, z[q]));
    }
  }
  for (int64_t q = 0; q < r; ++q)
    for (int64_t oo = o; oo < out; ++oo) dst[q * out + oo] = src[oo * r + q];
  return _mm512_cmp_ps_mask(chk, chk, _CMP_UNORD_Q) == 0 && AllFiniteAvx512(src + o * r, (out - o) * r);
}

using AxpyFn = void (*)(const float*, int64_t, int64_t, const float*, const float*, float*, float*, bool, bool);

// ---- routing ------------------------------------------------------------------------------------

// Top-k of one token's logits l[0..E) (larger first, equal -> lower index), its gates, and whether
// the token is finite. sel/gate hold top_k entries.
inline bool Route(const float* l, int64_t e, int64_t k, int32_t* sel, float* gate) {
  for (int64_t j = 0; j < e; ++j) {
    if (!std::isfinite(l[j])) {
      for (int64_t s = 0; s < k; ++s) {
        sel[s] = static_cast<int32_t>(s);
        gate[s] = std::numeric_limits<float>::quiet_NaN();
      }
      return false;
    }
  }
  // Selection by repeated max over the not-yet-chosen experts: E is small (tens). The scan keeps the
  // best value and index in registers and compares with no data-dependent branch (a branch on random
  // logits mispredicts about once per token and pass, which cost more than the compares); a chosen
  // expert's value is replaced by -inf, below every finite logit, in a copy of the logits (on the stack
  // for E <= 64, the usual case: no allocation per token). Strict `>`: an equal logit keeps the lower
  // index, and an unchosen finite logit always beats a chosen one.
  float lv_small[64];
  std::vector<float> lv_big(e > 64 ? static_cast<size_t>(e) : 0);
  float* lv = e > 64 ? lv_big.data() : lv_small;
  std::copy(l, l + e, lv);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < k; ++s) {
    float bv = lv[0];
    int64_t best = 0;
    for (int64_t j = 1; j < e; ++j) {
      const bool gt = lv[j] > bv;
      bv = gt ? lv[j] : bv;
      best = gt ? j : best;
    }
    sel[s] = static_cast<int32_t>(best);
    lv[best] = ninf;
  }
  // The top expert's term is exp(l_max - l_max) = exp(0) = 1 exactly, so it is set, not computed (the
  // same value: top_k = 1 gives gate 1 with no exp at all).
  if (k == 1) {
    gate[0] = 1.0f;
    return true;
  }
  const double m = l[sel[0]];
  double ex[64];
  std::vector<double> ex_big(k > 64 ? static_cast<size_t>(k) : 0);
  double* exs = k > 64 ? ex_big.data() : ex;
  double sum = exs[0] = 1.0;
  for (int64_t s = 1; s < k; ++s) sum += (exs[s] = std::exp(static_cast<double>(l[sel[s]]) - m));
  for (int64_t s = 0; s < k; ++s) gate[s] = static_cast<float>(exs[s] / sum);
  return true;
}

// ---- finiteness of the weights ----------------------------------------------------------------------

inline bool AllFinitePortable(const float* p, int64_t n) {
  uint32_t bad = 0;  // exponent all ones: NaN or +-inf (a loop gcc vectorises)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, p + i, 4);
    bad |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

SD_TARGET_AVX512 bool AllFiniteAvx512(const float* p, int64_t n) {
  __mmask16 bad = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) bad |= _mm512_fpclass_ps_mask(_mm512_loadu_ps(p + i), 0x99);  // NaN, +-inf
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    bad |= _mm512_mask_fpclass_ps_mask(m, _mm512_maskz_loadu_ps(m, p + i), 0x99);
  }
  return bad == 0;
}

SD_TARGET_AVX2 bool AllFiniteAvx2(const float* p, int64_t n) {
  const __m256 inf = _mm256_set1_ps(INFINITY), sign = _mm256_set1_ps(-0.0f);
  __m256 bad = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {  // not (|x| < inf): NaN and +-inf
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(p + i)), inf, _CMP_NLT_UQ));
  }
  return _mm256_movemask_ps(bad) == 0 && AllFinitePortable(p + i, n - i);
}

}  // namespace
}  // namespace lora_mixer
}  // namespace sd
