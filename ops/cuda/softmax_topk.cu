// SoftmaxTopK on CUDA -- fused softmax + top-k with one read of x (Milakov & Gimelshein 2018,
// arXiv 1805.02867, Algorithm 4; the CPU kernel is ops/softmax_topk.cc).
//
//   z = x / temperature
//   Values, Indices = TopK(Softmax(z), k)      (descending; equal logits -> lower index first)
//   LogSumExp       = m + log sum_j exp(z_j - m)
//
// Python half, the contract, the ranking rule for NaN/+inf/-inf rows and the float64 oracle:
// softdeploy/ops/softmax_topk.py; docs/ops/SoftmaxTopK.md.
//
// How: a block streams its part of a row once. Every thread keeps the online normaliser
// (m, d) of its elements (m in x units, d = sum 2^((x - m)*s), s = log2(e)/T: x - m is exact near the
// max, so no rounding of x*s enters the exponent) and offers each element, as one 64-bit ranking key
// (common.cuh Pack: logit order, then lower index), to a block-wide candidate buffer: only keys above
// the buffer's threshold (the k-th best key after the last compaction) enter; when a wave of loads
// could overflow the buffer it is sorted (bitonic) and cut back to k. On random logits about
// k*ln(n/k) entries per row are ever candidates. Rows too short to feed the device alone (fewer rows
// than ~4 per SM) are split over several blocks ("chunks"); a merge kernel combines the chunks'
// (m, d) and their top-k lists. The k winners' values exp2((x_i - M)*s)/D and LogSumExp
// M/T + ln D are formed in double. Special rows (NaN, +inf, all -inf) follow the contract exactly:
// flags are OR-reduced over the row, indices always follow the ranking rule.
//
// What must stay true:
//  * keys are distinct (the index is in them), so "enters iff above the threshold" keeps exactly the
//    contract's order, ties included, whatever order threads offer them in;
//  * k <= kMaxSharedK keeps the buffer in shared memory; larger k uses a buffer per block in the
//    workspace (the same code through generic pointers);
//  * no synchronisation with the host; the workspace is only touched by kernels on `stream`.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace sd {
namespace cuda {
namespace {

constexpr const char* kOp = "SoftmaxTopK";
constexpr int kThreads = 512;
constexpr int kUnroll = 4;
constexpr int kWave = kThreads * kUnroll;  // elements a block offers between two capacity checks
constexpr int kSharedCap = 4096;           // 32 KiB of uint64 keys
constexpr int64_t kMaxSharedK = kSharedCap - kWave;
constexpr int64_t kMinChunk = 8192;        // elements per chunk when a row is split

int CapacityFor(int64_t k) {
  int cap = 1;
  while (cap < k + kWave) cap <<= 1;
  return cap;
}

struct Plan {
  int64_t rows = 0, chunks = 1, chunk_len = 0;
  int cap = 0;
  bool global_buf = false;
  int64_t grid = 0;        // blocks of the first kernel
  size_t part_keys = 0, part_state = 0, bufs = 0;  // workspace byte offsets
  size_t bytes = 0;
};

Plan MakePlan(int64_t outer, int64_t n, int64_t inner, int64_t k) {
  Plan p;
  p.rows = outer * inner;
  p.cap = CapacityFor(k);
  p.global_buf = k > kMaxSharedK;
  const int64_t sms = std::max(1, SmCount());
  if (!p.global_buf && p.rows < 4 * sms && n >= 2 * kMinChunk) {
    p.chunks = std::min<int64_t>((4 * sms + p.rows - 1) / p.rows, n / kMinChunk);
    p.chunks = std::max<int64_t>(p.chunks, 1);
  }
  p.chunk_len = (n + p.chunks - 1) / p.chunks;
  const int64_t items = p.rows * p.chunks;
  p.grid = std::min<int64_t>(items, p.global_buf ? 2 * sms : int64_t{1} << 30);
  size_t off = 0;
  if (p.chunks > 1) {
    p.part_keys = off;
    off += sizeof(uint64_t) * static_cast<size_t>(items * k);
    p.part_state = off;
    off += 3 * sizeof(float) * static_cast<size_t>(items);
  }
  if (p.global_buf) {
    off = (off + 255) / 256 * 256;
    p.bufs = off;
    off += sizeof(uint64_t) * static_cast<size_t>(p.grid) * p.cap;
  }
  p.bytes = off;
  return p;
}

// The block's candidate buffer: buf[0, cap) (shared or global), count and threshold in shared.
struct Candidates {
  uint64_t* buf;
  int cap;
  int k;
  int* count;
  unsigned long long* thr;

  __device__ void Reset() {
    if (threadIdx.x == 0) {
      *count = 0;
      *thr = 0;
    }
    __syncthreads();
  }
  // Sort, keep the best min(count, k), update the threshold. Called by the whole block. Only the
  // smallest power of two >= count is sorted (entries beyond count are stale and padded with 0, which
  // ranks below every real key), so the last compaction of a row -- typically a few hundred
  // candidates -- costs a small fraction of a full-capacity sort.
  __device__ void Compact() {
    const int c = *count;
    int size = 2;
    while (size < c) size <<= 1;
    for (int i = c + threadIdx.x; i < size; i += blockDim.x) buf[i] = 0;
    __syncthreads();
    BlockSortDesc(buf, size);
    if (threadIdx.x == 0) {
      *count = c < k ? c : k;
      *thr = c < k ? 0ull : buf[k - 1];
    }
    __syncthreads();
  }
  // Before a wave of up to kWave offers (whole block): compact when the wave could overflow the
  // buffer, and as soon as the first k candidates are in (threshold still 0), so that the filter
  // starts working after one wave instead of after a full buffer.
  __device__ void BeginWave() {
    __syncthreads();
    const int c = *count;
    if (c + kWave > cap || (*thr == 0 && c >= k)) Compact();
  }
  __device__ __forceinline__ void Offer(uint64_t key, uint64_t t) {
    if (key > t) buf[atomicAdd(count, 1)] = key;
  }
};

// Writes the k winners of a row (buf sorted, count == k) and its LogSumExp.
template <class T>
__device__ void Emit(const Candidates& c, Online st, unsigned flags, double s, double t, int64_t k, T* values,
                     int64_t* indices, T* lse, int64_t out_base, int64_t inner, int64_t lse_off) {
  const float nan = __uint_as_float(0x7FC00000u);
  const bool special = (flags & (kHasNan | kHasPosInf)) != 0 || st.m == -__int_as_float(0x7F800000);
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const uint64_t key = c.buf[i];
    const uint32_t j = PackedIndex(key);
    float v = nan;
    if (!special) {
      const double xi = KeyLogit(PackedKey(key));
      v = static_cast<float>(exp2((xi - static_cast<double>(st.m)) * s) / st.d);
    }
    values[out_base + i * inner] = FromF<T>(v);
    indices[out_base + i * inner] = j;
  }
  if (lse != nullptr && threadIdx.x == 0) {
    float l;
    if (flags & kHasNan) l = nan;
    else if (flags & kHasPosInf) l = __int_as_float(0x7F800000);
    else if (st.m == -__int_as_float(0x7F800000)) l = -__int_as_float(0x7F800000);
    else l = static_cast<float>(static_cast<double>(st.m) / t + log(static_cast<double>(st.d)));
    lse[lse_off] = FromF<T>(l);
  }
}

// One block per (row, chunk) item (grid-stride). chunks == 1: emits the row; otherwise writes the
// chunk's sorted top-k keys and (m, d, flags) into the workspace for MergeKernel.
template <class T>
__global__ void __launch_bounds__(kThreads) ChunkKernel(const T* __restrict__ x, int64_t n, int64_t inner,
                                                        int64_t chunks, int64_t chunk_len, int64_t items, int k,
                                                        double s, double t, int cap, uint64_t* global_bufs,
                                                        T* values, int64_t* indices, T* lse,
                                                        uint64_t* part_keys, float* part_state) {
  __shared__ uint64_t smem[kSharedCap];
  __shared__ int count;
  __shared__ unsigned long long thr;
  Candidates c{global_bufs != nullptr ? global_bufs + static_cast<int64_t>(blockIdx.x) * cap : smem, cap, k, &count,
               &thr};
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t row = item / chunks, chunk = item % chunks;
    const int64_t o = row / inner, i = row % inner;
    const int64_t base = o * n * inner + i;
    const int64_t j0 = chunk * chunk_len, j1 = min(n, j0 + chunk_len);
    c.Reset();
    Online st;
    unsigned flags = 0;
    // Loads of wave w + 1 are issued before wave w is processed (software pipelining): twice the
    // bytes in flight per thread, which a bandwidth-bound pass needs to cover the memory latency.
    float next[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = j0 + u * kThreads + threadIdx.x;
      next[u] = j < j1 ? ToF(x[base + j * inner]) : 0.0f;
    }
    for (int64_t w = j0; w < j1; w += kWave) {
      float xs[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        xs[u] = next[u];
        const int64_t j = w + kWave + u * kThreads + threadIdx.x;
        next[u] = j < j1 ? ToF(x[base + j * inner]) : 0.0f;
      }
      c.BeginWave();
      const uint64_t th = *c.thr;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = w + u * kThreads + threadIdx.x;
        if (j >= j1) continue;
        const float v = xs[u];
        if (v != v) flags |= kHasNan;
        else if (v == __int_as_float(0x7F800000)) flags |= kHasPosInf;
        else OnlineAdd(st, v, s);
        c.Offer(Pack(RankKey(v), static_cast<uint32_t>(j)), th);
      }
    }
    __syncthreads();
    c.Compact();
    st = BlockOnline(st, s);
    flags = BlockOr(flags);
    if (chunks == 1) {
      Emit(c, st, flags, s, t, k, values, indices, lse, o * k * inner + i, inner, o * inner + i);
    } else {
      for (int q = threadIdx.x; q < k; q += blockDim.x) part_keys[item * k + q] = c.buf[q];
      if (threadIdx.x == 0) {
        part_state[3 * item] = st.m;
        part_state[3 * item + 1] = static_cast<float>(st.d);  // one rounding per chunk
        part_state[3 * item + 2] = __uint_as_float(flags);
      }
    }
    __syncthreads();
  }
}

// One block per row: merges the row's chunks (their (m, d, flags) and top-k keys) and emits.
template <class T>
__global__ void __launch_bounds__(kThreads) MergeKernel(int64_t rows, int64_t inner, int64_t chunks, int k, double s,
                                                        double t, int cap, const uint64_t* __restrict__ part_keys,
                                                        const float* __restrict__ part_state, T* values,
                                                        int64_t* indices, T* lse) {
  __shared__ uint64_t smem[kSharedCap];
  __shared__ int count;
  __shared__ unsigned long long thr;
  Candidates c{smem, cap, k, &count, &thr};
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t o = row / inner, i = row % inner;
    Online st;
    unsigned flags = 0;
    for (int64_t q = threadIdx.x; q < chunks; q += blockDim.x) {
      const float* ps = part_state + 3 * (row * chunks + q);
      st = OnlineMerge(st, Online{ps[0], ps[1]}, s);
      flags |= __float_as_uint(ps[2]);
    }
    st = BlockOnline(st, s);
    flags = BlockOr(flags);
    c.Reset();
    const int64_t total = chunks * k;
    const uint64_t* keys = part_keys + row * total;
    for (int64_t w = 0; w < total; w += kWave) {
      c.BeginWave();
      const uint64_t th = *c.thr;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = w + u * kThreads + threadIdx.x;
        if (j < total) c.Offer(keys[j], th);
      }
    }
    __syncthreads();
    c.Compact();
    Emit(c, st, flags, s, t, k, values, indices, lse, o * k * inner + i, inner, o * inner + i);
    __syncthreads();
  }
}

template <class... A>
std::string Cat(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  return s.str();
}

template <class T>
Result Launch(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t k, float temperature, T* values,
              int64_t* indices, T* lse, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const Plan p = MakePlan(outer, n, inner, k);
  if (p.rows == 0) return {};
  if (workspace_bytes < p.bytes || (p.bytes > 0 && workspace == nullptr)) {
    return {Status::kInvalid, Cat(kOp, ": workspace of ", workspace_bytes, " bytes, this shape needs ", p.bytes,
                                  " (rule: sd_cuda_softmax_topk_workspace_size)")};
  }
  char* ws = static_cast<char*>(workspace);
  const double s = 1.4426950408889634 / static_cast<double>(temperature);
  const double t = temperature;
  uint64_t* keys = p.chunks > 1 ? reinterpret_cast<uint64_t*>(ws + p.part_keys) : nullptr;
  float* state = p.chunks > 1 ? reinterpret_cast<float*>(ws + p.part_state) : nullptr;
  uint64_t* bufs = p.global_buf ? reinterpret_cast<uint64_t*>(ws + p.bufs) : nullptr;
  ChunkKernel<T><<<static_cast<unsigned>(p.grid), kThreads, 0, stream>>>(
      x, n, inner, p.chunks, p.chunk_len, p.rows * p.chunks, static_cast<int>(k), s, t, p.cap, bufs, values,
      indices, lse, keys, state);
  if (p.chunks > 1) {
    MergeKernel<T><<<static_cast<unsigned>(std::min<int64_t>(p.rows, int64_t{1} << 30)), kThreads, 0, stream>>>(
        p.rows, inner, p.chunks, static_cast<int>(k), s, t, p.cap, keys,
        state, values, indices, lse);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return {Status::kCuda, Cat(kOp, ": CUDA launch failed: ", cudaGetErrorString(e))};
  return {};
}

}  // namespace

size_t SoftmaxTopKWorkspace(int64_t outer, int64_t n, int64_t inner, int64_t k) {
  if (outer < 0 || n < 1 || inner < 0 || k < 1 || k > n) return 0;
  return MakePlan(outer, n, inner, k).bytes;
}

Result SoftmaxTopK(Dtype dtype, const void* x, int64_t outer, int64_t n, int64_t inner, int64_t k, float temperature,
                   void* values, int64_t* indices, void* lse, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream) {
  // The CPU kernel's checks and messages (ops/softmax_topk.cc).
  if (k < 1) return {Status::kInvalid, Cat(kOp, ": k ", k, " is out of range (rule: k >= 1)")};
  if (k > n) {
    return {Status::kInvalid, Cat(kOp, ": k ", k, " is larger than the axis length ", n, " (rule: 1 <= k <= axis length)")};
  }
  if (!(temperature > 0.0f)) {
    return {Status::kInvalid, Cat(kOp, ": temperature ", temperature, " is out of range (rule: temperature > 0)")};
  }
  if (n >= (int64_t{1} << 31)) {
    return {Status::kInvalid, Cat(kOp, ": axis length ", n, " exceeds the CUDA kernel's 2^31 - 1 (rule: 32-bit positions)")};
  }
  switch (dtype) {
    case Dtype::kFloat32:
      return Launch(static_cast<const float*>(x), outer, n, inner, k, temperature, static_cast<float*>(values),
                    indices, static_cast<float*>(lse), workspace, workspace_bytes, stream);
    case Dtype::kFloat16:
      return Launch(static_cast<const __half*>(x), outer, n, inner, k, temperature, static_cast<__half*>(values),
                    indices, static_cast<__half*>(lse), workspace, workspace_bytes, stream);
    case Dtype::kBFloat16:
      break;
  }
  return {Status::kInvalid, Cat(kOp, ": element type ", DtypeName(dtype),
                                " is not supported (rule: X is float32 or float16, docs/ops/SoftmaxTopK.md)")};
}

}  // namespace cuda
}  // namespace sd
