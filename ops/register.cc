// RegisterCustomOps: the library's only exported symbol. onnxruntime calls it once per
// SessionOptions that registers the library; it adds the com.softdeploy domain with every op of
// ops.inc. No exception crosses this C boundary.
#include <mutex>

#include "common/kernel.h"

#define SD_STRINGIFY_(x) #x
#define SD_STRINGIFY(x) SD_STRINGIFY_(x)

namespace sd {
#define SD_OP(OpType, stem) void Register##OpType(Ort::CustomOpDomain& domain);
#include "ops.inc"
#undef SD_OP
}  // namespace sd

namespace {

// Built once, shared by every session, never destroyed (see AddOp in common/kernel.h).
Ort::CustomOpDomain* Domain() {
  static Ort::CustomOpDomain* domain = [] {
    auto* d = new Ort::CustomOpDomain(sd::kDomain);
#define SD_OP(OpType, stem) sd::Register##OpType(*d);
#include "ops.inc"
#undef SD_OP
    return d;
  }();
  return domain;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // The runtime is older than the headers we were built with. API version 1 always exists and is
    // enough to say so.
    return api_base->GetApi(1)->CreateStatus(
        ORT_FAIL, "softdeploy: this onnxruntime is older than the API version the library was built for (" 
                  "ORT_API_VERSION " SD_STRINGIFY(ORT_API_VERSION) "); upgrade onnxruntime");
  }
  static std::once_flag init;
  std::call_once(init, [api] { Ort::InitApi(api); });
  return sd::Guard("RegisterCustomOps", [&] {
    Ort::UnownedSessionOptions session_options(options);
    session_options.Add(*Domain());
  });
}
