// The pure launch functions of softdeploy's CUDA kernels (ops/cuda/*.cu), shared by the C ABI
// (ops/cuda/c_api.cc: sd_cuda_* for ctypes drivers) and the onnxruntime CUDAExecutionProvider
// binding (ops/cuda/ort_cuda.cc). Each kernel's equation is in the header comment of its .cu file.
//
// Conventions (what must stay true):
//  * Pointers are device pointers; every launch is asynchronous on `stream` and never synchronises.
//  * A tensor is seen as [outer, n, inner] around the reduction axis (element (o, j, i) at
//    (o * n + j) * inner + i), as on the CPU (ops/common/kernel.h AxisLayout).
//  * Contract checks (k range, temperature, eps, shapes) run on the host before any launch and return
//    Status::kInvalid with the CPU kernels' message (op, value, rule); a CUDA launch error returns
//    Status::kCuda with cudaGetErrorString. Nothing is launched when a check fails.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace sd {
namespace cuda {

enum class Dtype : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
const char* DtypeName(Dtype t);

enum class Status : int { kOk = 0, kInvalid = 1, kCuda = 2 };
struct Result {
  Status status = Status::kOk;
  std::string message;
  bool ok() const { return status == Status::kOk; }
};

// Streaming multiprocessors of the current device (cached per device; 0 when there is none).
int SmCount();

// ---- SoftmaxTopK (ops/cuda/softmax_topk.cu) ----------------------------------------------------
// Workspace bytes the launch needs for this shape on the current device (0 = none; the launch then
// splits no row across blocks). The workspace must stay untouched until the launch has completed on
// the stream (stream-ordered reuse is fine).
size_t SoftmaxTopKWorkspace(int64_t outer, int64_t n, int64_t inner, int64_t k);
// values/lse in the input's dtype, indices int64, lse nullable ([outer, 1, inner]).
Result SoftmaxTopK(Dtype dtype, const void* x, int64_t outer, int64_t n, int64_t inner, int64_t k, float temperature,
                   void* values, int64_t* indices, void* lse, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream);

// ---- TwoPassSoftmax (ops/cuda/softmax.cu) --------------------------------------------------------
Result TwoPassSoftmax(Dtype dtype, const void* x, int64_t outer, int64_t n, int64_t inner, void* y,
                      cudaStream_t stream);

// ---- Softpick (ops/cuda/softmax.cu) --------------------------------------------------------------
Result Softpick(Dtype dtype, const void* x, int64_t outer, int64_t n, int64_t inner, float eps, void* y,
                cudaStream_t stream);

// ---- MaxSim (ops/cuda/max_sim.cu) ----------------------------------------------------------------
// q [B, Lq, dim], d [N, Ld, dim] in `dtype`; masks bool (uint8 0/1) or null; scores float32 [B, N].
// float16 / bfloat16 run on tensor cores (mma.sync through WMMA, float32 accumulation), float32 on
// CUDA cores in float32.
// q_scale [B, Lq], d_scale [N, Ld] float32 or null (1).
Result MaxSim(Dtype dtype, const void* q, const void* d, const uint8_t* q_mask, const uint8_t* d_mask,
              const float* q_scale, const float* d_scale, int64_t B,
              int64_t Lq, int64_t N, int64_t Ld, int64_t dim, float* scores, cudaStream_t stream);

// ---- SoftTokenEmbedding (ops/cuda/soft_token_embedding.cu) --------------------------------------
// float32 only. logits [B, V], embedding [V, E], noise [B, V] or null, mode [B] int64 or null (all
// thinking); mixed [B, E], weights / ids [B, max_topk], entropy [B]. The host checks the contract
// (ops/soft_token_embedding_contract.h) before the launch; kc_* = max(max_topk, top_k when on) per mode.
constexpr int64_t kSoftTokenEmbeddingMaxCandidates = 2048;  // shared memory: 16 bytes per candidate
struct SoftTokenEmbeddingFilters {
  double temperature;
  int64_t top_k;
  double top_p;
  double min_p;
};
struct SoftTokenEmbeddingParams {
  SoftTokenEmbeddingFilters thinking, after;
  int64_t max_topk, kc_thinking, kc_after;
  bool gumbel;
  float tau, noise_factor, clamp_min, clamp_max;
};
Result SoftTokenEmbedding(const float* logits, const float* embedding, const float* noise, const int64_t* mode,
                          int64_t B, int64_t V, int64_t E, const SoftTokenEmbeddingParams& p, float* mixed,
                          float* weights, int64_t* ids, float* entropy, cudaStream_t stream);

}  // namespace cuda
}  // namespace sd
