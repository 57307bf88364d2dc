// CopyOp (domain bench.floor): the least work a custom op can do per call -- read the input's shape,
// ask onnxruntime for the output, copy the data -- through onnxruntime's C API directly. What a call
// of a one-node model with it costs above a built-in Identity is onnxruntime's own per-call cost of a
// custom op, which no kernel library can remove (bench/custom_op_floor.py).
#include <onnxruntime_cxx_api.h>

#include <cstring>

namespace {

// Every status is checked: a failed call returns it to onnxruntime (never seen in the benchmark).
struct CopyKernel {
  const OrtApi* api;
  OrtStatusPtr ComputeV2(OrtKernelContext* context) noexcept {
    const OrtValue* in = nullptr;
    OrtTensorTypeAndShapeInfo* info = nullptr;
    size_t rank = 0;
    int64_t dims[8];
    if (auto* s = api->KernelContext_GetInput(context, 0, &in)) return s;
    if (auto* s = api->GetTensorTypeAndShape(in, &info)) return s;
    OrtStatusPtr s = api->GetDimensionsCount(info, &rank);
    if (s == nullptr && rank > 8) s = api->CreateStatus(ORT_INVALID_ARGUMENT, "CopyOp: rank > 8");
    if (s == nullptr) s = api->GetDimensions(info, dims, rank);
    api->ReleaseTensorTypeAndShapeInfo(info);
    if (s != nullptr) return s;
    OrtValue* out = nullptr;
    void* src = nullptr;
    void* dst = nullptr;
    if (auto* e = api->KernelContext_GetOutput(context, 0, dims, rank, &out)) return e;
    if (auto* e = api->GetTensorMutableData(const_cast<OrtValue*>(in), &src)) return e;
    if (auto* e = api->GetTensorMutableData(out, &dst)) return e;
    size_t n = 1;
    for (size_t i = 0; i < rank; ++i) n *= static_cast<size_t>(dims[i]);
    std::memcpy(dst, src, n * sizeof(float));
    return nullptr;
  }
};

struct CopyOp : Ort::CustomOpBase<CopyOp, CopyKernel, /*WithStatus=*/true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo*, void** kernel) const noexcept {
    *kernel = new CopyKernel{&api};
    return nullptr;
  }
  const char* GetName() const { return "CopyOp"; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  static CopyOp op;  // lives as long as the process: sessions keep a pointer to it
  static Ort::CustomOpDomain* domain = nullptr;
  try {
    if (domain == nullptr) {
      domain = new Ort::CustomOpDomain("bench.floor");
      domain->Add(&op);
    }
    Ort::UnownedSessionOptions(options).Add(*domain);
  } catch (const Ort::Exception& e) {
    return Ort::GetApi().CreateStatus(e.GetOrtErrorCode(), e.what());
  }
  return nullptr;
}
