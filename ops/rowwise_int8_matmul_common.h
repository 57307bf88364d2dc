// RowwiseInt8MatMul's scalar pieces shared by the binding (ops/rowwise_int8_matmul.cc) and the size-sweep tester
// (tests/native/sweep.cc): the weight packing and its lane bound, the portable row quantization and the portable
// GEMM loop. Baseline x86-64 code with no onnxruntime (defined in ops/rowwise_int8_matmul_common.cc); std
// containers are fine here, since no per-ISA translation unit includes this header.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "rowwise_int8_matmul_kernels.h"

namespace sd {
namespace rowwise_int8 {

// How a call multiplies, fixed at kernel creation: the portable loops; the AVX2 tiles or their zmm forms (AVX-512
// without VNNI): vpmaddubsw where the lane bound allows, else vpmaddwd on the widened packing; or a VNNI tile (ymm
// with AVX-VNNI on the avx2 variant, zmm with AVX-512 VNNI), for every B.
enum class Path { kPortable, kAvx2, kAvxVnni, kAvx512Bw, kAvx512Vnni };

// B packed for the vector tiles (layout: ops/rowwise_int8_matmul_kernels.h), its column sums and lane bound.
struct Packed {
  // kp * np * width bytes (int16 weights' bytes when width == 2); none on the portable path
  std::shared_ptr<uint8_t> panels;
  std::vector<int32_t> colsum;
  int64_t K = 0, N = 0, kp = 0, np = 0;
  int groups = 0;
  int width = 1;  // 2: the widened packing (the vpmaddubsw paths' weights outside the lane bound)
  PackedView View() const {
    return {reinterpret_cast<const int8_t*>(panels.get()), colsum.data(), K, N, kp, np, groups, width, np};
  }
};

// The largest of 4, 2, 1 vpmaddubsw results that may be summed in int16 for activations on 0..levels (0: not even
// single pairs are exact). See the lane bound in ops/rowwise_int8_matmul_kernels.h.
int LaneGroups(const int8_t* b, int64_t K, int64_t N, int levels);

// Column sums always; the lane bound for the vpmaddubsw paths; panels on every vector path (widened where the lane
// bound gives groups 0 on a vpmaddubsw path). `kept`: the panels are read by every call (B an initializer, packed at
// kernel creation), so they go into huge-page weight storage (ops/common/weight_arena.h); otherwise ordinary memory.
Packed Pack(const int8_t* b, int64_t K, int64_t N, int levels, Path path, bool kept);

// The portable row quantization: the AVX2 unit's operations, one entry at a time. Returns the first bad row or -1.
int64_t QuantizeRowsPortable(const float* x, int64_t M, int64_t K, int64_t kp, int levels, uint8_t* xq, float* sa,
                             int32_t* za);

// Columns [n0, n1) of Y [M, N] from B [K, N] as stored (int32 sums, a row at a time) and the quantized rows: the
// portable variant (CPUs without AVX2). The epilogue is the tiles':
// fma(float(acc - za colsum), sa sb, bias), bias nullptr for 0, then `act` and + residual (Y's layout; nullptr: none).
void GemmPortable(const int8_t* b, int64_t K, int64_t N, const int32_t* colsum, const uint8_t* xq, int64_t kp,
                  const float* sa, const int32_t* za, int64_t M, const float* sb, const float* bias, float* y,
                  int64_t n0, int64_t n1, Activation act, const float* residual);

}  // namespace rowwise_int8
}  // namespace sd
