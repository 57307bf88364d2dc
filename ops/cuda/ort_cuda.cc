// Registration of the CUDA kernels for onnxruntime's CUDAExecutionProvider: custom ops of domain
// com.softdeploy whose GetExecutionProviderType is "CUDAExecutionProvider", beside the CPU ops of
// ops.inc (same names; onnxruntime picks the kernel of the EP a node is assigned to). Inputs and
// outputs live in CUDA device memory; every launch goes on the stream onnxruntime hands over
// (KernelContext_GetGPUComputeStream) and nothing here synchronises.
//
// What must stay true:
//  * A CPU-only onnxruntime never creates these kernels (no CUDA EP in its sessions), so registering
//    them costs nothing there and touches no CUDA API (CreateKernel and Compute are the only places
//    that do).
//  * Contract checks match the CPU kernels' messages (same ops/common/kernel.h helpers).
//  * SoftmaxTopK's workspace comes from the CUDA EP's allocator ("Cuda" memory info) and is released
//    right after the launch: the allocator is stream-ordered for work on the compute stream (the
//    onnxruntime CUDA kernels' own scratch-buffer idiom), and nothing else runs on it in between.
#include <cuda_runtime_api.h>

#include <cstring>
#include <limits>

#include "common/kernel.h"
#include "cuda/kernels.h"
#include "soft_token_embedding_contract.h"
#include "softmax_topk_contract.h"

namespace sd {
namespace {

constexpr const char* kCudaEp = "CUDAExecutionProvider";

template <class T>
cuda::Dtype DtypeOf() {
  if constexpr (std::is_same_v<T, float>) return cuda::Dtype::kFloat32;
  else return cuda::Dtype::kFloat16;
}

void Check(const char* op, const cuda::Result& r) {
  if (r.ok()) return;
  if (r.status == cuda::Status::kInvalid) throw OpError(r.message);
  throw std::runtime_error(r.message.rfind(op, 0) == 0 ? r.message.substr(std::strlen(op) + 2) : r.message);
}

cudaStream_t StreamOf(Ort::KernelContext& ctx) { return static_cast<cudaStream_t>(ctx.GetGPUComputeStream()); }

struct SoftmaxTopKCuda {
  static constexpr const char* kName = "SoftmaxTopK";
  static constexpr bool kFloat16 = true;
  static constexpr Port kInputs[] = {{Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}, {Elem::kInt64}, {Elem::kT, /*optional=*/true}};
  int64_t k, axis;
  float temperature;
  explicit SoftmaxTopKCuda(const Attrs& attrs)
      : k(attrs.RequiredInt("k")), axis(attrs.Int("axis", -1)), temperature(attrs.Float("temperature", 1.0f)) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    const SoftmaxTopKCall<T> call = StartSoftmaxTopK(kName, ctx, x, k, axis, temperature);
    const AxisLayout& l = call.layout;
    T* const values = call.values;
    int64_t* const indices = call.indices;
    T* const lse = call.lse;
    if (l.rows() == 0) return;
    const size_t bytes = cuda::SoftmaxTopKWorkspace(l.outer, l.n, l.inner, k);
    void* ws = nullptr;
    OrtAllocator* alloc = nullptr;
    if (bytes > 0) {
      int device = 0;
      if (cudaGetDevice(&device) != cudaSuccess) Fail(kName, "no current CUDA device");
      Ort::MemoryInfo info("Cuda", OrtDeviceAllocator, device, OrtMemTypeDefault);
      Ort::ThrowOnError(Ort::GetApi().KernelContext_GetAllocator(ctx.GetOrtKernelContext(), info, &alloc));
      ws = alloc->Alloc(alloc, bytes);
      if (ws == nullptr) {
        Ort::GetApi().ReleaseAllocator(alloc);
        Fail(kName, "could not allocate a ", bytes, "-byte CUDA workspace");
      }
    }
    const cuda::Result r = cuda::SoftmaxTopK(DtypeOf<T>(), x.data, l.outer, l.n, l.inner, k, temperature, values,
                                             indices, lse, ws, bytes, StreamOf(ctx));
    if (alloc != nullptr) {
      alloc->Free(alloc, ws);  // stream-ordered: see the header comment
      Ort::GetApi().ReleaseAllocator(alloc);
    }
    Check(kName, r);
  }
};

struct TwoPassSoftmaxCuda {
  static constexpr const char* kName = "TwoPassSoftmax";
  static constexpr bool kFloat16 = true;
  static constexpr Port kInputs[] = {{Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}};
  int64_t axis;
  explicit TwoPassSoftmaxCuda(const Attrs& attrs) : axis(attrs.Int("axis", -1)) {}
  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    if (x.rank() == 0) Fail(kName, "input must have rank >= 1, got a scalar");
    const int64_t a = NormalizeAxis(kName, axis, x.rank());
    T* y = AllocOutput<T>(ctx, 0, x.shape);
    const AxisLayout l = AxisLayout::Of(x.shape, a);
    Check(kName, cuda::TwoPassSoftmax(DtypeOf<T>(), x.data, l.outer, l.n, l.inner, y, StreamOf(ctx)));
  }
};

struct SoftpickCuda {
  static constexpr const char* kName = "Softpick";
  static constexpr bool kFloat16 = true;
  static constexpr Port kInputs[] = {{Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}};
  int64_t axis;
  float eps;
  explicit SoftpickCuda(const Attrs& attrs) : axis(attrs.Int("axis", -1)), eps(attrs.Float("eps", 1e-6f)) {
    if (!(eps >= 0.0f) || eps == std::numeric_limits<float>::infinity()) {
      Fail(kName, "eps ", eps, " is not a finite number >= 0 (rule: 0 <= eps < inf)");
    }
  }
  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    if (x.rank() == 0) Fail(kName, "input must have rank >= 1, got a scalar");
    const int64_t a = NormalizeAxis(kName, axis, x.rank());
    T* y = AllocOutput<T>(ctx, 0, x.shape);
    const AxisLayout l = AxisLayout::Of(x.shape, a);
    Check(kName, cuda::Softpick(DtypeOf<T>(), x.data, l.outer, l.n, l.inner, eps, y, StreamOf(ctx)));
  }
};

struct MaxSimCuda {
  static constexpr const char* kName = "MaxSim";
  static constexpr bool kFloat16 = true;
  static constexpr Port kInputs[] = {{Elem::kT},        {Elem::kT},         {Elem::kBool, true},
                                     {Elem::kBool, true}, {Elem::kFloat, true}, {Elem::kFloat, true}};
  static constexpr Port kOutputs[] = {{Elem::kFloat}};
  explicit MaxSimCuda(const Attrs&) {}
  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> q = GetInput<T>(ctx, 0), d = GetInput<T>(ctx, 1);
    const Input<bool> q_mask = GetInput<bool>(ctx, 2), d_mask = GetInput<bool>(ctx, 3);
    const Input<float> q_scale = GetInput<float>(ctx, 4), d_scale = GetInput<float>(ctx, 5);
    if (q.rank() != 3) Fail(kName, "Q must have rank 3 [B, Lq, dim], got shape ", ShapeStr(q.shape));
    if (d.rank() != 3) Fail(kName, "D must have rank 3 [N, Ld, dim], got shape ", ShapeStr(d.shape));
    const int64_t B = q.shape[0], Lq = q.shape[1], dim = q.shape[2], N = d.shape[0], Ld = d.shape[1];
    if (d.shape[2] != dim) {
      Fail(kName, "Q has dim ", dim, " but D has dim ", d.shape[2], " (rule: Q and D share the last dimension)");
    }
    auto side = [&](const auto& x, const char* port, int64_t rows, int64_t cols, const char* dims) {
      if (x.present && x.shape != std::vector<int64_t>{rows, cols}) {
        Fail(kName, port, " has shape ", ShapeStr(x.shape), ", expected ", dims, " = [", rows, ", ", cols, "]");
      }
    };
    side(q_mask, "QMask", B, Lq, "[B, Lq]");
    side(d_mask, "DMask", N, Ld, "[N, Ld]");
    side(q_scale, "QScale", B, Lq, "[B, Lq]");
    side(d_scale, "DScale", N, Ld, "[N, Ld]");
    float* scores = AllocOutput<float>(ctx, 0, {B, N});
    static_assert(sizeof(bool) == 1, "bool masks are read as uint8");
    Check(kName, cuda::MaxSim(DtypeOf<T>(), q.data, d.data,
                              q_mask.present ? reinterpret_cast<const uint8_t*>(q_mask.data) : nullptr,
                              d_mask.present ? reinterpret_cast<const uint8_t*>(d_mask.data) : nullptr,
                              q_scale.present ? q_scale.data : nullptr, d_scale.present ? d_scale.data : nullptr, B,
                              Lq, N, Ld, dim, scores, StreamOf(ctx)));
  }
};

// float32 only, like the CPU kernel. Mode and Noise stay on the device: their values are not checked
// here (the kernel gives a NaN row for a bad one; ops/cuda/soft_token_embedding.cu).
struct SoftTokenEmbeddingCuda {
  static constexpr const char* kName = kSoftTokenEmbedding;
  static constexpr bool kFloat16 = false;
  static constexpr Port kInputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kT, true}, {Elem::kInt64, true}};
  static constexpr Port kOutputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kInt64}, {Elem::kT}};
  SoftTokenEmbeddingContract c;
  explicit SoftTokenEmbeddingCuda(const Attrs& attrs) : c(attrs) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    static_assert(std::is_same_v<T, float>, "SoftTokenEmbedding is registered for float32 only");
    const Input<float> x = GetInput<float>(ctx, 0);
    const Input<float> emb = GetInput<float>(ctx, 1);
    const Input<float> u = GetInput<float>(ctx, 2);
    const Input<int64_t> mode = GetInput<int64_t>(ctx, 3);
    c.Check(x.shape, emb.shape, u.present ? &u.shape : nullptr, mode.present ? &mode.shape : nullptr, nullptr);
    const int64_t b = x.shape[0], v = x.shape[1], e = emb.shape[1], k = c.max_topk;
    float* mixed = AllocOutput<float>(ctx, 0, {b, e});
    float* weights = AllocOutput<float>(ctx, 1, {b, k});
    int64_t* ids = AllocOutput<int64_t>(ctx, 2, {b, k});
    float* entropy = AllocOutput<float>(ctx, 3, {b});
    auto filters = [](const Filters& f) {
      return cuda::SoftTokenEmbeddingFilters{f.temperature, f.top_k, f.top_p, f.min_p};
    };
    const cuda::SoftTokenEmbeddingParams p{filters(c.thinking),
                                           filters(c.after),
                                           k,
                                           c.NumCandidates(c.thinking, v),
                                           c.NumCandidates(c.after, v),
                                           c.noise == "gumbel",
                                           c.tau,
                                           c.noise_factor,
                                           c.clamp_min,
                                           c.clamp_max};
    const bool has_noise = SoftTokenEmbeddingContract::HasNoise(u.present ? &u.shape : nullptr);
    Check(kName, cuda::SoftTokenEmbedding(x.data, emb.data, has_noise ? u.data : nullptr,
                                          mode.present ? mode.data : nullptr, b, v, e, p, mixed, weights, ids,
                                          entropy, StreamOf(ctx)));
  }
};

// sd::CustomOp assigned to the CUDA execution provider. CustomOpBase dispatches through its CRTP
// type (CustomOp), not through this subclass, so the table entry itself is replaced.
template <class Kernel, class T>
struct CudaOp : CustomOp<Kernel, T> {
  CudaOp() { OrtCustomOp::GetExecutionProviderType = [](const OrtCustomOp*) { return kCudaEp; }; }
};

// float32, plus float16 where the kernel has it.
template <class Kernel>
void Add(Ort::CustomOpDomain& domain) {
  domain.Add(new CudaOp<Kernel, float>());
  if constexpr (Kernel::kFloat16) domain.Add(new CudaOp<Kernel, Ort::Float16_t>());
}

// Each kernel of the table answers to the op type the table gives it.
constexpr bool SameName(const char* a, const char* b) {
  return *a == *b && (*a == '\0' || SameName(a + 1, b + 1));
}
#define SD_CUDA_OP(OpType, stem) \
  static_assert(SameName(OpType##Cuda::kName, #OpType), #OpType "Cuda::kName must be \"" #OpType "\"");
#include "cuda/cuda_ops.inc"
#undef SD_CUDA_OP

}  // namespace

// Called by register.cc's Domain() in a library built with CUDA: every op of ops/cuda/cuda_ops.inc.
void RegisterCudaOps(Ort::CustomOpDomain& domain) {
#define SD_CUDA_OP(OpType, stem) Add<OpType##Cuda>(domain);
#include "cuda/cuda_ops.inc"
#undef SD_CUDA_OP
}

}  // namespace sd
