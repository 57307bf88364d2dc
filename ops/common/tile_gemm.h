// Register-tiled C[rows x cols] (+)= A[rows x kdim] * B[kdim x cols] for the attention kernels
// (ops/softpick_attention.cc, ops/nystrom_gaussian_attention.cc): A row-major with row stride lda, B
// row-major with row stride ldb, C with row stride ldc; accumulate=false overwrites C.
// kDist = true accumulates (a - b)^2 instead of a * b: squared distances between the rows of A and the
// columns of B without the cancellation of |a|^2 + |b|^2 - 2 a.b.
//
// Tiles: AVX-512 6 rows x 64 columns (24 zmm accumulators, B loaded once per k for 6 rows), AVX2
// 6 x 16 (12 of the 16 ymm registers); portable: the loop nest with the column loop innermost, left to
// the compiler's baseline vectoriser. Every C element is the same sequential sum over k in every
// variant's tile position, so results do not depend on how rows are split between tasks.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/cpu.h"
#include "common/simd_math.h"

namespace sd::tile {

constexpr int kTileRows = 6;


// Portable: the loop nest with the column loop innermost (contiguous; the compiler vectorises it).
template <bool kDist = false>
inline void GemmPortable(const float* a, int64_t lda, const float* bm, int64_t ldb, int64_t kdim, float* c, int64_t ldc,
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

template <int RI, int NV, bool kDist>
SD_TARGET_AVX512 SD_INLINE inline void Tile512(const float* a, int64_t lda, const float* bm, int64_t ldb,
                                               int64_t kdim, float* c, int64_t ldc, __mmask16 last,
                                               bool accumulate) {
  __m512 acc[RI][NV];
  for (int r = 0; r < RI; ++r) {
    for (int x = 0; x < NV; ++x) {
      const __mmask16 mk = x == NV - 1 ? last : static_cast<__mmask16>(0xFFFF);
      acc[r][x] = accumulate ? _mm512_maskz_loadu_ps(mk, c + r * ldc + 16 * x) : _mm512_setzero_ps();
    }
  }
  for (int64_t kk = 0; kk < kdim; ++kk) {
    __m512 bv[NV];
    for (int x = 0; x < NV; ++x) {
      const __mmask16 mk = x == NV - 1 ? last : static_cast<__mmask16>(0xFFFF);
      bv[x] = _mm512_maskz_loadu_ps(mk, bm + kk * ldb + 16 * x);
    }
    for (int r = 0; r < RI; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + kk]);
      for (int x = 0; x < NV; ++x) {
        if constexpr (kDist) {
          const __m512 df = _mm512_sub_ps(av, bv[x]);
          acc[r][x] = _mm512_fmadd_ps(df, df, acc[r][x]);
        } else {
          acc[r][x] = _mm512_fmadd_ps(av, bv[x], acc[r][x]);
        }
      }
    }
  }
  for (int r = 0; r < RI; ++r) {
    for (int x = 0; x < NV; ++x) {
      const __mmask16 mk = x == NV - 1 ? last : static_cast<__mmask16>(0xFFFF);
      _mm512_mask_storeu_ps(c + r * ldc + 16 * x, mk, acc[r][x]);
    }
  }
}

template <int NV, bool kDist>
SD_TARGET_AVX512 inline void Rows512(const float* a, int64_t lda, const float* bm, int64_t ldb, int64_t kdim, float* c,
                              int64_t ldc, int64_t rows, __mmask16 last, bool accumulate) {
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows) {
    Tile512<kTileRows, NV, kDist>(a + r * lda, lda, bm, ldb, kdim, c + r * ldc, ldc, last, accumulate);
  }
  const float* ar = a + r * lda;
  float* cr = c + r * ldc;
  switch (rows - r) {
    case 5: Tile512<5, NV, kDist>(ar, lda, bm, ldb, kdim, cr, ldc, last, accumulate); break;
    case 4: Tile512<4, NV, kDist>(ar, lda, bm, ldb, kdim, cr, ldc, last, accumulate); break;
    case 3: Tile512<3, NV, kDist>(ar, lda, bm, ldb, kdim, cr, ldc, last, accumulate); break;
    case 2: Tile512<2, NV, kDist>(ar, lda, bm, ldb, kdim, cr, ldc, last, accumulate); break;
    case 1: Tile512<1, NV, kDist>(ar, lda, bm, ldb, kdim, cr, ldc, last, accumulate); break;
    default: break;
  }
}

template <bool kDist = false>
SD_TARGET_AVX512 inline void GemmAvx512(const float* a, int64_t lda, const float* bm, int64_t ldb, int64_t kdim, float* c,
                                 int64_t ldc, int64_t rows, int64_t cols, bool accumulate) {
  for (int64_t c0 = 0; c0 < cols; c0 += 64) {
    const int64_t w = std::min<int64_t>(64, cols - c0);
    const int nv = static_cast<int>((w + 15) / 16);
    const __mmask16 last = simd::TailMask16(w - 16 * (nv - 1));
    switch (nv) {
      case 4: Rows512<4, kDist>(a, lda, bm + c0, ldb, kdim, c + c0, ldc, rows, last, accumulate); break;
      case 3: Rows512<3, kDist>(a, lda, bm + c0, ldb, kdim, c + c0, ldc, rows, last, accumulate); break;
      case 2: Rows512<2, kDist>(a, lda, bm + c0, ldb, kdim, c + c0, ldc, rows, last, accumulate); break;
      default: Rows512<1, kDist>(a, lda, bm + c0, ldb, kdim, c + c0, ldc, rows, last, accumulate); break;
    }
  }
}

// AVX2: 6 rows x 2 vectors (16 columns) = 12 accumulators of the 16 ymm registers.
template <int RI, int NV, bool kDist>
SD_TARGET_AVX2 SD_INLINE inline void Tile256(const float* a, int64_t lda, const float* bm, int64_t ldb, int64_t kdim,
                                             float* c, int64_t ldc, __m256i last, bool full, bool accumulate) {
  __m256 acc[RI][NV];
  const __m256i all = _mm256_set1_epi32(-1);
  for (int r = 0; r < RI; ++r) {
    for (int x = 0; x < NV; ++x) {
      const __m256i mk = (x == NV - 1 && !full) ? last : all;
      acc[r][x] = accumulate ? _mm256_maskload_ps(c + r * ldc + 8 * x, mk) : _mm256_setzero_ps();
    }
  }
  for (int64_t kk = 0; kk < kdim; ++kk) {
    __m256 bv[NV];
    for (int x = 0; x < NV; ++x) {
      bv[x] = (x == NV - 1 && !full) ? _mm256_maskload_ps(bm + kk * ldb + 8 * x, last)
                                     : _mm256_loadu_ps(bm + kk * ldb + 8 * x);
    }
    for (int r = 0; r < RI; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + kk);
      for (int x = 0; x < NV; ++x) {
        if constexpr (kDist) {
          const __m256 df = _mm256_sub_ps(av, bv[x]);
          acc[r][x] = _mm256_fmadd_ps(df, df, acc[r][x]);
        } else {
          acc[r][x] = _mm256_fmadd_ps(av, bv[x], acc[r][x]);
        }
      }
    }
  }
  for (int r = 0; r < RI; ++r) {
    for (int x = 0; x < NV; ++x) {
      if (x == NV - 1 && !full) _mm256_maskstore_ps(c + r * ldc + 8 * x, last, acc[r][x]);
      else _mm256_storeu_ps(c + r * ldc + 8 * x, acc[r][x]);
    }
  }
}

template <int NV, bool kDist>
SD_TARGET_AVX2 inline void Rows256(const float* a, int64_t lda, const float* bm, int64_t ldb, int64_t kdim, float* c,
                            int64_t ldc, int64_t rows, __m256i last, bool full, bool accumulate) {
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows) {
    Tile256<kTileRows, NV, kDist>(a + r * lda, lda, bm, ldb, kdim, c + r * ldc, ldc, last, full, accumulate);
  }
  const float* ar = a + r * lda;
  float* cr = c + r * ldc;
  switch (rows - r) {
    case 5: Tile256<5, NV, kDist>(ar, lda, bm, ldb, kdim, cr, ldc, last, full, accumulate); break;
    case 4: Tile256<4, NV, kDist>(ar, lda, bm, ldb, kdim, cr, ldc, last, full, accumulate); break;
    case 3: Tile256<3, NV, kDist>(ar, lda, bm, ldb, kdim, cr, ldc, last, full, accumulate); break;
    case 2: Tile256<2, NV, kDist>(ar, lda, bm, ldb, kdim, cr, ldc, last, full, accumulate); break;
    case 1: Tile256<1, NV, kDist>(ar, lda, bm, ldb, kdim, cr, ldc, last, full, accumulate); break;
    default: break;
  }
}

template <bool kDist = false>
SD_TARGET_AVX2 inline void GemmAvx2(const float* a, int64_t lda, const float* bm, int64_t ldb, int64_t kdim, float* c,
                             int64_t ldc, int64_t rows, int64_t cols, bool accumulate) {
  for (int64_t c0 = 0; c0 < cols; c0 += 16) {
    const int64_t w = std::min<int64_t>(16, cols - c0);
    if (w > 8) {
      Rows256<2, kDist>(a, lda, bm + c0, ldb, kdim, c + c0, ldc, rows, simd::TailMask8(w - 8), w == 16, accumulate);
    } else {
      Rows256<1, kDist>(a, lda, bm + c0, ldb, kdim, c + c0, ldc, rows, simd::TailMask8(w), w == 8, accumulate);
    }
  }
}

}  // namespace sd::tile
