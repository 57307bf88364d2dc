// The AVX-VNNI units compiled a second time with vpdpbusd's EVEX encoding (ops/common/avxvnni.h): the functions of
// tests/native/max_sim_avxvnni_evex.cc and tests/native/rowwise_int8_matmul_avxvnni_evex.cc, for the size sweep
// (tests/native/sweep.cc) and the micro-benchmarks (bench/micro/maxsim_tiles.cc, bench/micro/rowwise_int8_pieces.cc).
// Never part of the library; callable only on a CPU with AVX-512 VNNI + VL.
#pragma once

#include "max_sim_tile.h"
#include "rowwise_int8_matmul_kernels.h"

namespace sd {
namespace maxsim {
void TileI8AvxVnniEvex(const TileArgs& a, const Doc& doc, TileResult* out);  // TileI8AvxVnni, EVEX
}  // namespace maxsim
namespace rowwise_int8 {
void GemmAvxVnniEvex(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M,
                     const float* sb, const float* bias, float* y, int64_t ldy, Activation act,
                     const float* residual);  // GemmAvxVnni, EVEX
}  // namespace rowwise_int8
}  // namespace sd
