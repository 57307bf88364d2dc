// LoRAMixer: the routed low-rank delta of a LoRA-Mixer projection (equation and rules:
// softdeploy/ops/lora_mixer.py, rendered in docs/ops/LoRAMixer.md).
//
//   per token x:  l = Router . x;  S = top_k by l (ties -> lower index);
//                 w_e = exp(l_e - max l) / sum_{S} exp(l_e' - max l);
//                 Delta = scaling * sum_{e in S} w_e * Bm_e . (A_e . x)
//
// SGMV-style (Punica): the tokens of a call are routed first (router logits, top-k, gates), then
// grouped by selected expert (a counting sort: for each expert the list of (token, scaling * w) in
// token order), and each expert's A_e . x and Bm_e . u are computed for its own tokens only. An
// unselected expert is never read: the work is top_k / E of the dense form, plus the router.
//
// What must stay true:
//  * Each token's result is independent of the other tokens of the call and of the thread split:
//    the tiles pair tokens, but a token's arithmetic is the same in every lane and position (an odd
//    token is paired with itself), the 8-row tiles pad with a repeated row, and the experts of a
//    token are added to its Delta in ascending expert order. Identical router rows therefore give
//    bit-identical logits (exact ties) and 1 and 2 threads give identical results.
//  * Work is split into fixed blocks of kTokenBlock tokens (sd::ParallelFor over blocks), never by
//    the number of threads.
//  * Non-finite tokens (any logit NaN or +-inf) get NaN Delta and Gates and Experts 0..top_k-1.
//  * A non-finite weight is an error whatever the routing: unselected experts are scanned, selected
//    ones are checked through the work (a non-finite value is absorbing in the sums of products), and
//    any sign of one runs the full scan of A, Bm and Router in that order (RequireFinite's message),
//    so the error does not depend on which check saw it first (see Compute).
//  * A token's routing is computed from its logits alone (a loop over the block's tokens after all
//    their logits), its top-k scan without data-dependent branches; the gates' arithmetic is
//    unchanged (exp in double of l_e - max l, the top expert's term exactly 1).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <immintrin.h>

#include "common/kernel.h"

namespace sd {
namespace {

constexpr const char* kOp = "LoRAMixer";
constexpr int64_t kTokenBlock = 64;
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
SD_TARGET_AVX512 inline __m512 Reduce16(__m512 v[16]) {
  __m512 w[8], y[4], z[2];
  for (int m = 0; m < 8; ++m) {  // lanes i + (i + 8) of v[2m] | of v[2m+1]
    w[m] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], 0xEE));
  }
  for (int m = 0; m < 4; ++m) {  // quads: v[4m], v[4m+1], v[4m+2], v[4m+3], 4 partials each
    y[m] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0xDD));
  }
  for (int m = 0; m < 2; ++m) {
    z[m] = _mm512_add_ps(_mm512_unpacklo_ps(y[2 * m], y[2 * m + 1]), _mm512_unpackhi_ps(y[2 * m], y[2 * m + 1]));
  }
  // lane 4q + l holds the sum of v[4l + q]
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(z[0]), _mm512_castps_pd(z[1]))),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(z[0]), _mm512_castps_pd(z[1]))));
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
  const __m512 sums = _mm512_permutexvar_ps(natural, Reduce16(acc));
  _mm256_storeu_ps(out0, _mm512_castps512_ps256(sums));
  _mm256_storeu_ps(out1, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sums), 1)));
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

void AxpyPortable(const float* bt, int64_t r, int64_t out, const float* c0, const float* c1, float* d0, float* d1,
                  bool fresh0, bool fresh1) {
  for (int64_t o = 0; o < out; ++o) {
    float a0 = fresh0 ? 0.0f : d0[o], a1 = fresh1 ? 0.0f : d1[o];
    for (int64_t j = 0; j < r; ++j) {
      a0 = std::fma(c0[j], bt[j * out + o], a0);
      a1 = std::fma(c1[j], bt[j * out + o], a1);
    }
    d0[o] = a0;
    d1[o] = a1;
  }
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
  for (; o < out; ++o) {  // the same fma chain per element as the vector lanes
    float a0 = fresh0 ? 0.0f : d0[o], a1 = fresh1 ? 0.0f : d1[o];
    for (int64_t j = 0; j < r; ++j) {
      a0 = std::fma(c0[j], bt[j * out + o], a0);
      a1 = std::fma(c1[j], bt[j * out + o], a1);
    }
    d0[o] = a0;
    d1[o] = a1;
  }
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
      for (int q = 0; q < 8; ++q) _mm512_storeu_ps(dst + q * out + o, _mm512_permutexvar_ps(last, z[q]));
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

// Fails naming the first non-finite entry of a weight input (the error path: a plain scan).
inline void RequireFinite(Isa isa, const char* name, const float* p, const std::vector<int64_t>& shape) {
  const int64_t n = NumElements(shape);
  const bool ok = isa == Isa::kAvx512 ? AllFiniteAvx512(p, n)
                  : isa == Isa::kAvx2 ? AllFiniteAvx2(p, n)
                                      : AllFinitePortable(p, n);
  if (ok) return;
  int64_t at = 0;
  while (at < n && std::isfinite(p[at])) ++at;
  std::vector<int64_t> index(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1, rest = at; d >= 0; --d) {
    index[d] = rest % shape[d];
    rest /= shape[d];
  }
  Fail(kOp, name, " holds a non-finite value (NaN or +-inf) at ", ShapeStr(index),
       " (rule: the experts' factors A, Bm and the Router are finite)");
}

struct LoRAMixerKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kT}, {Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}, {Elem::kInt64, /*optional=*/true}, {Elem::kT, /*optional=*/true}};

  int64_t top_k;
  float scaling;
  Isa isa;

  explicit LoRAMixerKernel(const Attrs& attrs)
      : top_k(attrs.Int("top_k", 1)), scaling(attrs.Float("scaling", 1.0f)), isa(SelectIsa()) {}

  template <class T>
  static const float* AsFloat(const Input<T>& in, std::vector<float>& buf) {
    if constexpr (std::is_same_v<T, float>) {
      return in.data;
    } else {
      buf.resize(static_cast<size_t>(in.size()));
      for (int64_t i = 0; i < in.size(); ++i) buf[i] = ToFloat(in.data[i]);
      return buf.data();
    }
  }

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0), a = GetInput<T>(ctx, 1), bm = GetInput<T>(ctx, 2),
                   router = GetInput<T>(ctx, 3);
    if (x.rank() == 0) Fail(kOp, "X must have rank >= 1 ([..., in]), got a scalar");
    if (a.rank() != 3) Fail(kOp, "A must have rank 3 ([E, r, in]), got shape ", ShapeStr(a.shape));
    if (bm.rank() != 3) Fail(kOp, "Bm must have rank 3 ([E, out, r]), got shape ", ShapeStr(bm.shape));
    if (router.rank() != 2) Fail(kOp, "Router must have rank 2 ([E, in]), got shape ", ShapeStr(router.shape));
    const int64_t e = a.shape[0], r = a.shape[1], n_in = a.shape[2], n_out = bm.shape[1];
    const char* e_rule = "rule: A [E, r, in], Bm [E, out, r] and Router [E, in] agree on E";
    if (bm.shape[0] != e) Fail(kOp, "Bm has E = ", bm.shape[0], " experts, A has E = ", e, " (", e_rule, ")");
    if (router.shape[0] != e) Fail(kOp, "Router has E = ", router.shape[0], " experts, A has E = ", e, " (", e_rule, ")");
    if (bm.shape[2] != r) {
      Fail(kOp, "Bm has r = ", bm.shape[2], ", A has r = ", r, " (rule: A [E, r, in] and Bm [E, out, r] agree on r)");
    }
    const char* in_rule = "rule: X [..., in], A [E, r, in] and Router [E, in] agree on in";
    if (x.shape.back() != n_in) Fail(kOp, "X has in = ", x.shape.back(), " features, A has in = ", n_in, " (", in_rule, ")");
    if (router.shape[1] != n_in) {
      Fail(kOp, "Router has in = ", router.shape[1], " features, A has in = ", n_in, " (", in_rule, ")");
    }
    if (top_k < 1 || top_k > e) Fail(kOp, "top_k ", top_k, " is out of range for E = ", e, " experts (rule: 1 <= top_k <= E)");
    if (!std::isfinite(scaling)) {
      Fail(kOp, "scaling ", std::isnan(scaling) ? "nan" : (scaling > 0 ? "inf" : "-inf"),
           " is not finite (rule: scaling is a finite number)");
    }

    const int64_t k = top_k;
    std::vector<int64_t> d_shape(x.shape.begin(), x.shape.end() - 1), k_shape = d_shape;
    d_shape.push_back(n_out);
    k_shape.push_back(k);
    T* delta_out = AllocOutput<T>(ctx, 0, d_shape);
    int64_t* experts_out = nullptr;
    T* gates_out = nullptr;
    // Experts and Gates are optional: absent or omitted (named ""), onnxruntime gives no tensor.
    if (ctx.GetOutputCount() > 1) {
      Ort::UnownedValue v = ctx.GetOutput(1, k_shape);
      if (static_cast<OrtValue*>(v) != nullptr) experts_out = v.GetTensorMutableData<int64_t>();
    }
    if (ctx.GetOutputCount() > 2) {
      Ort::UnownedValue v = ctx.GetOutput(2, k_shape);
      if (static_cast<OrtValue*>(v) != nullptr) gates_out = v.GetTensorMutableData<T>();
    }
    const int64_t n_tok = NumElements(std::vector<int64_t>(x.shape.begin(), x.shape.end() - 1));
    std::vector<float> xb, ab, bb, rb;
    const float* xf = AsFloat(x, xb);
    const float* af = AsFloat(a, ab);
    const float* bf = AsFloat(bm, bb);
    const float* rf = AsFloat(router, rb);
    // Every expert, selected or not, must be finite (see the op's docstring: a NaN must not depend on
    // the routing). RequireAllFinite scans A, Bm and Router in that order and fails naming the first
    // non-finite entry. With tokens, most of that scan is fused into the work (one extra pass over
    // ~200 KB of weights was ~5% of a call at the benchmark shape): a non-finite value is absorbing
    // in a sum of products (NaN stays NaN, inf + finite = inf, inf - inf = NaN, inf * 0 = NaN), so
    //  * a non-finite Router entry makes every token's logits non-finite,
    //  * a non-finite entry of a selected expert's A_e makes A_e . x non-finite for each of its
    //    (finite) tokens,
    //  * a selected expert's Bm_e is classified while it is transposed (TransposeAvx512) or scanned,
    //  * an unselected expert's A_e and Bm_e are scanned as before.
    // Any of these signs (also raised by a non-finite X or an overflow, which are not errors) runs the
    // full scan after the work, which then fails exactly as the scan up front did, or passes.
    const auto finite = isa == Isa::kAvx512 ? AllFiniteAvx512 : isa == Isa::kAvx2 ? AllFiniteAvx2 : AllFinitePortable;
    auto require_all_finite = [&] {
      RequireFinite(isa, "A", af, a.shape);
      RequireFinite(isa, "Bm", bf, bm.shape);
      RequireFinite(isa, "Router", rf, router.shape);
    };
    if (n_tok == 0) {
      require_all_finite();
      return;
    }

    DotTileFn dot = DotTilePortable;
    AxpyFn axpy = AxpyPortable;
    if (isa == Isa::kAvx512) {
      dot = DotTileAvx512;
      axpy = AxpyAvx512;
    } else if (isa == Isa::kAvx2) {
      dot = DotTileAvx2;
      axpy = AxpyAvx2;
    }
    // Bm_e -> Bm_e^T, and whether Bm_e is all finite.
    auto transpose = [&](const float* src, int64_t out, int64_t rr, float* dst) {
      if (isa == Isa::kAvx512) return TransposeAvx512(src, out, rr, dst);
      TransposePortable(src, out, rr, dst);
      return finite(src, out * rr);
    };

    // Phase 1 (parallel over token blocks): logits, top-k, gates.
    std::vector<int32_t> sel(static_cast<size_t>(n_tok * k));
    std::vector<float> gate(static_cast<size_t>(n_tok * k));
    std::vector<char> ok(static_cast<size_t>(n_tok));
    const size_t blocks = static_cast<size_t>((n_tok + kTokenBlock - 1) / kTokenBlock);
    ParallelFor(ctx, blocks, [&](size_t b) {
      const int64_t t0 = static_cast<int64_t>(b) * kTokenBlock, t1 = std::min(n_tok, t0 + kTokenBlock);
      // All the block's logits first, then the routing in a loop of its own: the tokens' top-k scans
      // are independent, so their dependency chains (a compare and select per expert) overlap there,
      // where between two dot tiles each waited on its own.
      std::vector<float> l(static_cast<size_t>((t1 - t0) * e));
      for (int64_t t = t0; t < t1; t += 2) {
        const int64_t u = std::min(t + 1, t1 - 1);
        DotRows(dot, xf + t * n_in, xf + u * n_in, rf, e, n_in, &l[(t - t0) * e], &l[(u - t0) * e]);
      }
      for (int64_t t = t0; t < t1; ++t) ok[t] = Route(&l[(t - t0) * e], e, k, &sel[t * k], &gate[t * k]);
    });

    // Phase 2 (serial, O(N k + E)): group (token, coefficient) by expert, tokens ascending within an
    // expert; transpose the used experts' Bm_e to [r, out] so the up-projection reads rows.
    std::vector<int64_t> start(static_cast<size_t>(e + 1), 0);
    for (int64_t t = 0; t < n_tok; ++t) {
      if (!ok[t]) continue;
      for (int64_t s = 0; s < k; ++s) ++start[sel[t * k + s] + 1];
    }
    for (int64_t j = 0; j < e; ++j) start[j + 1] += start[j];
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    std::vector<int64_t> tok(static_cast<size_t>(start[e]));
    std::vector<float> coef(static_cast<size_t>(start[e]));
    for (int64_t t = 0; t < n_tok; ++t) {
      if (!ok[t]) continue;
      for (int64_t s = 0; s < k; ++s) {
        const int64_t j = sel[t * k + s], p = fill[j]++;
        tok[p] = t;
        coef[p] = scaling * gate[t * k + s];
      }
    }
    // Only the used experts' slices are written (and read): no zero-initialisation of the rest.
    std::unique_ptr<float[]> bt(new float[static_cast<size_t>(std::max<int64_t>(e * r * n_out, 1))]);
    bool suspect = false;  // a sign of a non-finite weight (see require_all_finite)
    for (int64_t t = 0; t < n_tok; ++t) suspect |= !ok[t];
    for (int64_t j = 0; j < e; ++j) {
      const float* bj = bf + j * n_out * r;
      if (start[j + 1] == start[j]) {  // an unselected expert is only scanned, never computed
        suspect |= !finite(af + j * r * n_in, r * n_in) || !finite(bj, n_out * r);
        continue;
      }
      suspect |= !transpose(bj, n_out, r, bt.get() + j * r * n_out);
    }

    // Phase 3 (parallel over the same token blocks): per expert, its tokens in the block, in pairs.
    const bool direct = std::is_same_v<T, float>;
    std::vector<char> u_bad(blocks, 0);  // per block: some A_e . x was not finite
    ParallelFor(ctx, blocks, [&](size_t b) {
      const int64_t t0 = static_cast<int64_t>(b) * kTokenBlock, t1 = std::min(n_tok, t0 + kTokenBlock);
      std::vector<float> scratch(direct ? 0 : static_cast<size_t>((t1 - t0) * n_out));
      float* dbase = direct ? reinterpret_cast<float*>(delta_out) + t0 * n_out : scratch.data();
      // Each token's Delta starts with its first expert's contribution (no zero-fill pass); r = 0
      // contributes nothing, so there it is zero-filled.
      if (r == 0) std::fill(dbase, dbase + (t1 - t0) * n_out, 0.0f);
      std::vector<char> seen(static_cast<size_t>(t1 - t0), r == 0 ? 1 : 0);
      bool nonfinite = false;
      std::vector<float> u0(static_cast<size_t>(std::max<int64_t>(r, 1))), u1(u0.size()), c0(u0.size()),
          c1(u0.size());
      for (int64_t j = 0; j < e; ++j) {
        const int64_t* first = tok.data() + start[j];
        const int64_t* last = tok.data() + start[j + 1];
        const int64_t p0 = std::lower_bound(first, last, t0) - tok.data();
        const int64_t p1 = std::lower_bound(first, last, t1) - tok.data();
        const float* aj = af + j * r * n_in;
        const float* btj = bt.get() + j * r * n_out;
        for (int64_t p = p0; p < p1; p += 2) {
          const int64_t q = std::min(p + 1, p1 - 1);
          const int64_t ta = tok[p], tb = tok[q];
          if (r > 0) DotRows(dot, xf + ta * n_in, xf + tb * n_in, aj, r, n_in, u0.data(), u1.data());
          for (int64_t i = 0; i < r; ++i) {
            c0[i] = coef[p] * u0[i];
            c1[i] = coef[q] * u1[i];
            // not (|u| <= FLT_MAX): NaN or +-inf (no branch)
            nonfinite |= !(std::fabs(u0[i]) <= std::numeric_limits<float>::max()) |
                         !(std::fabs(u1[i]) <= std::numeric_limits<float>::max());
          }
          axpy(btj, r, n_out, c0.data(), c1.data(), dbase + (ta - t0) * n_out, dbase + (tb - t0) * n_out,
               !seen[ta - t0], !seen[tb - t0]);
          seen[ta - t0] = seen[tb - t0] = 1;
        }
      }
      u_bad[b] = nonfinite;
      const float qnan = std::numeric_limits<float>::quiet_NaN();
      for (int64_t t = t0; t < t1; ++t) {
        float* d = dbase + (t - t0) * n_out;
        if (!ok[t]) std::fill(d, d + n_out, qnan);
        if (!direct) {
          for (int64_t o = 0; o < n_out; ++o) delta_out[t * n_out + o] = FromFloat<T>(d[o]);
        }
        for (int64_t s = 0; s < k; ++s) {
          if (experts_out != nullptr) experts_out[t * k + s] = sel[t * k + s];
          if (gates_out != nullptr) gates_out[t * k + s] = FromFloat<T>(gate[t * k + s]);
        }
      }
    });
    for (const char bad : u_bad) suspect |= bad != 0;
    if (suspect) require_all_finite();
  }
};

}  // namespace

SD_REGISTER_KERNEL(LoRAMixer, LoRAMixerKernel)

}  // namespace sd
