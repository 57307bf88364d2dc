// The compute core shared by MaxSim and SignedMaxSim (ops/max_sim.cc, ops/signed_max_sim.cc).
//
//   best[b, n, i] = max_{j valid} s(i, j),   s(i, j) = QScale[b,i] * DScale[n,j] * <Q[b,i], D[n,j]>
//   (SignedMaxSim: also j* = the lowest valid j reaching the max, and no scales)
//
// Python halves and float64 oracles: softdeploy/ops/max_sim.py, softdeploy/ops/signed_max_sim.py.
//
// How: a tiled GEMM whose C tile never leaves the registers. Q[b] is packed once per call,
// transposed, in tiles of kLanes query tokens (32 for AVX-512: two zmm; 16 for AVX2: two ymm).
// For each document and query tile the micro-kernel runs over blocks of R document tokens: for every
// k it loads the two Q vectors and broadcasts D[j, k] of the R tokens (FMA with an embedded
// broadcast), so the R x kLanes similarities of a block sit in 2R accumulators; the block then
// folds into the running max (and argmax) per query lane and is dropped. The [Lq, N * Ld] similarity
// matrix is never written. int8: the same shape with exact int32 sums -- AVX-512 VNNI vpdpbusd
// (u8 x s8, 4 k per lane) on Q + 128 (u8, packed once) times a broadcast of D (s8), minus
// 128 * sum_k D[j, k] per document token; AVX2 (and AVX-512 without VNNI) vpmaddwd on int16 pairs.
// float16 documents are widened to float32 one document at a time (F16C). The index D streams from
// DRAM for a large N: each block prefetches the next block (float) or the next document (int8).
//
// What must stay true:
//  * masked document tokens never enter the max, NaN test or argmax (their similarities are
//    computed with the block and ignored); NaN in a valid pair makes the lane NaN at the end;
//  * argmax ties -> lowest j: the update is strictly greater, blocks run in increasing j, and the
//    index starts at the first valid token (so an all -inf row picks that token);
//  * per (b, n) the sum over query tokens runs in increasing i whatever the ISA or thread count;
//  * int8 sums are exact: |sum| <= dim * 128 * 255 < 2^31 for dim < 65793 (checked by the caller).
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/kernel.h"

namespace sd {
namespace maxsim {

constexpr int64_t kMaxLanes = 32;

// 64-byte aligned storage for packed Q tiles (aligned vector loads).
template <class V>
struct AlignedAllocator {
  using value_type = V;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  V* allocate(size_t n) {
    void* ptr = ::operator new(n * sizeof(V) + 64, std::align_val_t(64));
    return static_cast<V*>(ptr);
  }
  void deallocate(V* ptr, size_t) { ::operator delete(ptr, std::align_val_t(64)); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const AlignedAllocator<U>&) const { return false; }
};  // query tokens per tile (AVX-512); AVX2 uses 16, portable 1

// The whole problem, element type erased. Q/D data are float32 or int8 here (float16 widened).
struct Problem {
  int64_t B = 0, Lq = 0, N = 0, Ld = 0, dim = 0;
  const bool* q_mask = nullptr;   // [B, Lq] or null (all valid)
  const bool* d_mask = nullptr;   // [N, Ld] or null
  const float* q_scale = nullptr; // [B, Lq] or null (1)
  const float* d_scale = nullptr; // [N, Ld] or null (1)
  const float* q_sign = nullptr;  // [B, Lq], SignedMaxSim only
  const float* d_sign = nullptr;  // [N, Ld], SignedMaxSim only
  bool signed_max = false;
};

// The contract checks MaxSim and SignedMaxSim share: Q [B, Lq, dim] and D [N, Ld, dim] -> the
// problem's sizes. Messages name the op, the value and the rule.
template <class T>
Problem ProblemOf(const char* op, const Input<T>& q, const Input<T>& d) {
  if (q.rank() != 3) Fail(op, "Q must have rank 3 [B, Lq, dim], got shape ", ShapeStr(q.shape));
  if (d.rank() != 3) Fail(op, "D must have rank 3 [N, Ld, dim], got shape ", ShapeStr(d.shape));
  Problem p;
  p.B = q.shape[0], p.Lq = q.shape[1], p.dim = q.shape[2];
  p.N = d.shape[0], p.Ld = d.shape[1];
  if (d.shape[2] != p.dim) {
    Fail(op, "Q has dim ", p.dim, " but D has dim ", d.shape[2], " (rule: Q and D share the last dimension)");
  }
  return p;
}

// A per-token side input (mask, scale, sign) present with the wrong shape -> contract error.
template <class V>
void CheckSide(const char* op, const Input<V>& x, const char* port, int64_t rows, int64_t cols, const char* dims) {
  if (x.present && x.shape != std::vector<int64_t>{rows, cols}) {
    Fail(op, port, " has shape ", ShapeStr(x.shape), ", expected ", dims, " = [", rows, ", ", cols, "]");
  }
}

// Result of one (query tile, document): per lane the running max (value), the index of the max,
// and whether a valid pair was NaN.
struct TileResult {
  alignas(64) float best[kMaxLanes];
  alignas(64) int32_t idx[kMaxLanes];
  alignas(64) uint8_t nan[kMaxLanes];
};

// Per-document facts the micro-kernels need.
struct Doc {
  const void* data;        // [Ld, dim] float32 or int8
  const uint8_t* valid;    // [Ld] 1 = valid
  const float* scale;      // [Ld] or null
  int64_t first_valid;     // -1: no valid token
  int64_t stride = 0;      // elements from this document to the next (prefetch distance)
};

// Folds the per-lane results of one tile into the scores of (b, n): increasing i.
inline float SumTile(const Problem& p, const TileResult& r, int64_t b, int64_t n, int64_t i0, int64_t lanes,
                     float sum) {
  for (int64_t l = 0; l < lanes; ++l) {
    const int64_t i = i0 + l;
    if (p.q_mask != nullptr && !p.q_mask[b * p.Lq + i]) continue;
    float c;
    if (r.nan[l]) {
      c = std::numeric_limits<float>::quiet_NaN();
    } else if (p.signed_max) {
      c = p.q_sign[b * p.Lq + i] * p.d_sign[n * p.Ld + r.idx[l]] * r.best[l];
    } else {
      c = r.best[l];
    }
    sum += c;
  }
  return sum;
}

// ================================================================================================
// Portable: one query token at a time.

template <class E>
void TilePortable(const Problem& p, const E* q /*[dim]*/, float q_scale, const Doc& doc, TileResult* r) {
  float best = -std::numeric_limits<float>::infinity();
  int32_t idx = static_cast<int32_t>(doc.first_valid);
  bool nan = false;
  const E* d = static_cast<const E*>(doc.data);
  for (int64_t j = 0; j < p.Ld; ++j) {
    if (!doc.valid[j]) continue;
    float s;
    if constexpr (std::is_same_v<E, int8_t>) {
      int32_t acc = 0;
      for (int64_t k = 0; k < p.dim; ++k) acc += int32_t{q[k]} * int32_t{d[j * p.dim + k]};
      s = static_cast<float>(acc);
    } else {
      s = 0.0f;
      for (int64_t k = 0; k < p.dim; ++k) s += q[k] * d[j * p.dim + k];
    }
    if (doc.scale != nullptr) s *= doc.scale[j];
    s *= q_scale;
    if (std::isnan(s)) nan = true;
    if (s > best) {
      best = s;
      idx = static_cast<int32_t>(j);
    }
  }
  r->best[0] = best;
  r->idx[0] = idx;
  r->nan[0] = nan;
}

// ================================================================================================
// AVX-512 float32: tile = 32 query tokens (two zmm), blocks of R document tokens.

// Packs Q[b] (float32 [Lq, dim]) into tiles [tiles][dim][lanes], zero-padded past Lq.
template <int kLanes>
inline void PackQFloat(const float* q, int64_t Lq, int64_t dim, float* out) {
  const int64_t tiles = (Lq + kLanes - 1) / kLanes;
  // No memset of nothing: with Lq or dim 0, out is an empty vector's data(), null (UB for memset,
  // reported by the UBSan build of .ci/run's sanitizer stage).
  if (tiles * dim == 0) return;
  std::memset(out, 0, sizeof(float) * tiles * dim * kLanes);
  for (int64_t i = 0; i < Lq; ++i) {
    float* tile = out + (i / kLanes) * dim * kLanes + (i % kLanes);
    for (int64_t k = 0; k < dim; ++k) tile[k * kLanes] = q[i * dim + k];
  }
}

// Scales a block's similarities and folds them into the running (best, idx, nan) of two vectors.
#define SD_MAXSIM_FOLD(ACC, VEC, SET1F, SET1I, MUL, CMPNAN, CMPGT, BLENDF, BLENDI, MAXF)                \
  for (int r = 0; r < R; ++r) {                                                                 \
    const int64_t j = j0 + r;                                                                   \
    if (!doc.valid[j]) continue;                                                                \
    for (int h = 0; h < 2; ++h) {                                                               \
      VEC s = ACC[r][h];                                                                        \
      if (doc.scale != nullptr) s = MUL(s, SET1F(doc.scale[j]));                                \
      if (has_qscale) s = MUL(s, qscale[h]);                                                    \
      nan[h] = CMPNAN(nan[h], s);                                                               \
      if constexpr (kArg) {                                                                     \
        auto gt = CMPGT(s, best[h]);                                                            \
        best[h] = BLENDF(gt, best[h], s);                                                       \
        idx[h] = BLENDI(gt, idx[h], SET1I(static_cast<int32_t>(j)));                            \
      } else {                                                                                  \
        best[h] = MAXF(best[h], s);                                                             \
      }                                                                                         \
    }                                                                                           \
  }

struct Avx512State {
  __m512 best[2];
  __m512i idx[2];
  __mmask16 nan[2];
  __m512 qscale[2];
  bool has_qscale;
};

SD_TARGET_AVX512 inline __mmask16 NanOr512(__mmask16 m, __m512 s) {
  return static_cast<__mmask16>(m | _mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q));
}
SD_TARGET_AVX512 inline __mmask16 Gt512(__m512 a, __m512 b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
SD_TARGET_AVX512 inline __m512 BlendF512(__mmask16 m, __m512 a, __m512 b) { return _mm512_mask_blend_ps(m, a, b); }
SD_TARGET_AVX512 inline __m512i BlendI512(__mmask16 m, __m512i a, __m512i b) { return _mm512_mask_blend_epi32(m, a, b); }

template <int R, bool kArg>
SD_TARGET_AVX512 __attribute__((always_inline)) inline void BlockF32Avx512(const float* qp, const float* d, int64_t dim,
                                                                            int64_t j0, const Doc& doc, Avx512State& st) {
  __m512 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const float* drow = d + j0 * dim;
  // The next block (8 * dim floats, contiguous; past the last block it is the next document) is
  // pulled into the cache while this one computes: hardware prefetchers lose the 8 strided row
  // streams, and D comes from DRAM for a large index (one thread, N = 3000: 59 -> 108 GFLOP/s).
  const char* next = reinterpret_cast<const char*>(drow + R * dim);
  for (int64_t k = 0; k < dim; ++k) {
    _mm_prefetch(next + k * 32, _MM_HINT_T0);
    const __m512 q0 = _mm512_load_ps(qp + k * 32), q1 = _mm512_load_ps(qp + k * 32 + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(drow[r * dim + k]);
      acc[r][0] = _mm512_fmadd_ps(q0, b, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(q1, b, acc[r][1]);
    }
  }
  __m512* best = st.best;
  __m512i* idx = st.idx;
  __mmask16* nan = st.nan;
  const __m512* qscale = st.qscale;
  const bool has_qscale = st.has_qscale;
  SD_MAXSIM_FOLD(acc, __m512, _mm512_set1_ps, _mm512_set1_epi32, _mm512_mul_ps, NanOr512, Gt512, BlendF512, BlendI512,
                 _mm512_max_ps)
}

// acc += u8(a) . s8(broadcast of *b) per 4-byte group: vpdpbusd with an embedded {1to16} broadcast.
// Inline asm on named accumulators (BlockI8Vnni8): GCC 12 compiles _mm512_dpbusd_epi32 on an
// accumulator array in this loop into ~16 extra register copies and spills per 16 vpdpbusd
// (one thread, hot document: 335 -> 360 GOP/s).
#define SD_DPBUSD_BCST(acc, a, b) \
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*reinterpret_cast<const int32_t*>(b)))

// int8 with VNNI: qp is [dim4][32 lanes][4 bytes] of Q + 128 (u8), the broadcast operand is D (s8):
// vpdpbusd sums (q + 128) * d exactly, and dsum128[j] = 128 * sum_k D[j, k] is subtracted per token.
template <int R, bool kArg>
SD_TARGET_AVX512 __attribute__((target("avx512vnni"), always_inline)) inline void BlockI8VnniN(
    const uint8_t* qp, const int32_t* dsum128, const int8_t* d, int64_t dim, int64_t j0, const Doc& doc,
    Avx512State& st) {
  __m512i acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
  const int8_t* drow = d + j0 * dim;
  const int64_t full = dim / 4;
  const char* next = reinterpret_cast<const char*>(drow + R * dim);  // next block: see BlockF32Avx512
  for (int64_t k4 = 0; k4 < full; ++k4) {
    _mm_prefetch(next + k4 * 32, _MM_HINT_T0);
    const __m512i q0 = _mm512_load_si512(qp + k4 * 128), q1 = _mm512_load_si512(qp + k4 * 128 + 64);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t w;
      std::memcpy(&w, drow + r * dim + k4 * 4, 4);
      const __m512i b = _mm512_set1_epi32(w);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], q0, b);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], q1, b);
    }
  }
  if (full * 4 < dim) {  // last 1..3 k: the missing D bytes read as 0
    const __m512i q0 = _mm512_load_si512(qp + full * 128), q1 = _mm512_load_si512(qp + full * 128 + 64);
    for (int r = 0; r < R; ++r) {
      int32_t w = 0;
      std::memcpy(&w, drow + r * dim + full * 4, static_cast<size_t>(dim - full * 4));
      const __m512i b = _mm512_set1_epi32(w);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], q0, b);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], q1, b);
    }
  }
  __m512 facc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512i c = _mm512_set1_epi32(dsum128[j0 + r]);
    facc[r][0] = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][0], c));
    facc[r][1] = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][1], c));
  }
  __m512* best = st.best;
  __m512i* idx = st.idx;
  __mmask16* nan = st.nan;
  const __m512* qscale = st.qscale;
  const bool has_qscale = st.has_qscale;
  SD_MAXSIM_FOLD(facc, __m512, _mm512_set1_ps, _mm512_set1_epi32, _mm512_mul_ps, NanOr512, Gt512, BlendF512, BlendI512,
                 _mm512_max_ps)
}

// The main 8-token block of the VNNI path with 16 named accumulators (see SD_DPBUSD_BCST). The
// accumulators start at -128 * sum_k D[j, k], which removes the bias of the u8 side.
template <bool kArg>
SD_TARGET_AVX512 __attribute__((target("avx512vnni"), always_inline)) inline void BlockI8Vnni8(
    const uint8_t* qp, const int32_t* dsum128, const int8_t* d, int64_t dim, int64_t j0, const Doc& doc,
    Avx512State& st) {
#define SD_INIT(r) __m512i a##r##0 = _mm512_set1_epi32(-dsum128[j0 + r]), a##r##1 = a##r##0;
  SD_INIT(0) SD_INIT(1) SD_INIT(2) SD_INIT(3) SD_INIT(4) SD_INIT(5) SD_INIT(6) SD_INIT(7)
#undef SD_INIT
  const int8_t* drow = d + j0 * dim;
  const int64_t full = dim / 4;
  // The same block of the NEXT document goes to L2 (the index streams from DRAM; int8 computes fast
  // enough that one block of lookahead leaves it latency-bound), and DocSums128 of the next document
  // then finds it there. Past the last document the address is harmless: prefetches never fault.
  const char* next = reinterpret_cast<const char*>(drow + doc.stride);
  for (int64_t k4 = 0; k4 < full; ++k4) {
    _mm_prefetch(next + k4 * 32, _MM_HINT_T1);
    const __m512i q0 = _mm512_load_si512(qp + k4 * 128), q1 = _mm512_load_si512(qp + k4 * 128 + 64);
    const int8_t* b = drow + k4 * 4;
#define SD_STEP(r)                             \
  SD_DPBUSD_BCST(a##r##0, q0, b + (r) * dim); \
  SD_DPBUSD_BCST(a##r##1, q1, b + (r) * dim);
    SD_STEP(0) SD_STEP(1) SD_STEP(2) SD_STEP(3) SD_STEP(4) SD_STEP(5) SD_STEP(6) SD_STEP(7)
#undef SD_STEP
  }
  if (full * 4 < dim) {  // last 1..3 k: the missing D bytes read as 0
    const __m512i q0 = _mm512_load_si512(qp + full * 128), q1 = _mm512_load_si512(qp + full * 128 + 64);
#define SD_TAIL(r)                                                                          \
  {                                                                                         \
    int32_t w = 0;                                                                          \
    std::memcpy(&w, drow + (r) * dim + full * 4, static_cast<size_t>(dim - full * 4));       \
    SD_DPBUSD_BCST(a##r##0, q0, reinterpret_cast<const int8_t*>(&w));                       \
    SD_DPBUSD_BCST(a##r##1, q1, reinterpret_cast<const int8_t*>(&w));                       \
  }
    SD_TAIL(0) SD_TAIL(1) SD_TAIL(2) SD_TAIL(3) SD_TAIL(4) SD_TAIL(5) SD_TAIL(6) SD_TAIL(7)
#undef SD_TAIL
  }
  constexpr int R = 8;
  const __m512 facc[R][2] = {
      {_mm512_cvtepi32_ps(a00), _mm512_cvtepi32_ps(a01)}, {_mm512_cvtepi32_ps(a10), _mm512_cvtepi32_ps(a11)},
      {_mm512_cvtepi32_ps(a20), _mm512_cvtepi32_ps(a21)}, {_mm512_cvtepi32_ps(a30), _mm512_cvtepi32_ps(a31)},
      {_mm512_cvtepi32_ps(a40), _mm512_cvtepi32_ps(a41)}, {_mm512_cvtepi32_ps(a50), _mm512_cvtepi32_ps(a51)},
      {_mm512_cvtepi32_ps(a60), _mm512_cvtepi32_ps(a61)}, {_mm512_cvtepi32_ps(a70), _mm512_cvtepi32_ps(a71)}};
  __m512* best = st.best;
  __m512i* idx = st.idx;
  __mmask16* nan = st.nan;
  const __m512* qscale = st.qscale;
  const bool has_qscale = st.has_qscale;
  SD_MAXSIM_FOLD(facc, __m512, _mm512_set1_ps, _mm512_set1_epi32, _mm512_mul_ps, NanOr512, Gt512, BlendF512, BlendI512,
                 _mm512_max_ps)
}

// Full 8-token blocks take the named-register kernel, the last Ld % 8 tokens the generic one.
template <int R, bool kArg>
SD_TARGET_AVX512 __attribute__((target("avx512vnni"), always_inline)) inline void BlockI8Vnni(
    const uint8_t* qp, const int32_t* dsum128, const int8_t* d, int64_t dim, int64_t j0, const Doc& doc,
    Avx512State& st) {
  if constexpr (R == 8) BlockI8Vnni8<kArg>(qp, dsum128, d, dim, j0, doc, st);
  else BlockI8VnniN<R, kArg>(qp, dsum128, d, dim, j0, doc, st);
}

// ================================================================================================
// AVX2: tile = 16 query tokens (two ymm).

struct Avx2State {
  __m256 best[2];
  __m256i idx[2];
  __m256 nan[2];  // all-ones lanes where a valid pair was NaN
  __m256 qscale[2];
  bool has_qscale;
};

SD_TARGET_AVX2 inline __m256 NanOr256(__m256 m, __m256 s) { return _mm256_or_ps(m, _mm256_cmp_ps(s, s, _CMP_UNORD_Q)); }
SD_TARGET_AVX2 inline __m256 Gt256(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
SD_TARGET_AVX2 inline __m256 BlendF256(__m256 m, __m256 a, __m256 b) { return _mm256_blendv_ps(a, b, m); }
SD_TARGET_AVX2 inline __m256i BlendI256(__m256 m, __m256i a, __m256i b) {
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), m));
}

template <int R, bool kArg>
SD_TARGET_AVX2 __attribute__((always_inline)) inline void BlockF32Avx2(const float* qp, const float* d, int64_t dim,
                                                                        int64_t j0, const Doc& doc, Avx2State& st) {
  __m256 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const float* drow = d + j0 * dim;
  const char* next = reinterpret_cast<const char*>(drow + R * dim);  // next block: see BlockF32Avx512
  for (int64_t k = 0; k < dim; ++k) {
    _mm_prefetch(next + k * 32, _MM_HINT_T0);
    const __m256 q0 = _mm256_load_ps(qp + k * 16), q1 = _mm256_load_ps(qp + k * 16 + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(drow + r * dim + k);
      acc[r][0] = _mm256_fmadd_ps(q0, b, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(q1, b, acc[r][1]);
    }
  }
  __m256* best = st.best;
  __m256i* idx = st.idx;
  __m256* nan = st.nan;
  const __m256* qscale = st.qscale;
  const bool has_qscale = st.has_qscale;
  SD_MAXSIM_FOLD(acc, __m256, _mm256_set1_ps, _mm256_set1_epi32, _mm256_mul_ps, NanOr256, Gt256, BlendF256, BlendI256,
                 _mm256_max_ps)
}

// int8 without VNNI: qp is [dim2][16 lanes][2 int16]; vpmaddwd sums two exact int16 products.
template <int R, bool kArg>
SD_TARGET_AVX2 __attribute__((always_inline)) inline void BlockI8Avx2(const int16_t* qp, const int8_t* d, int64_t dim,
                                                                       int64_t j0, const Doc& doc, Avx2State& st) {
  __m256i acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const int8_t* drow = d + j0 * dim;
  const int64_t pairs = (dim + 1) / 2;
  for (int64_t k2 = 0; k2 < pairs; ++k2) {
    const __m256i q0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(qp + k2 * 32));
    const __m256i q1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(qp + k2 * 32 + 16));
    const int64_t k = 2 * k2;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int8_t* dd = drow + r * dim + k;
      const int32_t lo = static_cast<uint16_t>(static_cast<int16_t>(dd[0]));
      const int32_t hi = k + 1 < dim ? static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(static_cast<int16_t>(dd[1]))) << 16) : 0;
      const __m256i b = _mm256_set1_epi32(lo | hi);
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(q0, b));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(q1, b));
    }
  }
  __m256 facc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    facc[r][0] = _mm256_cvtepi32_ps(acc[r][0]);
    facc[r][1] = _mm256_cvtepi32_ps(acc[r][1]);
  }
  __m256* best = st.best;
  __m256i* idx = st.idx;
  __m256* nan = st.nan;
  const __m256* qscale = st.qscale;
  const bool has_qscale = st.has_qscale;
  SD_MAXSIM_FOLD(facc, __m256, _mm256_set1_ps, _mm256_set1_epi32, _mm256_mul_ps, NanOr256, Gt256, BlendF256, BlendI256,
                 _mm256_max_ps)
}

#undef SD_MAXSIM_FOLD

// ================================================================================================
// Tiles: run the blocks over one document for one query tile and store the per-lane result.

#define SD_MAXSIM_BLOCKS(BLOCK, ...)                                  \
  int64_t j = 0;                                                      \
  for (; j + 8 <= p.Ld; j += 8) BLOCK<8, kArg>(__VA_ARGS__, j, doc, st); \
  switch (p.Ld - j) {                                                 \
    case 7: BLOCK<7, kArg>(__VA_ARGS__, j, doc, st); break;            \
    case 6: BLOCK<6, kArg>(__VA_ARGS__, j, doc, st); break;            \
    case 5: BLOCK<5, kArg>(__VA_ARGS__, j, doc, st); break;            \
    case 4: BLOCK<4, kArg>(__VA_ARGS__, j, doc, st); break;            \
    case 3: BLOCK<3, kArg>(__VA_ARGS__, j, doc, st); break;            \
    case 2: BLOCK<2, kArg>(__VA_ARGS__, j, doc, st); break;            \
    case 1: BLOCK<1, kArg>(__VA_ARGS__, j, doc, st); break;            \
    default: break;                                                   \
  }

SD_TARGET_AVX512 inline void InitState(Avx512State& st, const Doc& doc, const float* qscale) {
  st.best[0] = st.best[1] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  st.idx[0] = st.idx[1] = _mm512_set1_epi32(static_cast<int32_t>(doc.first_valid));
  st.nan[0] = st.nan[1] = 0;
  st.has_qscale = qscale != nullptr;
  st.qscale[0] = st.has_qscale ? _mm512_loadu_ps(qscale) : _mm512_set1_ps(1.0f);
  st.qscale[1] = st.has_qscale ? _mm512_loadu_ps(qscale + 16) : _mm512_set1_ps(1.0f);
}
SD_TARGET_AVX512 inline void StoreState(const Avx512State& st, TileResult* out) {
  for (int h = 0; h < 2; ++h) {
    _mm512_store_ps(out->best + 16 * h, st.best[h]);
    _mm512_store_si512(out->idx + 16 * h, st.idx[h]);
    for (int l = 0; l < 16; ++l) out->nan[16 * h + l] = (st.nan[h] >> l) & 1;
  }
}

template <bool kArg>
SD_TARGET_AVX512 void TileF32Avx512(const Problem& p, const float* qp, const float* qscale, const Doc& doc,
                                    TileResult* out) {
  Avx512State st;
  InitState(st, doc, qscale);
  const float* d = static_cast<const float*>(doc.data);
  SD_MAXSIM_BLOCKS(BlockF32Avx512, qp, d, p.dim)
  StoreState(st, out);
}

template <bool kArg>
SD_TARGET_AVX512 __attribute__((target("avx512vnni"))) void TileI8Vnni(const Problem& p, const uint8_t* qp,
                                                                        const int32_t* dsum128, const float* qscale,
                                                                        const Doc& doc, TileResult* out) {
  Avx512State st;
  InitState(st, doc, qscale);
  const int8_t* d = static_cast<const int8_t*>(doc.data);
  SD_MAXSIM_BLOCKS(BlockI8Vnni, qp, dsum128, d, p.dim)
  StoreState(st, out);
}

SD_TARGET_AVX2 inline void InitState(Avx2State& st, const Doc& doc, const float* qscale) {
  st.best[0] = st.best[1] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  st.idx[0] = st.idx[1] = _mm256_set1_epi32(static_cast<int32_t>(doc.first_valid));
  st.nan[0] = st.nan[1] = _mm256_setzero_ps();
  st.has_qscale = qscale != nullptr;
  st.qscale[0] = st.has_qscale ? _mm256_loadu_ps(qscale) : _mm256_set1_ps(1.0f);
  st.qscale[1] = st.has_qscale ? _mm256_loadu_ps(qscale + 8) : _mm256_set1_ps(1.0f);
}
SD_TARGET_AVX2 inline void StoreState(const Avx2State& st, TileResult* out) {
  for (int h = 0; h < 2; ++h) {
    _mm256_storeu_ps(out->best + 8 * h, st.best[h]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out->idx + 8 * h), st.idx[h]);
    const int bits = _mm256_movemask_ps(st.nan[h]);
    for (int l = 0; l < 8; ++l) out->nan[8 * h + l] = (bits >> l) & 1;
  }
}

template <bool kArg>
SD_TARGET_AVX2 void TileF32Avx2(const Problem& p, const float* qp, const float* qscale, const Doc& doc,
                                TileResult* out) {
  Avx2State st;
  InitState(st, doc, qscale);
  const float* d = static_cast<const float*>(doc.data);
  SD_MAXSIM_BLOCKS(BlockF32Avx2, qp, d, p.dim)
  StoreState(st, out);
}

template <bool kArg>
SD_TARGET_AVX2 void TileI8Avx2(const Problem& p, const int16_t* qp, const float* qscale, const Doc& doc,
                               TileResult* out) {
  Avx2State st;
  InitState(st, doc, qscale);
  const int8_t* d = static_cast<const int8_t*>(doc.data);
  SD_MAXSIM_BLOCKS(BlockI8Avx2, qp, d, p.dim)
  StoreState(st, out);
}

#undef SD_MAXSIM_BLOCKS

// float16 -> float32, n elements.
SD_TARGET_AVX2 __attribute__((target("f16c"))) inline void WidenF16C(const Ort::Float16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  }
  for (; i < n; ++i) y[i] = x[i].ToFloat();
}

// Sums of the 16 int32 lanes of each of v[0..15], as one vector (lane r = sum of v[r]).
SD_TARGET_AVX512 inline __m512i HorizontalSums16(const __m512i* v) {
  __m512i c[4];
  for (int g = 0; g < 4; ++g) {
    const __m512i* w = v + 4 * g;
    const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(w[0], w[1]), _mm512_unpackhi_epi32(w[0], w[1]));
    const __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(w[2], w[3]), _mm512_unpackhi_epi32(w[2], w[3]));
    c[g] = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));  // per 128-bit lane: w0..w3
  }
  const __m512i u01 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[0], c[1], 0x44), _mm512_shuffle_i32x4(c[0], c[1], 0xEE));
  const __m512i u23 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[2], c[3], 0x44), _mm512_shuffle_i32x4(c[2], c[3], 0xEE));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(u01, u23, 0x88), _mm512_shuffle_i32x4(u01, u23, 0xDD));
}

// out[j] = 128 * sum_k d[j, k] (the bias of the u8 side of vpdpbusd), exact in int32. Sixteen rows at
// a time (vpdpbusd against 0x01 bytes, then one horizontal-sum tree): this runs once per document
// and call, and a per-row reduction cost 14% of the int8 kernel.
SD_TARGET_AVX512 __attribute__((target("avx512vnni"))) inline void DocSums128(const int8_t* d, int64_t Ld, int64_t dim,
                                                                             int32_t* out) {
  const __m512i ones = _mm512_set1_epi8(1);
  const int64_t tail = dim % 64;
  const __mmask64 tail_mask = tail == 0 ? 0 : (~0ull >> (64 - tail));
  int64_t j = 0;
  for (; j + 16 <= Ld; j += 16) {
    __m512i acc[16];
    for (int r = 0; r < 16; ++r) {
      const int8_t* row = d + (j + r) * dim;
      __m512i a = _mm512_setzero_si512();
      int64_t k = 0;
      for (; k + 64 <= dim; k += 64) a = _mm512_dpbusd_epi32(a, ones, _mm512_loadu_si512(row + k));
      if (tail != 0) a = _mm512_dpbusd_epi32(a, ones, _mm512_maskz_loadu_epi8(tail_mask, row + k));
      acc[r] = a;
    }
    _mm512_storeu_si512(out + j, _mm512_slli_epi32(HorizontalSums16(acc), 7));
  }
  for (; j < Ld; ++j) {
    int32_t sum = 0;
    for (int64_t k = 0; k < dim; ++k) sum += d[j * dim + k];
    out[j] = 128 * sum;
  }
}

inline bool HasVnni() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
}
inline bool HasF16c() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c");
}

// ================================================================================================
// The driver: packs Q, splits documents over onnxruntime's pool, writes Scores [B, N].

enum class Path { kPortable, kAvx2, kAvx512, kAvx512Vnni };

inline Path ChoosePath(Isa isa, bool int8) {
  if (isa == Isa::kAvx512) return int8 ? (HasVnni() ? Path::kAvx512Vnni : Path::kAvx2) : Path::kAvx512;
  if (isa == Isa::kAvx2) return Path::kAvx2;
  return Path::kPortable;
}

inline int64_t LanesOf(Path path) {
  switch (path) {
    case Path::kAvx512:
    case Path::kAvx512Vnni: return 32;
    case Path::kAvx2: return 16;
    default: return 1;
  }
}

// T: float, Ort::Float16_t or int8_t. `scores` is [B, N]. Validation is the caller's, done before.
template <class T>
void Run(Ort::KernelContext& ctx, const Problem& p, const T* q, const T* d, Isa isa, float* scores) {
  constexpr bool kInt8 = std::is_same_v<T, int8_t>;
  constexpr bool kHalf = std::is_same_v<T, Ort::Float16_t>;
  using E = std::conditional_t<kInt8, int8_t, float>;  // element type the tiles read
  if (p.B == 0 || p.N == 0) return;
  const Path path = ChoosePath(isa, kInt8);
  const int64_t lanes = LanesOf(path);
  const int64_t tiles = (p.Lq + lanes - 1) / lanes;
  const bool half_simd = kHalf && path != Path::kPortable && HasF16c();

  // Q as E [B, Lq, dim] (float16 widened once).
  std::vector<float> q_wide;
  const E* qe;
  if constexpr (kHalf) {
    q_wide.resize(static_cast<size_t>(p.B * p.Lq * p.dim));
    for (size_t i = 0; i < q_wide.size(); ++i) q_wide[i] = q[i].ToFloat();
    qe = q_wide.data();
  } else {
    qe = q;
  }

  // Packed Q tiles per batch row + per-lane scales (padded with 1) and int8 corrections.
  const int64_t dim4 = (p.dim + 3) / 4, dim2 = (p.dim + 1) / 2;
  int64_t tile_elems = 0;  // elements of one packed tile
  if (path == Path::kAvx512 || path == Path::kAvx2) tile_elems = kInt8 ? dim2 * 2 * lanes : p.dim * lanes;
  if (path == Path::kAvx512Vnni) tile_elems = dim4 * 4 * lanes;
  std::vector<float, AlignedAllocator<float>> qf;
  std::vector<int16_t, AlignedAllocator<int16_t>> q16;
  std::vector<uint8_t, AlignedAllocator<uint8_t>> q8;
  const size_t packs = static_cast<size_t>(p.B * tiles);
  if constexpr (!kInt8) {
    if (path != Path::kPortable) {
      qf.resize(packs * tile_elems);
      for (int64_t b = 0; b < p.B; ++b) {
        if (lanes == 32) PackQFloat<32>(qe + b * p.Lq * p.dim, p.Lq, p.dim, qf.data() + b * tiles * tile_elems);
        else PackQFloat<16>(qe + b * p.Lq * p.dim, p.Lq, p.dim, qf.data() + b * tiles * tile_elems);
      }
    }
  } else if (path == Path::kAvx512Vnni) {
    q8.assign(packs * tile_elems, 0);
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t i = 0; i < p.Lq; ++i) {
        const int64_t t = i / lanes, l = i % lanes;
        uint8_t* tile = q8.data() + (b * tiles + t) * tile_elems;
        for (int64_t k = 0; k < p.dim; ++k) {
          tile[(k / 4) * lanes * 4 + l * 4 + k % 4] = static_cast<uint8_t>(qe[(b * p.Lq + i) * p.dim + k] + 128);
        }
      }
    }
  } else if (path == Path::kAvx2) {
    q16.assign(packs * tile_elems, 0);
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t i = 0; i < p.Lq; ++i) {
        const int64_t t = i / lanes, l = i % lanes;
        int16_t* tile = q16.data() + (b * tiles + t) * tile_elems;
        for (int64_t k = 0; k < p.dim; ++k) tile[(k / 2) * lanes * 2 + l * 2 + k % 2] = qe[(b * p.Lq + i) * p.dim + k];
      }
    }
  }
  std::vector<float> qscale_lanes;
  if (p.q_scale != nullptr) {
    qscale_lanes.assign(packs * lanes, 1.0f);
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t i = 0; i < p.Lq; ++i) qscale_lanes[(b * tiles) * lanes + i] = p.q_scale[b * p.Lq + i];
  }

  const size_t tasks = NumTasks(p.N, p.B * p.Lq * p.Ld * std::max<int64_t>(p.dim, 1));
  const int64_t doc_elems = p.Ld * p.dim;
  std::vector<float> d_wide(kHalf ? tasks * static_cast<size_t>(doc_elems) : 0);
  std::vector<uint8_t> valid(tasks * static_cast<size_t>(p.Ld));
  std::vector<int32_t> dsum128(path == Path::kAvx512Vnni ? tasks * static_cast<size_t>(p.Ld) : 0);

  ParallelFor(ctx, tasks, [&](size_t task) {
    int64_t n0, n1;
    TaskRange(task, tasks, p.N, &n0, &n1);
    uint8_t* v = valid.data() + task * p.Ld;
    TileResult res;
    for (int64_t n = n0; n < n1; ++n) {
      Doc doc;
      doc.first_valid = -1;
      for (int64_t j = 0; j < p.Ld; ++j) {
        v[j] = p.d_mask == nullptr || p.d_mask[n * p.Ld + j];
        if (v[j] && doc.first_valid < 0) doc.first_valid = j;
      }
      if (doc.first_valid < 0) {  // no valid token: 0 for every query token
        for (int64_t b = 0; b < p.B; ++b) scores[b * p.N + n] = 0.0f;
        continue;
      }
      doc.valid = v;
      doc.stride = doc_elems;
      doc.scale = p.d_scale == nullptr ? nullptr : p.d_scale + n * p.Ld;
      if constexpr (kHalf) {
        float* w = d_wide.data() + task * doc_elems;
        const Ort::Float16_t* src = d + n * doc_elems;
        if (half_simd) WidenF16C(src, w, doc_elems);
        else for (int64_t i = 0; i < doc_elems; ++i) w[i] = src[i].ToFloat();
        doc.data = w;
      } else {
        doc.data = d + n * doc_elems;
      }
      if constexpr (kInt8) {
        if (path == Path::kAvx512Vnni) DocSums128(d + n * doc_elems, p.Ld, p.dim, dsum128.data() + task * p.Ld);
      }
      for (int64_t b = 0; b < p.B; ++b) {
        float sum = 0.0f;
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t i0 = t * lanes, count = std::min(lanes, p.Lq - i0);
          const float* qs = p.q_scale == nullptr ? nullptr : qscale_lanes.data() + (b * tiles + t) * lanes;
          const size_t pack = static_cast<size_t>(b * tiles + t);
          switch (path) {
            case Path::kAvx512:
              if constexpr (!kInt8) {
                if (p.signed_max) TileF32Avx512<true>(p, qf.data() + pack * tile_elems, qs, doc, &res);
                else TileF32Avx512<false>(p, qf.data() + pack * tile_elems, qs, doc, &res);
              }
              break;
            case Path::kAvx512Vnni:
              if constexpr (kInt8) {
                TileI8Vnni<false>(p, q8.data() + pack * tile_elems, dsum128.data() + task * p.Ld, qs, doc, &res);
              }
              break;
            case Path::kAvx2:
              if constexpr (kInt8) {
                TileI8Avx2<false>(p, q16.data() + pack * tile_elems, qs, doc, &res);
              } else {
                if (p.signed_max) TileF32Avx2<true>(p, qf.data() + pack * tile_elems, qs, doc, &res);
                else TileF32Avx2<false>(p, qf.data() + pack * tile_elems, qs, doc, &res);
              }
              break;
            default:
              TilePortable<E>(p, qe + (b * p.Lq + i0) * p.dim, qs == nullptr ? 1.0f : qs[0], doc, &res);
          }
          sum = SumTile(p, res, b, n, i0, count, sum);
        }
        scores[b * p.N + n] = sum;
      }
    }
  });
}

}  // namespace maxsim
}  // namespace sd
