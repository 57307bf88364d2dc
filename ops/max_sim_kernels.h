// The MaxSim / SignedMaxSim micro-kernels, written once over the vector traits of ops/common/vec.h
// and instantiated by each ISA translation unit (ops/max_sim_avx2.cc, ops/max_sim_avx512.cc).
//
// float32: a tile of 2 * V::kLanes query tokens (two vectors of packed Q) against blocks of
// R = V::kBlockF32 document tokens: for every k the two Q vectors are loaded once and D[j, k] of the
// R tokens is broadcast, so the R x tile similarities of a block sit in 2R accumulators (AVX-512:
// 32 lanes x 8 tokens = 16 zmm; AVX2: 16 lanes x 6 tokens = 12 ymm + 2 Q + 1 broadcast = 15 of 16
// ymm -- the former 8-token AVX2 block needed 19 and spilled). The block then folds into the running
// max (and argmax) per query lane and is dropped.
//
// int8: the same block shape with exact int32 accumulators and a per-ISA dot step over groups of
// 4 bytes (one broadcast int32 of D per token and group): see BlockInt.
//
// What must stay true (the caller relies on it): masked tokens never enter max / NaN / argmax; the
// argmax update is strictly greater and blocks run in increasing j (ties -> lowest j); float32 sums
// over k run in increasing k with one rounding per FMA, whatever the ISA.
#pragma once

#include <cstring>
#include <limits>

#include "common/vec.h"
#include "max_sim_tile.h"

namespace sd {
namespace maxsim {
namespace {  // internal linkage on purpose: see ops/common/vec.h

template <class V>
struct State {
  typename V::F best[2];
  typename V::I idx[2];
  typename V::M nan[2];
  typename V::F qscale[2];
  bool has_qscale;
};

template <class V>
SD_VEC_INLINE void Init(State<V>& st, const Doc& doc, const TileArgs& a) {
  st.best[0] = st.best[1] = V::set1(-std::numeric_limits<float>::infinity());
  st.idx[0] = st.idx[1] = V::set1i(static_cast<int32_t>(doc.first_valid));
  st.nan[0] = st.nan[1] = V::none();
  st.has_qscale = a.qscale != nullptr;
  if (st.has_qscale) {  // only the tile's own `count` scales are read (the last tile is partial)
    const int count = static_cast<int>(a.count < 2 * V::kLanes ? a.count : 2 * V::kLanes);
    const int c0 = count < V::kLanes ? count : V::kLanes;
    st.qscale[0] = V::loadu_tail(a.qscale, c0);
    st.qscale[1] = V::loadu_tail(a.qscale + c0, count - c0);
  }
}

template <class V>
SD_VEC_INLINE void Store(const State<V>& st, TileResult* out) {
  for (int h = 0; h < 2; ++h) {
    V::storeu(out->best + V::kLanes * h, st.best[h]);
    V::storeui(out->idx + V::kLanes * h, st.idx[h]);
    const unsigned bits = V::bits(st.nan[h]);
    for (int l = 0; l < V::kLanes; ++l) out->nan[V::kLanes * h + l] = (bits >> l) & 1u;
  }
}

// Scales a block's similarities (D scale, then Q scale: the portable order) and folds the valid
// tokens into the running (best, idx, nan) of the two vectors, in increasing j.
template <class V, int R, bool kArg>
SD_VEC_INLINE void Fold(const typename V::F (&acc)[R][2], int64_t j0, const Doc& doc, State<V>& st) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int64_t j = j0 + r;
    if (!doc.valid[j]) continue;
    for (int h = 0; h < 2; ++h) {
      typename V::F s = acc[r][h];
      if (doc.scale != nullptr) s = V::mul(s, V::set1(doc.scale[j]));
      if (st.has_qscale) s = V::mul(s, st.qscale[h]);
      st.nan[h] = V::mask_or(st.nan[h], V::isnan(s));
      if constexpr (kArg) {
        const typename V::M gt = V::gt(s, st.best[h]);
        st.best[h] = V::select(gt, st.best[h], s);
        st.idx[h] = V::selecti(gt, st.idx[h], V::set1i(static_cast<int32_t>(j)));
      } else {
        st.best[h] = V::max(st.best[h], s);
      }
    }
  }
}

// The int8 tiles' fold when no NaN can arise and the query scale may wait (Deferred: the document's scales finite,
// the tile's query scales finite and > 0): s = acc * dscale[j] alone enters the running max, and Finish multiplies
// the max by the query scale once per lane. The result is the same float: x -> round(x * qs) is non-decreasing for
// qs > 0, so round(max_j x_j * qs) = max_j round(x_j * qs); and a finite integer sum times finite scales is never
// NaN (it may overflow to +-inf, as the eager order would). Half of Fold's vector work per token (6 ops of 12 per
// 16 lanes), which was ~20% of the paired vpmaddubsw tile (perf, Zen 4).
inline bool Deferred(const TileArgs& a, const Doc& doc) {
  return doc.scale_finite && (a.qscale == nullptr || a.qscale_positive);
}

template <class V, int R>
SD_VEC_INLINE void FoldDeferred(const typename V::F (&acc)[R][2], int64_t j0, const Doc& doc, State<V>& st) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int64_t j = j0 + r;
    if (!doc.valid[j]) continue;
    for (int h = 0; h < 2; ++h) {
      typename V::F s = acc[r][h];
      if (doc.scale != nullptr) s = V::mul(s, V::set1(doc.scale[j]));
      st.best[h] = V::max(st.best[h], s);
    }
  }
}

template <class V>
SD_VEC_INLINE void FinishDeferred(State<V>& st) {
  if (st.has_qscale)
    for (int h = 0; h < 2; ++h) st.best[h] = V::mul(st.best[h], st.qscale[h]);
}

// ---- float32 ------------------------------------------------------------------------------------

template <class V, int R, bool kArg, bool kPrefetch = true>
SD_VEC_INLINE void BlockF32(const float* qp, const float* d, int64_t dim, int64_t j0, const Doc& doc,
                            State<V>& st) {
  constexpr int L = V::kLanes;
  typename V::F acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = V::zero();
  const float* drow = d + j0 * dim;
  // The next block (R * dim floats, contiguous; past the last block it is the next document) is
  // pulled into L1 while this one computes: the hardware prefetchers lose the R strided row streams
  // and D comes from DRAM for a large index (AVX-512, one thread, N = 3000: 59 -> 108 GFLOP/s).
  // R * 4 bytes per k covers the block in dim steps; prefetches never fault past the end.
  const char* next = reinterpret_cast<const char*>(drow + R * dim);
  for (int64_t k = 0; k < dim; ++k) {
    if constexpr (kPrefetch) _mm_prefetch(next + k * (R * 4), _MM_HINT_T0);
    const typename V::F q0 = V::load(qp + k * 2 * L), q1 = V::load(qp + k * 2 * L + L);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const typename V::F b = V::broadcast(drow + r * dim + k);
      acc[r][0] = V::fma(q0, b, acc[r][0]);
      acc[r][1] = V::fma(q1, b, acc[r][1]);
    }
  }
  Fold<V, R, kArg>(acc, j0, doc, st);
}

// The last Ld % R tokens: one block of exactly `rem` tokens (0 < rem < R).
template <class V, int R, bool kArg>
SD_VEC_INLINE void TailF32(int64_t rem, const float* qp, const float* d, int64_t dim, int64_t j0, const Doc& doc,
                           State<V>& st) {
  if constexpr (R > 0) {
    if (rem == R) BlockF32<V, R, kArg>(qp, d, dim, j0, doc, st);
    else TailF32<V, R - 1, kArg>(rem, qp, d, dim, j0, doc, st);
  }
}

// All a.tiles query tiles against one document, block by block: each block of R document tokens
// is read from DRAM once and reused from L1 by the other tiles (AVX2, Lq = 32 is two tiles; one pass
// per tile streamed the index twice: 1000 documents, thread CPU time, 94 -> GFLOP/s below). Up to
// kChunk tiles share a pass (their states live in memory; Fold reads them once per block).
template <class V, bool kArg>
inline void TileF32(const TileArgs& a, const Doc& doc, TileResult* out) {
  constexpr int R = V::kBlockF32, kChunk = 4, kTile = 2 * V::kLanes;
  const float* d = static_cast<const float*>(doc.data);
  for (int64_t t0 = 0; t0 < a.tiles; t0 += kChunk) {
    const int nt = static_cast<int>(a.tiles - t0 < kChunk ? a.tiles - t0 : kChunk);
    State<V> st[kChunk];
    const float* qp[kChunk];
    for (int t = 0; t < nt; ++t) {
      TileArgs at = a;
      at.qscale = a.qscale == nullptr ? nullptr : a.qscale + (t0 + t) * kTile;
      const int64_t left = a.count - (t0 + t) * kTile;
      at.count = static_cast<int>(left < kTile ? left : kTile);
      Init(st[t], doc, at);
      qp[t] = reinterpret_cast<const float*>(static_cast<const char*>(a.qp) + (t0 + t) * a.tile_stride);
    }
    int64_t j = 0;
    for (; j + R <= a.Ld; j += R) {
      BlockF32<V, R, kArg>(qp[0], d, a.dim, j, doc, st[0]);  // prefetches the next block for all
      for (int t = 1; t < nt; ++t) BlockF32<V, R, kArg, false>(qp[t], d, a.dim, j, doc, st[t]);
    }
    for (int t = 0; t < nt; ++t) {
      TailF32<V, R - 1, kArg>(a.Ld - j, qp[t], d, a.dim, j, doc, st[t]);
      Store(st[t], out + t0 + t);
    }
  }
}

// ---- int8 ---------------------------------------------------------------------------------------
// Step: the ISA's exact int32 dot step over one group of 4 bytes per lane:
//   static I dot(I acc, I q, I b)   acc + (the lane's group of q) . (broadcast group b)
//   kBlock                          document tokens per block (2 kBlock accumulators, 2 Q vectors,
//                                   the broadcast and the step's temporaries fit the register file)
// qp is [groups][2 * kLanes lanes][4 bytes]; document rows are `groups * 4` bytes apart; the
// accumulators start at `init` (the per-lane bias correction, or 0).

template <class V, class Step, int R>
SD_VEC_INLINE void BlockInt(const uint8_t* qp, const uint8_t* d, int64_t groups, int64_t j0, const typename V::I (&init)[2],
                            const Doc& doc, State<V>& st) {
  constexpr int L = V::kLanes;
  const int64_t row = groups * 4;
  typename V::I acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = init[0], acc[r][1] = init[1];
  const uint8_t* drow = d + j0 * row;
  for (int64_t g = 0; g < groups; ++g) {
    const typename V::I q0 = V::loadi(qp + g * 8 * L), q1 = V::loadi(qp + g * 8 * L + 4 * L);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const typename V::I b = V::broadcast4(drow + r * row + g * 4);
      acc[r][0] = Step::dot(acc[r][0], q0, b);
      acc[r][1] = Step::dot(acc[r][1], q1, b);
    }
  }
  typename V::F facc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) facc[r][0] = V::cvt(acc[r][0]), facc[r][1] = V::cvt(acc[r][1]);
  Fold<V, R, false>(facc, j0, doc, st);
}

template <class V, class Step, int R>
SD_VEC_INLINE void TailInt(int64_t rem, const uint8_t* qp, const uint8_t* d, int64_t groups, int64_t j0,
                           const typename V::I (&init)[2], const Doc& doc, State<V>& st) {
  if constexpr (R > 0) {
    if (rem == R) BlockInt<V, Step, R>(qp, d, groups, j0, init, doc, st);
    else TailInt<V, Step, R - 1>(rem, qp, d, groups, j0, init, doc, st);
  }
}

// groups: 4-byte groups per document row; init: per-lane start of the accumulators (2 vectors).
template <class V, class Step>
SD_VEC_INLINE void TileInt(const TileArgs& a, int64_t groups, const typename V::I (&init)[2], const Doc& doc,
                           TileResult* out) {
  constexpr int R = Step::kBlock;
  State<V> st;
  Init(st, doc, a);
  const uint8_t* qp = static_cast<const uint8_t*>(a.qp);
  const uint8_t* d = static_cast<const uint8_t*>(doc.data);
  int64_t j = 0;
  for (; j + R <= a.Ld; j += R) BlockInt<V, Step, R>(qp, d, groups, j, init, doc, st);
  TailInt<V, Step, R - 1>(a.Ld - j, qp, d, groups, j, init, doc, st);
  Store(st, out);
}

}  // namespace
}  // namespace maxsim
}  // namespace sd
