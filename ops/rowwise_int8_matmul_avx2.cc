// RowwiseInt8MatMul for AVX2 (no VNNI needed): the row quantization (every vector path's) and the int16-summing
// GEMM tile's sums (the tiling and the epilogue: ops/rowwise_int8_matmul_ymm.h). Compiled with -mavx2 -mfma
// -ffp-contract=off (CMakeLists.txt) and only called after the run-time ISA check in ops/rowwise_int8_matmul.cc; no
// onnxruntime, no std containers (see ops/common/vec.h on why).
//
// Why this form (bench/results/minilm_int8_options.md, "Past MLAS without VNNI"): onnxruntime's u8s8 AVX2 GEMM
// spends vpmaddubsw + vpmaddwd + vpaddd on every 32 products. Summing `groups` vpmaddubsw results in int16 first
// (vpaddw) spends 2.5 ops per 32 products for groups = 2 and 2.25 for groups = 4: register-only loops of the three
// mixes ran at 108, 142 and 156 GMAC/s on one Zen 4 core. Exact under the lane bound of
// ops/rowwise_int8_matmul_kernels.h, which Pack checks.
//
// Weights outside the lane bound (no vpmaddubsw form is exact: e.g. rowwise-8-bit's plain 8-bit grid, the VNNI
// class's format) run WideSums on the widened packing: int16 weights and activations, vpmaddwd straight into int32
// (2 vector ops per 16 products; bench/results/rowwise_int8_wide.md has the measurements and the form it beat).
//
// What must stay true: the quantized integers equal the portable variant's (the same float32 operations; a row's min
// and max do not depend on order; the zero point's integer add equals the portable float add of two small
// integers); every int16 sum is exact (groups from Pack); the epilogue is fma(float(acc - z * colsum), sa * sb,
// bias), as in the portable variant, so both give the same bits.
#include <immintrin.h>

#include "rowwise_int8_matmul_ymm.h"

namespace sd {
namespace rowwise_int8 {
namespace {

constexpr float kMinScale = 0x1p-126f;  // the smallest normal float32: 1 / s stays finite

// acc[r][h] (int32 x 8) = rows r of xq times the panel's columns 8h..8h+7, over kp (a multiple of 16): per block of
// 16 k, `kGroups` vpmaddubsw results summed in int16, then vpmaddwd(ones) into int32.
template <int kGroups>
struct LaneSums {
  static_assert(kGroups == 1 || kGroups == 2 || kGroups == 4, "groups per int16 sum");
  template <int MR>
  static inline void Run(const uint8_t* xq, int64_t kp, const int8_t* panel, __m256i out[MR][2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[MR][2];  // local, not `out`: GCC keeps a local array in registers, the caller's it stores per step
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t k = 0; k < kp; k += kKB, panel += 8 * 32) {
      for (int g0 = 0; g0 < 4; g0 += kGroups) {
        for (int r = 0; r < MR; ++r) {
          // one row at a time, both halves together: live are the broadcast, two int16 sums and a product
          __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
          for (int g = g0; g < g0 + kGroups; ++g) {
            const __m256i a = Broadcast4(xq + r * kp + k + 4 * g);
            const __m256i p0 =
                _mm256_maddubs_epi16(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + 64 * g)));
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
};

// The same sums on the widened packing (weights outside the lane bound): per pair of k, the int16 activations
// (q[k], q[k + 1]) broadcast and one vpmaddwd + vpaddd per row and half, exact in int32 for every int8 B.
struct WideSums {
  template <int MR>
  static inline void Run(const uint8_t* xq, int64_t kp, const int8_t* panel, __m256i out[MR][2]) {
    const int16_t* a = reinterpret_cast<const int16_t*>(xq);
    __m256i acc[MR][2];  // local, as above
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    // Two pairs of k a trip: the loop's own increments and branch are ~3 of the ~36 operations a trip, which the
    // remainder tiles (fewer rows, the same loop overhead) feel most: 1.11x at M = 8, 1.01x at M = 128
    // (bench/results/rowwise_int8_wide.md).
#pragma GCC unroll 2
    for (int64_t k = 0; k < kp; k += 2, panel += 2 * 32) {
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + 32));
      for (int r = 0; r < MR; ++r) {
        const __m256i x = Broadcast4(reinterpret_cast<const uint8_t*>(a + r * kp + k));
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(x, b0));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(x, b1));
      }
    }
    for (int r = 0; r < MR; ++r) out[r][0] = acc[r][0], out[r][1] = acc[r][1];
  }
};

}  // namespace

void GemmAvx2(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M, const float* sb,
              const float* bias, float* y, int64_t ldy, Activation act, const float* residual) {
  if (w.width == 2) GemmYmm<WideSums>(w, xq, sa, za, M, sb, bias, y, ldy, act, residual);
  else if (w.groups == 4) GemmYmm<LaneSums<4>>(w, xq, sa, za, M, sb, bias, y, ldy, act, residual);
  else if (w.groups == 2) GemmYmm<LaneSums<2>>(w, xq, sa, za, M, sb, bias, y, ldy, act, residual);
  else GemmYmm<LaneSums<1>>(w, xq, sa, za, M, sb, bias, y, ldy, act, residual);
}

namespace {

// The row quantization into uint8 codes (the vpmaddubsw and vpdpbusd tiles' activations) or int16 ones (the widened
// packing's: the same integers, written once as the vpmaddwd tiles read them rather than widened in a second pass).
template <class Code>
int64_t QuantizeRows(const float* x, int64_t M, int64_t K, int64_t kp, int levels, Code* xq, float* sa, int32_t* za) {
  static_assert(sizeof(Code) == 1 || sizeof(Code) == 2, "uint8 or int16 codes");
  const float top = static_cast<float>(levels);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    // Two sets of accumulators, so no min, max or or chain bounds the pass. v * 0 is +-0 for a finite entry and NaN
    // for NaN or +-inf; or-ing the bits keeps a NaN (all-ones exponent, nonzero mantissa), so `nan` flags a bad row.
    const __m256 zero = _mm256_setzero_ps();
    __m256 lo = zero, hi = zero, nan = zero, lo1 = zero, hi1 = zero;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      const __m256 v = _mm256_loadu_ps(row + k), v1 = _mm256_loadu_ps(row + k + 8);
      lo = _mm256_min_ps(lo, v);
      hi = _mm256_max_ps(hi, v);
      lo1 = _mm256_min_ps(lo1, v1);
      hi1 = _mm256_max_ps(hi1, v1);
      nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_mul_ps(v, zero), _mm256_mul_ps(v1, zero)));
    }
    for (; k + 8 <= K; k += 8) {
      const __m256 v = _mm256_loadu_ps(row + k);
      lo = _mm256_min_ps(lo, v);
      hi = _mm256_max_ps(hi, v);
      nan = _mm256_or_ps(nan, _mm256_mul_ps(v, zero));
    }
    alignas(32) float l8[8], h8[8], n8[8];
    _mm256_store_ps(l8, _mm256_min_ps(lo, lo1));
    _mm256_store_ps(h8, _mm256_max_ps(hi, hi1));
    _mm256_store_ps(n8, nan);
    float mn = 0.f, mx = 0.f, bad = 0.f;
    for (int i = 0; i < 8; ++i) {
      mn = l8[i] < mn ? l8[i] : mn;
      mx = h8[i] > mx ? h8[i] : mx;
      bad += n8[i];
    }
    for (; k < K; ++k) {
      mn = row[k] < mn ? row[k] : mn;
      mx = row[k] > mx ? row[k] : mx;
      bad += row[k] * 0.f;
    }
    const float range = mx - mn;
    if (bad != bad || !(range <= 3.40282347e38f)) return m;  // a NaN or +-inf entry, or hi - lo overflows
    float scale = range / top;
    if (!(scale >= kMinScale)) scale = 1.f;
    const float neg_lo = -mn / scale;
    const float zp = __builtin_nearbyintf(neg_lo < 0.f ? 0.f : (neg_lo > top ? top : neg_lo));
    sa[m] = scale;
    za[m] = static_cast<int32_t>(zp);
    const float inv = 1.f / scale;
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i zp16 = _mm256_set1_epi16(static_cast<int16_t>(za[m]));
    const __m256i top8 = _mm256_set1_epi8(static_cast<char>(levels));
    const __m256i top16 = _mm256_set1_epi16(static_cast<int16_t>(levels));
    Code* dst = xq + m * kp;
    // q = round(x * inv) + z, saturated to 0..255 and clipped to levels. vcvtps2dq rounds in the current mode
    // (half to even unless a caller changed MXCSR), as the portable variant's nearbyint does; round(x * inv) is
    // within +-(levels + 1), so the int16 packing is exact and z is added there (the portable variant's float sum of
    // two small integers is exact, so the same). 32 entries a step: 20 vector ops.
    const auto codes16 = [&](const float* p) {  // 16 entries as int16 round(x * inv) + z, in lane-interleaved order
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p), vinv));
      const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p + 8), vinv));
      return _mm256_add_epi16(_mm256_packs_epi32(a, b), zp16);
    };
    k = 0;
    if constexpr (sizeof(Code) == 1) {
      for (; k + 32 <= K; k += 32) {
        // packus of the two: dwords [a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7] of the four groups of 8 entries
        const __m256i u = _mm256_packus_epi16(codes16(row + k), codes16(row + k + 16));
        const __m256i ordered = _mm256_permutevar8x32_epi32(u, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), _mm256_min_epu8(ordered, top8));
      }
    }
    for (; k + 16 <= K; k += 16) {
      const __m256i w = _mm256_permute4x64_epi64(codes16(row + k), 0xD8);  // 16 x int16 in order
      if constexpr (sizeof(Code) == 1) {
        const __m128i u = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + k), _mm_min_epu8(u, _mm256_castsi256_si128(top8)));
      } else {  // clip(v, 0, L): what packus (saturation to 0..255) and the min with L give above
        const __m256i c = _mm256_min_epi16(_mm256_max_epi16(w, _mm256_setzero_si256()), top16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), c);
      }
    }
    for (; k < K; ++k) {
      const float q = __builtin_nearbyintf(row[k] * inv) + zp;
      dst[k] = static_cast<Code>(q < 0.f ? 0.f : (q > top ? top : q));
    }
    for (; k < kp; ++k) dst[k] = static_cast<Code>(zp);
  }
  return -1;
}

}  // namespace

int64_t QuantizeRowsAvx2(const float* x, int64_t M, int64_t K, int64_t kp, int levels, uint8_t* xq, float* sa,
                         int32_t* za) {
  return QuantizeRows(x, M, K, kp, levels, xq, sa, za);
}

int64_t QuantizeRowsWideAvx2(const float* x, int64_t M, int64_t K, int64_t kp, int levels, int16_t* xw, float* sa,
                             int32_t* za) {
  return QuantizeRows(x, M, K, kp, levels, xw, sa, za);
}

}  // namespace rowwise_int8
}  // namespace sd
