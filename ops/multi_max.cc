// MultiMax -- softmax of sigma-modulated logits (Zhou, Fritz & Keuper, ICML 2024, arXiv 2406.01189).
//
//   sigma(x) = x + t0*relu(r0 - x) + t1*relu(x - r1) + t2*relu(r2 - x)^2 + t3*relu(x - r3)^2
//   Y = softmax(sigma(X) + Mask, axis)          (the additive Mask, broadcast to X, AFTER sigma)
//
// Python half, the contract, the special-value rules and the float64 oracle:
// softdeploy/ops/multi_max.py; docs/ops/MultiMax.md. sigma(+-inf) is sigma's limit (SigmaParams::Of), a non-finite
// parameter makes every output NaN, quadratic terms are (t*relu)*relu.
//
// z_j = sigma(x_j) + mask_j is evaluated in DOUBLE, as the reference does: softmax's output error is
// the absolute error of z, and float32 z carries |z| * 2^-24 of it (8.8e-6 relative at |z| ~ 56 with
// t0 = 1.7, against the 2e-6 contract), and float32 relu^2 overflows for |x| > 1.8e19 where the
// double value is finite. In double sigma never overflows for float inputs (|z| < 1e117).
//
// Per row, block by block (kBlock elements; a block's z fits in L1):
//   pass 1 computes the block's z into a double buffer (reading x and the mask once) and its max M_b,
//          then stages w_j = exp(z_j - M_b) in Y (float, from a double range reduction
//          n = round(d log2 e), t = d - n ln2 of d = z_j - M_b, and a float polynomial for exp(t)),
//          summing the w_j; the block sums are combined online in double, S = sum_b s_b e^(M_b - M);
//   pass 2 rescales each block of Y in place by e^(M_b - M) / S.
// sigma is evaluated once per element (not again in pass 2, as a two-pass softmax must), and no
// exponent ever leaves double before it is reduced. The former float scheme (sigma and
// round(z log2 e) in float, exponents carried in float) went wrong from |z| ~ 5.6e7 (n off by many
// units, |t| up to ~88, the polynomial negative or huge: NaN rows, e.g. [[2.1e9]]), and z log2 e
// overflowed to -inf for the Hugging Face mask finfo(float32).min: inf - inf = NaN rows.
//
// What must stay true:
//  * A row whose z holds NaN or +inf, or only -inf, is all NaN (softmax parity); -inf z gives 0.
//  * The Mask is read through strides: any shape broadcastable to X. Rows whose x and mask are
//    contiguous along the axis (or whose mask is constant along it, e.g. a [B, 1, 1, T] padding mask
//    against [B, H, Tq, T] scores, or an omitted mask) run in place; others are gathered.
//  * Validation happens before ParallelFor; nothing inside it throws. Rows are split across threads,
//    never a row, so results do not depend on the thread count.
#include <cmath>
#include <cstring>

#include "common/kernel.h"
#include "multi_max_row.h"

namespace sd {
namespace {

constexpr const char* kOp = "MultiMax";

using multi_max::RowArgs;
using multi_max::SigmaParams;

SigmaParams SigmaOf(const float* ranges, const float* ts) {
  SigmaParams p;
  p.finite = true;
  for (int k = 0; k < 4; ++k) {
    p.r[k] = ranges[k];
    p.t[k] = ts[k];
    p.finite &= std::isfinite(ranges[k]) && std::isfinite(ts[k]);
  }
  // x -> -inf: only the r0 and r2 terms are active, sigma ~ t2*x^2 + (1 - t0)*x + const.
  if (p.t[2] != 0) p.neg = p.t[2] > 0 ? INFINITY : -INFINITY;
  else p.neg = p.t[0] < 1 ? -INFINITY : (p.t[0] > 1 ? INFINITY : p.r[0]);
  // x -> +inf: only the r1 and r3 terms, sigma ~ t3*x^2 + (1 + t1)*x + const.
  if (p.t[3] != 0) p.pos = p.t[3] > 0 ? INFINITY : -INFINITY;
  else p.pos = p.t[1] > -1 ? INFINITY : (p.t[1] < -1 ? -INFINITY : p.r[1]);
  return p;
}

// sigma(x) in double, with its limits at +-inf.
double SigmaAt(const SigmaParams& p, double x) {
  if (x == -INFINITY) return p.neg;
  if (x == INFINITY) return p.pos;
  const double a = std::max(p.r[0] - x, 0.0), b = std::max(x - p.r[1], 0.0);
  const double c = std::max(p.r[2] - x, 0.0), d = std::max(x - p.r[3], 0.0);
  // Plain multiply-add: std::fma is a libm call (~50 ns) on the portable x86-64 baseline.
  return x + p.t[0] * a + p.t[1] * b + (p.t[2] * c) * c + (p.t[3] * d) * d;  // NaN x stays NaN
}

void FillNan(float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = NAN;
}

// ---- portable ------------------------------------------------------------------------------------

// Everything in double: z, its max, exp(z - max) and the sum -- the reference's arithmetic.
void RowPortable(const RowArgs& a, const SigmaParams& p) {
  double zmax = -INFINITY;
  bool bad = false;
  for (int64_t j = 0; j < a.n; ++j) {
    const double z = SigmaAt(p, a.x[j]) + a.mask[j * a.mask_step];
    bad |= std::isnan(z) || z == INFINITY;
    zmax = std::max(zmax, z);
  }
  if (bad || zmax == -INFINITY) return FillNan(a.y, a.n);
  double sum = 0;
  for (int64_t j = 0; j < a.n; ++j) sum += std::exp(SigmaAt(p, a.x[j]) + a.mask[j * a.mask_step] - zmax);
  const double inv = 1.0 / sum;
  for (int64_t j = 0; j < a.n; ++j) {
    a.y[j] = static_cast<float>(std::exp(SigmaAt(p, a.x[j]) + a.mask[j * a.mask_step] - zmax) * inv);
  }
}

int64_t NumBlocks(int64_t n) { return (n + multi_max::kBlock - 1) / multi_max::kBlock; }

// The AVX2 and AVX-512 rows: ops/multi_max_kernels.h (one source over ops/common/vec.h), compiled in
// ops/multi_max_avx2.cc and ops/multi_max_avx512.cc.

// ---- binding ------------------------------------------------------------------------------------

using RowFn = void (*)(const RowArgs&, const SigmaParams&);

struct MultiMaxKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kT}, {Elem::kT, /*optional=*/true}};
  static constexpr Port kOutputs[] = {{Elem::kT}};

  int64_t axis;
  Isa isa;

  explicit MultiMaxKernel(const Attrs& attrs) : axis(attrs.Int("axis", -1)), isa(SelectIsa()) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    const Input<T> ranges = GetInput<T>(ctx, 1);
    const Input<T> ts = GetInput<T>(ctx, 2);
    const Input<T> mask = GetInput<T>(ctx, 3);
    if (x.rank() == 0) Fail(kOp, "input must have rank >= 1, got a scalar");
    const int64_t ax = NormalizeAxis(kOp, axis, x.rank());
    if (ranges.shape != std::vector<int64_t>{4}) {
      Fail(kOp, "Ranges has shape ", ShapeStr(ranges.shape), " (rule: Ranges must have shape [4])");
    }
    if (ts.shape != std::vector<int64_t>{4}) Fail(kOp, "Ts has shape ", ShapeStr(ts.shape), " (rule: Ts must have shape [4])");
    // Mask strides aligned to X's dims (0 along broadcast dims).
    const int64_t rank = x.rank();
    std::vector<int64_t> mstride(static_cast<size_t>(rank), 0);
    if (mask.present) {
      bool ok = mask.rank() <= rank;
      for (int64_t k = 0; ok && k < mask.rank(); ++k) {
        const int64_t md = mask.shape[mask.rank() - 1 - k], xd = x.shape[rank - 1 - k];
        ok = md == 1 || md == xd;
      }
      if (!ok) {
        Fail(kOp, "Mask of shape ", ShapeStr(mask.shape), " is not broadcastable to X of shape ", ShapeStr(x.shape),
             " (rule: Mask rank <= X rank and each Mask dim equals X's or is 1)");
      }
      int64_t stride = 1;
      for (int64_t k = mask.rank() - 1; k >= 0; --k) {
        const int64_t xk = rank - mask.rank() + k;
        mstride[xk] = mask.shape[k] == 1 ? 0 : stride;
        stride *= mask.shape[k];
      }
    }
    T* y = AllocOutput<T>(ctx, 0, x.shape);
    if (x.size() == 0) return;

    float r[4], t[4];
    for (int k = 0; k < 4; ++k) {
      r[k] = ToFloat(ranges.data[k]);
      t[k] = ToFloat(ts.data[k]);
    }
    const SigmaParams params = SigmaOf(r, t);
    const AxisLayout l = AxisLayout::Of(x.shape, ax);
    const RowFn row_fn =
        isa == Isa::kAvx512 ? multi_max::RowAvx512 : (isa == Isa::kAvx2 ? multi_max::RowAvx2 : RowPortable);
    const int64_t mask_axis_stride = mstride[static_cast<size_t>(ax)];
    static const float kZero = 0.0f;

    const int64_t rows = l.rows();
    const size_t tasks = NumTasks(rows, l.n * 4);
    ParallelFor(ctx, tasks, [&](size_t task) {
      int64_t r0, r1;
      TaskRange(task, tasks, rows, &r0, &r1);
      const bool direct_x = std::is_same_v<T, float> && l.inner == 1;
      const bool direct_mask = !mask.present || (std::is_same_v<T, float> && mask_axis_stride <= 1);
      std::vector<float> x_buf, y_buf, m_buf;
      std::vector<double> block_max(static_cast<size_t>(NumBlocks(l.n)));
      if (!direct_x) {
        x_buf.resize(static_cast<size_t>(l.n));
        y_buf.resize(static_cast<size_t>(l.n));
      }
      if (!direct_mask) m_buf.resize(static_cast<size_t>(mask_axis_stride == 0 ? 1 : l.n));
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t o = row / l.inner, i = row % l.inner;
        const int64_t base = o * l.n * l.inner + i;
        RowArgs a{};
        a.n = l.n;
        a.block_max = block_max.data();
        if (!params.finite) {
          for (int64_t j = 0; j < l.n; ++j) y[base + j * l.inner] = FromFloat<T>(NAN);
          continue;
        }
        if (direct_x) {
          a.x = reinterpret_cast<const float*>(x.data) + base;
          a.y = reinterpret_cast<float*>(y) + base;
        } else {
          for (int64_t j = 0; j < l.n; ++j) x_buf[j] = ToFloat(x.data[base + j * l.inner]);
          a.x = x_buf.data();
          a.y = y_buf.data();
        }
        if (!mask.present) {
          a.mask = &kZero;
          a.mask_step = 0;
        } else {
          // Offset of this row's first mask element: unravel (o, i) over X's dims.
          int64_t off = 0, rem_o = o, rem_i = i;
          for (int64_t k = rank - 1; k > ax; --k) {
            off += (rem_i % x.shape[k]) * mstride[k];
            rem_i /= x.shape[k];
          }
          for (int64_t k = ax - 1; k >= 0; --k) {
            off += (rem_o % x.shape[k]) * mstride[k];
            rem_o /= x.shape[k];
          }
          a.mask_step = mask_axis_stride == 0 ? 0 : 1;
          if (direct_mask) {
            a.mask = reinterpret_cast<const float*>(mask.data) + off;
          } else {
            for (size_t j = 0; j < m_buf.size(); ++j) m_buf[j] = ToFloat(mask.data[off + j * mask_axis_stride]);
            a.mask = m_buf.data();
          }
        }
        row_fn(a, params);
        if (!direct_x) {
          for (int64_t j = 0; j < l.n; ++j) y[base + j * l.inner] = FromFloat<T>(y_buf[j]);
        }
      }
    });
  }
};

}  // namespace

SD_REGISTER_KERNEL(MultiMax, MultiMaxKernel)

}  // namespace sd
