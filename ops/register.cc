// The library's two exported symbols. RegisterCustomOps: onnxruntime calls it once per
// SessionOptions that registers the library; it adds the com.softdeploy domain with every op of
// ops.inc. SoftdeployLibraryInfo: what the library is and which kernel variant it runs, for
// softdeploy/runtime/library.py (doctor, `softdeploy ops`, reports) and anyone with ctypes.
// No exception crosses either C boundary.
#include <cstring>
#include <mutex>
#include <string>

#include "common/kernel.h"

#define SD_STRINGIFY_(x) #x
#define SD_STRINGIFY(x) SD_STRINGIFY_(x)

namespace sd {
#define SD_OP(OpType, stem) void Register##OpType(Ort::CustomOpDomain& domain);
#include "ops.inc"
#undef SD_OP
#ifdef SD_WITH_CUDA
void RegisterCudaOps(Ort::CustomOpDomain& domain);  // ops/cuda/ort_cuda.cc
#endif
}  // namespace sd

namespace {

// Built once, shared by every session, never destroyed (see AddOp in common/kernel.h).
Ort::CustomOpDomain* Domain() {
  static Ort::CustomOpDomain* domain = [] {
    auto* d = new Ort::CustomOpDomain(sd::kDomain);
#define SD_OP(OpType, stem) sd::Register##OpType(*d);
#include "ops.inc"
#undef SD_OP
#ifdef SD_WITH_CUDA
    // The same op names for onnxruntime's CUDAExecutionProvider; a CPU-only session never creates them.
    sd::RegisterCudaOps(*d);
#endif
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

namespace {

std::string JsonString(const std::string& v) {
  std::string out = "\"";
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// A JSON list of the op types of an X-macro list (ops.inc, cuda/cuda_ops.inc).
#define SD_JSON_OP(OpType, stem) ops += std::string(ops.empty() ? "" : ", ") + "\"" #OpType "\"";

// What of the GPU path this library holds (decided at build time; nothing CUDA runs to answer).
std::string CudaJson() {
#ifdef SD_WITH_CUDA
  std::string ops;
#define SD_CUDA_OP SD_JSON_OP
#include "cuda/cuda_ops.inc"
#undef SD_CUDA_OP
  return "{\"compiled\": true, \"architectures\": \"" SD_CUDA_ARCHS "\", \"cuda_version\": \"" SD_CUDA_VERSION
         "\", \"ops\": [" + ops + "], \"execution_provider\": \"CUDAExecutionProvider\", \"c_abi\": \"sd_cuda_*\"}";
#else
  return "{\"compiled\": false}";
#endif
}

#if defined(__clang__)
constexpr const char* kCompiler = "clang " __clang_version__;
#elif defined(__GNUC__)
constexpr const char* kCompiler = "gcc " __VERSION__;
#else
constexpr const char* kCompiler = "unknown";
#endif

std::string LibraryInfoJson() {
  const sd::IsaChoice isa = sd::ChooseIsa();
  std::string ops;
#define SD_OP SD_JSON_OP
#include "ops.inc"
#undef SD_OP
  return sd::StrCat(
      "{\"library\": \"softdeploy_ops\", \"version\": ", JsonString(SD_VERSION),
      ", \"ort_api_version\": ", ORT_API_VERSION, ", \"domain\": ", JsonString(sd::kDomain),
      ", \"opset_version\": ", sd::kOpsetVersion, ", \"ops\": [", ops, "]",
      ", \"isa_detected\": ", JsonString(sd::IsaName(isa.detected)),
      ", \"isa_requested\": ", isa.requested.empty() ? std::string("null") : JsonString(isa.requested),
      ", \"isa_request_valid\": ", isa.valid ? "true" : "false",
      ", \"isa_selected\": ", isa.valid ? JsonString(sd::IsaName(isa.selected)) : std::string("null"),
      ", \"isa_note\": ", isa.note.empty() ? std::string("null") : JsonString(isa.note),
      ", \"isa_cpu_limit\": ", isa.cpu_limit.empty() ? std::string("null") : JsonString(isa.cpu_limit),
      // what the int8 kernels check at creation (RowwiseInt8MatMul's VNNI tile): CPUID, so an emulated CPU
      // (bench/cpuid_avx2.c) reads as the kernels see it
      ", \"avx512_vnni\": ", isa.detected == sd::Isa::kAvx512 && sd::CpuHasAvx512Vnni() ? "true" : "false",
      // the avx2 variant's VEX vpdpbusd ymm tiles (RowwiseInt8MatMul's, MaxSim's int8), as the kernels decide
      ", \"avx_vnni\": ", sd::KernelsUseAvxVnni() ? "true" : "false",
      ", \"compiler\": ", JsonString(kCompiler), ", \"cuda\": ", CudaJson(), "}");
}

}  // namespace

// Writes a JSON object describing the library into out[0, capacity) (always NUL-terminated when
// capacity > 0, like snprintf) and returns its full length without the NUL; 0 on failure. Keys:
// library, version, ort_api_version (the headers it was compiled against), domain, opset_version,
// ops, isa_detected, isa_requested (SOFTDEPLOY_ISA or null), isa_request_valid, isa_selected (what a
// kernel created now runs; null when the request is invalid and kernel creation fails), isa_note
// (why selected differs from requested, or null), isa_cpu_limit (SOFTDEPLOY_TEST_CPU, a test setting
// capping isa_detected, or null), avx512_vnni (the detected variant is avx512 and CPUID reports AVX-512 VNNI: the
// int8 kernels' vpdpbusd tiles run), avx_vnni (CPUID reports AVX-VNNI and SOFTDEPLOY_TEST_CPU is unset: with
// the avx2 variant selected, the int8 kernels' VEX vpdpbusd ymm tiles run), compiler, cuda ({"compiled": false}, or compiled true with
// architectures (CMAKE_CUDA_ARCHITECTURES, e.g. "80-real,90"), cuda_version, ops, execution_provider and
// c_abi). Computed at each call: the ISA fields follow
// SOFTDEPLOY_ISA and SOFTDEPLOY_TEST_CPU as kernels created at that moment would.
extern "C" __attribute__((visibility("default"))) size_t SoftdeployLibraryInfo(char* out, size_t capacity) {
  try {
    const std::string info = LibraryInfoJson();
    if (out != nullptr && capacity > 0) {
      const size_t n = std::min(info.size(), capacity - 1);
      std::memcpy(out, info.data(), n);
      out[n] = '\0';
    }
    return info.size();
  } catch (...) {
    if (out != nullptr && capacity > 0) out[0] = '\0';
    return 0;
  }
}
