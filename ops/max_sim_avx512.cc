// MaxSim / SignedMaxSim tiles for AVX-512 (F, BW, VL, DQ; VNNI where the CPU has it). This
// translation unit is compiled with the AVX-512 flags and -ffp-contract=off (CMakeLists.txt) and only
// ever called after the run-time check in ops/max_sim_core.h; it includes no onnxruntime and no std
// containers (see ops/common/vec.h on why). float32 is the generic tile of ops/max_sim_kernels.h;
// int8 VNNI keeps its own 8-token block on named registers (below).
#include <cstring>

#include "max_sim_kernels.h"

namespace sd {
namespace maxsim {
namespace {

using V = vec::Avx512;

// acc += u8(a) . s8(broadcast of *b) per 4-byte group: vpdpbusd with an embedded {1to16} broadcast.
// Inline asm on named accumulators (BlockI8Vnni8): GCC 12 compiles _mm512_dpbusd_epi32 on an
// accumulator array in this loop into ~16 extra register copies and spills per 16 vpdpbusd
// (one thread, hot document: 335 -> 360 GOP/s).
#define SD_DPBUSD_BCST(acc, a, b) \
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*reinterpret_cast<const int32_t*>(b)))

// int8 with VNNI: qp is [dim4][32 lanes][4 bytes] of Q + 128 (u8), the broadcast operand is D (s8):
// vpdpbusd sums (q + 128) * d exactly, and dsum128[j] = 128 * sum_k D[j, k] is subtracted per token.
template <int R, bool kArg>
__attribute__((target("avx512vnni"), always_inline)) inline void BlockI8VnniN(
    const uint8_t* qp, const int32_t* dsum128, const int8_t* d, int64_t dim, int64_t j0, const Doc& doc,
    State<V>& st) {
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
  Fold<V, R, kArg>(facc, j0, doc, st);
}

// The main 8-token block of the VNNI path with 16 named accumulators (see SD_DPBUSD_BCST). The
// accumulators start at -128 * sum_k D[j, k], which removes the bias of the u8 side.
template <bool kArg>
__attribute__((target("avx512vnni"), always_inline)) inline void BlockI8Vnni8(
    const uint8_t* qp, const int32_t* dsum128, const int8_t* d, int64_t dim, int64_t j0, const Doc& doc,
    State<V>& st) {
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
  Fold<V, R, kArg>(facc, j0, doc, st);
}

// Full 8-token blocks take the named-register kernel, the last Ld % 8 tokens the generic one.
template <int R, bool kArg>
__attribute__((target("avx512vnni"), always_inline)) inline void BlockI8Vnni(
    const uint8_t* qp, const int32_t* dsum128, const int8_t* d, int64_t dim, int64_t j0, const Doc& doc,
    State<V>& st) {
  if constexpr (R == 8) BlockI8Vnni8<kArg>(qp, dsum128, d, dim, j0, doc, st);
  else BlockI8VnniN<R, kArg>(qp, dsum128, d, dim, j0, doc, st);
}


}  // namespace

void TileF32Avx512(const TileArgs& a, bool argmax, const Doc& doc, TileResult* out) {
  if (argmax) TileF32<V, true>(a, doc, out);
  else TileF32<V, false>(a, doc, out);
}

__attribute__((target("avx512vnni"))) void TileI8Avx512Vnni(const TileArgs& a, const Doc& doc, TileResult* out) {
  constexpr bool kArg = false;
  State<V> st;
  Init(st, doc, a);
  const uint8_t* qp = static_cast<const uint8_t*>(a.qp);
  const int8_t* d = static_cast<const int8_t*>(doc.data);
  const int32_t* dsum128 = a.bias;
  const int64_t dim = a.dim;
  int64_t j = 0;
  for (; j + 8 <= a.Ld; j += 8) BlockI8Vnni<8, kArg>(qp, dsum128, d, dim, j, doc, st);
  switch (a.Ld - j) {
    case 7: BlockI8Vnni<7, kArg>(qp, dsum128, d, dim, j, doc, st); break;
    case 6: BlockI8Vnni<6, kArg>(qp, dsum128, d, dim, j, doc, st); break;
    case 5: BlockI8Vnni<5, kArg>(qp, dsum128, d, dim, j, doc, st); break;
    case 4: BlockI8Vnni<4, kArg>(qp, dsum128, d, dim, j, doc, st); break;
    case 3: BlockI8Vnni<3, kArg>(qp, dsum128, d, dim, j, doc, st); break;
    case 2: BlockI8Vnni<2, kArg>(qp, dsum128, d, dim, j, doc, st); break;
    case 1: BlockI8Vnni<1, kArg>(qp, dsum128, d, dim, j, doc, st); break;
    default: break;
  }
  Store(st, out);
}

namespace {
// Sums of the 16 int32 lanes of each of v[0..15], as one vector (lane r = sum of v[r]).
SD_VEC_INLINE __m512i HorizontalSums16(const __m512i* v) {
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

}  // namespace

// out[j] = 128 * sum_k d[j, k] (the bias of the u8 side of vpdpbusd), exact in int32. Sixteen rows at
// a time (vpdpbusd against 0x01 bytes, then one horizontal-sum tree): this runs once per document
// and call, and a per-row reduction cost 14% of the int8 kernel.
__attribute__((target("avx512vnni"))) void DocSums128Avx512Vnni(const int8_t* d, int64_t Ld, int64_t dim,
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

}  // namespace maxsim
}  // namespace sd
