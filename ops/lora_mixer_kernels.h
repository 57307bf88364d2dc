// LoRAMixer's vector pieces, written once over the vector traits of ops/common/vec.h and instantiated per
// ISA translation unit (ops/lora_mixer_avx2.cc, ops/lora_mixer_avx512.cc); the portable pieces, the routing
// and the declarations are in ops/lora_mixer_tiles.h, the kernel in ops/lora_mixer.cc. What differs by ISA
// is stated by one Policy per variant: how many rows a pass of the dot tile takes (AVX-512 all 8 rows x 2
// tokens, 16 accumulators; AVX2 4 rows x 2 tokens, 8 of its 16 registers, in two passes) and the transposing
// reduction of those accumulators (the same tree for every accumulator, so equal rows give equal sums).
// Each variant gives the results its former hand-written twin gave, bit for bit: the dot tile's per-lane
// FMA chains and reduction trees are the same, and every up-projection output is the same FMA chain over
// the ranks j = 0..r-1 (-ffp-contract=off from CMakeLists.txt).
//
// Everything sits in an anonymous namespace (internal linkage: see ops/common/vec.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/vec.h"
#include "lora_mixer_tiles.h"

namespace sd {
namespace lora_mixer {
namespace {

template <class V>
struct Policy;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
template <>
struct Policy<vec::Avx512> {
  static constexpr int kPassRows = 8;
  // One load per row vector for both tokens' FMAs (gcc otherwise folds the load into each FMA: 18 loads
  // per 16 FMAs, and the loop becomes load-bound).
  static SD_VEC_INLINE void pin(__m512& v) { __asm__("" : "+v"(v)); }
  // The 16 accumulators (token 0's 8 rows, then token 1's) summed lane-wise by one transposing tree; lane
  // 4q + l of the tree holds the sum of v[4l + q], and one permute puts acc[n] in lane n, stored as two halves.
  // (maskz forms with all lanes: GCC 12's plain shuffles and unpacks warn about an uninitialised temporary in
  // its own headers; the same instructions)
  static SD_VEC_INLINE void finish(__m512 v[16], float* out0, float* out1) {
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
      z[m] = _mm512_add_ps(_mm512_maskz_unpacklo_ps(0xFFFF, y[2 * m], y[2 * m + 1]),
                           _mm512_maskz_unpackhi_ps(0xFFFF, y[2 * m], y[2 * m + 1]));
    }
    const __m512 sums = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, _mm512_castps_pd(z[0]), _mm512_castps_pd(z[1]))),
        _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, _mm512_castps_pd(z[0]), _mm512_castps_pd(z[1]))));
    const __m512i natural = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 ordered = _mm512_maskz_permutexvar_ps(0xFFFF, natural, sums);
    _mm256_storeu_ps(out0, _mm512_maskz_extractf32x8_ps(0xFF, ordered, 0));
    _mm256_storeu_ps(out1, _mm512_maskz_extractf32x8_ps(0xFF, ordered, 1));
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
template <>
struct Policy<vec::Avx2> {
  // Two tokens x 4 rows per pass (8 accumulators, 6 loads per 8 FMAs: the FMA units, not the loads, bound
  // the loop), two passes for the 8 rows of a tile (16 accumulators would not fit the 16 ymm registers).
  static constexpr int kPassRows = 4;
  static SD_VEC_INLINE void pin(__m256& v) { __asm__("" : "+x"(v)); }
  // acc = token 0's 4 rows, then token 1's; lane 4q + l of the tree holds the sum of v[2l + q].
  static SD_VEC_INLINE void finish(__m256 v[8], float* out0, float* out1) {
    __m256 w[4], y[2];
    for (int m = 0; m < 4; ++m) {  // halves: v[2m] | v[2m+1], lanes i + (i + 4)
      w[m] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * m], v[2 * m + 1], 0x20),
                           _mm256_permute2f128_ps(v[2 * m], v[2 * m + 1], 0x31));
    }
    for (int m = 0; m < 2; ++m) {
      y[m] = _mm256_add_ps(_mm256_unpacklo_ps(w[2 * m], w[2 * m + 1]), _mm256_unpackhi_ps(w[2 * m], w[2 * m + 1]));
    }
    alignas(32) float s[8];
    _mm256_store_ps(s, _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(y[0]), _mm256_castps_pd(y[1]))),
                                     _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(y[0]), _mm256_castps_pd(y[1])))));
    for (int k = 0; k < 4; ++k) {
      out0[k] = s[4 * (k % 2) + k / 2];
      out1[k] = s[4 * ((k + 4) % 2) + (k + 4) / 2];
    }
  }
};
#endif

// out_t[j] = rows[j] . x_t for 2 tokens x R rows: one accumulator per token and row, each a sequential FMA
// chain per lane over i (the last, partial vector loaded with zeros past n), then Policy::finish.
template <class V, int R>
SD_VEC_INLINE void DotPass(const float* x0, const float* x1, const float* const* rows, int64_t n, float* out0,
                           float* out1) {
  using F = typename V::F;
  constexpr int L = V::kLanes;
  F acc[2 * R];
  for (int k = 0; k < 2 * R; ++k) acc[k] = V::zero();
  auto step = [&](int64_t i, int count) SD_VEC_LAMBDA {
    const bool full = count == L;
    const F xa = full ? V::loadu(x0 + i) : V::loadu_tail(x0 + i, count);
    const F xb = full ? V::loadu(x1 + i) : V::loadu_tail(x1 + i, count);
    for (int k = 0; k < R; ++k) {
      F w = full ? V::loadu(rows[k] + i) : V::loadu_tail(rows[k] + i, count);
      Policy<V>::pin(w);
      acc[k] = V::fma(w, xa, acc[k]);
      acc[R + k] = V::fma(w, xb, acc[R + k]);
    }
  };
  int64_t i = 0;
  for (; i + L <= n; i += L) step(i, L);
  if (i < n) step(i, static_cast<int>(n - i));
  Policy<V>::finish(acc, out0, out1);
}

template <class V>
void DotTile(const float* x0, const float* x1, const float* const* rows, int64_t n, float* out0, float* out1) {
  constexpr int R = Policy<V>::kPassRows;
  for (int p = 0; p < kRows; p += R) DotPass<V, R>(x0, x1, rows + p, n, out0 + p, out1 + p);
}

// d_t += sum_j c_t[j] * BT[j, :] for 2 tokens (BT = Bm_e^T, [r, out]); fresh: d_t starts at 0. 4 vectors x 2
// tokens per step (8 accumulators; 4 BT loads and 2 coefficient broadcasts per rank), then one vector at a
// time, the last one partial: every output element gets the FMA chain j = 0..r-1 in order.
template <class V>
void Axpy(const float* bt, int64_t r, int64_t out, const float* c0, const float* c1, float* d0, float* d1,
          bool fresh0, bool fresh1) {
  using F = typename V::F;
  constexpr int L = V::kLanes;
  int64_t o = 0;
  for (; o + 4 * L <= out; o += 4 * L) {
    // Both tokens' loads before any store: d0 and d1 may be the same token (paired with itself).
    F a[8];
    for (int v = 0; v < 4; ++v) {
      a[v] = fresh0 ? V::zero() : V::loadu(d0 + o + L * v);
      a[4 + v] = fresh1 ? V::zero() : V::loadu(d1 + o + L * v);
    }
    for (int64_t j = 0; j < r; ++j) {
      const float* b = bt + j * out + o;
      F v0 = V::loadu(b), v1 = V::loadu(b + L), v2 = V::loadu(b + 2 * L), v3 = V::loadu(b + 3 * L);
      Policy<V>::pin(v0);  // one load per vector, not one per FMA
      Policy<V>::pin(v1);
      Policy<V>::pin(v2);
      Policy<V>::pin(v3);
      const F w0 = V::set1(c0[j]), w1 = V::set1(c1[j]);
      a[0] = V::fma(w0, v0, a[0]);
      a[1] = V::fma(w0, v1, a[1]);
      a[2] = V::fma(w0, v2, a[2]);
      a[3] = V::fma(w0, v3, a[3]);
      a[4] = V::fma(w1, v0, a[4]);
      a[5] = V::fma(w1, v1, a[5]);
      a[6] = V::fma(w1, v2, a[6]);
      a[7] = V::fma(w1, v3, a[7]);
    }
    for (int v = 0; v < 4; ++v) {
      V::storeu(d0 + o + L * v, a[v]);
      V::storeu(d1 + o + L * v, a[4 + v]);
    }
  }
  for (; o < out; o += L) {
    const int count = static_cast<int>(std::min<int64_t>(L, out - o));
    const bool full = count == L;
    F a0 = fresh0 ? V::zero() : full ? V::loadu(d0 + o) : V::loadu_tail(d0 + o, count);
    F a1 = fresh1 ? V::zero() : full ? V::loadu(d1 + o) : V::loadu_tail(d1 + o, count);
    for (int64_t j = 0; j < r; ++j) {
      const F b = full ? V::loadu(bt + j * out + o) : V::loadu_tail(bt + j * out + o, count);
      a0 = V::fma(V::set1(c0[j]), b, a0);
      a1 = V::fma(V::set1(c1[j]), b, a1);
    }
    if (full) {
      V::storeu(d0 + o, a0);
      V::storeu(d1 + o, a1);
    } else {
      V::storeu_tail(d0 + o, count, a0);
      V::storeu_tail(d1 + o, count, a1);
    }
  }
}

// Whether p[0, n) is all finite: not (|x| < inf) is NaN or +-inf.
template <class V>
bool AllFinite(const float* p, int64_t n) {
  constexpr int L = V::kLanes;
  const typename V::F inf = V::set1(INFINITY);
  typename V::M bad = V::none();
  int64_t i = 0;
  for (; i + L <= n; i += L) bad = V::mask_or(bad, V::nlt(V::abs(V::loadu(p + i)), inf));
  if (i < n) bad = V::mask_or(bad, V::nlt(V::abs(V::loadu_tail(p + i, static_cast<int>(n - i))), inf));  // 0 past n
  return V::bits(bad) == 0;
}

}  // namespace
}  // namespace lora_mixer
}  // namespace sd
