// RowwiseInt8MatMul's compute pieces shared by the binding (ops/rowwise_int8_matmul.cc: contract checks, weight
// packing, the portable variant) and the vector translation units (ops/rowwise_int8_matmul_avx2.cc,
// ops/rowwise_int8_matmul_avxvnni.cc, ops/rowwise_int8_matmul_avx512.cc, ops/rowwise_int8_matmul_avx512vnni.cc). The equation and rules:
// softdeploy/ops/rowwise_int8_matmul.py, rendered in docs/ops/RowwiseInt8MatMul.md.
//
// The packed weights (both vector tiles read them): B [K, N] int8 in 16-column panels. Per panel and block of 16 k, eight 32-byte vectors
// [group g = (k / 4) % 4][half h = columns 8h..8h+7]; lane j (4 bytes) of vector [g][h] holds B[16i + 4g + t,
// n0 + 8h + j] for t = 0..3. K is padded to kp (a multiple of 16) and N to np (a multiple of 16) with 0, and colsum
// (np entries, 0 past N) holds sum_k B[k, n].
//
// The lane bound ("groups"): vpmaddubsw multiplies the uint8 activations by the int8 weights and adds each pair
// (k = 16i + 4g + 2p + {0, 1}) into a saturating int16 lane; the AVX2 tile then adds the lanes of `groups`
// consecutive g in int16 (vpaddw) before one vpmaddwd(ones) + vpaddd into int32. Exact iff no int16 sum can leave
// [-32768, 32767]: for every lane set S = {16i + 4g + 2p + j : g in the group set, j in {0, 1}} of every column,
// L * (sum of the positive B[k, n], k in S) <= 32767 and L * (sum of the negative ones) >= -32768, L the
// activations' top code (levels). Pack computes the largest of 4, 2, 1 that holds for every lane set; 0 when even
// single pairs can saturate (then no vpmaddubsw form is exact).
//
// The widened packing (width 2), for the vpmaddubsw paths' weights outside the lane bound (groups 0): B as int16, per
// panel and pair of k (k = 2i, 2i + 1), 64 bytes: lane c (4 bytes) holds B[2i, n0 + c], B[2i + 1, n0 + c] for the 16
// columns c in order (a ymm tile reads columns 0-7 at offset 0 and 8-15 at offset 32; a zmm one all 16). The tiles
// then multiply int16-widened activations (xq as int16, row stride kp entries) with vpmaddwd straight into int32:
// |q0 b0 + q1 b1| <= 2 * 255 * 128, so every int8 B is exact. A panel is kp * kNR * width bytes.
//
// No onnxruntime and no std containers here: the vector translation units include this header (see ops/common/vec.h
// on why inline code shared with an -mavx2 unit must have internal linkage).
#pragma once

#include <cstdint>

namespace sd {
namespace rowwise_int8 {

constexpr int kNR = 16;  // columns per panel: two ymm of eight int32 lanes
constexpr int kKB = 16;  // k per packed block: four groups of four bytes
constexpr int kMR = 6;   // rows per ymm tile: 6 x 2 int32 accumulators + ones + a broadcast + products

// What the epilogue applies after fma(float(acc - za colsum), sa sb, bias), in this order: the activation (kGelu:
// ops/common/simd_math.h's GeluErf, the same float32 operations on every variant), then + residual[m, n] (a float32
// tensor of Y's shape and row stride; nullptr: none).
enum class Activation : int { kNone = 0, kGelu = 1 };

// The packed weights (see above); `panels` holds np / kNR panels of kp * kNR bytes.
struct PackedView {
  const int8_t* panels;
  const int32_t* colsum;
  int64_t K, N, kp, np;
  int groups;  // 4, 2 or 1; 0: no vpmaddubsw form is exact for these weights
  int width;   // bytes per packed weight: 1 (int8 panels), 2 (the widened packing: vpmaddwd tiles, int16 xq)
  // Columns of panels readable from `panels`: np for a whole packing; for a task's range of its panels, also the
  // panels after the range, so that the tiles prefetch the next task's first panel as they would their own next one.
  int64_t readable_np;
};

// Rows [0, M) of Y (row stride ldy) at the columns of `w` (a whole packing or a range of its panels) from the
// quantized rows xq (row stride kp, padded with each row's zero point), their scales sa and zero points za:
// Y[m, n] = fma(float(acc - za[m] colsum[n]), sa[m] * sb[n], bias[n]) with acc = sum_k xq[m, k] B[k, n] in int32,
// then `act` and + residual (Activation above; residual offset like y). bias may be nullptr (0). AVX2 + FMA only;
// w.groups 4, 2 or 1 (width 1: the vpmaddubsw tile), or width 2 (the vpmaddwd tile; xq then points at int16 rows, see
// the widened packing above).
void GemmAvx2(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M, const float* sb,
              const float* bias, float* y, int64_t ldy, Activation act, const float* residual);

// The same on VEX vpdpbusd ymm (ops/rowwise_int8_matmul_avxvnni.cc): exact for every int8 B, w.groups is not read.
// AVX2 + FMA + AVX-VNNI only.
void GemmAvxVnni(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M, const float* sb,
                 const float* bias, float* y, int64_t ldy, Activation act, const float* residual);

// The same on vpdpbusd zmm (ops/rowwise_int8_matmul_avx512vnni.cc): exact for every int8 B, w.groups is not read.
// AVX-512 F/BW/VL/DQ + VNNI only.
void GemmAvx512Vnni(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M,
                    const float* sb, const float* bias, float* y, int64_t ldy, Activation act,
                    const float* residual);

// The AVX2 tiles' forms on zmm (ops/rowwise_int8_matmul_avx512.cc), for AVX-512 CPUs without VNNI: as GemmAvx2,
// w.groups 4, 2 or 1 (width 1), or width 2 with int16 xq. AVX-512 F/BW/VL/DQ only.
void GemmAvx512Bw(const PackedView& w, const uint8_t* xq, const float* sa, const int32_t* za, int64_t M,
                  const float* sb, const float* bias, float* y, int64_t ldy, Activation act, const float* residual);

// Quantizes rows [0, M) of X (row stride K) as the contract says (per row: lo = min(0, min x), hi = max(0, max x),
// s = (hi - lo) / L or 1 when that is below 2^-126, z = round(clip(-lo / s, 0, L)), q = clip(round(x * (1 / s)) + z,
// 0, L), all in float32, round half to even) into xq (row stride kp, padded with z), sa, za. Returns the first row
// whose entries are not all finite or whose hi - lo overflows, or -1. AVX2 only.
int64_t QuantizeRowsAvx2(const float* x, int64_t M, int64_t K, int64_t kp, int levels, uint8_t* xq, float* sa,
                         int32_t* za);

// The same integers as int16 (xw, row stride kp entries): the widened packing's activations, in one pass. AVX2 only.
int64_t QuantizeRowsWideAvx2(const float* x, int64_t M, int64_t K, int64_t kp, int levels, int16_t* xw, float* sa,
                             int32_t* za);

}  // namespace rowwise_int8
}  // namespace sd
