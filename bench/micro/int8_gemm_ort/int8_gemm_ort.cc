// RowwiseInt8MatMul (domain bench.int8): the int8 GEMM prototype of ../int8_gemm_paired.h as an onnxruntime custom
// op, so that bench/minilm_int8_rowwise.py can run all-MiniLM-L6-v2 end to end with it. Benchmark-only: AVX2 only,
// one thread, no function body, not part of softdeploy's operator contract.
//   inputs   X float [..., K]; W int8 [np * kp] in i8gemm::Weights' packed layout; scale float [np];
//            colsum int32 [np] (sum_k q[k, n]); bias float [np]
//   attrs    K, N (the unpadded sizes), groups (1, 2 or 4 vpmaddubsw results per int16 sum), levels (255 or 127)
//   output   Y float [..., N] = rows of X quantized per row, times W, scaled, plus bias (int8_gemm_paired.h)
#include <onnxruntime_cxx_api.h>

#include <string>

#include "int8_gemm_paired.h"

namespace {

struct RowwiseKernel {
  const OrtApi* api;
  int64_t K, N, groups, levels;

  OrtStatusPtr Fail(const std::string& what) const {
    return api->CreateStatus(ORT_INVALID_ARGUMENT, ("RowwiseInt8MatMul: " + what).c_str());
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) noexcept {
    const OrtValue* in[5] = {};
    for (size_t i = 0; i < 5; ++i)
      if (auto* s = api->KernelContext_GetInput(context, i, &in[i])) return s;
    OrtTensorTypeAndShapeInfo* info = nullptr;
    size_t rank = 0;
    int64_t dims[8];
    if (auto* s = api->GetTensorTypeAndShape(in[0], &info)) return s;
    OrtStatusPtr s = api->GetDimensionsCount(info, &rank);
    if (s == nullptr && (rank < 1 || rank > 8)) s = Fail("X must have rank 1 to 8");
    if (s == nullptr) s = api->GetDimensions(info, dims, rank);
    api->ReleaseTensorTypeAndShapeInfo(info);
    if (s != nullptr) return s;
    if (dims[rank - 1] != K) return Fail("X's last dimension " + std::to_string(dims[rank - 1]) + " != K " + std::to_string(K));
    int64_t M = 1;
    for (size_t i = 0; i + 1 < rank; ++i) M *= dims[i];
    dims[rank - 1] = N;
    OrtValue* out = nullptr;
    if (auto* e = api->KernelContext_GetOutput(context, 0, dims, rank, &out)) return e;
    void* ptr[5] = {};
    for (size_t i = 0; i < 5; ++i)
      if (auto* e = api->GetTensorMutableData(const_cast<OrtValue*>(in[i]), &ptr[i])) return e;
    void* y = nullptr;
    if (auto* e = api->GetTensorMutableData(out, &y)) return e;
    i8gemm::Weights w;
    w.K = K, w.N = N, w.kp = i8gemm::Round16(K), w.np = (N + i8gemm::kNR - 1) / i8gemm::kNR * i8gemm::kNR;
    w.panels = static_cast<const int8_t*>(ptr[1]);
    w.sb = static_cast<const float*>(ptr[2]);
    w.colsum = static_cast<const int32_t*>(ptr[3]);
    w.bias = static_cast<const float*>(ptr[4]);
    thread_local i8gemm::Scratch scratch;  // per thread: concurrent Run calls never share it
    i8gemm::GemmGroups(w, static_cast<const float*>(ptr[0]), M, static_cast<int>(levels), static_cast<float*>(y),
                       static_cast<int>(groups), scratch);
    return nullptr;
  }
};

struct RowwiseOp : Ort::CustomOpBase<RowwiseOp, RowwiseKernel, /*WithStatus=*/true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const noexcept {
    auto* k = new RowwiseKernel{&api, 0, 0, 0, 0};
    const char* names[4] = {"K", "N", "groups", "levels"};
    int64_t* values[4] = {&k->K, &k->N, &k->groups, &k->levels};
    for (int i = 0; i < 4; ++i) {
      if (auto* s = api.KernelInfoGetAttribute_int64(info, names[i], values[i])) {
        delete k;
        return s;
      }
    }
    if (k->groups != 1 && k->groups != 2 && k->groups != 4) {
      delete k;
      return api.CreateStatus(ORT_INVALID_ARGUMENT, "RowwiseInt8MatMul: groups must be 1, 2 or 4");
    }
    *kernel = k;
    return nullptr;
  }
  const char* GetName() const { return "RowwiseInt8MatMul"; }
  size_t GetInputTypeCount() const { return 5; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    switch (i) {
      case 1: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
      case 3: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
      default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    }
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  static RowwiseOp op;  // lives as long as the process: sessions keep a pointer to it
  static Ort::CustomOpDomain* domain = nullptr;
  try {
    if (domain == nullptr) {
      domain = new Ort::CustomOpDomain("bench.int8");
      domain->Add(&op);
    }
    Ort::UnownedSessionOptions(options).Add(*domain);
  } catch (const Ort::Exception& e) {
    return Ort::GetApi().CreateStatus(e.GetOrtErrorCode(), e.what());
  }
  return nullptr;
}
