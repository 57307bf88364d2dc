// Register-tiled C[rows x cols] (+)= A[rows x kdim] * B[kdim x cols] for the attention kernels
// (ops/softpick_attention_kernels.h, ops/nystrom_gaussian_attention_kernels.h), written once over the vector
// traits of ops/common/vec.h: A row-major with row stride lda, B row-major with row stride ldb, C with row
// stride ldc; accumulate=false overwrites C. kDist = true accumulates (a - b)^2 instead of a * b: squared
// distances between the rows of A and the columns of B without the cancellation of |a|^2 + |b|^2 - 2 a.b.
//
// Tiles: kTileRows = 6 rows x TileVecs<V> vectors (AVX-512 4 x 16 = 64 columns: 24 zmm accumulators, B
// loaded once per k for 6 rows; AVX2 2 x 8 = 16 columns: 12 of the 16 ymm registers); the last vector of a
// column block holds the block's tail (loadu_tail / storeu_tail). GemmPortable: the loop nest with the
// column loop innermost, left to the compiler's baseline vectoriser. Every C element is the same
// sequential sum over k in every variant and tile position, so results do not depend on how rows are split
// between tasks.
//
// Everything sits in an anonymous namespace (internal linkage: see ops/common/vec.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/vec.h"

namespace sd {
namespace tile {
namespace {

constexpr int kTileRows = 6;

// Vectors per column block: 4 where the register file has 32 vectors (AVX-512), else 2.
template <class V>
constexpr int TileVecs() {
  return V::kLanes == 16 ? 4 : 2;
}

// Portable: the loop nest with the column loop innermost (contiguous; the compiler vectorises it).
template <bool kDist = false>
void GemmPortable(const float* a, int64_t lda, const float* bm, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
                  int64_t rows, int64_t cols, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    if (!accumulate) std::memset(cr, 0, static_cast<size_t>(cols) * sizeof(float));
    for (int64_t kk = 0; kk < kdim; ++kk) {
      const float x = a[r * lda + kk];
      const float* br = bm + kk * ldb;
      if constexpr (kDist) {
        for (int64_t j = 0; j < cols; ++j) cr[j] += (x - br[j]) * (x - br[j]);
      } else {
        for (int64_t j = 0; j < cols; ++j) cr[j] += x * br[j];
      }
    }
  }
}

// kFull: every vector of the block is whole; else the last one holds `tail` (1 <= tail < kLanes) columns.
template <class V, int RI, int NV, bool kDist, bool kFull>
SD_VEC_INLINE void Tile(const float* a, int64_t lda, const float* bm, int64_t ldb, int64_t kdim, float* c,
                        int64_t ldc, int tail, bool accumulate) {
  using F = typename V::F;
  auto load = [&](const float* p, int x) SD_VEC_LAMBDA {
    return (kFull || x < NV - 1) ? V::loadu(p) : V::loadu_tail(p, tail);
  };
  F acc[RI][NV];
  for (int r = 0; r < RI; ++r) {
    for (int x = 0; x < NV; ++x) acc[r][x] = accumulate ? load(c + r * ldc + V::kLanes * x, x) : V::zero();
  }
  for (int64_t kk = 0; kk < kdim; ++kk) {
    F bv[NV];
    for (int x = 0; x < NV; ++x) bv[x] = load(bm + kk * ldb + V::kLanes * x, x);
    for (int r = 0; r < RI; ++r) {
      const F av = V::broadcast(a + r * lda + kk);
      for (int x = 0; x < NV; ++x) {
        if constexpr (kDist) {
          const F df = V::sub(av, bv[x]);
          acc[r][x] = V::fma(df, df, acc[r][x]);
        } else {
          acc[r][x] = V::fma(av, bv[x], acc[r][x]);
        }
      }
    }
  }
  for (int r = 0; r < RI; ++r) {
    for (int x = 0; x < NV; ++x) {
      float* p = c + r * ldc + V::kLanes * x;
      if (kFull || x < NV - 1) V::storeu(p, acc[r][x]);
      else V::storeu_tail(p, tail, acc[r][x]);
    }
  }
}

template <class V, int NV, bool kDist, bool kFull>
void Rows(const float* a, int64_t lda, const float* bm, int64_t ldb, int64_t kdim, float* c, int64_t ldc, int64_t rows,
          int tail, bool accumulate) {
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows) {
    Tile<V, kTileRows, NV, kDist, kFull>(a + r * lda, lda, bm, ldb, kdim, c + r * ldc, ldc, tail, accumulate);
  }
  const float* ar = a + r * lda;
  float* cr = c + r * ldc;
  switch (rows - r) {
    case 5: Tile<V, 5, NV, kDist, kFull>(ar, lda, bm, ldb, kdim, cr, ldc, tail, accumulate); break;
    case 4: Tile<V, 4, NV, kDist, kFull>(ar, lda, bm, ldb, kdim, cr, ldc, tail, accumulate); break;
    case 3: Tile<V, 3, NV, kDist, kFull>(ar, lda, bm, ldb, kdim, cr, ldc, tail, accumulate); break;
    case 2: Tile<V, 2, NV, kDist, kFull>(ar, lda, bm, ldb, kdim, cr, ldc, tail, accumulate); break;
    case 1: Tile<V, 1, NV, kDist, kFull>(ar, lda, bm, ldb, kdim, cr, ldc, tail, accumulate); break;
    default: break;
  }
}

template <class V, int NV, bool kDist>
SD_VEC_INLINE void RowsAnyTail(const float* a, int64_t lda, const float* bm, int64_t ldb, int64_t kdim, float* c,
                               int64_t ldc, int64_t rows, int tail, bool accumulate) {
  if (tail == V::kLanes) Rows<V, NV, kDist, true>(a, lda, bm, ldb, kdim, c, ldc, rows, tail, accumulate);
  else Rows<V, NV, kDist, false>(a, lda, bm, ldb, kdim, c, ldc, rows, tail, accumulate);
}

template <class V, bool kDist = false>
void Gemm(const float* a, int64_t lda, const float* bm, int64_t ldb, int64_t kdim, float* c, int64_t ldc, int64_t rows,
          int64_t cols, bool accumulate) {
  constexpr int L = V::kLanes, kBlock = TileVecs<V>() * L;
  for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
    const int w = static_cast<int>(std::min<int64_t>(kBlock, cols - c0));
    const int nv = (w + L - 1) / L, tail = w - L * (nv - 1);
    const float* b0 = bm + c0;
    float* cc = c + c0;
    if constexpr (TileVecs<V>() == 4) {
      switch (nv) {
        case 4: RowsAnyTail<V, 4, kDist>(a, lda, b0, ldb, kdim, cc, ldc, rows, tail, accumulate); break;
        case 3: RowsAnyTail<V, 3, kDist>(a, lda, b0, ldb, kdim, cc, ldc, rows, tail, accumulate); break;
        case 2: RowsAnyTail<V, 2, kDist>(a, lda, b0, ldb, kdim, cc, ldc, rows, tail, accumulate); break;
        default: RowsAnyTail<V, 1, kDist>(a, lda, b0, ldb, kdim, cc, ldc, rows, tail, accumulate); break;
      }
    } else {
      if (nv == 2) RowsAnyTail<V, 2, kDist>(a, lda, b0, ldb, kdim, cc, ldc, rows, tail, accumulate);
      else RowsAnyTail<V, 1, kDist>(a, lda, b0, ldb, kdim, cc, ldc, rows, tail, accumulate);
    }
  }
}

}  // namespace
}  // namespace tile
}  // namespace sd
