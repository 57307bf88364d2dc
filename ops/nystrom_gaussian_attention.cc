// NystromGaussianAttention -- SOFT's softmax-free attention in Nystrom form (Lu et al. 2021).
//
//   k(a, b) = exp(-|a - b|^2 / (2 sqrt(d))),   K1 = k(Q, L) [n, m],   K2 = k(L, L) [m, m]
//   P = K2 + reg I,  V_0 = alpha P,  alpha = 1.8 / (max_i sum_j K2_ij)^2,  V_{t+1} = 2 V_t - V_t P V_t
//   O = K1 (V_T (K1^T V))                                                 (right to left: linear in n)
//
// Python half (the contract, the non-finite distance rule, the float64 oracle, the function body):
// softdeploy/ops/nystrom_gaussian_attention.py; docs/ops/NystromGaussianAttention.md.
//
// Per (batch, head) task, every n-long product a register-tiled float32 GEMM (common/vec_gemm.h):
//   Lt = L^T (packed [d, m]);  D1 = dist(Q, Lt) [n, m] and D2 = dist(L, Lt) [m, m] as sums of squared
//   differences (no |a|^2 + |b|^2 - 2ab cancellation: K2's diagonal is exactly 1);  the non-finite rule
//   (NaN if either vector has a NaN or both an inf, +inf if one has an inf) on flagged rows only;
//   K = exp(-D / (2 sqrt d));  Newton-Schulz: A = P V_t, V_{t+1} = 2 V_t - V_t A (two m x m x m GEMMs per
//   step), the last step in float64;  K1t = K1^T;  KtV = K1t V [m, dv];  W = V_T KtV [m, dv] in float64,
//   rounded once;  O = K1 W [n, dv].
// Why the last step and W in float64: V_T approximates P^-1, whose entries grow to ~1/regularization with
// both signs (P's condition number reaches ~1e3 for m = 16, reg = 0.01), so W = V_T KtV cancels, and a
// float32 V_T carries ~cond(P) u of rounding that the last float32 step adds afresh. Newton-Schulz corrects
// errors of V_{T-1} to first order on the converged part of the spectrum, so ONE float64 step from the
// float32 V_{T-1} and a float64 W give the float64 iteration's V_T to ~u: O's error dropped ~10x (to
// ~1e-6 relative to max|O|, the error of float32 K1, K2 and the n-long float32 sums), for 1/T of the
// Newton-Schulz work (2 m^3 + m^2 dv float64 multiply-adds per head).
// Memory: O(n m + m^2 + m dv) per task; nothing of size n x n.
//
// Variants: the tiles, the exp and the float64 GEMM written once over ops/common/vec.h's traits
// (ops/nystrom_gaussian_attention_kernels.h), compiled per ISA (ops/nystrom_gaussian_attention_avx2.cc,
// _avx512.cc); the portable variant is the same loop nests left to the compiler's baseline vectoriser.
//
// What must stay true: every form runs exactly newton_iters steps (the op is the iteration, not an
// exact inverse); results do not depend on the thread count (one task = one head).
#include <cmath>
#include <cstring>
#include <vector>

#include "common/kernel.h"
#include "common/vec_gemm.h"
#include "nystrom_gaussian_attention_kernels.h"

namespace sd {
namespace {

constexpr const char* kOp = "NystromGaussianAttention";
constexpr const char* kLayout = "rule: Q [B, H, n, d], V [B, H, n, dv], Landmarks [B, H, m, d]";
constexpr int64_t kMaxIters = 1000;  // softdeploy/ops/nystrom_gaussian_attention.py MAX_ITERS

using GemmFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, int64_t, int64_t,
                        bool);

struct Ops {
  GemmFn gemm;
  GemmFn dist;
  void (*neg_exp)(float*, int64_t, float);  // x <- exp(-x * c)
  void (*gemm64)(const double*, const double*, double*, int64_t, int64_t, int64_t);
};

void NegExpPortable(float* x, int64_t n, float c) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp(-x[i] * c);
}

void Gemm64Portable(const double* a, const double* b, double* c, int64_t rows, int64_t kdim, int64_t cols) {
  nystrom::Gemm64Body(a, b, c, rows, kdim, cols);
}

// Row flags of the non-finite rule: bit 0 = holds a NaN, bit 1 = holds an inf.
std::vector<uint8_t> RowFlags(const float* x, int64_t rows, int64_t d, bool* any) {
  std::vector<uint8_t> f(static_cast<size_t>(rows), 0);
  *any = false;
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t v = 0;
    for (int64_t k = 0; k < d; ++k) {
      const float e = x[r * d + k];
      if (std::isnan(e)) v |= 1;
      else if (std::isinf(e)) v |= 2;
    }
    f[r] = v;
    *any = *any || v != 0;
  }
  return f;
}

// D[r][c] under the non-finite rule where row r (flags fa) or column c (flags fb) is flagged.
void FixNonFinite(float* dmat, int64_t rows, int64_t cols, const std::vector<uint8_t>& fa,
                  const std::vector<uint8_t>& fb) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t a = fa[r], b = fb[c];
      if (a == 0 && b == 0) continue;
      if ((a & 1) || (b & 1) || ((a & 2) && (b & 2))) dmat[r * cols + c] = NAN;
      else dmat[r * cols + c] = INFINITY;
    }
  }
}

struct Problem {
  int64_t B, H, n, d, m, dv;
  int64_t iters;
  float reg;
  const float* q;
  const float* v;
  const float* l;
  float* o;
};

void RunHead(const Problem& p, const Ops& ops, int64_t bh) {
  const int64_t n = p.n, d = p.d, m = p.m, dv = p.dv;
  const float* q = p.q + bh * n * d;
  const float* v = p.v + bh * n * dv;
  const float* l = p.l + bh * m * d;
  float* o = p.o + bh * n * dv;
  std::vector<float> lt(static_cast<size_t>(d * m));
  for (int64_t j = 0; j < m; ++j) {
    for (int64_t k = 0; k < d; ++k) lt[k * m + j] = l[j * d + k];
  }
  std::vector<float> k1(static_cast<size_t>(n * m)), k2(static_cast<size_t>(m * m));
  ops.dist(q, d, lt.data(), m, d, k1.data(), m, n, m, false);
  ops.dist(l, d, lt.data(), m, d, k2.data(), m, m, m, false);
  bool q_any, l_any;
  const std::vector<uint8_t> qf = RowFlags(q, n, d, &q_any), lf = RowFlags(l, m, d, &l_any);
  if (q_any || l_any) {
    FixNonFinite(k1.data(), n, m, qf, lf);
    FixNonFinite(k2.data(), m, m, lf, lf);
  }
  const float c = static_cast<float>(1.0 / (2.0 * std::sqrt(static_cast<double>(d))));
  ops.neg_exp(k1.data(), n * m, c);
  ops.neg_exp(k2.data(), m * m, c);
  // alpha = 1.8 / (max row sum of K2)^2 (a NaN row sum makes alpha NaN, as in the reference)
  double max_row = -INFINITY;
  bool nan_row = false;
  for (int64_t i = 0; i < m; ++i) {
    double s = 0.0;
    for (int64_t j = 0; j < m; ++j) s += k2[i * m + j];
    nan_row = nan_row || std::isnan(s);
    max_row = std::max(max_row, s);
  }
  const double alpha = nan_row ? NAN : 1.8 / (max_row * max_row);
  // P in float64 (for the last step) and float32 (for the others): K2 + reg I
  std::vector<double> p64(static_cast<size_t>(m * m));
  for (int64_t e = 0; e < m * m; ++e) p64[e] = k2[e];
  for (int64_t i = 0; i < m; ++i) p64[i * m + i] += static_cast<double>(p.reg);
  std::vector<double> vt64(p64.size());
  for (int64_t e = 0; e < m * m; ++e) vt64[e] = alpha * p64[e];
  if (p.iters > 0) {
    // V_0 .. V_{T-1} in float32 (register-tiled), then V_T = 2 V - V (P V) in float64 (file comment)
    std::vector<float> pm(static_cast<size_t>(m * m)), vt(pm.size()), a(pm.size()), vn(pm.size());
    for (int64_t e = 0; e < m * m; ++e) pm[e] = static_cast<float>(p64[e]), vt[e] = static_cast<float>(vt64[e]);
    for (int64_t t = 0; t + 1 < p.iters; ++t) {
      ops.gemm(pm.data(), m, vt.data(), m, m, a.data(), m, m, m, false);  // A = P V_t
      ops.gemm(vt.data(), m, a.data(), m, m, vn.data(), m, m, m, false);  // V_t P V_t
      for (int64_t e = 0; e < m * m; ++e) vn[e] = 2.0f * vt[e] - vn[e];
      vt.swap(vn);
    }
    std::vector<double> v64(p64.size()), a64(p64.size());
    for (int64_t e = 0; e < m * m; ++e) v64[e] = vt[e];
    ops.gemm64(p64.data(), v64.data(), a64.data(), m, m, m);   // A = P V_{T-1}
    ops.gemm64(v64.data(), a64.data(), vt64.data(), m, m, m);  // V_{T-1} P V_{T-1}
    for (int64_t e = 0; e < m * m; ++e) vt64[e] = 2.0 * v64[e] - vt64[e];
  }
  // right to left: K1^T V [m, dv] (float32), then W = V_T (K1^T V) [m, dv] (float64, rounded once), then
  // K1 W [n, dv] (float32)
  std::vector<float> k1t(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) k1t[j * n + i] = k1[i * m + j];
  }
  std::vector<float> ktv(static_cast<size_t>(m * dv)), w(static_cast<size_t>(m * dv));
  ops.gemm(k1t.data(), n, v, dv, n, ktv.data(), dv, m, dv, false);
  std::vector<double> ktv64(ktv.begin(), ktv.end()), w64(ktv.size());
  ops.gemm64(vt64.data(), ktv64.data(), w64.data(), m, m, dv);
  for (size_t e = 0; e < w.size(); ++e) w[e] = static_cast<float>(w64[e]);
  ops.gemm(k1.data(), m, w.data(), dv, m, o, dv, n, dv, false);
}

struct NystromKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}};

  int64_t iters;
  float reg;
  Isa isa;

  explicit NystromKernel(const Attrs& attrs)
      : iters(attrs.Int("newton_iters", 20)), reg(attrs.Float("regularization", 0.01f)), isa(SelectIsa()) {
    if (iters < 0 || iters > kMaxIters) {
      Fail(kOp, "newton_iters ", iters, " is out of range (rule: 0 <= newton_iters <= ", kMaxIters, ")");
    }
    if (!(std::isfinite(reg) && reg >= 0.0f)) {
      Fail(kOp, "regularization ", reg, " is not a finite number >= 0 (rule: 0 <= regularization < inf)");
    }
  }

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> q = GetInput<T>(ctx, 0), v = GetInput<T>(ctx, 1), l = GetInput<T>(ctx, 2);
    const char* names[] = {"Q", "V", "Landmarks"};
    const Input<T>* ins[] = {&q, &v, &l};
    for (int i = 0; i < 3; ++i) {
      if (ins[i]->rank() != 4) Fail(kOp, names[i], " must have rank 4, got rank ", ins[i]->rank(), " (", kLayout, ")");
    }
    if (v.shape[0] != q.shape[0] || v.shape[1] != q.shape[1] || v.shape[2] != q.shape[2]) {
      Fail(kOp, "V has [B, H, n] = [", v.shape[0], ", ", v.shape[1], ", ", v.shape[2], "] but Q has [", q.shape[0],
           ", ", q.shape[1], ", ", q.shape[2], "] (", kLayout, ")");
    }
    if (l.shape[0] != q.shape[0] || l.shape[1] != q.shape[1]) {
      Fail(kOp, "Landmarks have [B, H] = [", l.shape[0], ", ", l.shape[1], "] but Q has [", q.shape[0], ", ",
           q.shape[1], "] (", kLayout, ")");
    }
    if (l.shape[3] != q.shape[3]) Fail(kOp, "Landmarks have d=", l.shape[3], " but Q has d=", q.shape[3], " (", kLayout, ")");
    if (q.shape[3] == 0) Fail(kOp, "d=0 (rule: d >= 1)");
    if (l.shape[2] == 0) Fail(kOp, "m=0 landmarks (rule: m >= 1)");
    Problem p{q.shape[0], q.shape[1], q.shape[2], q.shape[3], l.shape[2], v.shape[3], iters, reg,
              nullptr, nullptr, nullptr, nullptr};
    T* out = AllocOutput<T>(ctx, 0, {p.B, p.H, p.n, p.dv});
    const int64_t out_size = p.B * p.H * p.n * p.dv;
    if (out_size == 0) return;
    std::vector<float> qb, vb, lb, ob;
    p.q = AsFloat(q, qb), p.v = AsFloat(v, vb), p.l = AsFloat(l, lb);
    if constexpr (std::is_same_v<T, float>) {
      p.o = out;
    } else {
      ob.resize(static_cast<size_t>(out_size));
      p.o = ob.data();
    }
    Ops ops;
    switch (isa) {
      case Isa::kAvx512:
        ops = {nystrom::GemmAvx512, nystrom::DistAvx512, nystrom::NegExpAvx512, nystrom::Gemm64Avx512};
        break;
      case Isa::kAvx2: ops = {nystrom::GemmAvx2, nystrom::DistAvx2, nystrom::NegExpAvx2, nystrom::Gemm64Avx2}; break;
      default: ops = {tile::GemmPortable<false>, tile::GemmPortable<true>, NegExpPortable, Gemm64Portable};
    }
    const Problem& cp = p;
    ParallelFor(ctx, static_cast<size_t>(p.B * p.H), [&](size_t t) { RunHead(cp, ops, static_cast<int64_t>(t)); });
    if constexpr (!std::is_same_v<T, float>) {
      for (int64_t e = 0; e < out_size; ++e) out[e] = FromFloat<T>(ob[e]);
    }
  }
};

}  // namespace

SD_REGISTER_KERNEL(NystromGaussianAttention, NystromKernel)

}  // namespace sd
