// RowwiseInt8MatMul: a float32 MatMul through int8, the activations quantized per row inside the call.
//
//   per row m of A [M, K] (A's leading dimensions flattened), in float32, round half to even:
//     lo = min(0, min_k A[m, k]),  hi = max(0, max_k A[m, k]),  s = (hi - lo) / L  (1 when below 2^-126)
//     z  = round(clip(-lo / s, 0, L)),  q[m, k] = clip(round(A[m, k] * (1 / s)) + z, 0, L)
//   V[m, n] = s_m * BScale[n] * sum_k (q[m, k] - z_m) * B[k, n] + Bias[n]
//   Y[m, n] = act(V[m, n]) + Residual[m, n]      (act: identity, or gelu(v) = v / 2 (1 + erf(v / sqrt(2))))
//
// The equation and rules: softdeploy/ops/rowwise_int8_matmul.py, rendered in docs/ops/RowwiseInt8MatMul.md. The
// integers are exact (int32; K <= 65536); V is fma(float(acc - z colsum), s * BScale, Bias) in float32, gelu is
// ops/common/simd_math.h's GeluErf (|error| <= 2e-7 |v|), the residual one float32 add: the epilogue of every tile
// (on the ymm driver the GELU and the residual after it run over each finished 16-column panel, still in cache), so
// neither costs a pass of its own over Y.
//
// Variants: AVX-512 (ops/rowwise_int8_matmul_zmm.h: on a CPU with VNNI the vpdpbusd tile of
// ops/rowwise_int8_matmul_avx512vnni.cc, every int8 B; without VNNI ops/rowwise_int8_matmul_avx512.cc, the AVX2
// tile's form on zmm); AVX2 (ops/rowwise_int8_matmul_ymm.h: on a CPU with AVX-VNNI the VEX vpdpbusd tile of
// ops/rowwise_int8_matmul_avxvnni.cc, every int8 B; without it ops/rowwise_int8_matmul_avx2.cc, vpmaddubsw results
// summed in int16 under the lane bound of ops/rowwise_int8_matmul_kernels.h); and portable C++ (CPUs without AVX2).
// The vpmaddubsw paths (AVX2 without AVX-VNNI, AVX-512 without VNNI) run weights outside the lane bound on the widened
// packing instead: int16 weights packed at creation, the rows quantized straight to int16, vpmaddwd into int32 -- exact
// for every int8 B, so a model written for the VNNI class stays vectorized there. The row quantization is the AVX2
// unit's on every vector path. A constant B (an initializer) is packed (and its lane bound found) once, at kernel
// creation, into huge-page weight storage (ops/common/weight_arena.h); a B fed at run time is packed on every call.
//
// What must stay true: every contract check runs before ParallelFor; all variants produce the same integers and
// the same bits (the same float32 operations; see the vector units' headers); the kernel's state after creation is
// read-only (concurrent Run; the quantized rows' scratch is per thread, RowsScratch below).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/kernel.h"
#include "rowwise_int8_matmul_common.h"
#include "rowwise_int8_matmul_kernels.h"

namespace sd {
namespace {

using namespace rowwise_int8;  // NOLINT: the kernel's own compute pieces

constexpr const char* kOp = "RowwiseInt8MatMul";
// |sum_k (q - z) B[k, n]| <= K * 255 * 128 and z * colsum alike must fit in int32.
constexpr int64_t kMaxK = 65536;
// The quantized rows' scratch: `bytes` of this thread's buffer, kept between calls, up to kKeptRowsBytes; a larger one
// in *own for this call only, so no thread keeps more than that. Allocated per call, the scratch came back from
// malloc at another address each time in a model (the other nodes' sizes in between), so the quantization wrote into
// lines no cache held: up to 0.4 ms of a 21 ms MiniLM encode on AVX2 (bench/results/rowwise_int8_wide.md). Safe under
// concurrent Run: each thread has its own, and one Compute uses it at a time. Written before it is read.
constexpr size_t kKeptRowsBytes = size_t{4} << 20;  // M = 1024 rows at K = 1536, widened
uint8_t* RowsScratch(size_t bytes, std::unique_ptr<uint8_t[]>* own) {
  if (bytes > kKeptRowsBytes) {
    own->reset(new uint8_t[bytes]);
    return own->get();
  }
  thread_local std::vector<uint8_t> kept;  // grows to the largest call's, as two_pass_softmax's LaneExponents
  if (kept.size() < bytes) kept.resize(bytes);
  return kept.data();
}

// Fails naming the bad row and what is wrong with it (the error path: a plain scan of that row).
[[noreturn]] void FailRow(const float* x, int64_t K, int64_t m) {
  const float* row = x + m * K;
  for (int64_t k = 0; k < K; ++k) {
    if (!std::isfinite(row[k])) {
      Fail(kOp, "A[", m, ", ", k, "] = ", row[k], " is not finite (rule: A is finite, each row's range sets its ",
           "scale; rows are A's leading dimensions flattened)");
    }
  }
  Fail(kOp, "A row ", m, " spans max - min = inf in float32 (rule: each row's range max(0, max A) - min(0, min A) ",
       "is a finite float32)");
}

struct RowwiseInt8MatMulKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT},
                                     {Elem::kInt8},
                                     {Elem::kFloat},
                                     {Elem::kFloat, /*optional=*/true},
                                     {Elem::kFloat, /*optional=*/true}};
  static constexpr Port kOutputs[] = {{Elem::kT}};

  int levels;
  Activation activation;
  Isa isa;
  Path path;
  std::shared_ptr<const Packed> constant_b;  // B packed at creation when it is an initializer

  // Y: A's leading dimensions and B's columns, float32 -- where A's rank is known, B is a matrix and every dimension
  // is a number or a name. Otherwise Y's shape stays unknown: an empty shape here is a rank-0 or an unknown-rank
  // input, and an unknown dimension reads as -1, which onnxruntime would take as a size. The kernel's own checks run
  // at Compute.
  static void InferOutputShape(Ort::ShapeInferContext& ctx) {
    if (ctx.GetInputCount() < 2) return;
    Ort::ShapeInferContext::Shape y = ctx.GetInputShape(0);
    const Ort::ShapeInferContext::Shape& b = ctx.GetInputShape(1);
    if (y.empty() || b.size() != 2) return;
    y.back() = b[1];
    for (const auto& d : y) {
      if (d.IsInt() && d.AsInt() < 0) return;
    }
    Ort::ThrowOnError(ctx.SetOutputShape(0, y, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT));
  }

  explicit RowwiseInt8MatMulKernel(const Attrs& attrs)
      : isa(SelectIsa()),
        path(isa == Isa::kPortable ? Path::kPortable
             : isa == Isa::kAvx2   ? (KernelsUseAvxVnni() ? Path::kAvxVnni : Path::kAvx2)
             : CpuHasAvx512Vnni()  ? Path::kAvx512Vnni
                                   : Path::kAvx512Bw) {
    const int64_t l = attrs.Int("levels", 255);
    if (l != 255 && l != 127) {
      Fail(kOp, "levels ", l, " is neither 255 nor 127 (rule: the activations' top code L is 255 (uint8) or 127 ",
           "(7 bits))");
    }
    levels = static_cast<int>(l);
    const std::string act = attrs.String("activation", "none");
    if (act != "none" && act != "gelu") {
      Fail(kOp, "activation '", act, "' is not 'none' or 'gelu' (rule: the epilogue applies no activation or GELU's ",
           "erf form)");
    }
    activation = act == "gelu" ? Activation::kGelu : Activation::kNone;
    if (const OrtValue* b = attrs.ConstantInput(1)) {
      Ort::ConstValue v(b);
      const std::vector<int64_t> shape = v.GetTensorTypeAndShapeInfo().GetShape();
      if (shape.size() == 2 && shape[0] <= kMaxK) {  // otherwise Compute names the rule broken
        constant_b = std::make_shared<const Packed>(
            Pack(v.GetTensorData<int8_t>(), shape[0], shape[1], levels, path, /*kept=*/true));
      }
    }
  }

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> a = GetInput<T>(ctx, 0);
    const Input<int8_t> b = GetInput<int8_t>(ctx, 1);
    const Input<float> b_scale = GetInput<float>(ctx, 2), bias = GetInput<float>(ctx, 3),
                       residual = GetInput<float>(ctx, 4);
    if (a.rank() == 0) Fail(kOp, "A must have rank >= 1 ([..., K]), got a scalar");
    if (b.rank() != 2) Fail(kOp, "B must have rank 2 ([K, N]), got shape ", ShapeStr(b.shape));
    const int64_t K = b.shape[0], N = b.shape[1];
    if (a.shape.back() != K) {
      Fail(kOp, "A has K = ", a.shape.back(), " features, B has K = ", K, " rows (rule: A [..., K] and B [K, N] agree ",
           "on K)");
    }
    if (K > kMaxK) Fail(kOp, "K = ", K, " exceeds ", kMaxK, " (rule: K <= 65536 keeps the int32 sums exact)");
    if (b_scale.shape != std::vector<int64_t>{N}) {
      Fail(kOp, "BScale must have shape [N] = [", N, "], got ", ShapeStr(b_scale.shape), " (rule: one scale per ",
           "column of B)");
    }
    if (bias.present && bias.shape != std::vector<int64_t>{N}) {
      Fail(kOp, "Bias must have shape [N] = [", N, "], got ", ShapeStr(bias.shape), " (rule: one bias per column ",
           "of B)");
    }
    for (int64_t n = 0; n < N; ++n) {
      if (!(std::isfinite(b_scale.data[n]) && b_scale.data[n] > 0.f)) {
        Fail(kOp, "BScale[", n, "] = ", b_scale.data[n], " is not a finite number > 0 (rule: weight scales are ",
             "finite and positive)");
      }
    }
    std::vector<int64_t> y_shape(a.shape.begin(), a.shape.end() - 1);
    const int64_t M = NumElements(y_shape);  // rows: A's leading dimensions flattened
    y_shape.push_back(N);
    if (residual.present && residual.shape != y_shape && NumElements(residual.shape) != 1) {
      Fail(kOp, "Residual must have Y's shape ", ShapeStr(y_shape), " or one element, got ", ShapeStr(residual.shape),
           " (rule: the residual is added element by element, or one value to every entry)");
    }
    float* y = AllocOutput<float>(ctx, 0, y_shape);
    if (M == 0) return;

    const float* x = reinterpret_cast<const float*>(a.data);
    const bool vector = path != Path::kPortable;
    Packed local;
    const Packed* packed = constant_b.get();
    if (packed == nullptr || packed->K != K || packed->N != N) {
      local = Pack(b.data, K, N, levels, path, /*kept=*/false);
      packed = &local;
    }
    const int64_t kp = packed->kp;
    // The widened packing's tiles read the quantized rows as int16, which the quantization writes directly (M * kp
    // entries of 1 or 2 bytes).
    const bool wide = vector && packed->width == 2;
    std::unique_ptr<uint8_t[]> rows_own;
    uint8_t* const xq = RowsScratch(static_cast<size_t>(M * kp * (wide ? 2 : 1)), &rows_own);
    const std::unique_ptr<float[]> sa(new float[static_cast<size_t>(M)]);
    const std::unique_ptr<int32_t[]> za(new int32_t[static_cast<size_t>(M)]);
    // (the AVX2 unit's on the AVX-512 paths too: a zmm form of it measured 0.79-0.85x its speed on Zen 4;
    // bench/results/rowwise_int8_matmul.md)
    const int64_t bad =
        wide     ? QuantizeRowsWideAvx2(x, M, K, kp, levels, reinterpret_cast<int16_t*>(xq), sa.get(), za.get())
        : vector ? QuantizeRowsAvx2(x, M, K, kp, levels, xq, sa.get(), za.get())
                 : QuantizeRowsPortable(x, M, K, kp, levels, xq, sa.get(), za.get());
    if (bad >= 0) FailRow(x, K, bad);  // checked for every row, even when N = 0 leaves nothing to compute
    if (N == 0) return;
    const float* sb = b_scale.data;
    const float* bias_data = bias.present ? bias.data : nullptr;
    // One residual value for every entry: -0.0 (what an omitted Residual becomes under a function body's fill) adds
    // nothing to any float, so it is skipped; another value is spread to Y's shape (a node written by hand).
    const float* res = residual.present ? residual.data : nullptr;
    std::unique_ptr<float[]> spread;
    if (res != nullptr && residual.shape != y_shape) {
      if (std::signbit(res[0]) && res[0] == 0.f) {
        res = nullptr;
      } else {
        spread.reset(new float[static_cast<size_t>(M * N)]);
        std::fill(spread.get(), spread.get() + M * N, res[0]);
        res = spread.get();
      }
    }

    // Tasks over 16-column panels on every path (the same split: results never depend on it): the weights are
    // read once, the quantized rows (M * kp entries) by every task. A unit of work ~ 32 int8 products.
    const int64_t panels = packed->np / kNR;
    const size_t tasks = NumTasks(panels, M * kp * kNR / 32);
    if (vector) {
      const PackedView whole = packed->View();
      ParallelFor(ctx, tasks, [&](size_t task) {
        int64_t p0, p1;
        TaskRange(task, tasks, panels, &p0, &p1);
        const int64_t n0 = p0 * kNR;
        PackedView part = whole;
        part.panels = whole.panels + n0 * kp * whole.width;
        part.colsum = whole.colsum + n0;
        part.np = (p1 - p0) * kNR;
        part.readable_np = whole.np - n0;
        part.N = std::min(N, p1 * kNR) - n0;
        const float* bias_part = bias_data == nullptr ? nullptr : bias_data + n0;
        const float* res_part = res == nullptr ? nullptr : res + n0;
        switch (path) {
          case Path::kAvx512Vnni:
            GemmAvx512Vnni(part, xq, sa.get(), za.get(), M, sb + n0, bias_part, y + n0, N, activation, res_part);
            break;
          case Path::kAvxVnni:
            GemmAvxVnni(part, xq, sa.get(), za.get(), M, sb + n0, bias_part, y + n0, N, activation, res_part);
            break;
          case Path::kAvx512Bw:
            GemmAvx512Bw(part, xq, sa.get(), za.get(), M, sb + n0, bias_part, y + n0, N, activation, res_part);
            break;
          default: GemmAvx2(part, xq, sa.get(), za.get(), M, sb + n0, bias_part, y + n0, N, activation, res_part); break;
        }
      });
      return;
    }
    // Portable (CPUs without AVX2): int32 sums over B as stored, a row of the task's columns at a time.
    ParallelFor(ctx, tasks, [&](size_t task) {
      int64_t p0, p1;
      TaskRange(task, tasks, panels, &p0, &p1);
      GemmPortable(b.data, K, N, packed->colsum.data(), xq, kp, sa.get(), za.get(), M, sb, bias_data, y,
                   p0 * kNR, std::min(N, p1 * kNR), activation, res);
    });
  }
};

}  // namespace

// float32 only: the int8 path exists for speed on float32 models (a float16 A would be quantized from float32 the
// same way; no caller needs it).
void RegisterRowwiseInt8MatMul(Ort::CustomOpDomain& domain) { AddOp<RowwiseInt8MatMulKernel, float>(domain); }

}  // namespace sd
