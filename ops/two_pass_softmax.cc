// TwoPassSoftmax -- softmax without a max pass (Dukhan & Ablavatski 2020, arXiv 2001.04438).
//
//   y_i = exp(x_i) / sum_j exp(x_j)       along `axis` (same values as ai.onnx.Softmax-13)
//
// Python half, the contract and the float64 oracle: softdeploy/ops/two_pass_softmax.py; docs/ops/TwoPassSoftmax.md.
//
// Two reads of x, no max pass, no overflow, for any |x| up to ~2.9e6 (AVX2: 3.5e5; larger rows take RowSafe):
//  * AVX-512 and AVX2: pass 1 reads x, writes exp(x_j) / 2^nb into y and accumulates the row sum
//    as a (mantissa, exponent) pair; nb is the rounded exponent of a block reference (an entry of the
//    row at most 79 below every entry of the block), or, where there is none, of the block's maximum per lane.
//    Pass 2 rescales y in place (one multiply per element). See the AVX-512 section.
//  * portable: the paper's algorithm verbatim -- pass 1 accumulates sum_j exp(x_j) as a
//    (mantissa v, exponent e) pair with e' = max(e, n_j), v' = v 2^(e - e') + m_j 2^(n_j - e'),
//    pass 2 recomputes y_j = (m_j / v) 2^(n_j - e).
// Every term is formed as exp(x) = m 2^n with n = round(x log2 e) and t = x - n ln2 (Cody-Waite),
// so only integer exponent differences are taken: full float precision even for |x| ~ 1e4.
//
// What must stay true:
//  * -inf inputs give exactly 0 (masks); a row with no finite entry, or with +inf or NaN, is
//    recomputed by the reference three-pass loop (RowSafe) so that it matches ai.onnx.Softmax / torch
//    in which entries are NaN.
//  * Sums are accumulated in blocks (kBlock elements, then merged) to keep the float32 summation
//    error of long rows (V = 256000) near 1e-7 relative.
//  * Rows are independent: threads split rows (MapRows), never a row.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/kernel.h"
#include "common/simd_math.h"
#include "two_pass_softmax_row.h"

namespace sd {
namespace {

constexpr const char* kOp = "TwoPassSoftmax";

// Reference three-pass softmax for the rows the fast path does not handle (all -inf, +inf, NaN).
void RowSafe(const float* x, float* y, int64_t n) {
  float m = -INFINITY;
  bool has_nan = false;
  for (int64_t j = 0; j < n; ++j) {
    has_nan |= std::isnan(x[j]);
    m = std::max(m, x[j]);
  }
  if (has_nan || m == -INFINITY || m == INFINITY) {
    // NaN anywhere, all -inf (0/0) or +inf (inf - inf): the whole row is NaN, as in ai.onnx.Softmax.
    for (int64_t j = 0; j < n; ++j) y[j] = NAN;
    return;
  }
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(static_cast<double>(x[j]) - m);
  for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(std::exp(static_cast<double>(x[j]) - m) / s);
}

// ---- portable -----------------------------------------------------------------------------------

void AccumulatePortable(float& v, float& e, float m, float n) {
  const float max_e = std::max(e, n);
  v = simd::Scale2(v, e - max_e) + simd::Scale2(m, n - max_e);
  e = max_e;
}

void RowPortable(const float* x, float* y, int64_t n) {
  // Three-level summation (blocks of 64 terms, groups of 64 blocks, the row): one scalar accumulator
  // would otherwise carry ~n/64 rounding errors into rows of 256000 (2.5e-6 relative, over the
  // contract's 1e-6).
  constexpr int64_t kBlock = 64, kGroup = 64 * kBlock;
  float acc_v = 0.0f, acc_e = simd::kNoExponent;
  for (int64_t j = 0; j < n;) {
    const int64_t group_end = std::min(n, j + kGroup);
    float gv = 0.0f, ge = simd::kNoExponent;
    while (j < group_end) {
      const int64_t block_end = std::min(group_end, j + kBlock);
      float v = 0.0f, e = simd::kNoExponent;
      for (; j < block_end; ++j) {
        // ExtExp's float reduction is accurate for |x| < ~2.9e6 only (common/simd_math.h); beyond, the
        // row takes RowSafe, as the vector variants do (9.5e-2 relative error at |x| ~ 5.6e7 before).
        if (std::fabs(x[j]) >= 2.9e6f && std::isfinite(x[j])) return RowSafe(x, y, n);
        float m, ne;
        simd::ExtExp(x[j], &m, &ne);
        if (std::isnan(m) || std::isnan(ne)) return RowSafe(x, y, n);
        AccumulatePortable(v, e, m, ne);
      }
      AccumulatePortable(gv, ge, v, e);
    }
    AccumulatePortable(acc_v, acc_e, gv, ge);
  }
  if (!(acc_v > 0.0f) || !std::isfinite(acc_v)) return RowSafe(x, y, n);
  const float inv = 1.0f / acc_v;
  for (int64_t j = 0; j < n; ++j) {
    float m, e;
    simd::ExtExp(x[j], &m, &e);
    y[j] = simd::Scale2(m * inv, e - acc_e);
  }
}

// AVX-512 rows of at least this many elements, in tensors of at least kStreamBytes, read x with a
// non-temporal hint: prefetchnta on each line as the block-max loop first touches it. x is read from
// DRAM once per block and reread from L1 by the block's exps, never again, while y (written by pass 1,
// rescaled by pass 2) must survive in L2 until pass 2: the hint keeps x from evicting it there (Zen 4:
// L2 1 MB; a 128000-entry row is 0.5 MB of x and 0.5 MB of y). 64 rows, one thread, each variant in its
// own process (bench/micro/two_pass_softmax_rows.cc --rows64 <variant>), three alternations in each
// of two batches: 64 x 128000 3.42-3.81 -> 2.50-2.63 ms and 3.17-3.89 -> 3.04-3.27 ms, 64 x 256000
// 8.41-8.65 -> 6.48-7.09 ms and 7.29-7.43 -> 6.82-7.12 ms (this shared machine's DRAM bandwidth moves
// between batches); in onnxruntime with bound buffers 64 x 128000 3.09-3.22 -> 2.63-2.89 ms. The
// AVX2 variant measured the same with and without it (2.96-3.19 vs 3.06-3.12 ms at 64 x 128000), so
// it has none. A smaller tensor may be
// cache-resident on entry, where the hint would send x back to DRAM for its next reader (1 x 128000
// measured 0-10% slower with it), hence the tensor threshold; rows of 32000 stay in L2 either way.
constexpr int64_t kNonTemporalMinElements = 65536;

// ---- AVX-512 and AVX2 (ops/two_pass_softmax_kernels.h) --------------------------------------------
//
// Pass 1 reads x once and writes exp(x_j) / 2^nb into y, where nb is the rounded base-2 exponent of
// the block's reference m (blocks of kBlock elements): the largest of its first 2L entries and the references
// before it. An entry more than 79 above m (its term could overflow the float sums) is seen by the pass's running
// maximum, and that block -- and the rest of the row -- takes the former route: nb from the block's maximum
// in each SIMD lane, by a quick max over the block while it sits in L1 (also every block of the AVX-512 rows
// read with the non-temporal hint, which rides on that max loop). Each term is formed exactly as in the two-pass
// paper -- exp(x) = m * 2^n with n = round(x log2 e) and t = x - n ln2 by Cody-Waite -- so only the
// integer exponent difference n - nb is taken, never the rounded difference x - max that limits a
// three-pass softmax to ~|x - max| * 2^-24 relative error. The sum is accumulated as the paper's
// (mantissa, exponent) pair per lane, merged once per block.
// Pass 2 scales y in place by 2^(nb - E) / V, (V, E) being the row sum.
// Compared with the paper's pass 2 (recompute exp from x), rescaling y costs one multiply per
// element instead of a second exp: on Zen 4 the exp, not memory, bounds rows that fit in L2.

// The rows return false (the caller then takes RowSafe) for rows with NaN, +inf, no finite entry, or
// |max| >= 2.9e6 (AVX2: 3.5e5), beyond which the magic-bias rounding of x log2e (AVX2: 8 x log2e, with
// the block's exponent in the bias) is no longer exact.
// y is written in place by both passes, deliberately: pass 1's stores, which miss the cache for
// large tensors, overlap its exp work, and pass 2 then finds y in L2/L3. Writing pass 1 to a cached
// scratch row and y in pass 2 (streaming or not) was 1.4-2x slower at 64 x 128000 / 256000 on
// Zen 4 (64 rows through RowAvx512, one thread): pass 2 has too little work to hide the misses. So was
// (1.0-1.6x slower) a pipeline over rows, pass 1 of row r into a cached scratch row while pass 2 of
// row r - 1 streams its scratch to y: two DRAM transfers per element instead of three, but this
// machine's streaming stores do not overlap with the loads.
// AVX2 has the AVX-512 variant's structure on 8 lanes: per-lane block exponents nb, pass 1 writes
// exp(x_j) / 2^nb into y, pass 2 multiplies by 2^(nb - E) / V. Without vscalefps, its exp is XNNPACK's lut8
// form: 2^(j/8) from an 8-entry table in one register (vpermps), 2^(n - nb) added to its exponent field, and a
// degree-3 polynomial on [-ln2/16, ln2/16] -- 6 multiply-adds per vector where the degree-5 form took 8. Terms
// more than 2^127 below their block's maximum, and outputs below ~2^-126, come out as 0 (as in XNNPACK's AVX2
// kernels) -- within the contract's absolute tolerance. 64 x 1000 (L2-resident), 1 thread, Zen 4, the row
// alone (bench/micro/two_pass_softmax_rows.cc): 0.34 -> 0.28 ns per entry.

// The vector rows' per-thread scratch: nb per (block, lane); onnxruntime's pool threads reuse it.
float* LaneExponents(int64_t n) {
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>((n + two_pass::kBlock - 1) / two_pass::kBlock * two_pass::kMaxLanes));
  return scratch.data();
}

struct TwoPassSoftmaxKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}};

  int64_t axis;
  Isa isa;

  explicit TwoPassSoftmaxKernel(const Attrs& attrs) : axis(attrs.Int("axis", -1)), isa(SelectIsa()) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    T* y = AllocOutput<T>(ctx, 0, x.shape);
    if (x.rank() == 0) Fail(kOp, "input must have rank >= 1, got a scalar");
    const AxisLayout l = AxisLayout::Of(x.shape, NormalizeAxis(kOp, axis, x.rank()));
    if (x.size() == 0) return;
    // Only rows read in place (float32, last axis): MapRows hands any other row over in a cached scratch.
    const bool hint = std::is_same_v<T, float> && l.inner == 1 && l.n >= kNonTemporalMinElements &&
                      x.size() * int64_t{sizeof(float)} >= kStreamBytes;
    switch (isa) {
      case Isa::kAvx512:
        MapRows<T>(ctx, x.data, y, l, [hint = hint](const float* a, float* b, int64_t n) {
          if (!two_pass::RowAvx512(a, b, n, LaneExponents(n), hint)) RowSafe(a, b, n);
        });
        break;
      case Isa::kAvx2:
        MapRows<T>(ctx, x.data, y, l, [](const float* a, float* b, int64_t n) {
          if (!two_pass::RowAvx2(a, b, n, LaneExponents(n))) RowSafe(a, b, n);
        });
        break;
      default:
        MapRows<T>(ctx, x.data, y, l, RowPortable);
    }
  }
};

}  // namespace

SD_REGISTER_KERNEL(TwoPassSoftmax, TwoPassSoftmaxKernel)

}  // namespace sd
