// The C ABI of the CUDA kernels: plain functions on device pointers and a cudaStream_t (passed as
// void*), for drivers without onnxruntime (tests/ops/test_cuda.py through ctypes, bench/gpu/).
// Exported by ops/exports.map only in a library built with CUDA (SoftdeployLibraryInfo's "cuda"
// says so).
//
// Every function returns 0 on success, 1 for a contract violation (nothing launched) and 2 for a
// CUDA error; sd_cuda_last_error copies the calling thread's last message (snprintf-like). dtype:
// 0 float32, 1 float16, 2 bfloat16 (sd::cuda::Dtype). Launches are asynchronous on `stream`.
//
// What must stay true: no exception crosses the ABI, and nothing CUDA runs at library load.
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "cuda/kernels.h"
#include "soft_token_embedding_contract.h"

namespace sd {
namespace cuda {

const char* DtypeName(Dtype t) {
  switch (t) {
    case Dtype::kFloat32: return "float32";
    case Dtype::kFloat16: return "float16";
    case Dtype::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

int SmCount() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  // Cached per device: the attribute query is cheap but not free on every launch.
  static int cache[64] = {0};
  if (device >= 0 && device < 64 && cache[device] > 0) return cache[device];
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (device >= 0 && device < 64) cache[device] = sms;
  return sms;
}

}  // namespace cuda
}  // namespace sd

namespace {

thread_local std::string last_error;

template <class F>
int Call(F&& f) noexcept {
  try {
    const sd::cuda::Result r = f();
    last_error = r.message;
    return static_cast<int>(r.status);
  } catch (const std::exception& e) {
    last_error = e.what();
    return 2;
  } catch (...) {
    last_error = "unknown error";
    return 2;
  }
}

sd::cuda::Dtype AsDtype(int dtype) { return static_cast<sd::cuda::Dtype>(dtype); }

bool ValidDtype(int dtype) { return dtype >= 0 && dtype <= 2; }

sd::cuda::Result BadDtype(const char* op, int dtype) {
  return {sd::cuda::Status::kInvalid, std::string(op) + ": dtype code " + std::to_string(dtype) +
                                          " names no element type (rule: 0 float32, 1 float16, 2 bfloat16)"};
}

}  // namespace

#define SD_CUDA_API extern "C" __attribute__((visibility("default")))

SD_CUDA_API size_t sd_cuda_last_error(char* out, size_t capacity) {
  if (out != nullptr && capacity > 0) {
    const size_t n = std::min(last_error.size(), capacity - 1);
    std::memcpy(out, last_error.data(), n);
    out[n] = '\0';
  }
  return last_error.size();
}

// Number of CUDA devices the runtime sees (0 without a driver or device; never fails).
SD_CUDA_API int sd_cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

SD_CUDA_API size_t sd_cuda_softmax_topk_workspace_size(int64_t outer, int64_t n, int64_t inner, int64_t k) {
  try {
    return sd::cuda::SoftmaxTopKWorkspace(outer, n, inner, k);
  } catch (...) {
    return 0;
  }
}

SD_CUDA_API int sd_cuda_softmax_topk(int dtype, const void* x, int64_t outer, int64_t n, int64_t inner, int64_t k,
                                     float temperature, void* values, int64_t* indices, void* lse, void* workspace,
                                     size_t workspace_bytes, void* stream) {
  return Call([&] {
    if (!ValidDtype(dtype)) return BadDtype("SoftmaxTopK", dtype);
    return sd::cuda::SoftmaxTopK(AsDtype(dtype), x, outer, n, inner, k, temperature, values, indices, lse, workspace,
                                 workspace_bytes, static_cast<cudaStream_t>(stream));
  });
}

SD_CUDA_API int sd_cuda_two_pass_softmax(int dtype, const void* x, int64_t outer, int64_t n, int64_t inner, void* y,
                                         void* stream) {
  return Call([&] {
    if (!ValidDtype(dtype)) return BadDtype("TwoPassSoftmax", dtype);
    return sd::cuda::TwoPassSoftmax(AsDtype(dtype), x, outer, n, inner, y, static_cast<cudaStream_t>(stream));
  });
}

SD_CUDA_API int sd_cuda_softpick(int dtype, const void* x, int64_t outer, int64_t n, int64_t inner, float eps, void* y,
                                 void* stream) {
  return Call([&] {
    if (!ValidDtype(dtype)) return BadDtype("Softpick", dtype);
    return sd::cuda::Softpick(AsDtype(dtype), x, outer, n, inner, eps, y, static_cast<cudaStream_t>(stream));
  });
}

SD_CUDA_API int sd_cuda_max_sim(int dtype, const void* q, const void* d, const uint8_t* q_mask, const uint8_t* d_mask,
                                const float* q_scale, const float* d_scale, int64_t B, int64_t Lq, int64_t N,
                                int64_t Ld, int64_t dim, float* scores, void* stream) {
  return Call([&] {
    if (!ValidDtype(dtype)) return BadDtype("MaxSim", dtype);
    return sd::cuda::MaxSim(AsDtype(dtype), q, d, q_mask, d_mask, q_scale, d_scale, B, Lq, N, Ld, dim, scores,
                            static_cast<cudaStream_t>(stream));
  });
}

// SoftTokenEmbedding (float32): the host checks of the contract (ops/soft_token_embedding_contract.h, the
// CPU kernel's messages) on the shapes and attributes, then the launch. noise 0 "none", 1 "gumbel"; noise_ptr and
// mode may be null (omitted). Mode and Noise values stay on the device (see ops/cuda/soft_token_embedding.cu).
SD_CUDA_API int sd_cuda_soft_token_embedding(const float* logits, const float* embedding, const float* noise_ptr,
                                             const int64_t* mode, int64_t B, int64_t V, int64_t E, double temperature,
                                             int64_t top_k, double top_p, double min_p, double at_temperature,
                                             int64_t at_top_k, double at_top_p, double at_min_p, int64_t max_topk,
                                             int noise, float tau, float noise_factor, float clamp_min,
                                             float clamp_max, float* mixed, float* weights, int64_t* ids,
                                             float* entropy, void* stream) {
  return Call([&]() -> sd::cuda::Result {
    const sd::Filters thinking{temperature, top_k, top_p, min_p}, after{at_temperature, at_top_k, at_top_p, at_min_p};
    const std::string kind = noise == 0 ? "none" : noise == 1 ? "gumbel" : "code " + std::to_string(noise);
    const sd::SoftTokenEmbeddingContract c(thinking, after, max_topk, kind, tau, noise_factor, clamp_min, clamp_max);
    try {
      const std::vector<int64_t> noise_shape{B, V}, mode_shape{B};
      c.Check({B, V}, {V, E}, noise_ptr != nullptr ? &noise_shape : nullptr, mode != nullptr ? &mode_shape : nullptr,
              nullptr);
    } catch (const sd::OpError& e) {
      return {sd::cuda::Status::kInvalid, e.what()};
    }
    auto filters = [](const sd::Filters& f) {
      return sd::cuda::SoftTokenEmbeddingFilters{f.temperature, f.top_k, f.top_p, f.min_p};
    };
    const sd::cuda::SoftTokenEmbeddingParams p{filters(thinking), filters(after), max_topk,
                                               c.NumCandidates(thinking, V), c.NumCandidates(after, V), noise == 1,
                                               tau, noise_factor, clamp_min, clamp_max};
    return sd::cuda::SoftTokenEmbedding(logits, embedding, noise_ptr, mode, B, V, E, p, mixed, weights, ids, entropy,
                                        static_cast<cudaStream_t>(stream));
  });
}

// Every op of ops/cuda/cuda_ops.inc has its entry point sd_cuda_<stem> above.
#define SD_CUDA_OP(OpType, stem) \
  static_assert(sizeof(&sd_cuda_##stem) != 0, "ops/cuda/cuda_ops.inc names " #OpType ": define sd_cuda_" #stem);
#include "cuda/cuda_ops.inc"
#undef SD_CUDA_OP
