// Device helpers shared by the CUDA kernels of ops/cuda/ (compiled by nvcc only).
//
// What must stay true:
//  * Nothing here runs at library load time: no static objects with CUDA calls, so the library loads
//    on a machine without a GPU or driver (cudart is linked statically, see CMakeLists.txt).
//  * The packed ranking key of SoftmaxTopK is a strict total order equal to the contract's ranking
//    rule (docs/ops/SoftmaxTopK.md): NaN > +inf > finite (descending) > -inf, equal logits -> lower
//    index first; -0.0 and +0.0 are equal logits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sd {
namespace cuda {

__device__ __forceinline__ float ToF(float v) { return v; }
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T FromF(float v);
template <>
__device__ __forceinline__ float FromF<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromF<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A 32-bit key whose unsigned order is the ranking order of the logits: every NaN -> 0xFFFFFFFF,
// +inf -> 0xFF800000, -inf -> 0x007FFFFF, -0.0 folded onto +0.0.
__device__ __forceinline__ uint32_t RankKey(float x) {
  if (x != x) return 0xFFFFFFFFu;
  if (x == 0.0f) x = 0.0f;
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float KeyLogit(uint32_t key) {  // inverse of RankKey (NaN -> a NaN)
  if (key == 0xFFFFFFFFu) return __uint_as_float(0x7FC00000u);
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}
// (key, index) in one uint64 whose order is the contract's: larger key first, then LOWER index
// first (the low word is ~index). Distinct for distinct indices; 0 ranks below every real entry
// (index < 2^32 - 1, checked by the callers), so it pads buffers.
__device__ __forceinline__ uint64_t Pack(uint32_t key, uint32_t index) {
  return (static_cast<uint64_t>(key) << 32) | static_cast<uint32_t>(~index);
}
__device__ __forceinline__ uint32_t PackedIndex(uint64_t p) { return ~static_cast<uint32_t>(p); }
__device__ __forceinline__ uint32_t PackedKey(uint64_t p) { return static_cast<uint32_t>(p >> 32); }

// Sorts buf[0, size) descending (size a power of two) with the whole block; bitonic network.
__device__ inline void BlockSortDesc(uint64_t* buf, int size) {
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int l = i ^ j;
        if (l > i) {
          const uint64_t a = buf[i], b = buf[l];
          const bool desc = (i & k) == 0;
          if (desc ? a < b : a > b) {
            buf[i] = b;
            buf[l] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// Block-wide sum / max through shared memory (any blockDim that is a multiple of 32, <= 1024).
template <class F>
__device__ inline float BlockReduce(float v, F op, float identity) {
  __shared__ float warp_vals[32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // warp_vals may still be read by a previous call
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? warp_vals[lane] : identity;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;  // every thread holds the result
}
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
__device__ inline unsigned BlockOr(unsigned v) {
  __shared__ unsigned warp_vals[32];
  for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(0xFFFFFFFFu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? warp_vals[lane] : 0u;
  for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// 2^t for a double t, to float accuracy for any t: the integer part goes to the exponent exactly, the
// fraction (|f| <= 0.5, exact in double) through exp2f. (exp2f of fl(t) would lose |t| * 2^-24 to the
// rounding of t: 7e-6 relative at t = 115, beyond the contract's 1e-6.)
__device__ __forceinline__ float Exp2Split(double t) {
  if (t < -200.0) return 0.0f;
  const double n = rint(t);
  return scalbnf(exp2f(static_cast<float>(t - n)), static_cast<int>(n));
}

// Online normalizer state (Milakov & Gimelshein): m = running max of the finite-or--inf logits in
// x units (so the exponent (x - m) * s is formed in double from the exact difference), d = sum of
// 2^((x - m)*s), s = log2(e)/T. Terms with x == m are exactly 1 (also when s is +inf); -inf terms 0.
// d is accumulated in double: a float sum of 10^5 terms per row would spend most of the contract's
// 1e-6 (TwoPassSoftmax) on rounding; the double adds cost little beside the loads.
struct Online {
  float m = -__builtin_huge_valf();
  double d = 0.0;
};
__device__ __forceinline__ float Term(float x, float m, double s) {
  return x == m ? 1.0f : Exp2Split((static_cast<double>(x) - static_cast<double>(m)) * s);
}
__device__ __forceinline__ void OnlineAdd(Online& st, float x, double s) {
  if (x > st.m) {
    st.d = st.d * Term(st.m, x, s) + 1.0;
    st.m = x;
  } else if (x > -__int_as_float(0x7F800000)) {
    st.d += Term(x, st.m, s);
  }
}
__device__ __forceinline__ Online OnlineMerge(Online a, Online b, double s) {
  if (b.m > a.m) {
    const Online t = a;
    a = b;
    b = t;
  }
  if (b.m > -__int_as_float(0x7F800000)) a.d += b.d * Term(b.m, a.m, s);
  return a;
}
__device__ inline Online BlockOnline(Online st, double s) {
  __shared__ float ms[32];
  __shared__ double ds[32];
  for (int o = 16; o > 0; o >>= 1) {
    Online other{__shfl_xor_sync(0xFFFFFFFFu, st.m, o), __shfl_xor_sync(0xFFFFFFFFu, st.d, o)};
    st = OnlineMerge(st, other, s);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) {
    ms[warp] = st.m;
    ds[warp] = st.d;
  }
  __syncthreads();
  const int warps = blockDim.x >> 5;
  st = lane < warps ? Online{ms[lane], ds[lane]} : Online{};
  for (int o = 16; o > 0; o >>= 1) {
    Online other{__shfl_xor_sync(0xFFFFFFFFu, st.m, o), __shfl_xor_sync(0xFFFFFFFFu, st.d, o)};
    st = OnlineMerge(st, other, s);
  }
  return st;
}

constexpr unsigned kHasNan = 1u, kHasPosInf = 2u;

}  // namespace cuda
}  // namespace sd
