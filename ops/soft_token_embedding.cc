// SoftTokenEmbedding -- soft thinking's next input embedding (Soft Thinking; SofT-GRPO).
//
//   p       = softmax(Logits[b] / T)                      (T, top_k, top_p, min_p by the row's Mode)
//   Entropy = -sum_j p_j ln p_j
//   rank    : entries by logit, larger first, equal logits -> lower id first
//   keep    : the rank prefix of length min(kk, n_p, n_min): kk = top_k (0 or >= V: V);
//             i < n_p iff sum_{j<i} p_(j) < top_p * Z, Z = sum_{j<kk} p_(j) (1 when top_k is off);
//             i < n_min iff p_(i) >= min_p * p_(0)
//   Ids     = the first max_topk ranked ids; w = p renormalised over the kept ones among them, else 0
//   gumbel  : (thinking rows) w = softmax((ln(w + 1e-6) + noise_factor * clip(-ln(-ln U[Ids]), lo, hi)) / tau),
//             re-sorted by w (stable)
//   Mixed   = sum_k w_k Embedding[Ids_k]
//
// Python half, the rules for special values and the float64 oracle: softdeploy/ops/soft_token_embedding.py;
// docs/ops/SoftTokenEmbedding.md.
//
// One read of the logits per row: SoftmaxTopK's fast row (ops/softmax_topk_kernels.h, with the
// entropy's sum d1 = sum 2^u u fused in, kEntropy) gives the top kc = max(max_topk, top_k) candidates
// and the normaliser D = sum_j exp((x_j - M) / T) relative to the row maximum M. The rest works on
// the kc candidates in double:
//  * every filter keeps a prefix of the ranking, and only the first max_topk slots are output, so the
//    kept slots are the first min(max_topk, n) candidates -- no filter needs an entry beyond the kc;
//  * top_k: Z D = sum of the kk candidates' exp((x - M) / T), exact; top_p compares the running sum of
//    candidates before slot i (exact) against top_p * Z D, which needs the whole row's D only when
//    top_k is off -- the fast row's D (relative error ~1e-7) is then the one approximate quantity, so a
//    slot whose preceding mass is within that of top_p may be decided differently from float64;
//  * min_p: exp((x_i - M) / T) >= min_p (p_(0) is the maximum, exp(0) = 1), normaliser-free.
// Then the K x E weighted gather (per ISA). The portable variant and every row the fast row refuses
// (NaN, +inf, all -inf, scaled logits beyond its range) take RowGeneric: double, two reads (max,
// then exps and a heap of the kc best by the ranking rule).
//
// What must stay true: rows are independent (threads split rows, never a row); the ranking is
// SoftmaxTopK's; a Noise value is read only for the Ids of thinking rows with a distribution.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "common/kernel.h"
#include "soft_token_embedding_contract.h"
#include "soft_token_embedding_row.h"

namespace sd {
namespace {

constexpr const char* kOp = kSoftTokenEmbedding;
constexpr double kLogEps = 1e-6;  // SofT-GRPO: log(topk_probs + 1e-6)

struct Entry {
  float value;
  int64_t index;
};

// The ranking: NaN above everything, then larger value, then lower index (SoftmaxTopK's).
struct RanksAbove {
  bool operator()(const Entry& a, const Entry& b) const {
    const bool an = std::isnan(a.value), bn = std::isnan(b.value);
    if (an != bn) return an;
    if (!an && a.value != b.value) return a.value > b.value;
    return a.index < b.index;
  }
};

// One row's outputs before the gather: the K slots in output order, and the entropy.
struct RowResult {
  std::vector<double> w;
  std::vector<int64_t> ids;
  double entropy;
};

struct SoftTokenEmbeddingKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kT, true}, {Elem::kInt64, true}};
  static constexpr Port kOutputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kInt64}, {Elem::kT}};

  SoftTokenEmbeddingContract c;
  Isa isa;

  explicit SoftTokenEmbeddingKernel(const Attrs& attrs) : c(attrs), isa(SelectIsa()) {}

  // The filters, the weights and the noise of a row with a distribution, from its ranked candidates
  // (cand[0] the maximum M), e_i = exp((x_i - M) / T) for them, and d = sum_j exp((x_j - M) / T) over
  // the row.
  void Finish(const std::vector<Entry>& cand, double d, const Filters& f, int64_t v, const float* u_row, int64_t row,
              RowResult& out) const {
    const int64_t kc = static_cast<int64_t>(cand.size());
    std::vector<double> e(static_cast<size_t>(kc));
    for (int64_t i = 0; i < kc; ++i) {
      e[i] = std::exp((static_cast<double>(cand[i].value) - cand[0].value) / f.temperature);
    }
    const bool top_k_on = f.top_k > 0 && f.top_k < v;
    int64_t n = std::min(c.max_topk, top_k_on ? f.top_k : c.max_topk);
    if (f.top_p < 1.0) {
      const double z = top_k_on ? std::accumulate(e.begin(), e.begin() + f.top_k, 0.0) : d;
      const double bound = f.top_p * z;
      double before = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        if (!(before < bound)) {
          n = i;
          break;
        }
        before += e[i];
      }
    }
    if (f.min_p > 0.0) {
      for (int64_t i = 0; i < n; ++i) {
        if (!(e[i] >= f.min_p)) {  // p_(i) >= min_p p_(0), p_(0) = 1 / d
          n = i;
          break;
        }
      }
    }
    const int64_t k = c.max_topk;
    double kept = 0.0;
    for (int64_t i = 0; i < n; ++i) kept += e[i];
    out.w.assign(static_cast<size_t>(k), 0.0);
    out.ids.resize(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) {
      out.ids[i] = cand[i].index;
      if (i < n) out.w[i] = e[i] / kept;
    }
    if (u_row == nullptr) return;
    // Gumbel (SofT-GRPO): g = clip(-ln(-ln U), lo, hi); w = softmax((ln(w + 1e-6) + c.noise_factor g) / c.tau).
    std::vector<double> y(static_cast<size_t>(k));
    double y_max = -INFINITY;
    for (int64_t i = 0; i < k; ++i) {
      const float uf = u_row[out.ids[i]];
      if (!(uf >= 0.0f && uf <= 1.0f)) {
        Fail(kOp, "Noise[", row, ", ", out.ids[i], "] = ", uf, " is outside [0, 1] (rule: Noise is uniform in (0, 1))");
      }
      const double g = std::clamp(-std::log(-std::log(static_cast<double>(uf))), static_cast<double>(c.clamp_min),
                                  static_cast<double>(c.clamp_max));
      y[i] = (std::log(out.w[i] + kLogEps) + static_cast<double>(c.noise_factor) * g) / static_cast<double>(c.tau);
      y_max = std::max(y_max, y[i]);
    }
    double sum = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      y[i] = std::exp(y[i] - y_max);
      sum += y[i];
    }
    std::vector<int64_t> order(static_cast<size_t>(k));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return y[a] > y[b]; });
    const std::vector<int64_t> ids = out.ids;
    for (int64_t i = 0; i < k; ++i) {
      out.w[i] = y[order[i]] / sum;
      out.ids[i] = ids[order[i]];
    }
  }

  // Every row in double, two reads: the maximum (and NaN / +inf), then the exps, the entropy's sum
  // and a heap of the kc best entries by the ranking rule.
  void RowGeneric(const float* x, int64_t v, int64_t kc, const Filters& f, const float* u_row, int64_t row,
                  std::vector<Entry>& heap, RowResult& out) const {
    bool special = false;
    float m = -INFINITY;
    for (int64_t j = 0; j < v; ++j) {
      if (std::isnan(x[j]) || x[j] == INFINITY) special = true;
      else m = std::max(m, x[j]);
    }
    special = special || m == -INFINITY;
    heap.clear();
    double d = 0.0, d1 = 0.0;
    const double t = f.temperature;
    for (int64_t j = 0; j < v; ++j) {
      const Entry en{x[j], j};
      if (static_cast<int64_t>(heap.size()) < kc) {
        heap.push_back(en);
        std::push_heap(heap.begin(), heap.end(), RanksAbove());
      } else if (RanksAbove()(en, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), RanksAbove());
        heap.back() = en;
        std::push_heap(heap.begin(), heap.end(), RanksAbove());
      }
      if (!special && x[j] > -INFINITY) {
        const double z = (static_cast<double>(x[j]) - m) / t;
        const double ez = std::exp(z);
        d += ez;
        d1 += ez * z;
      }
    }
    std::sort(heap.begin(), heap.end(), RanksAbove());
    if (special) {
      out.w.assign(static_cast<size_t>(c.max_topk), NAN);
      out.ids.resize(static_cast<size_t>(c.max_topk));
      for (int64_t i = 0; i < c.max_topk; ++i) out.ids[i] = heap[i].index;
      out.entropy = NAN;
      return;
    }
    out.entropy = std::log(d) - d1 / d;
    Finish(heap, d, f, v, u_row, row, out);
  }

  void Compute(Ort::KernelContext& ctx) const {
    const Input<float> x = GetInput<float>(ctx, 0);
    const Input<float> emb = GetInput<float>(ctx, 1);
    const Input<float> u = GetInput<float>(ctx, 2);
    const Input<int64_t> mode = GetInput<int64_t>(ctx, 3);
    c.Check(x.shape, emb.shape, u.present ? &u.shape : nullptr, mode.present ? &mode.shape : nullptr, mode.data);
    const int64_t b = x.shape[0], v = x.shape[1], e = emb.shape[1], k = c.max_topk;
    float* mixed = AllocOutput<float>(ctx, 0, {b, e});
    float* weights = AllocOutput<float>(ctx, 1, {b, k});
    int64_t* ids = AllocOutput<int64_t>(ctx, 2, {b, k});
    float* entropy = AllocOutput<float>(ctx, 3, {b});
    if (b == 0) return;
    const bool gumbel = c.noise == "gumbel";
    const int64_t kc_max = std::min(v, std::max(c.NumCandidates(c.thinking, v), c.NumCandidates(c.after, v)));
    const size_t tasks = NumTasks(b, v);
    // A Noise value outside [0, 1] is found inside a task, which must not throw: each task keeps its
    // first error, and the lowest row's is raised after the loop (the same error at any thread count).
    std::vector<std::string> errors(tasks);
    ParallelFor(ctx, tasks, [&](size_t task) {
      int64_t r0, r1;
      TaskRange(task, tasks, b, &r0, &r1);
      try {
        Rows(x, emb, u, mode, r0, r1, kc_max, gumbel, mixed, weights, ids, entropy);
      } catch (const std::exception& err) {
        errors[task] = err.what();
      }
    });
    for (const std::string& err : errors) {
      if (!err.empty()) throw OpError(err);
    }
  }

  void Rows(const Input<float>& x, const Input<float>& emb, const Input<float>& u, const Input<int64_t>& mode,
            int64_t r0, int64_t r1, int64_t kc_max, bool gumbel, float* mixed, float* weights, int64_t* ids,
            float* entropy) const {
    const int64_t v = x.shape[1], e = emb.shape[1], k = c.max_topk;
    {
      const size_t cap = static_cast<size_t>(softmax_topk::CandidateCapacity(kc_max));
      std::vector<float> cand_values(cap);
      std::vector<int32_t> cand_indices(cap), cand_keys(cap);
      const softmax_topk::Candidates buf{cand_values.data(), cand_indices.data(), cand_keys.data()};
      std::vector<Entry> cand;
      std::vector<float> wf(static_cast<size_t>(k));
      RowResult out;
      for (int64_t r = r0; r < r1; ++r) {
        const bool is_after = mode.present && mode.data[r] == 1;
        const Filters& f = is_after ? c.after : c.thinking;
        const int64_t kc = std::min(v, c.NumCandidates(f, v));
        const float* row = x.data + r * v;
        const float* u_row = gumbel && !is_after ? u.data + r * v : nullptr;
        const float s = static_cast<float>(1.4426950408889634 / f.temperature);  // log2(e) / T
        bool done = false;
        if ((isa == Isa::kAvx512 || isa == Isa::kAvx2) && std::isfinite(s) && s > 0.0f) {
          double sum, sum_u;
          int64_t count;
          done = isa == Isa::kAvx512 ? soft_token_embedding::FastRowAvx512(row, v, kc, s, buf, &sum, &sum_u, &count)
                                     : soft_token_embedding::FastRowAvx2(row, v, kc, s, buf, &sum, &sum_u, &count);
          if (done) {
            cand.clear();
            for (int64_t j = 0; j < count; ++j) cand.push_back(Entry{cand_values[j], cand_indices[j]});
            std::partial_sort(cand.begin(), cand.begin() + kc, cand.end(), RanksAbove());
            cand.resize(static_cast<size_t>(kc));
            // p_j = 2^u_j / sum, u_j = (x_j - M) s: H = ln sum - ln 2 * sum_u / sum
            out.entropy = std::log(sum) - 0.6931471805599453 * sum_u / sum;
            Finish(cand, sum, f, v, u_row, r, out);
          }
        }
        if (!done) RowGeneric(row, v, kc, f, u_row, r, cand, out);
        for (int64_t i = 0; i < k; ++i) {
          wf[i] = static_cast<float>(out.w[i]);
          weights[r * k + i] = wf[i];
          ids[r * k + i] = out.ids[i];
        }
        entropy[r] = static_cast<float>(out.entropy);
        float* mixed_row = mixed + r * e;
        if (isa == Isa::kAvx512) {
          soft_token_embedding::WeightedRowsAvx512(emb.data, e, out.ids.data(), wf.data(), k, mixed_row);
        } else if (isa == Isa::kAvx2) {
          soft_token_embedding::WeightedRowsAvx2(emb.data, e, out.ids.data(), wf.data(), k, mixed_row);
        } else {
          for (int64_t c = 0; c < e; ++c) {
            float a = 0.0f;
            for (int64_t i = 0; i < k; ++i) a = std::fma(wf[i], emb.data[out.ids[i] * e + c], a);
            mixed_row[c] = a;
          }
        }
      }
    }
  }

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    Compute(ctx);
  }
};

}  // namespace

void RegisterSoftTokenEmbedding(Ort::CustomOpDomain& domain) { AddOp<SoftTokenEmbeddingKernel, float>(domain); }

}  // namespace sd
