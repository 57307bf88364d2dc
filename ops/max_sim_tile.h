// The per-ISA tile functions of MaxSim / SignedMaxSim (ops/max_sim_core.h drives them). Plain types
// only: this header is included by the ISA translation units (ops/max_sim_avx2.cc, -mavx2 -mfma;
// ops/max_sim_avx512.cc, AVX-512 flags), which must not include onnxruntime or std containers whose
// inline functions would be compiled there with the ISA's flags (see ops/common/vec.h).
//
// A tile is one (query tile, document) pair: Q packed for the variant, the document's tokens, the
// running max (and argmax) per query lane stored to a TileResult. Layouts (lanes = tile width):
//   float32        qp [dim][lanes]                              D [Ld][dim]          (the input)
//   int8 VNNI-512  qp [dim4][lanes][4] u8 = Q + 128             D [Ld][dim]          (the input)
//   int8 int16     qp [dim2][lanes][2] int16                    D [Ld][dim2 * 2]     int16 copy, 0-padded
//   int8 AVX-VNNI  qp [dim4][lanes][4] s8 = Q                   D [Ld][dim4 * 4]     u8 = D + 128 copy
//   int8 AVX2 ubs  qp [dim4][lanes][4] u8 = Q + 128 (Ubs2: + 64) D [Ld][dim]          (the input, 7-bit)
//   int8 AVX2 tab  qp [dim4][16][lanes][4] s8 = Q * sign pattern  D: |D| [Ld][dim4 * 4] u8, patterns [Ld][dim4]
#pragma once

#include <cstdint>

namespace sd {
namespace maxsim {

constexpr int64_t kMaxLanes = 32;  // query tokens per tile (AVX-512); AVX2 uses 16, portable 1

// Result of one (query tile, document): per lane the running max (value), the index of the max,
// and whether a valid pair was NaN.
struct TileResult {
  alignas(64) float best[kMaxLanes];
  alignas(64) int32_t idx[kMaxLanes];
  alignas(64) uint8_t nan[kMaxLanes];
};

// Per-document facts the micro-kernels need.
struct Doc {
  const void* data;        // the document in the tile's layout (above)
  const uint8_t* valid;    // [Ld] 1 = valid
  const float* scale;      // [Ld] or null
  int64_t first_valid;     // -1: no valid token
  int64_t stride = 0;      // elements from this document to the next in the input (prefetch distance)
  bool scale_finite = false;  // every scale finite (or no scales): the int8 tiles may defer the query scale
};

// One query tile (float32: `tiles` consecutive tiles, `tile_stride` bytes apart, results to
// out[0 .. tiles)). qscale: the `count` query scales of these tiles (null: 1); lanes past `count` are
// padding whose results the caller ignores.
struct TileArgs {
  int64_t Ld = 0, dim = 0;
  const void* qp = nullptr;
  const float* qscale = nullptr;
  int64_t count = 0;
  int64_t tiles = 1, tile_stride = 0;
  bool qscale_positive = false;  // the `count` query scales all finite and > 0 (or none): see FoldDeferred
  const int32_t* bias = nullptr;  // VNNI-512: [Ld] 128 * sum_k D[j, k]; AVX-VNNI: [lanes] 128 * sum_k Q[i, k];
                                  // AVX2 ubs: [Ld] sum_k D[j, k] (DocSums7Avx2)
};

// float32, all a.tiles tiles in one pass over the document (argmax: SignedMaxSim also tracks the
// lowest j reaching the max).
void TileF32Avx512(const TileArgs& a, bool argmax, const Doc& doc, TileResult* out);
void TileF32Avx2(const TileArgs& a, bool argmax, const Doc& doc, TileResult* out);

// int8, exact int32 sums.
void TileI8Avx512Vnni(const TileArgs& a, const Doc& doc, TileResult* out);  // needs avx512vnni
void TileI8Avx2I16(const TileArgs& a, const Doc& doc, TileResult* out);     // vpmaddwd, any AVX2 CPU
void TileI8Avx2Ubs(const TileArgs& a, const Doc& doc, TileResult* out);     // vpmaddubsw, D in [-64, 63]
void TileI8Avx2Ubs2(const TileArgs& a, const Doc& doc, TileResult* out);    // vpmaddubsw pairs, D and Q in [-64, 63]
// |D| x Q * sign(D) from the tile's 16-pattern table, Q without -128, any D
void TileI8Avx2Tab(const TileArgs& a, const Doc& doc, TileResult* out);
void TileI8AvxVnni(const TileArgs& a, const Doc& doc, TileResult* out);     // needs avxvnni (VEX vpdpbusd)

// Per-document preparation of the int8 variants.
void DocSums128Avx512Vnni(const int8_t* d, int64_t Ld, int64_t dim, int32_t* out);  // out[j] = 128 sum_k d[j, k]
void WidenI8Avx2(const int8_t* d, int64_t Ld, int64_t dim, int16_t* out);           // -> [Ld][dim2 * 2]
void BiasI8Avx2(const int8_t* d, int64_t Ld, int64_t dim, uint8_t* out);            // -> [Ld][dim4 * 4] u8
// out[j] = sum_k d[j, k]; false when an entry lies outside [-64, 63] (the document is then not for the Ubs tiles)
bool DocSums7Avx2(const int8_t* d, int64_t Ld, int64_t dim, int32_t* out);
// -> |D| [Ld][dim4 * 4] u8 then the sign patterns [Ld][dim4] (x 16) for TileI8Avx2Tab.
// `out` is 64-byte aligned with TabDocBytes(Ld, dim4) bytes: the tile keeps its partial sums after the patterns.
void PrepTabAvx2(const int8_t* d, int64_t Ld, int64_t dim, uint8_t* out);
inline int64_t TabPartialsOffset(int64_t Ld, int64_t dim4) { return (Ld * dim4 * 5 + 63) / 64 * 64; }
inline int64_t TabDocBytes(int64_t Ld, int64_t dim4) { return TabPartialsOffset(Ld, dim4) + Ld * 16 * 4; }
inline int32_t* TabPartials(const uint8_t* doc, int64_t Ld, int64_t dim4) {
  return reinterpret_cast<int32_t*>(const_cast<uint8_t*>(doc) + TabPartialsOffset(Ld, dim4));
}

// float16 documents: n float16 values (their bits) -> float32, exactly (F16C; needs f16c besides AVX2).
void WidenF16Avx2(const uint16_t* x, float* y, int64_t n);

}  // namespace maxsim
}  // namespace sd
