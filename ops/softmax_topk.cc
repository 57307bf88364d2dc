// SoftmaxTopK -- fused softmax + top-k (Milakov & Gimelshein 2018, arXiv 1805.02867, Algorithm 4).
//
//   z = x / temperature
//   Values, Indices = TopK(Softmax(z), k)      (descending; equal logits -> lower index first)
//   LogSumExp       = m + log sum_j exp(z_j - m)
//
// Python half, the contract, the ranking rule for NaN/+inf/-inf rows and the float64 oracle:
// softdeploy/ops/softmax_topk.py; OPS.md.
//
// One read of x per row, never a probability row. Per row:
//  * selection: a heap of the k best (logit, index) pairs seen so far; an entry enters only when it
//    ranks above the heap's worst. The SIMD variants test a whole vector against that threshold
//    with one compare, so only candidates (about k*ln(n/k) per row on random data) take the scalar
//    path. The heap's order is a strict total order (value, then index), and x is scanned in index
//    order, so an entry equal to the threshold never enters: ties keep the lower index.
//  * normaliser: the online recurrence m' = max(m, z), d' = d*e^(m-m') + e^(z-m'), run per SIMD lane
//    and amortised per block: a block's lane maxima are taken first (pass A, the same loads as the
//    threshold test), the lane sums rescaled once if a maximum grew, then the block's exps summed
//    against the new maxima (pass B, from L1). exps are taken in base 2, u = x*s - C with
//    s = log2(e)/T and C = fl(m*s) exactly known, so the final step can undo every rounding of C.
//  * values: exp((x_i - M)/T) / D for the k winners only, in double.
//
// What must stay true:
//  * The fast variants (AVX-512, AVX2) handle rows of finite and -inf entries. A NaN or +inf entry is
//    always a candidate (the compare is NLE_UQ: NaN passes), and the candidate path hands the row to
//    RowGeneric, which implements every special row of the contract in double. So does a row whose
//    scaled logits leave the float range (tiny temperatures).
//  * -inf entries contribute exactly 0 (the clamped exp2 below); a lane that has only seen -inf has
//    m = -inf, C = -inf and d = 0, and stays out of the final sum.
//  * Rows are independent: threads split rows, never a row; results do not depend on the thread
//    count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/kernel.h"
#include "common/simd_math.h"

namespace sd {
namespace {

constexpr const char* kOp = "SoftmaxTopK";

// ---- selection ----------------------------------------------------------------------------------

struct Entry {
  float value;
  int64_t index;
};

// The contract's ranking: NaN above everything, then larger value, then lower index.
struct RanksAbove {
  bool operator()(const Entry& a, const Entry& b) const {
    const bool an = std::isnan(a.value), bn = std::isnan(b.value);
    if (an != bn) return an;
    if (!an && a.value != b.value) return a.value > b.value;
    return a.index < b.index;
  }
};

// The same order for entries that are never NaN (the fast variants' candidates).
inline bool RanksAboveNoNan(const Entry& a, const Entry& b) {
  return a.value != b.value ? a.value > b.value : a.index < b.index;
}

// The k best entries seen so far, as a heap whose root is the worst of them (every parent ranks
// below its children).
class Selection {
 public:
  explicit Selection(int64_t k) : k_(static_cast<size_t>(k)) { heap_.reserve(k_); }
  void Reset() { heap_.clear(); }
  bool full() const { return heap_.size() == k_; }
  // Value of the worst kept entry; meaningful once full().
  float worst() const { return heap_.front().value; }
  // Offers entry (v, i), any value; i must be larger than every index offered before.
  void Offer(float v, int64_t i) {
    const Entry e{v, i};
    if (!full()) {
      heap_.push_back(e);
      std::push_heap(heap_.begin(), heap_.end(), RanksAbove());
    } else if (RanksAbove()(e, heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), RanksAbove());
      heap_.back() = e;
      std::push_heap(heap_.begin(), heap_.end(), RanksAbove());
    }
  }
  // Replaces the worst entry by (v, i), which ranks above it; neither the heap nor v holds NaN.
  // One sift-down: the hot path of the candidates, ~k*ln(n/k) times per row.
  void ReplaceWorstNoNan(float v, int64_t i) {
    const Entry e{v, i};
    const size_t n = heap_.size();
    size_t at = 0;
    for (;;) {
      size_t child = 2 * at + 1;
      if (child >= n) break;
      if (child + 1 < n && RanksAboveNoNan(heap_[child], heap_[child + 1])) ++child;  // the worse child
      if (!RanksAboveNoNan(e, heap_[child])) break;
      heap_[at] = heap_[child];
      at = child;
    }
    heap_[at] = e;
  }
  // The kept entries, best first (destroys the heap).
  const std::vector<Entry>& Sorted() {
    std::sort(heap_.begin(), heap_.end(), RanksAbove());
    return heap_;
  }

 private:
  size_t k_;
  std::vector<Entry> heap_;
};

// One row's results, contiguous, in float; the caller scatters (and converts) them.
struct RowOut {
  float* values;
  int64_t* indices;
  float lse;
};

// Values and LogSumExp of a row with finite maximum m (of x) and D = sum_j exp((x_j - m) / T).
void EmitFinite(Selection& sel, float m, double d, double t, RowOut& out) {
  const std::vector<Entry>& top = sel.Sorted();
  const double inv_d = 1.0 / d;
  for (size_t i = 0; i < top.size(); ++i) {
    out.values[i] = static_cast<float>(std::exp((static_cast<double>(top[i].value) - m) / t) * inv_d);
    out.indices[i] = top[i].index;
  }
  out.lse = static_cast<float>(static_cast<double>(m) / t + std::log(d));
}

// A row without a finite maximum (NaN, +inf or only -inf): NaN values, indices by the ranking rule.
void EmitSpecial(Selection& sel, float lse, RowOut& out) {
  const std::vector<Entry>& top = sel.Sorted();
  for (size_t i = 0; i < top.size(); ++i) {
    out.values[i] = NAN;
    out.indices[i] = top[i].index;
  }
  out.lse = lse;
}

// ---- portable, and every special row -------------------------------------------------------------

// The online normalizer in double, one exp per element, fused with the selection; handles every row
// of the contract (NaN, +inf, all -inf, scaled logits beyond the float range).
void RowGeneric(const float* x, int64_t n, double t, Selection& sel, RowOut& out) {
  sel.Reset();
  bool nan = false, pos_inf = false;
  double m = -INFINITY, d = 0.0;  // running max and sum of exp(z - m), z = x / t
  for (int64_t j = 0; j < n; ++j) {
    sel.Offer(x[j], j);
    const double z = static_cast<double>(x[j]) / t;
    if (std::isnan(z)) {
      nan = true;
    } else if (z == INFINITY) {
      pos_inf = true;
    } else if (z > m) {
      d = d * std::exp(m - z) + 1.0;  // exp(-inf) = 0 when m was -inf
      m = z;
    } else if (z > -INFINITY) {
      d += std::exp(z - m);
    }
  }
  if (nan) return EmitSpecial(sel, NAN, out);
  if (pos_inf) return EmitSpecial(sel, INFINITY, out);
  if (m == -INFINITY) return EmitSpecial(sel, -INFINITY, out);
  const std::vector<Entry>& top = sel.Sorted();
  for (size_t i = 0; i < top.size(); ++i) {
    out.values[i] = static_cast<float>(std::exp(static_cast<double>(top[i].value) / t - m) / d);
    out.indices[i] = top[i].index;
  }
  out.lse = static_cast<float>(m + std::log(d));
}

// Offers the candidates x[base + b] (bits b of mask, ascending). Returns false at a NaN or +inf
// entry: the row then belongs to RowGeneric.
inline bool OfferCandidates(const float* x, int64_t base, uint32_t mask, Selection& sel) {
  while (mask != 0) {
    const int64_t j = base + __builtin_ctz(mask);
    mask &= mask - 1;
    const float v = x[j];
    if (!(v < INFINITY)) return false;
    if (!sel.full()) {
      sel.Offer(v, j);
    } else if (v > sel.worst()) {  // equal values stay out: the kept one has the lower index
      sel.ReplaceWorstNoNan(v, j);
    }
  }
  return true;
}

// 2^f for f in [-1/2, 1/2]: the exp polynomial of common/simd_math.h in the variable t = f*ln2,
// with ln2^i folded into its coefficients.
constexpr double kLn2 = 0.6931471805599453;
constexpr float kP1 = static_cast<float>(simd::kC1 * kLn2);
constexpr float kP2 = static_cast<float>(simd::kC2 * kLn2 * kLn2);
constexpr float kP3 = static_cast<float>(simd::kC3 * kLn2 * kLn2 * kLn2);
constexpr float kP4 = static_cast<float>(simd::kC4 * kLn2 * kLn2 * kLn2 * kLn2);
constexpr float kP5 = static_cast<float>(simd::kC5 * kLn2 * kLn2 * kLn2 * kLn2 * kLn2);

// Elements per block: the block is read twice (lane maxima, then exps), the second time from L1.
constexpr int64_t kBlock = 512;

// Final lane reduction shared by the SIMD variants: lane l holds max m_l, C_l = fl(m_l * s) and
// d_l = sum over its elements of 2^(x*s - C_l). Returns false when the scaled maxima left the float
// range (the row then goes to RowGeneric).
bool FinishLanes(const float* m, const float* c, const float* d, int lanes, float s, double t, Selection& sel,
                 RowOut& out) {
  float row_max = -INFINITY;
  for (int l = 0; l < lanes; ++l) row_max = std::max(row_max, m[l]);
  if (row_max == -INFINITY) {
    EmitSpecial(sel, -INFINITY, out);
    return true;
  }
  double sum = 0.0;
  const double ms = static_cast<double>(row_max) * s;
  for (int l = 0; l < lanes; ++l) {
    if (m[l] == -INFINITY) continue;
    if (!std::isfinite(c[l]) || !std::isfinite(d[l])) return false;
    sum += static_cast<double>(d[l]) * std::exp2(static_cast<double>(c[l]) - ms);
  }
  if (!(sum > 0.0) || !std::isfinite(sum)) return false;
  // sum = sum_j 2^((x_j - M) * s); s = log2(e)/T up to one rounding, which the ratio of the k
  // values to it and LogSumExp see only as a relative error of ~1e-8 * E|z - M|.
  EmitFinite(sel, row_max, sum, t, out);
  return true;
}

// ---- AVX-512 ------------------------------------------------------------------------------------

// 2^u for u <= ~0. Fast: u must not be -inf or NaN. Clamped: -inf and NaN give 0.
SD_TARGET_AVX512 inline __m512 Exp2(__m512 u) {
  const __m512 n = _mm512_roundscale_ps(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(u, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(kP5), f, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);  // 2^n with n < -150 flushes to exactly 0
}
SD_TARGET_AVX512 inline __m512 Exp2Clamped(__m512 u) {
  return Exp2(_mm512_max_ps(u, _mm512_set1_ps(-200.0f)));  // max_ps(NaN, c) = c
}

// Sums 2^(x*s + neg_c) over x[j, end), end - j <= kBlock; -inf entries only if `clamp`.
template <bool kClamp>
SD_TARGET_AVX512 inline __m512 BlockSumAvx512(const float* x, int64_t j, int64_t end, __m512 vs, __m512 neg_c) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  auto term = [&](__m512 v) SD_TARGET_AVX512 {
    const __m512 u = _mm512_fmadd_ps(v, vs, neg_c);
    return kClamp ? Exp2Clamped(u) : Exp2(u);
  };
  for (; j + 64 <= end; j += 64) {
    a0 = _mm512_add_ps(a0, term(_mm512_loadu_ps(x + j)));
    a1 = _mm512_add_ps(a1, term(_mm512_loadu_ps(x + j + 16)));
    a2 = _mm512_add_ps(a2, term(_mm512_loadu_ps(x + j + 32)));
    a3 = _mm512_add_ps(a3, term(_mm512_loadu_ps(x + j + 48)));
  }
  for (; j + 16 <= end; j += 16) a0 = _mm512_add_ps(a0, term(_mm512_loadu_ps(x + j)));
  if (j < end) {
    const __mmask16 k = static_cast<__mmask16>((1u << (end - j)) - 1);
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + j);
    a1 = _mm512_add_ps(a1, Exp2Clamped(_mm512_fmadd_ps(v, vs, neg_c)));
  }
  return _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
}

SD_TARGET_AVX512 bool RowAvx512(const float* x, int64_t n, float s, double t, Selection& sel, RowOut& out) {
  sel.Reset();
  const __m512 vs = _mm512_set1_ps(s), minus_s = _mm512_set1_ps(-s);
  __m512 m = _mm512_set1_ps(-INFINITY);  // lane maxima of x
  __m512 neg_c = _mm512_set1_ps(INFINITY);  // -fl(m * s)
  __m512 d = _mm512_setzero_ps();         // lane sums of 2^(x*s - C)
  __m512 thr = _mm512_set1_ps(-INFINITY);
  bool clamp = false;  // sticky once a block held -inf entries
  for (int64_t j = 0; j < n;) {
    const int64_t end = std::min(n, j + kBlock);
    // Pass A: lane maxima and the threshold test, on the same loads.
    __m512 b0 = _mm512_set1_ps(-INFINITY), b1 = b0;
    int64_t i = j;
    for (; i + 32 <= end; i += 32) {
      const __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
      b0 = _mm512_max_ps(v0, b0);  // a NaN v is dropped here and caught as a candidate
      b1 = _mm512_max_ps(v1, b1);
      const uint32_t c = sel.full() ? (static_cast<uint32_t>(_mm512_cmp_ps_mask(v0, thr, _CMP_NLE_UQ)) |
                                       static_cast<uint32_t>(_mm512_cmp_ps_mask(v1, thr, _CMP_NLE_UQ)) << 16)
                                    : 0xFFFFFFFFu;
      if (c != 0) {
        if (!OfferCandidates(x, i, c, sel)) return false;
        if (sel.full()) thr = _mm512_set1_ps(sel.worst());
      }
    }
    for (; i < end; i += 16) {
      const __mmask16 k = static_cast<__mmask16>(end - i >= 16 ? 0xFFFF : (1u << (end - i)) - 1);
      const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i);
      b0 = _mm512_max_ps(v, b0);
      const uint32_t c = sel.full() ? static_cast<uint32_t>(_mm512_cmp_ps_mask(v, thr, _CMP_NLE_UQ) & k) : k;
      if (c != 0) {
        if (!OfferCandidates(x, i, c, sel)) return false;
        if (sel.full()) thr = _mm512_set1_ps(sel.worst());
      }
    }
    // One rescale of the lane sums per block, only where a lane maximum grew.
    const __m512 new_m = _mm512_max_ps(_mm512_max_ps(b0, b1), m);
    const __mmask16 grew = _mm512_cmp_ps_mask(new_m, m, _CMP_GT_OQ);
    if (grew != 0) {
      const __m512 new_neg_c = _mm512_mul_ps(new_m, minus_s);
      d = _mm512_mask_mul_ps(d, grew, d, Exp2Clamped(_mm512_sub_ps(new_neg_c, neg_c)));
      neg_c = _mm512_mask_mov_ps(neg_c, grew, new_neg_c);
      m = new_m;
    }
    // Pass B: the block's exps against the (new) lane maxima. -inf entries (or an all -inf lane)
    // make the fast exp NaN: the block is summed again with the clamped one, and so are the rest.
    __m512 sum = clamp ? BlockSumAvx512<true>(x, j, end, vs, neg_c) : BlockSumAvx512<false>(x, j, end, vs, neg_c);
    if (!clamp && _mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q) != 0) {
      clamp = true;
      sum = BlockSumAvx512<true>(x, j, end, vs, neg_c);
    }
    d = _mm512_add_ps(d, sum);
    j = end;
  }
  alignas(64) float lm[16], lc[16], ld[16];
  _mm512_store_ps(lm, m);
  _mm512_store_ps(lc, _mm512_sub_ps(_mm512_setzero_ps(), neg_c));
  _mm512_store_ps(ld, d);
  return FinishLanes(lm, lc, ld, 16, s, t, sel, out);
}

// ---- AVX2 ---------------------------------------------------------------------------------------

// 2^u for u <= ~1; -inf and NaN give 0 (max_ps(NaN, c) = c), u < -127 flushes to 0.
SD_TARGET_AVX2 inline __m256 Exp2Avx2(__m256 u) {
  const __m256 uc = _mm256_max_ps(u, _mm256_set1_ps(-127.0f));
  const __m256 n = _mm256_round_ps(uc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(uc, n);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(kP5), f, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  return _mm256_mul_ps(p, simd::Exp2NonPositive(n));
}

SD_TARGET_AVX2 bool RowAvx2(const float* x, int64_t n, float s, double t, Selection& sel, RowOut& out) {
  sel.Reset();
  const __m256 vs = _mm256_set1_ps(s), minus_s = _mm256_set1_ps(-s);
  __m256 m = _mm256_set1_ps(-INFINITY), neg_c = _mm256_set1_ps(INFINITY), d = _mm256_setzero_ps();
  __m256 thr = _mm256_set1_ps(-INFINITY);
  alignas(32) float tail[8];
  // Elements [i, i + 8) as a vector; the row's last partial vector is padded with -inf.
  auto load = [&](int64_t i, int64_t end) SD_TARGET_AVX2 {
    if (i + 8 <= end) return _mm256_loadu_ps(x + i);
    for (int l = 0; l < 8; ++l) tail[l] = i + l < end ? x[i + l] : -INFINITY;
    return _mm256_load_ps(tail);
  };
  for (int64_t j = 0; j < n;) {
    const int64_t end = std::min(n, j + kBlock);
    __m256 b0 = _mm256_set1_ps(-INFINITY), b1 = b0;
    for (int64_t i = j; i < end; i += 8) {
      const __m256 v = load(i, end);
      if ((i & 8) == 0) b0 = _mm256_max_ps(v, b0);
      else b1 = _mm256_max_ps(v, b1);
      const uint32_t valid = end - i >= 8 ? 0xFFu : (1u << (end - i)) - 1;
      const uint32_t c = sel.full() ? static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v, thr, _CMP_NLE_UQ))) & valid
                                    : valid;
      if (c != 0) {
        if (!OfferCandidates(x, i, c, sel)) return false;
        if (sel.full()) thr = _mm256_set1_ps(sel.worst());
      }
    }
    const __m256 new_m = _mm256_max_ps(_mm256_max_ps(b0, b1), m);
    const __m256 grew = _mm256_cmp_ps(new_m, m, _CMP_GT_OQ);
    if (_mm256_movemask_ps(grew) != 0) {
      const __m256 new_neg_c = _mm256_mul_ps(new_m, minus_s);
      d = _mm256_blendv_ps(d, _mm256_mul_ps(d, Exp2Avx2(_mm256_sub_ps(new_neg_c, neg_c))), grew);
      neg_c = _mm256_blendv_ps(neg_c, new_neg_c, grew);
      m = new_m;
    }
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t i = j;
    for (; i + 16 <= end; i += 16) {
      a0 = _mm256_add_ps(a0, Exp2Avx2(_mm256_fmadd_ps(_mm256_loadu_ps(x + i), vs, neg_c)));
      a1 = _mm256_add_ps(a1, Exp2Avx2(_mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), vs, neg_c)));
    }
    for (; i < end; i += 8) a0 = _mm256_add_ps(a0, Exp2Avx2(_mm256_fmadd_ps(load(i, end), vs, neg_c)));
    d = _mm256_add_ps(d, _mm256_add_ps(a0, a1));
    j = end;
  }
  alignas(32) float lm[8], lc[8], ld[8];
  _mm256_store_ps(lm, m);
  _mm256_store_ps(lc, _mm256_sub_ps(_mm256_setzero_ps(), neg_c));
  _mm256_store_ps(ld, d);
  return FinishLanes(lm, lc, ld, 8, s, t, sel, out);
}

// ---- kernel -------------------------------------------------------------------------------------

struct SoftmaxTopKKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}, {Elem::kInt64}, {Elem::kT, /*optional=*/true}};

  int64_t k;
  int64_t axis;
  float temperature;
  Isa isa;

  explicit SoftmaxTopKKernel(const Attrs& attrs)
      : k(attrs.RequiredInt("k")),
        axis(attrs.Int("axis", -1)),
        temperature(attrs.Float("temperature", 1.0f)),
        isa(SelectIsa()) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    if (x.rank() == 0) Fail(kOp, "input must have rank >= 1, got a scalar");
    const int64_t a = NormalizeAxis(kOp, axis, x.rank());
    if (k < 1) Fail(kOp, "k ", k, " is out of range (rule: k >= 1)");
    const int64_t n = x.shape[a];
    if (k > n) Fail(kOp, "k ", k, " is larger than the axis length ", n, " (rule: 1 <= k <= axis length)");
    if (!(temperature > 0.0f)) Fail(kOp, "temperature ", temperature, " is out of range (rule: temperature > 0)");

    std::vector<int64_t> out_shape = x.shape, lse_shape = x.shape;
    out_shape[a] = k;
    lse_shape[a] = 1;
    T* values = AllocOutput<T>(ctx, 0, out_shape);
    int64_t* indices = AllocOutput<int64_t>(ctx, 1, out_shape);
    // LogSumExp is optional: absent (2 outputs) or omitted (named ""), onnxruntime gives no tensor.
    T* lse = nullptr;
    if (ctx.GetOutputCount() > 2) {
      Ort::UnownedValue v = ctx.GetOutput(2, lse_shape);
      if (static_cast<OrtValue*>(v) != nullptr) lse = v.GetTensorMutableData<T>();
    }
    const AxisLayout l = AxisLayout::Of(x.shape, a);
    if (l.rows() == 0) return;

    const double t = temperature;
    const float s = static_cast<float>(1.4426950408889634 / t);  // log2(e) / T
    // The float pipeline needs a positive, finite scale; otherwise every row is done in double.
    const Isa row_isa = std::isfinite(s) && s > 0.0f ? isa : Isa::kPortable;
    const int64_t rows = l.rows();
    const size_t tasks = NumTasks(rows, n);
    ParallelFor(ctx, tasks, [&](size_t task) {
      int64_t r0, r1;
      TaskRange(task, tasks, rows, &r0, &r1);
      const bool direct = std::is_same_v<T, float> && l.inner == 1;
      std::vector<float> in_buf(direct ? 0 : static_cast<size_t>(n));
      std::vector<float> val_buf(static_cast<size_t>(k));
      std::vector<int64_t> idx_buf(static_cast<size_t>(k));
      Selection sel(k);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t o = r / l.inner, i = r % l.inner;
        const int64_t base = o * n * l.inner + i;
        const float* row;
        if (direct) {
          row = reinterpret_cast<const float*>(x.data) + base;
        } else {
          for (int64_t j = 0; j < n; ++j) in_buf[j] = ToFloat(x.data[base + j * l.inner]);
          row = in_buf.data();
        }
        RowOut out{val_buf.data(), idx_buf.data(), 0.0f};
        bool done = false;
        if (row_isa == Isa::kAvx512) done = RowAvx512(row, n, s, t, sel, out);
        else if (row_isa == Isa::kAvx2) done = RowAvx2(row, n, s, t, sel, out);
        if (!done) RowGeneric(row, n, t, sel, out);
        const int64_t out_base = o * k * l.inner + i;
        for (int64_t j = 0; j < k; ++j) {
          values[out_base + j * l.inner] = FromFloat<T>(val_buf[j]);
          indices[out_base + j * l.inner] = idx_buf[j];
        }
        if (lse != nullptr) lse[o * l.inner + i] = FromFloat<T>(out.lse);
      }
    });
  }
};

}  // namespace

SD_REGISTER_KERNEL(SoftmaxTopK, SoftmaxTopKKernel)

}  // namespace sd
