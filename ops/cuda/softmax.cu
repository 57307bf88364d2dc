// TwoPassSoftmax and Softpick on CUDA (CPU kernels: ops/two_pass_softmax.cc, ops/softpick.cc).
//
// TwoPassSoftmax:  y_i = exp(x_i - m) / sum_j exp(x_j - m)        (ai.onnx.Softmax values)
//   Pass 1 reads the row once for the online normaliser (m, d) (common.cuh Online; the GPU
//   counterpart of Dukhan & Ablavatski's no-max-pass first pass: one read, no overflow); pass 2 reads
//   it again and writes 2^((x_i - m) log2 e) / d. Exponents are formed in double from the exact
//   difference x - m and split before exp2f (common.cuh Exp2Split), so finite rows stay within the
//   contract's 1e-6 up to |x| ~ 1e4. A row holding NaN or +inf, or only -inf, is all NaN; -inf
//   entries give exactly 0.
//
// Softpick:  m = max_j x_j over the finite entries,  e_j = exp(x_j - m) - exp(-m),
//            y_i = max(e_i, 0) / (sum_{j: x_j finite} |e_j| + eps)
//   |e_j| is computed free of cancellation as exp(max(z, 0) - m) * (1 - exp(-|z|)) (z = x finite,
//   else 0), in double, as the float64 reference does (softdeploy/ops/softpick.py). NaN -> NaN,
//   +inf -> +inf, -inf and x <= 0 -> exactly 0, a row with no finite entry -> all zeros.
//
// Both: one block per row (grid-stride over rows); rows along a strided axis are read strided.
// Python halves and float64 oracles: softdeploy/ops/two_pass_softmax.py, softdeploy/ops/softpick.py.
//
// What must stay true: rows are independent (a block never shares a row), no host synchronisation.
#include <sstream>

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace sd {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr double kLog2e = 1.4426950408889634;

template <class T>
__global__ void __launch_bounds__(kThreads) TwoPassKernel(const T* __restrict__ x, int64_t rows, int64_t n,
                                                          int64_t inner, T* __restrict__ y) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = (row / inner) * n * inner + row % inner;
    Online st;
    unsigned flags = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = ToF(x[base + j * inner]);
      if (v != v) flags |= kHasNan;
      else if (v == __int_as_float(0x7F800000)) flags |= kHasPosInf;
      else OnlineAdd(st, v, kLog2e);
    }
    st = BlockOnline(st, kLog2e);
    flags = BlockOr(flags);
    const bool special = flags != 0 || st.m == -__int_as_float(0x7F800000);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = ToF(x[base + j * inner]);
      // term / d, not term * (1/d): the reciprocal would add a rounding.
      const float out = special ? __uint_as_float(0x7FC00000u) : static_cast<float>(Term(v, st.m, kLog2e) / st.d);
      y[base + j * inner] = FromF<T>(out);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) SoftpickKernel(const T* __restrict__ x, int64_t rows, int64_t n,
                                                           int64_t inner, double eps, T* __restrict__ y) {
  const float inf = __int_as_float(0x7F800000);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = (row / inner) * n * inner + row % inner;
    float m = -inf;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = ToF(x[base + j * inner]);
      if (v > -inf && v < inf) m = fmaxf(m, v);
    }
    m = BlockReduce(m, MaxOp{}, -inf);
    double d = 0.0;
    if (m > -inf) {
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const float v = ToF(x[base + j * inner]);
        if (v > -inf && v < inf) {
          const double z = v;
          d += exp(fmax(z, 0.0) - static_cast<double>(m)) * -expm1(-fabs(z));
        }
      }
    }
    // block sum in double: two float halves would lose digits; reduce through shared memory.
    __shared__ double warp_sums[32];
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xFFFFFFFFu, d, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = d;
    __syncthreads();
    d = (threadIdx.x & 31) < (blockDim.x >> 5) ? warp_sums[threadIdx.x & 31] : 0.0;
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xFFFFFFFFu, d, o);
    d += eps;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = ToF(x[base + j * inner]);
      float out = 0.0f;
      if (v != v || v == inf) {
        out = v;  // NaN -> NaN, +inf -> +inf
      } else if (v > 0.0f && m > -inf) {
        const double z = v;
        out = static_cast<float>(exp(z - static_cast<double>(m)) * -expm1(-z) / d);
      }
      if (!(m > -inf)) out = 0.0f;  // no finite entry: all zeros
      y[base + j * inner] = FromF<T>(out);
    }
  }
}

template <class... A>
std::string Cat(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  return s.str();
}

unsigned Grid(int64_t rows) { return static_cast<unsigned>(rows < (int64_t{1} << 30) ? rows : (int64_t{1} << 30)); }

Result Launched(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return {Status::kCuda, Cat(op, ": CUDA launch failed: ", cudaGetErrorString(e))};
  return {};
}

}  // namespace

Result TwoPassSoftmax(Dtype dtype, const void* x, int64_t outer, int64_t n, int64_t inner, void* y,
                      cudaStream_t stream) {
  const int64_t rows = outer * inner;
  if (rows == 0 || n == 0) return {};
  switch (dtype) {
    case Dtype::kFloat32:
      TwoPassKernel<<<Grid(rows), kThreads, 0, stream>>>(static_cast<const float*>(x), rows, n, inner,
                                                          static_cast<float*>(y));
      return Launched("TwoPassSoftmax");
    case Dtype::kFloat16:
      TwoPassKernel<<<Grid(rows), kThreads, 0, stream>>>(static_cast<const __half*>(x), rows, n, inner,
                                                          static_cast<__half*>(y));
      return Launched("TwoPassSoftmax");
    case Dtype::kBFloat16:
      break;
  }
  return {Status::kInvalid, Cat("TwoPassSoftmax: element type ", DtypeName(dtype),
                                " is not supported (rule: X is float32 or float16, docs/ops/TwoPassSoftmax.md)")};
}

Result Softpick(Dtype dtype, const void* x, int64_t outer, int64_t n, int64_t inner, float eps, void* y,
                cudaStream_t stream) {
  // The CPU kernel's check and message (ops/softpick.cc).
  if (!(eps >= 0.0f) || eps == __builtin_inff()) {
    return {Status::kInvalid, Cat("Softpick: eps ", eps, " is not a finite number >= 0 (rule: 0 <= eps < inf)")};
  }
  const int64_t rows = outer * inner;
  if (rows == 0 || n == 0) return {};
  switch (dtype) {
    case Dtype::kFloat32:
      SoftpickKernel<<<Grid(rows), kThreads, 0, stream>>>(static_cast<const float*>(x), rows, n, inner, eps,
                                                           static_cast<float*>(y));
      return Launched("Softpick");
    case Dtype::kFloat16:
      SoftpickKernel<<<Grid(rows), kThreads, 0, stream>>>(static_cast<const __half*>(x), rows, n, inner, eps,
                                                           static_cast<__half*>(y));
      return Launched("Softpick");
    case Dtype::kBFloat16:
      break;
  }
  return {Status::kInvalid, Cat("Softpick: element type ", DtypeName(dtype),
                                " is not supported (rule: X is float32 or float16, docs/ops/Softpick.md)")};
}

}  // namespace cuda
}  // namespace sd
