// MaxSim -- ColBERT late interaction (Khattab & Zaharia 2020).
//
//   Scores[b, n] = sum_{i: QMask[b,i]} max_{j: DMask[n,j]} QScale[b,i] * DScale[n,j] * <Q[b,i], D[n,j]>
//
// Python half, the contract and the float64 oracle: softdeploy/ops/max_sim.py; docs/ops/MaxSim.md.
// The tiled running-max GEMM (AVX-512 / VNNI / AVX2 / portable) is in max_sim_core.h.
//
// What must stay true: masked document tokens are excluded (never multiplied by 0); masked query
// tokens and documents without a valid token contribute 0; int8 sums are exact (int32); every
// contract check runs before ParallelFor.
#include "max_sim_core.h"

namespace sd {
namespace {

constexpr const char* kOp = "MaxSim";
// int8: |sum_k q_k d_k| <= dim * 128 * 255 (the VNNI path's biased sum) must fit in int32.
constexpr int64_t kMaxInt8Dim = 65536;

struct MaxSimKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT},
                                     {Elem::kT},
                                     {Elem::kBool, true},
                                     {Elem::kBool, true},
                                     {Elem::kFloat, true},
                                     {Elem::kFloat, true}};
  static constexpr Port kOutputs[] = {{Elem::kFloat}};

  Isa isa;
  bool avx_vnni;  // int8 on AVX2: vpdpbusd ymm (KernelsUseAvxVnni, ops/common/cpu.h)
  explicit MaxSimKernel(const Attrs&) : isa(SelectIsa()), avx_vnni(KernelsUseAvxVnni()) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> q = GetInput<T>(ctx, 0), d = GetInput<T>(ctx, 1);
    const Input<bool> q_mask = GetInput<bool>(ctx, 2), d_mask = GetInput<bool>(ctx, 3);
    const Input<float> q_scale = GetInput<float>(ctx, 4), d_scale = GetInput<float>(ctx, 5);
    maxsim::Problem p = maxsim::ProblemOf(kOp, q, d);
    maxsim::CheckSide(kOp, q_mask, "QMask", p.B, p.Lq, "[B, Lq]");
    maxsim::CheckSide(kOp, d_mask, "DMask", p.N, p.Ld, "[N, Ld]");
    maxsim::CheckSide(kOp, q_scale, "QScale", p.B, p.Lq, "[B, Lq]");
    maxsim::CheckSide(kOp, d_scale, "DScale", p.N, p.Ld, "[N, Ld]");
    if constexpr (std::is_same_v<T, int8_t>) {
      if (!q_scale.present || !d_scale.present) {
        Fail(kOp, "int8 inputs need QScale and DScale (rule: <q, d> = QScale[b, i] * DScale[n, j] * sum_k q_k * d_k)");
      }
      if (p.dim > kMaxInt8Dim) {
        Fail(kOp, "int8 dim ", p.dim, " exceeds ", kMaxInt8Dim, " (rule: exact int32 accumulation)");
      }
    }
    p.q_mask = q_mask.present ? q_mask.data : nullptr;
    p.d_mask = d_mask.present ? d_mask.data : nullptr;
    p.q_scale = q_scale.present ? q_scale.data : nullptr;
    p.d_scale = d_scale.present ? d_scale.data : nullptr;
    float* scores = AllocOutput<float>(ctx, 0, {p.B, p.N});
    maxsim::Run<T>(ctx, p, q.data, d.data, isa, avx_vnni, scores);
  }
};

}  // namespace

// float32, float16 and int8 instances under one op name (onnxruntime dispatches on Q's type).
void RegisterMaxSim(Ort::CustomOpDomain& domain) {
  AddOp<MaxSimKernel, float>(domain);
  AddOp<MaxSimKernel, Ort::Float16_t>(domain);
  AddOp<MaxSimKernel, int8_t>(domain);
}

}  // namespace sd
