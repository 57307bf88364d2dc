// SoftmaxTopK -- fused softmax + top-k (Milakov & Gimelshein 2018, arXiv 1805.02867, Algorithm 4).
//
//   z = x / temperature
//   Values, Indices = TopK(Softmax(z), k)      (descending; equal logits -> lower index first)
//   LogSumExp       = m + log sum_j exp(z_j - m)
//
// Python half, the contract, the ranking rule for NaN/+inf/-inf rows and the float64 oracle:
// softdeploy/ops/softmax_topk.py; docs/ops/SoftmaxTopK.md.
//
// One read of x per row, never a probability row. Two designs share the entry points and the
// final emit (values: exp((x_i - M)/T) / D for the k winners only, in double):
//  * AVX-512 and AVX2: one fast row written once over the vector traits (ops/softmax_topk_kernels.h)
//    and compiled per ISA translation unit (ops/softmax_topk_avx512.cc, ops/softmax_topk_avx2.cc):
//    one pass per row -- a candidate buffer filled by compress and cut back exactly to the k best,
//    and the normaliser against ONE reference per row with a table-based exp (AVX-512: 32 entries in
//    two registers and a degree-2 polynomial, about 11 vector ops per 16 entries; AVX2: 8 entries in
//    one register, degree 3).
//  * portable: RowGeneric, in double, with a heap of the k best (logit, index) pairs.
//
// What must stay true:
//  * The fast variants (AVX-512, AVX2) handle rows of finite and -inf entries. A NaN or +inf entry is
//    always a candidate (the compare is NLE_UQ: NaN passes), and the candidate path hands the row to
//    RowGeneric, which implements every special row of the contract in double. So does a row whose
//    scaled logits leave the supported range (tiny temperatures, huge logits).
//  * -inf entries contribute 0 in RowGeneric; in the fast variants less than 2^-120 of the row's
//    largest term each (they are clamped there), far below float resolution.
//  * Rows are independent: threads split rows, never a row; results do not depend on the thread
//    count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/kernel.h"
#include "softmax_topk_contract.h"
#include "softmax_topk_row.h"

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
void EmitFinite(const std::vector<Entry>& top, float m, double d, double t, RowOut& out) {
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
    // (no structured binding: lambdas below capture these, which C++17 allows only for plain variables)
    const SoftmaxTopKCall<T> call = StartSoftmaxTopK(kOp, ctx, x, k, axis, temperature);
    const AxisLayout& l = call.layout;
    T* const values = call.values;
    int64_t* const indices = call.indices;
    T* const lse = call.lse;
    const int64_t n = l.n;
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
      const bool fast = row_isa == Isa::kAvx512 || row_isa == Isa::kAvx2;
      const size_t cap = fast ? static_cast<size_t>(softmax_topk::CandidateCapacity(k)) : 0;
      std::vector<float> cand_values(cap);
      std::vector<int32_t> cand_indices(cap), cand_keys(cap);
      const softmax_topk::Candidates cand{cand_values.data(), cand_indices.data(), cand_keys.data()};
      std::vector<Entry> top;
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
        if (fast) {
          double sum;
          int64_t count;
          done = row_isa == Isa::kAvx512 ? softmax_topk::FastRowAvx512(row, n, k, s, cand, &sum, &count)
                                         : softmax_topk::FastRowAvx2(row, n, k, s, cand, &sum, &count);
          if (done) {
            top.clear();
            for (int64_t j = 0; j < count; ++j) top.push_back(Entry{cand.values[j], cand.indices[j]});
            auto order = [](const Entry& p, const Entry& q) { return RanksAboveNoNan(p, q); };
            if (count == k) {
              std::sort(top.begin(), top.end(), order);
            } else {
              std::partial_sort(top.begin(), top.begin() + k, top.end(), order);
              top.resize(static_cast<size_t>(k));
            }
            EmitFinite(top, top.front().value, sum, t, out);
          }
        }
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
