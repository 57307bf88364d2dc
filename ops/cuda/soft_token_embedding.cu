// SoftTokenEmbedding on CUDA -- soft thinking's next input embedding (the CPU kernel is
// ops/soft_token_embedding.cc; the contract and the float64 oracle: softdeploy/ops/soft_token_embedding.py,
// docs/ops/SoftTokenEmbedding.md).
//
//   p       = softmax(Logits[b] / T),  Entropy = -sum_j p_j ln p_j          (T, filters by Mode[b])
//   Ids     = the first max_topk entries ranked by logit (ties: lower id); keep = the prefix that
//             top_k, top_p (on the top_k-renormalised p) and min_p (p >= min_p p_max) each allow
//   w       = p renormalised over the kept slots (0 past them); noise "gumbel" on thinking rows:
//             w = softmax((ln(w + 1e-6) + noise_factor clip(-ln(-ln U[Ids]), lo, hi)) / tau), stable re-sort
//   Mixed   = sum_k w_k Embedding[Ids_k]
//
// How: one block per row, three kinds of passes over the row in global memory -- the maximum and the
// NaN / +inf flags; the normaliser D = sum exp((x - M) / T) and the entropy's sum sum e z in double;
// then kc selection passes, each a block-wide maximum of the packed ranking keys (common.cuh Pack:
// the contract's total order, distinct per index) strictly below the previous winner, so the kc best
// come out in rank order with exact ties. kc = max(max_topk, top_k when on) <= kMaxCandidates. Thread 0
// then applies the filters, the weights and the noise to the kc candidates in double (as the CPU
// kernel's Finish does), and the block forms Mixed, one column per thread, the slots in order with one
// fma each. The passes re-read the row (kc + 2 reads): simple and exact, not the one-read design of
// SoftmaxTopK's CUDA kernel; at max_topk 10 and V 152k a row is ~0.6 MB, so the reads stay in L2.
//
// What a device kernel cannot do: raise. A Noise value outside [0, 1] (or NaN) that a thinking row
// reads, or a Mode value other than 0 / 1, gives that row NaN Weights, Mixed and Entropy (the CPU kernel
// raises; the CUDA binding checks every rule it can on the host, without copying Mode or Noise back).
//
// What must stay true: rows are independent (a block per row); the ranking is the packed key's.
#include <cmath>
#include <string>

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace sd {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr double kLogEps = 1e-6;  // SofT-GRPO: log(topk_probs + 1e-6)

__device__ inline unsigned long long BlockMaxU64(unsigned long long v) {
  __shared__ unsigned long long warp_vals[32];
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    v = other > v ? other : v;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? warp_vals[lane] : 0ull;
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    v = other > v ? other : v;
  }
  return v;
}

__device__ inline double BlockSumD(double v) {
  __shared__ double warp_vals[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? warp_vals[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

__global__ void __launch_bounds__(kThreads)
    SoftTokenEmbeddingRows(const float* __restrict__ x, const float* __restrict__ emb, const float* __restrict__ noise,
                           const int64_t* __restrict__ mode, int64_t V, int64_t E, SoftTokenEmbeddingParams p,
                           float* __restrict__ mixed, float* __restrict__ weights, int64_t* __restrict__ ids,
                           float* __restrict__ entropy) {
  extern __shared__ unsigned char smem[];
  const int64_t kc_cap = p.kc_thinking > p.kc_after ? p.kc_thinking : p.kc_after;
  uint64_t* cand = reinterpret_cast<uint64_t*>(smem);                 // [kc_cap]
  double* e = reinterpret_cast<double*>(cand + kc_cap);               // [kc_cap]
  float* w_sh = reinterpret_cast<float*>(e + kc_cap);                 // [max_topk]
  int64_t* id_sh = reinterpret_cast<int64_t*>(w_sh + ((p.max_topk + 1) & ~int64_t{1}));  // [max_topk], 8-aligned
  __shared__ double row_entropy;

  const int64_t r = blockIdx.x;
  const float* row = x + r * V;
  const int64_t m_r = mode != nullptr ? mode[r] : 0;
  const bool is_after = m_r == 1;
  const SoftTokenEmbeddingFilters f = is_after ? p.after : p.thinking;
  const int64_t kc = is_after ? p.kc_after : p.kc_thinking;
  const int64_t K = p.max_topk;

  // Pass 1: the maximum over entries that are not NaN, and the NaN / +inf flags.
  float m = -__int_as_float(0x7F800000);
  unsigned flags = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = row[j];
    if (v != v) flags |= kHasNan;
    else if (v == __int_as_float(0x7F800000)) flags |= kHasPosInf;
    else m = fmaxf(m, v);
  }
  m = BlockReduce(m, MaxOp(), -__int_as_float(0x7F800000));
  flags = BlockOr(flags);
  const bool special = flags != 0 || m == -__int_as_float(0x7F800000) || (m_r != 0 && m_r != 1);

  // Pass 2: D = sum exp((x - M) / T) and sum exp(z) z, z = (x - M) / T, in double.
  double d = 0.0, d1 = 0.0;
  if (!special) {
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float v = row[j];
      if (v > -__int_as_float(0x7F800000)) {
        const double z = (static_cast<double>(v) - m) / f.temperature;
        const double ez = exp(z);
        d += ez;
        d1 += ez * z;
      }
    }
  }
  d = BlockSumD(d);
  d1 = BlockSumD(d1);

  // kc selection passes: the best packed key strictly below the previous winner.
  uint64_t below = ~0ull;
  for (int64_t i = 0; i < kc; ++i) {
    uint64_t best = 0ull;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const uint64_t key = Pack(RankKey(row[j]), static_cast<uint32_t>(j));
      if (key < below && key > best) best = key;
    }
    best = BlockMaxU64(best);
    if (threadIdx.x == 0) cand[i] = best;
    below = best;
  }
  __syncthreads();

  if (threadIdx.x == 0) {
    if (special) {
      for (int64_t i = 0; i < K; ++i) {
        w_sh[i] = __int_as_float(0x7FC00000);
        id_sh[i] = PackedIndex(cand[i]);
      }
      row_entropy = __longlong_as_double(0x7FF8000000000000ll);
    } else {
      row_entropy = log(d) - d1 / d;
      const float top = KeyLogit(PackedKey(cand[0]));
      for (int64_t i = 0; i < kc; ++i) e[i] = exp((static_cast<double>(KeyLogit(PackedKey(cand[i]))) - top) / f.temperature);
      const bool top_k_on = f.top_k > 0 && f.top_k < V;
      int64_t n = top_k_on && f.top_k < K ? f.top_k : K;
      if (f.top_p < 1.0) {
        double z = d;
        if (top_k_on) {
          z = 0.0;
          for (int64_t i = 0; i < f.top_k; ++i) z += e[i];
        }
        double before = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          if (!(before < f.top_p * z)) {
            n = i;
            break;
          }
          before += e[i];
        }
      }
      if (f.min_p > 0.0) {
        for (int64_t i = 0; i < n; ++i) {
          if (!(e[i] >= f.min_p)) {
            n = i;
            break;
          }
        }
      }
      double kept = 0.0;
      for (int64_t i = 0; i < n; ++i) kept += e[i];
      // e[0, K) becomes the weights (double), id_sh the ids
      for (int64_t i = 0; i < K; ++i) {
        id_sh[i] = PackedIndex(cand[i]);
        e[i] = i < n ? e[i] / kept : 0.0;
      }
      if (p.gumbel && !is_after) {
        double y_max = -HUGE_VAL;
        bool bad = false;
        for (int64_t i = 0; i < K; ++i) {
          const float u = noise[r * V + id_sh[i]];
          if (!(u >= 0.0f && u <= 1.0f)) bad = true;
          const double g = fmin(fmax(-log(-log(static_cast<double>(u))), static_cast<double>(p.clamp_min)),
                                static_cast<double>(p.clamp_max));
          e[i] = (log(e[i] + kLogEps) + static_cast<double>(p.noise_factor) * g) / static_cast<double>(p.tau);
          y_max = fmax(y_max, e[i]);
        }
        double sum = 0.0;
        for (int64_t i = 0; i < K; ++i) {
          e[i] = exp(e[i] - y_max);
          sum += e[i];
        }
        for (int64_t i = 0; i < K; ++i) e[i] = bad ? __longlong_as_double(0x7FF8000000000000ll) : e[i] / sum;
        if (bad) row_entropy = __longlong_as_double(0x7FF8000000000000ll);
        // stable insertion sort by weight, descending (ties keep the rank order)
        for (int64_t i = 1; i < K; ++i) {
          const double wi = e[i];
          const int64_t ii = id_sh[i];
          int64_t j = i;
          while (j > 0 && e[j - 1] < wi) {
            e[j] = e[j - 1];
            id_sh[j] = id_sh[j - 1];
            --j;
          }
          e[j] = wi;
          id_sh[j] = ii;
        }
      }
      for (int64_t i = 0; i < K; ++i) w_sh[i] = static_cast<float>(e[i]);
    }
    for (int64_t i = 0; i < K; ++i) {
      weights[r * K + i] = w_sh[i];
      ids[r * K + i] = id_sh[i];
    }
    entropy[r] = static_cast<float>(row_entropy);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < E; c += blockDim.x) {
    float a = 0.0f;
    for (int64_t i = 0; i < K; ++i) a = fmaf(w_sh[i], emb[id_sh[i] * E + c], a);
    mixed[r * E + c] = a;
  }
}

// Dynamic shared memory of a block: the candidates' keys and exps, then the weights and ids.
size_t SoftTokenEmbeddingSharedBytes(const SoftTokenEmbeddingParams& p) {
  const int64_t kc = p.kc_thinking > p.kc_after ? p.kc_thinking : p.kc_after;
  return static_cast<size_t>(kc) * (sizeof(uint64_t) + sizeof(double)) +
         static_cast<size_t>((p.max_topk + 1) & ~int64_t{1}) * sizeof(float) +
         static_cast<size_t>(p.max_topk) * sizeof(int64_t);
}

}  // namespace

Result SoftTokenEmbedding(const float* logits, const float* embedding, const float* noise, const int64_t* mode,
                          int64_t B, int64_t V, int64_t E, const SoftTokenEmbeddingParams& p, float* mixed,
                          float* weights, int64_t* ids, float* entropy, cudaStream_t stream) {
  const int64_t kc = p.kc_thinking > p.kc_after ? p.kc_thinking : p.kc_after;
  if (kc > kSoftTokenEmbeddingMaxCandidates) {
    return {Status::kInvalid, "SoftTokenEmbedding: max(max_topk, top_k) = " + std::to_string(kc) +
                                  " is above the CUDA kernel's " + std::to_string(kSoftTokenEmbeddingMaxCandidates) +
                                  " candidates (rule: on CUDA, max_topk and top_k <= " +
                                  std::to_string(kSoftTokenEmbeddingMaxCandidates) + ")"};
  }
  if (V >= (int64_t{1} << 32) - 1) {
    return {Status::kInvalid, "SoftTokenEmbedding: V = " + std::to_string(V) +
                                  " does not fit the packed ranking key (rule: V < 2^32 - 1 on CUDA)"};
  }
  if (B == 0) return {};
  SoftTokenEmbeddingRows<<<static_cast<unsigned>(B), kThreads, SoftTokenEmbeddingSharedBytes(p), stream>>>(
      logits, embedding, noise, mode, V, E, p, mixed, weights, ids, entropy);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return {Status::kCuda, std::string("SoftTokenEmbedding: ") + cudaGetErrorString(err)};
  return {};
}

}  // namespace cuda
}  // namespace sd
