// MaxSim on CUDA -- ColBERT late interaction (Khattab & Zaharia 2020; CPU kernel: ops/max_sim.cc).
//
//   Scores[b, n] = sum_{i: QMask[b,i]} max_{j: DMask[n,j]} QScale[b,i] * DScale[n,j] * <Q[b,i], D[n,j]>
//   (QScale, DScale optional: 1 when absent)
//
// Python half, the contract and the float64 oracle: softdeploy/ops/max_sim.py; docs/ops/MaxSim.md.
//
// float16 / bfloat16 (TensorCoreKernel): a block owns one query b and kDocsPerBlock documents. Q[b]
// is staged once in shared memory, zero-padded to multiples of 16 (Lq, dim); per document, tiles of 64
// document tokens are staged (zero-padded) and multiplied on tensor cores (WMMA 16x16x16 -> mma.sync,
// float32 accumulation): warp w computes the 16 token columns [16w, 16w + 16) of S = Q D^T for every
// query row, stores the tile to shared memory and folds it into per-row running maxima. The [Lq, Ld]
// similarities never reach global memory. Blocks of the same documents for different queries are
// adjacent in the grid (blockIdx.x = b), so their document reads share L2.
// float32, and shapes whose staged tiles exceed the shared-memory budget (GenericKernel): one block
// per (b, n), warps over query tokens, lanes over document tokens, float32 FMAs in increasing k.
//
// What must stay true (as on the CPU): masked document tokens never enter the max or the NaN test
// (padding rows and columns are zeros and are skipped by the j < Ld / i < Lq bounds, so inf * 0 in a
// padded slot cannot leak); a NaN similarity of a valid pair makes the token's term NaN; a document
// with no valid token contributes 0 per query token; masked query tokens contribute 0; per (b, n) the
// sum runs in increasing i.
#include <mma.h>

#include <sstream>

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace sd {
namespace cuda {
namespace {

constexpr const char* kOp = "MaxSim";
constexpr int kWarps = 4;
constexpr int kTileJ = 16 * kWarps;  // document tokens per staged tile
constexpr int kDocsPerBlock = 8;
constexpr int kMaxLqPad = 128;       // accumulator fragments per warp: kMaxLqPad / 16
constexpr size_t kSmemBudget = 96 * 1024;

__device__ __forceinline__ bool Valid(const uint8_t* mask, int64_t at) { return mask == nullptr || mask[at] != 0; }

// Folds one (i, best, nan) state per query token into Scores[b, n] (increasing i, one thread).
__device__ inline float SumRows(const float* best, const unsigned* nan, const uint8_t* q_mask, int64_t b, int64_t Lq,
                                bool any_valid_doc_token) {
  float sum = 0.0f;
  for (int64_t i = 0; i < Lq; ++i) {
    if (!Valid(q_mask, b * Lq + i)) continue;
    if (!any_valid_doc_token) continue;  // contributes 0
    sum += nan[i] ? __uint_as_float(0x7FC00000u) : best[i];
  }
  return sum;
}

size_t TensorCoreSmem(int64_t Lq, int64_t dim, size_t elem) {
  const int64_t lq_pad = (Lq + 15) / 16 * 16, dim_pad = (dim + 15) / 16 * 16;
  return elem * static_cast<size_t>((lq_pad + kTileJ) * dim_pad) + sizeof(float) * kWarps * lq_pad * 16 +
         (sizeof(float) + sizeof(unsigned)) * kWarps * lq_pad;
}

// Copies rows [0, rows) of src (row stride dim) into dst [rows_pad, dim_pad], zero-padding columns
// >= dim and rows >= rows (whole block).
template <class T>
__device__ inline void StageRows(T* dst, const T* src, int64_t rows, int rows_pad, int64_t dim, int dim_pad, bool vec) {
  if (vec) {
    const int per_row = dim_pad / 8;
    for (int ch = threadIdx.x; ch < rows_pad * per_row; ch += blockDim.x) {
      const int r = ch / per_row, k = (ch % per_row) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows && k < dim) v = *reinterpret_cast<const uint4*>(src + r * dim + k);
      *reinterpret_cast<uint4*>(dst + r * dim_pad + k) = v;
    }
    return;
  }
  const T zero = FromF<T>(0.0f);
  for (int e = threadIdx.x; e < rows_pad * dim_pad; e += blockDim.x) {
    const int r = e / dim_pad, k = e % dim_pad;
    dst[e] = r < rows && k < dim ? src[r * dim + k] : zero;
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps) TensorCoreKernel(const T* __restrict__ q, const T* __restrict__ d,
                                                               const uint8_t* __restrict__ q_mask,
                                                               const uint8_t* __restrict__ d_mask,
                                                               const float* __restrict__ q_scale,
                                                               const float* __restrict__ d_scale, int64_t Lq,
                                                               int64_t N, int64_t Ld, int64_t dim,
                                                               float* __restrict__ scores) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int lq_pad = static_cast<int>((Lq + 15) / 16 * 16), dim_pad = static_cast<int>((dim + 15) / 16 * 16);
  T* qs = reinterpret_cast<T*>(smem_raw);                       // [lq_pad, dim_pad]
  T* ds = qs + lq_pad * dim_pad;                                // [kTileJ, dim_pad]
  float* st = reinterpret_cast<float*>(ds + kTileJ * dim_pad);  // [kWarps][lq_pad, 16]
  float* best = st + kWarps * lq_pad * 16;                      // [kWarps][lq_pad]
  unsigned* nan = reinterpret_cast<unsigned*>(best + kWarps * lq_pad);
  const int64_t b = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // 16-byte loads (8 elements) where every row starts 16-byte aligned: dim % 8 == 0 and aligned bases.
  const bool vec = dim % 8 == 0 && (reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(d)) % 16 == 0;
  StageRows(qs, q + b * Lq * dim, Lq, lq_pad, dim, dim_pad, vec);
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kDocsPerBlock;
  for (int64_t n = n0; n < min(N, n0 + kDocsPerBlock); ++n) {
    for (int i = lane; i < lq_pad; i += 32) {
      best[warp * lq_pad + i] = -__int_as_float(0x7F800000);
      nan[warp * lq_pad + i] = 0;
    }
    bool any_valid = false;
    for (int64_t j0 = 0; j0 < Ld; j0 += kTileJ) {
      __syncthreads();  // previous tile consumed (and qs written, on the first)
      StageRows(ds, d + (n * Ld + j0) * dim, (Ld - j0 < kTileJ ? Ld - j0 : int64_t{kTileJ}), kTileJ, dim, dim_pad, vec);
      __syncthreads();
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kMaxLqPad / 16];
      const int row_tiles = lq_pad / 16;
#pragma unroll
      for (int r = 0; r < kMaxLqPad / 16; ++r)
        if (r < row_tiles) wmma::fill_fragment(acc[r], 0.0f);
      for (int k = 0; k < dim_pad; k += 16) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bf;
        wmma::load_matrix_sync(bf, ds + warp * 16 * dim_pad + k, dim_pad);
#pragma unroll
        for (int r = 0; r < kMaxLqPad / 16; ++r) {
          if (r < row_tiles) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af;
            wmma::load_matrix_sync(af, qs + r * 16 * dim_pad + k, dim_pad);
            wmma::mma_sync(acc[r], af, bf, acc[r]);
          }
        }
      }
      float* my = st + warp * lq_pad * 16;
#pragma unroll
      for (int r = 0; r < kMaxLqPad / 16; ++r)
        if (r < row_tiles) wmma::store_matrix_sync(my + r * 16 * 16, acc[r], 16, wmma::mem_row_major);
      __syncwarp();
      // Fold the warp's [lq_pad, 16] tile into its running row maxima: lane reads element e0 + lane
      // (consecutive words: no bank conflicts), each half-warp holds one row, reduced by shuffles.
      for (int e0 = 0; e0 < lq_pad * 16; e0 += 32) {
        const int e = e0 + lane, i = e >> 4, c = e & 15;
        const int64_t j = j0 + warp * 16 + c;
        float v = -__int_as_float(0x7F800000);
        unsigned has_nan = 0;
        if (i < Lq && j < Ld && Valid(d_mask, n * Ld + j)) {
          v = my[e];
          if (q_scale != nullptr || d_scale != nullptr) {
            v = (q_scale != nullptr ? q_scale[b * Lq + i] : 1.0f) * (d_scale != nullptr ? d_scale[n * Ld + j] : 1.0f) * v;
          }
          if (v != v) {
            has_nan = 1;
            v = -__int_as_float(0x7F800000);
          }
        }
        for (int o = 8; o > 0; o >>= 1) {
          v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
          has_nan |= __shfl_xor_sync(0xFFFFFFFFu, has_nan, o);
        }
        if (c == 0 && i < Lq) {
          best[warp * lq_pad + i] = fmaxf(best[warp * lq_pad + i], v);
          nan[warp * lq_pad + i] |= has_nan;
        }
      }
      if (threadIdx.x == 0) {
        for (int64_t j = j0; j < min(Ld, j0 + kTileJ) && !any_valid; ++j) any_valid = Valid(d_mask, n * Ld + j);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // combine the warps' column ranges (max and NaN are order-free), then the ordered sum
      for (int i = 0; i < Lq; ++i) {
        for (int w = 1; w < kWarps; ++w) {
          best[i] = fmaxf(best[i], best[w * lq_pad + i]);
          nan[i] |= nan[w * lq_pad + i];
        }
      }
      scores[b * N + n] = SumRows(best, nan, q_mask, b, Lq, any_valid);
    }
    __syncthreads();  // the next document re-initialises best / nan
  }
}

// One block per (n, b) (blockIdx.x = n: N may exceed the 65535 of gridDim.y): warp w takes query tokens w, w + kWarps, ...; lanes take document tokens.
template <class T>
__global__ void __launch_bounds__(32 * kWarps) GenericKernel(const T* __restrict__ q, const T* __restrict__ d,
                                                            const uint8_t* __restrict__ q_mask,
                                                            const uint8_t* __restrict__ d_mask,
                                                            const float* __restrict__ q_scale,
                                                            const float* __restrict__ d_scale, int64_t Lq,
                                                            int64_t N, int64_t Ld, int64_t dim,
                                                            float* __restrict__ scores) {
  extern __shared__ __align__(128) unsigned char smem_generic[];
  float* best = reinterpret_cast<float*>(smem_generic);                // [Lq]
  unsigned* nan = reinterpret_cast<unsigned*>(best + Lq);           // [Lq]
  const int64_t n = blockIdx.x, b = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ int any_valid;
  if (threadIdx.x == 0) {
    any_valid = 0;
    for (int64_t j = 0; j < Ld && !any_valid; ++j) any_valid = Valid(d_mask, n * Ld + j);
  }
  for (int64_t i = warp; i < Lq; i += kWarps) {
    const T* qi = q + (b * Lq + i) * dim;
    float m = -__int_as_float(0x7F800000);
    unsigned has_nan = 0;
    for (int64_t j = lane; j < Ld; j += 32) {
      if (!Valid(d_mask, n * Ld + j)) continue;
      const T* dj = d + (n * Ld + j) * dim;
      float s = 0.0f;
      for (int64_t k = 0; k < dim; ++k) s = fmaf(ToF(qi[k]), ToF(dj[k]), s);
      if (q_scale != nullptr || d_scale != nullptr) {
        s = (q_scale != nullptr ? q_scale[b * Lq + i] : 1.0f) * (d_scale != nullptr ? d_scale[n * Ld + j] : 1.0f) * s;
      }
      if (s != s) has_nan = 1;
      else m = fmaxf(m, s);
    }
    for (int o = 16; o > 0; o >>= 1) {
      m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
      has_nan |= __shfl_xor_sync(0xFFFFFFFFu, has_nan, o);
    }
    if (lane == 0) {
      best[i] = m;
      nan[i] = has_nan;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) scores[b * N + n] = SumRows(best, nan, q_mask, b, Lq, any_valid != 0);
}

template <class... A>
std::string Cat(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  return s.str();
}

template <bool kTensorCores, class T>
Result Launch(const T* q, const T* d, const uint8_t* q_mask, const uint8_t* d_mask, const float* q_scale,
              const float* d_scale, int64_t B, int64_t Lq, int64_t N,
              int64_t Ld, int64_t dim, float* scores, cudaStream_t stream) {
  if (B == 0 || N == 0) return {};
  if (B > 65535 || N > 65535LL * kDocsPerBlock) {
    return {Status::kInvalid, Cat(kOp, ": B ", B, " x N ", N, " exceeds the CUDA grid (rule: B <= 65535, N <= ",
                                  65535LL * kDocsPerBlock, ")")};
  }
  const size_t smem = TensorCoreSmem(Lq, dim, sizeof(T));
  const int64_t lq_pad = (Lq + 15) / 16 * 16;
  bool launched = false;
  if constexpr (kTensorCores) {
    if (lq_pad <= kMaxLqPad && smem <= kSmemBudget && Lq > 0 && dim > 0) {
    launched = true;
    if (smem > 48 * 1024) {
      const cudaError_t e = cudaFuncSetAttribute(TensorCoreKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem));
      if (e != cudaSuccess) return {Status::kCuda, Cat(kOp, ": ", cudaGetErrorString(e))};
    }
    const dim3 grid(static_cast<unsigned>(B), static_cast<unsigned>((N + kDocsPerBlock - 1) / kDocsPerBlock));
    TensorCoreKernel<T><<<grid, 32 * kWarps, smem, stream>>>(q, d, q_mask, d_mask, q_scale, d_scale, Lq, N, Ld, dim, scores);
    }
  }
  if (!launched) {
    const size_t gsmem = (sizeof(float) + sizeof(unsigned)) * static_cast<size_t>(Lq);
    if (gsmem > 48 * 1024) return {Status::kInvalid, Cat(kOp, ": Lq ", Lq, " exceeds the CUDA kernel's 6144 query tokens")};
    const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(B));
    GenericKernel<T><<<grid, 32 * kWarps, gsmem, stream>>>(q, d, q_mask, d_mask, q_scale, d_scale, Lq, N, Ld, dim, scores);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return {Status::kCuda, Cat(kOp, ": CUDA launch failed: ", cudaGetErrorString(e))};
  return {};
}

}  // namespace

Result MaxSim(Dtype dtype, const void* q, const void* d, const uint8_t* q_mask, const uint8_t* d_mask,
              const float* q_scale, const float* d_scale, int64_t B,
              int64_t Lq, int64_t N, int64_t Ld, int64_t dim, float* scores, cudaStream_t stream) {
  switch (dtype) {
    case Dtype::kFloat32:
      return Launch<false>(static_cast<const float*>(q), static_cast<const float*>(d), q_mask, d_mask, q_scale, d_scale, B, Lq, N, Ld, dim,
                    scores, stream);
    case Dtype::kFloat16:
      return Launch<true>(static_cast<const __half*>(q), static_cast<const __half*>(d), q_mask, d_mask, q_scale, d_scale, B, Lq, N, Ld, dim,
                    scores, stream);
    case Dtype::kBFloat16:
      return Launch<true>(static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(d), q_mask, d_mask,
                          q_scale, d_scale, B, Lq, N, Ld, dim, scores, stream);
  }
  return {Status::kInvalid, Cat(kOp, ": unknown element type")};
}

}  // namespace cuda
}  // namespace sd
