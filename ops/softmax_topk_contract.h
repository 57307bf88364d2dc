// SoftmaxTopK's contract on the input and attributes, and its outputs, for every kernel binding (the
// CPU kernel in ops/softmax_topk.cc, the CUDA one in ops/cuda/ort_cuda.cc): one set of checks and
// messages (they match softdeploy/ops/softmax_topk.py's validate). Baseline code only: not for the
// per-ISA translation units.
#pragma once

#include <cstdint>
#include <vector>

#include "common/kernel.h"

namespace sd {

template <class T>
struct SoftmaxTopKCall {
  AxisLayout layout;  // the rows along the reduced axis (layout.n = its length)
  T* values;
  int64_t* indices;
  T* lse;  // nullptr: LogSumExp absent (2 outputs) or omitted (named "")
};

// Checks the contract (rank >= 1, the axis, 1 <= k <= axis length, temperature > 0) and allocates the
// outputs: Values and Indices [.., k, ..], LogSumExp [.., 1, ..] where requested.
template <class T>
SoftmaxTopKCall<T> StartSoftmaxTopK(const char* op, Ort::KernelContext& ctx, const Input<T>& x, int64_t k,
                                    int64_t axis, float temperature) {
  if (x.rank() == 0) Fail(op, "input must have rank >= 1, got a scalar");
  const int64_t a = NormalizeAxis(op, axis, x.rank());
  if (k < 1) Fail(op, "k ", k, " is out of range (rule: k >= 1)");
  const int64_t n = x.shape[a];
  if (k > n) Fail(op, "k ", k, " is larger than the axis length ", n, " (rule: 1 <= k <= axis length)");
  if (!(temperature > 0.0f)) Fail(op, "temperature ", temperature, " is out of range (rule: temperature > 0)");
  std::vector<int64_t> out_shape = x.shape, lse_shape = x.shape;
  out_shape[a] = k;
  lse_shape[a] = 1;
  T* values = AllocOutput<T>(ctx, 0, out_shape);
  int64_t* indices = AllocOutput<int64_t>(ctx, 1, out_shape);
  T* lse = nullptr;
  if (ctx.GetOutputCount() > 2) {
    Ort::UnownedValue v = ctx.GetOutput(2, lse_shape);
    if (static_cast<OrtValue*>(v) != nullptr) lse = v.GetTensorMutableData<T>();
  }
  return {AxisLayout::Of(x.shape, a), values, indices, lse};
}

}  // namespace sd
