// SignedMaxSim -- MaxSim with the match chosen on magnitude, then signed (Killingback et al. 2026).
//
//   j* = argmax_{j: DMask[n,j]} <Q[b,i], D[n,j]>   (ties -> lowest j)
//   Scores[b, n] = sum_{i: QMask[b,i]} QSign[b,i] * DSign[n,j*] * <Q[b,i], D[n,j*]>
//
// Python half, the contract and the float64 oracle: softdeploy/ops/signed_max_sim.py; docs/ops/SignedMaxSim.md.
// The tiled GEMM with a running max AND argmax per query lane: max_sim_core.h (driver) and
// max_sim_kernels.h (the micro-kernels, per ISA).
#include <cmath>

#include "max_sim_core.h"

namespace sd {
namespace {

constexpr const char* kOp = "SignedMaxSim";

// Signs as float32, checked against [-1, 1] (NaN passes: it propagates like any NaN input).
template <class T>
std::vector<float> Signs(const Input<T>& s, const char* port) {
  std::vector<float> out(static_cast<size_t>(s.size()));
  const int64_t cols = s.shape[1];
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = ToFloat(s.data[i]);
    if (std::fabs(out[i]) > 1.0f) {
      Fail(kOp, port, "[", static_cast<int64_t>(i) / cols, ", ", static_cast<int64_t>(i) % cols, "] = ", out[i],
           " is outside [-1, 1] (rule: signs lie in [-1, 1])");
    }
  }
  return out;
}

struct SignedMaxSimKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kT}, {Elem::kT}, {Elem::kBool, true},
                                     {Elem::kBool, true}};
  static constexpr Port kOutputs[] = {{Elem::kFloat}};

  Isa isa;
  explicit SignedMaxSimKernel(const Attrs&) : isa(SelectIsa()) {}  // float only: no int8 variant to pick

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> q = GetInput<T>(ctx, 0), q_sign = GetInput<T>(ctx, 1);
    const Input<T> d = GetInput<T>(ctx, 2), d_sign = GetInput<T>(ctx, 3);
    const Input<bool> q_mask = GetInput<bool>(ctx, 4), d_mask = GetInput<bool>(ctx, 5);
    maxsim::Problem p = maxsim::ProblemOf(kOp, q, d);
    maxsim::CheckSide(kOp, q_sign, "QSign", p.B, p.Lq, "[B, Lq]");
    maxsim::CheckSide(kOp, d_sign, "DSign", p.N, p.Ld, "[N, Ld]");
    maxsim::CheckSide(kOp, q_mask, "QMask", p.B, p.Lq, "[B, Lq]");
    maxsim::CheckSide(kOp, d_mask, "DMask", p.N, p.Ld, "[N, Ld]");
    const std::vector<float> qs = Signs(q_sign, "QSign"), ds = Signs(d_sign, "DSign");
    p.q_mask = q_mask.present ? q_mask.data : nullptr;
    p.d_mask = d_mask.present ? d_mask.data : nullptr;
    p.q_sign = qs.data();
    p.d_sign = ds.data();
    p.signed_max = true;
    float* scores = AllocOutput<float>(ctx, 0, {p.B, p.N});
    maxsim::Run<T>(ctx, p, q.data, d.data, isa, false, scores);  // float only: no int8 variant
  }
};

}  // namespace

void RegisterSignedMaxSim(Ort::CustomOpDomain& domain) {
  AddOp<SignedMaxSimKernel, float>(domain);
  AddOp<SignedMaxSimKernel, Ort::Float16_t>(domain);
}

}  // namespace sd
