// The thin binding layer between onnxruntime's custom-op C API and softdeploy's pure compute
// functions. One header so that every ops/<stem>.cc reads the same way:
//
//   struct MyKernel {
//     static constexpr const char* kName = "MyOp";            // ONNX op type, as in ops.inc
//     static constexpr sd::Port kInputs[] = {{sd::Elem::kT}};  // kT = the float type of this instance
//     static constexpr sd::Port kOutputs[] = {{sd::Elem::kT}};
//     explicit MyKernel(const sd::Attrs& attrs);              // reads + validates attributes
//     template <class T> void Compute(Ort::KernelContext& ctx) const;  // validates inputs, runs
//   };
//   SD_REGISTER_KERNEL(MyOp, MyKernel)   // float32 and float16 instances
//
// What must stay true:
//  * No C++ exception crosses the C ABI: kernel creation and Compute run inside Guard(), which turns
//    sd::OpError (contract violations) into ORT_INVALID_ARGUMENT statuses and anything else into a
//    failure status naming the op.
//  * Compute is const and kernels hold only attributes and what they derive at creation from
//    constant inputs (Attrs::ConstantInput), never written afterwards: onnxruntime may call Run()
//    concurrently on one session, i.e. Compute concurrently on one kernel instance.
//  * Threads come from onnxruntime's intra-op pool (KernelContext_ParallelFor), so the session's
//    thread settings hold. Work inside ParallelFor must not throw.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/cpu.h"

namespace sd {

constexpr const char* kDomain = "com.softdeploy";
// The one opset version of the domain the kernels implement (softdeploy.OPSET_VERSION), reported by
// SoftdeployLibraryInfo. The kernels cannot refuse a model importing com.softdeploy at another
// version: the OrtKernelInfo API of ORT_API_VERSION 21 does not expose the opset, and onnxruntime
// builds one schema per custom op name, since the first registration's start version, valid up to
// opset 1000 -- so a node of opset 2 resolves to since-version 1 and matches a kernel registered
// for [1, 1] alike (CustomOpBase's start_ver_ / end_ver_ cannot tell them apart; tried). Session
// (softdeploy/runtime/session.py) refuses such models before onnxruntime sees them.
constexpr int kOpsetVersion = 1;

// A violated operator contract (bad attribute, bad shape, bad value). Message: "<Op>: <what>".
class OpError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}

template <class... Args>
[[noreturn]] void Fail(const char* op, const Args&... args) {
  throw OpError(StrCat(op, ": ", args...));
}

inline std::string ShapeStr(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Runs f, converting every exception into an onnxruntime status (nullptr on success).
template <class F>
OrtStatusPtr Guard(const char* op, F&& f) noexcept {
  const OrtApi& api = Ort::GetApi();
  try {
    f();
    return nullptr;
  } catch (const OpError& e) {
    return api.CreateStatus(ORT_INVALID_ARGUMENT, e.what());
  } catch (const EnvironmentError& e) {
    return api.CreateStatus(ORT_FAIL, StrCat("softdeploy kernel library: cannot create ", op, ": ", e.what()).c_str());
  } catch (const Ort::Exception& e) {
    return api.CreateStatus(e.GetOrtErrorCode(), StrCat(op, ": ", e.what()).c_str());
  } catch (const std::bad_alloc&) {
    return api.CreateStatus(ORT_FAIL, StrCat(op, ": out of memory").c_str());
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_FAIL, StrCat(op, ": ", e.what()).c_str());
  } catch (...) {
    return api.CreateStatus(ORT_FAIL, StrCat(op, ": unknown error").c_str());
  }
}

// ---- attributes -------------------------------------------------------------------------------

// Reads a node's attributes. onnxruntime's getters fail alike for an absent attribute and for one
// of another type, so a failed getter probes the others: an attribute present with the wrong type
// (INT temperature=2 where FLOAT is declared) is an error naming the op, the value and the rule --
// never the default. An attribute name the op does not declare cannot be seen from here (the C API
// of ORT_API_VERSION 21 has no way to list a node's attributes): softdeploy.runtime.Session checks
// names against the registry before onnxruntime sees the model.
class Attrs {
 public:
  Attrs(const OrtApi& api, const OrtKernelInfo* info, const char* op) : api_(api), info_(info), op_(op) {}

  int64_t Int(const char* name, int64_t fallback) const {
    int64_t v = 0;
    if (Ok(api_.KernelInfoGetAttribute_int64(info_, name, &v))) return v;
    RejectOtherType(name, "INT");
    return fallback;
  }
  int64_t RequiredInt(const char* name) const {
    int64_t v = 0;
    if (Ok(api_.KernelInfoGetAttribute_int64(info_, name, &v))) return v;
    RejectOtherType(name, "INT");
    Fail(op_, NodeName(), "attribute '", name, "' is required (rule: '", name,
         "' is an INT attribute without a default)");
  }
  float Float(const char* name, float fallback) const {
    float v = 0;
    if (Ok(api_.KernelInfoGetAttribute_float(info_, name, &v))) return v;
    RejectOtherType(name, "FLOAT");
    return fallback;
  }
  std::string String(const char* name, const std::string& fallback) const {
    std::string v;
    if (GetString(name, &v)) return v;
    RejectOtherType(name, "STRING");
    return fallback;
  }
  const char* op() const { return op_; }

  // Input `index` when the model holds it as a constant initializer (onnxruntime keeps the value alive and
  // unchanged for the session's life), else nullptr: a graph input or a computed value, known only at Compute.
  const OrtValue* ConstantInput(size_t index) const {
    int is_constant = 0;
    const OrtValue* value = nullptr;
    if (!Ok(api_.KernelInfoGetConstantInput_tensor(info_, index, &is_constant, &value)) || !is_constant) return nullptr;
    return value;
  }

 private:
  bool Ok(OrtStatus* status) const {
    if (status == nullptr) return true;
    api_.ReleaseStatus(status);
    return false;
  }
  bool GetString(const char* name, std::string* out) const {
    size_t size = 0;
    if (!Ok(api_.KernelInfoGetAttribute_string(info_, name, nullptr, &size))) return false;
    std::string v(size, '\0');
    if (!Ok(api_.KernelInfoGetAttribute_string(info_, name, v.data(), &size))) return false;
    if (!v.empty() && v.back() == '\0') v.pop_back();
    *out = std::move(v);
    return true;
  }
  // Fails when `name` is present with a type other than `want`; returns when it is absent. The scalar
  // getters check the attribute's type; the array getters do not (onnxruntime copies the list field of
  // that element type, so any present attribute "succeeds", with 0 values unless it is that list): they
  // tell presence and the INTS / FLOATS that hold values, and a TENSOR is probed by its own checked
  // getter. What is left -- STRINGS, an empty INTS or FLOATS, GRAPH and the like -- the C API of
  // ORT_API_VERSION 21 cannot tell apart, and the message says so instead of guessing.
  void RejectOtherType(const char* name, const char* want) const {
    std::string got;
    int64_t i = 0;
    float f = 0;
    std::string s;
    size_t n_ints = 0, n_floats = 0;
    if (std::string(want) != "INT" && Ok(api_.KernelInfoGetAttribute_int64(info_, name, &i))) {
      got = StrCat("INT ", i);
    } else if (std::string(want) != "FLOAT" && Ok(api_.KernelInfoGetAttribute_float(info_, name, &f))) {
      got = StrCat("FLOAT ", f);
    } else if (std::string(want) != "STRING" && GetString(name, &s)) {
      got = StrCat("STRING '", s, "'");
    } else if (!Ok(api_.KernelInfoGetAttributeArray_int64(info_, name, nullptr, &n_ints))) {
      return;  // absent
    } else if (n_ints > 0) {
      got = StrCat("INTS of ", n_ints, " values");
    } else if (Ok(api_.KernelInfoGetAttributeArray_float(info_, name, nullptr, &n_floats)) && n_floats > 0) {
      got = StrCat("FLOATS of ", n_floats, " values");
    } else if (IsTensor(name)) {
      got = "TENSOR";
    } else {
      got = "a list without numbers (STRINGS, or an empty INTS or FLOATS) or a GRAPH / SPARSE_TENSOR / TYPE_PROTO";
    }
    Fail(op_, NodeName(), "attribute '", name, "' must be ", want, ", got ", got, " (rule: '", name, "' is declared ",
         want, " in docs/ops/", op_, ".md; write it in that type, as REGISTRY['", op_, "'].make_node does)");
  }
  bool IsTensor(const char* name) const {
    OrtAllocator* alloc = nullptr;
    if (!Ok(api_.GetAllocatorWithDefaultOptions(&alloc))) return false;
    OrtValue* value = nullptr;
    if (!Ok(api_.KernelInfoGetAttribute_tensor(info_, name, alloc, &value))) return false;
    api_.ReleaseValue(value);
    return true;
  }
  // "node 'name': " (as softdeploy.runtime.Session's check words it), or "" for an unnamed node.
  std::string NodeName() const {
    size_t size = 0;
    if (!Ok(api_.KernelInfo_GetNodeName(info_, nullptr, &size)) || size <= 1) return "";
    std::string v(size, '\0');
    if (!Ok(api_.KernelInfo_GetNodeName(info_, v.data(), &size))) return "";
    if (!v.empty() && v.back() == '\0') v.pop_back();
    return v.empty() ? "" : StrCat("node '", v, "': ");
  }
  const OrtApi& api_;
  const OrtKernelInfo* info_;
  const char* op_;
};

// ---- tensors ----------------------------------------------------------------------------------

// Element type of a port: kT is the float type the op instance is registered for (float32 or
// float16); the others are fixed.
enum class Elem { kT, kFloat, kInt64, kInt32, kInt8, kUint8, kBool };
struct Port {
  Elem elem;
  bool optional = false;
};

template <class T>
constexpr ONNXTensorElementDataType OnnxTypeOf() {
  if constexpr (std::is_same_v<T, float>) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  else if constexpr (std::is_same_v<T, Ort::Float16_t>) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  else if constexpr (std::is_same_v<T, int64_t>) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  else if constexpr (std::is_same_v<T, int32_t>) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  else if constexpr (std::is_same_v<T, int8_t>) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
  else if constexpr (std::is_same_v<T, uint8_t>) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  else if constexpr (std::is_same_v<T, bool>) return ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
  else static_assert(sizeof(T) == 0, "unsupported element type");
}

template <class T>
ONNXTensorElementDataType Resolve(Elem e) {
  switch (e) {
    case Elem::kT: return OnnxTypeOf<T>();
    case Elem::kFloat: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case Elem::kInt64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    case Elem::kInt32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    case Elem::kInt8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    case Elem::kUint8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    case Elem::kBool: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
  }
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

inline int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A read-only view of one input. `present` is false for an omitted optional input.
template <class T>
struct Input {
  const T* data = nullptr;
  std::vector<int64_t> shape;
  bool present = false;
  int64_t size() const { return NumElements(shape); }
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
};

template <class T>
Input<T> GetInput(Ort::KernelContext& ctx, size_t index) {
  Input<T> in;
  if (index >= ctx.GetInputCount()) return in;
  Ort::ConstValue v = ctx.GetInput(index);
  if (static_cast<const OrtValue*>(v) == nullptr) return in;
  in.present = true;
  in.shape = v.GetTensorTypeAndShapeInfo().GetShape();
  in.data = v.GetTensorData<T>();
  return in;
}

template <class T>
T* AllocOutput(Ort::KernelContext& ctx, size_t index, const std::vector<int64_t>& shape) {
  return ctx.GetOutput(index, shape).GetTensorMutableData<T>();
}

// Normalises a possibly negative axis; error names the op, the value and the rule.
inline int64_t NormalizeAxis(const char* op, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) {
    Fail(op, "axis ", axis, " is out of range for an input of rank ", rank, " (rule: -rank <= axis < rank)");
  }
  return axis < 0 ? axis + rank : axis;
}

// A tensor seen as [outer, n, inner] around one axis.
struct AxisLayout {
  int64_t outer = 1, n = 1, inner = 1;
  int64_t rows() const { return outer * inner; }
  static AxisLayout Of(const std::vector<int64_t>& shape, int64_t axis) {
    AxisLayout l;
    for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
      if (i < axis) l.outer *= shape[i];
      else if (i == axis) l.n = shape[i];
      else l.inner *= shape[i];
    }
    return l;
  }
};

// ---- threads ----------------------------------------------------------------------------------

// Units of work per task (see NumTasks). A unit is about one element of a softmax-like row
// (~0.25 ns); 65536 units (~15 us) keep the wake-up of a pool thread (1 us idle, tens of us on a
// busy machine) a small fraction of each task.
constexpr int64_t kTaskGrain = 65536;

// TEST-ONLY: SOFTDEPLOY_TASK_GRAIN=<units> replaces kTaskGrain for the kernels created while it is
// set, so that the thread-consistency tests split their small samples into many tasks (at the
// default, samples of up to 2 x 65536 entries run as one task and two threads cannot disagree).
// Read at kernel creation; a value that is not a positive integer fails the creation.
inline int64_t TaskGrainFromEnv(const char* op) {
  const char* v = std::getenv("SOFTDEPLOY_TASK_GRAIN");
  if (v == nullptr) return kTaskGrain;
  char* end = nullptr;
  const long long g = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || g < 1) {
    Fail(op, "SOFTDEPLOY_TASK_GRAIN='", v, "' is not a positive integer (rule: units of work per task, a test-only ",
         "setting; unset, it is ", kTaskGrain, ")");
  }
  return static_cast<int64_t>(g);
}

// The grain of the kernel computing on this thread (set around Compute by KernelHolder).
inline thread_local int64_t tls_task_grain = kTaskGrain;

// Number of tasks for `rows` independent rows of `row_cost` units each: enough tasks to feed a
// thread pool, none smaller than the grain (kTaskGrain units).
inline size_t NumTasks(int64_t rows, int64_t row_cost) {
  constexpr int64_t kMaxTasks = 256;
  if (rows <= 1) return rows < 1 ? 0 : 1;
  int64_t by_cost = std::max<int64_t>(1, rows * std::max<int64_t>(row_cost, 1) / tls_task_grain);
  return static_cast<size_t>(std::min({rows, by_cost, kMaxTasks}));
}

// Half-open row range of task `t` out of `tasks` over `rows` rows.
inline void TaskRange(size_t t, size_t tasks, int64_t rows, int64_t* begin, int64_t* end) {
  *begin = rows * static_cast<int64_t>(t) / static_cast<int64_t>(tasks);
  *end = rows * static_cast<int64_t>(t + 1) / static_cast<int64_t>(tasks);
}

// Float32 outputs at least this large are written with streaming (non-temporal) stores by the
// kernels whose last pass recomputes each output from x (MultiMax, AdaptiveTemperatureSoftmax):
// they would not stay in cache for the consumer anyway (the L3 of the machines we measure is 32 MB,
// shared by input and output), and streaming saves the read-for-ownership of every output line.
constexpr int64_t kStreamBytes = 16 << 20;

// Runs fn(task) for task in [0, tasks) on onnxruntime's intra-op thread pool. fn must not throw.
template <class F>
void ParallelFor(Ort::KernelContext& ctx, size_t tasks, const F& fn) {
  if (tasks == 0) return;
  if (tasks == 1) {
    fn(size_t{0});
    return;
  }
  auto trampoline = [](void* data, size_t task) { (*static_cast<const F*>(data))(task); };
  ctx.ParallelFor(trampoline, tasks, 0, const_cast<F*>(&fn));
}

// ---- float16 ------------------------------------------------------------------------------------

inline float ToFloat(float v) { return v; }
inline float ToFloat(Ort::Float16_t v) { return v.ToFloat(); }
template <class T>
T FromFloat(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return T(v);
}

// An input as float32: its own data when T is float, else converted into buf (which then holds it).
template <class T>
const float* AsFloat(const Input<T>& in, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    return in.data;
  } else {
    buf.resize(static_cast<size_t>(in.size()));
    for (int64_t e = 0; e < in.size(); ++e) buf[e] = ToFloat(in.data[e]);
    return buf.data();
  }
}

// Applies row_fn(const float* x, float* y, int64_t n) to every row along `axis` of x (layout l),
// writing y of the same shape. Rows are handed over as contiguous float32: directly when T is
// float and the axis is innermost, otherwise gathered into (and scattered from) per-task scratch.
template <class T, class RowFn>
void MapRows(Ort::KernelContext& ctx, const T* x, T* y, const AxisLayout& l, const RowFn& row_fn) {
  const int64_t rows = l.rows();
  const size_t tasks = NumTasks(rows, l.n);
  ParallelFor(ctx, tasks, [&](size_t task) {
    int64_t r0, r1;
    TaskRange(task, tasks, rows, &r0, &r1);
    const bool direct = std::is_same_v<T, float> && l.inner == 1;
    std::vector<float> in_buf, out_buf;
    if (!direct) {
      in_buf.resize(static_cast<size_t>(l.n));
      out_buf.resize(static_cast<size_t>(l.n));
    }
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = r / l.inner, i = r % l.inner;
      const int64_t base = o * l.n * l.inner + i;
      if (direct) {
        row_fn(reinterpret_cast<const float*>(x) + base, reinterpret_cast<float*>(y) + base, l.n);
        continue;
      }
      for (int64_t j = 0; j < l.n; ++j) in_buf[j] = ToFloat(x[base + j * l.inner]);
      row_fn(in_buf.data(), out_buf.data(), l.n);
      for (int64_t j = 0; j < l.n; ++j) y[base + j * l.inner] = FromFloat<T>(out_buf[j]);
    }
  });
}

// ---- registration -------------------------------------------------------------------------------

template <class Kernel, class T>
struct KernelHolder {
  Kernel kernel;
  int64_t task_grain;
  explicit KernelHolder(const Attrs& attrs) : kernel(attrs), task_grain(TaskGrainFromEnv(Kernel::kName)) {}
  OrtStatusPtr ComputeV2(OrtKernelContext* context) noexcept {
    return Guard(Kernel::kName, [&] {
      Ort::KernelContext ctx(context);
      tls_task_grain = task_grain;
      kernel.template Compute<T>(ctx);
    });
  }
};

// A kernel may give onnxruntime's graph-level shape inference its output shapes with
//   static void InferOutputShape(Ort::ShapeInferContext& ctx);   // ctx.SetOutputShape(...) where it can tell
// Without one, onnxruntime knows a custom op's output types (from its type constraints) but not their shapes, so
// its optimizer cannot fold Shape -> Gather -> Concat chains after the node (all-MiniLM-L6-v2 quantized to
// RowwiseInt8MatMul kept one per attention projection, and TVM's importer refuses them).
template <class Kernel, class = void>
struct HasShapeRule : std::false_type {};
template <class Kernel>
struct HasShapeRule<Kernel, std::void_t<decltype(&Kernel::InferOutputShape)>> : std::true_type {};

template <class Kernel, class T>
struct CustomOp : Ort::CustomOpBase<CustomOp<Kernel, T>, KernelHolder<Kernel, T>, /*WithStatus=*/true> {
  CustomOp() {
    if constexpr (HasShapeRule<Kernel>::value) {
      this->InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* context) noexcept -> OrtStatusPtr {
        // onnxruntime ignores the returned status (an output the rule does not set keeps an unknown shape, as
        // without a rule); a failure is released here, not leaked, and never crosses the C ABI as an exception
        OrtStatusPtr status = Guard(Kernel::kName, [&] {
          Ort::ShapeInferContext ctx(&Ort::GetApi(), context);
          Kernel::InferOutputShape(ctx);
        });
        if (status != nullptr) Ort::GetApi().ReleaseStatus(status);
        return nullptr;
      };
    }
  }
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const noexcept {
    return Guard(Kernel::kName, [&] { *kernel = new KernelHolder<Kernel, T>(Attrs(api, info, Kernel::kName)); });
  }
  const char* GetName() const { return Kernel::kName; }
  size_t GetInputTypeCount() const { return std::size(Kernel::kInputs); }
  ONNXTensorElementDataType GetInputType(size_t i) const { return Resolve<T>(Kernel::kInputs[i].elem); }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return Kernel::kInputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return std::size(Kernel::kOutputs); }
  ONNXTensorElementDataType GetOutputType(size_t i) const { return Resolve<T>(Kernel::kOutputs[i].elem); }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return Kernel::kOutputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
};

// Op instances live for the life of the process: onnxruntime keeps raw pointers to them in every
// session that registered the library, and destroying them at exit races with onnxruntime's own
// teardown. They are therefore allocated once and never freed.
template <class Kernel, class T>
void AddOp(Ort::CustomOpDomain& domain) {
  domain.Add(new CustomOp<Kernel, T>());
}

}  // namespace sd

// Registers float32 and float16 instances of a kernel under one op name (onnxruntime dispatches on
// the input type).
#define SD_REGISTER_KERNEL(OpType, Kernel)                 \
  void Register##OpType(Ort::CustomOpDomain& domain) {     \
    ::sd::AddOp<Kernel, float>(domain);                    \
    ::sd::AddOp<Kernel, Ort::Float16_t>(domain);           \
  }
