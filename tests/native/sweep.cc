// Size-sweep tester for the kernels written over the vector traits (ops/common/vec.h), built by CMake
// (target softdeploy_sweep, never installed) and run by tests/ops/test_sweep.py. For every variant this
// CPU runs (SOFTDEPLOY_TEST_CPU lowers it, as for the library) it sweeps row lengths n = 1 .. 3W + 1
// around the variant's vector width and group (W = 4 vectors per loop iteration), and the sizes around
// each kernel's tiles (SoftmaxTopK: the 512-entry partial sums, the candidate buffer's cut at k + 48;
// Softpick and TwoPassSoftmax: the 1024-entry blocks), over several kinds of rows, against float64 references computed
// here from the operators' equations -- not from another kernel. Generated sizes, not hand-listed
// samples. Prints one line per failure and a summary; exit status 1 on any failure.
//
//   SoftmaxTopK fast row (AVX2, AVX-512): the top k by the contract's order (larger value, then lower index),
//     exactly; sum_j 2^((x_j - M) s) to 2e-6 relative (float partial sums, the 8.6e-8 exp).
//   TwoPassSoftmax row (AVX2, AVX-512 with and without the x prefetch hint): y_i = exp(x_i - m) /
//     sum_j exp(x_j - m) to 1e-6 relative + 1e-37 absolute; rows with NaN, +inf or no finite entry,
//     and only those, refused (RowSafe's).
//   Softpick row (AVX2, AVX-512): y_i = max(e_i, 0) / (sum_{finite j} |e_j| + eps),
//     e_j = exp(x_j - m) - exp(-m); -inf -> 0, NaN -> NaN, +inf -> +inf, a row without a finite entry
//     all 0; to 2e-6 relative + 1e-37 absolute (the contract's tolerance; AVX2 flushes terms below
//     2^-126 of the row's largest to 0).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/cpu.h"
#include "softmax_topk_row.h"
#include "softpick_row.h"
#include "two_pass_softmax_row.h"

namespace {

int g_failures = 0, g_checks = 0;

void Fail(const std::string& what) {
  if (++g_failures <= 30) std::printf("FAIL %s\n", what.c_str());
}

// Row kinds: each stresses another path (candidates, raises of the reference, ties, masks, R > 0).
enum Kind { kNormal, kAscending, kTies, kMasked, kLarge, kSpecial, kKinds };
const char* kKindName[] = {"normal", "ascending", "ties", "masked", "large", "special"};

std::vector<float> MakeRow(int64_t n, Kind kind, std::mt19937& rng, bool allow_special) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = normal(rng);
  switch (kind) {
    case kAscending: std::sort(x.begin(), x.end()); break;  // every entry a candidate, C raised often
    case kTies:
      for (auto& v : x) v = std::round(v * 2.0f) / 2.0f;  // equal values across lanes and vectors
      break;
    case kMasked:
      for (auto& v : x)
        if (unit(rng) < 0.9f) v = -INFINITY;
      break;
    case kLarge:
      for (auto& v : x) v *= 40.0f;  // Softpick: logits > 69 raise its scale R
      break;
    case kSpecial:
      if (allow_special) {
        x[static_cast<size_t>(rng() % n)] = NAN;
        x[static_cast<size_t>(rng() % n)] = INFINITY;
        x[static_cast<size_t>(rng() % n)] = -INFINITY;
      }
      break;
    default: break;
  }
  return x;
}

// Lengths around a width w (lanes per vector, 4 vectors per iteration) and around each tile edge.
std::vector<int64_t> Sizes(int lanes, std::initializer_list<int64_t> tiles) {
  std::vector<int64_t> n;
  for (int64_t i = 1; i <= 3 * 4 * lanes + 1; ++i) n.push_back(i);
  for (int64_t t : tiles)
    for (int64_t d = -2; d <= 2; ++d)
      for (int64_t m : {1, 2, 3})
        if (t * m + d > 0) n.push_back(t * m + d);
  std::sort(n.begin(), n.end());
  n.erase(std::unique(n.begin(), n.end()), n.end());
  return n;
}

// ---- SoftmaxTopK --------------------------------------------------------------------------------

using TopKRow = bool (*)(const float*, int64_t, int64_t, float, const sd::softmax_topk::Candidates&, double*,
                         int64_t*);

void SweepSoftmaxTopK(const char* variant, TopKRow row, int lanes) {
  std::mt19937 rng(1);
  for (int64_t n : Sizes(lanes, {512, 1024})) {
    for (int kind = 0; kind < kKinds; ++kind) {
      if (kind == kLarge || kind == kSpecial) continue;  // those rows belong to the generic path
      const std::vector<float> x = MakeRow(n, static_cast<Kind>(kind), rng, false);
      for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{49}, n / 2, n - 1, n}) {
        if (k < 1 || k > n) continue;
        for (double t : {1.0, 0.37, 4.0}) {
          const float s = static_cast<float>(1.4426950408889634 / t);
          const size_t cap = static_cast<size_t>(sd::softmax_topk::CandidateCapacity(k));
          std::vector<float> values(cap);
          std::vector<int32_t> indices(cap), keys(cap);
          double sum = 0.0;
          int64_t count = 0;
          const std::string at = std::string("SoftmaxTopK ") + variant + " n=" + std::to_string(n) +
                                 " k=" + std::to_string(k) + " T=" + std::to_string(t) + " " + kKindName[kind];
          ++g_checks;
          if (!row(x.data(), n, k, s, {values.data(), indices.data(), keys.data()}, &sum, &count)) {
            // Only a row without a finite entry may leave the fast path here.
            if (std::any_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); }))
              Fail(at + ": fast path refused a finite row");
            continue;
          }
          if (count < k || count > k + sd::softmax_topk::kSlack) {
            Fail(at + ": candidate count " + std::to_string(count));
            continue;
          }
          // Reference order: larger value, then lower index; the kernel's first k by the same order.
          auto ranks_above = [&](int64_t a, int64_t b) { return x[a] != x[b] ? x[a] > x[b] : a < b; };
          std::vector<int64_t> want(static_cast<size_t>(n));
          for (int64_t j = 0; j < n; ++j) want[j] = j;
          std::partial_sort(want.begin(), want.begin() + k, want.end(), ranks_above);
          std::vector<int64_t> got(indices.begin(), indices.begin() + count);
          std::partial_sort(got.begin(), got.begin() + k, got.end(), ranks_above);
          for (int64_t i = 0; i < count; ++i)
            if (values[i] != x[indices[i]]) Fail(at + ": a candidate's value is not its entry's");
          for (int64_t i = 0; i < k; ++i) {
            if (got[i] != want[i]) {
              Fail(at + ": rank " + std::to_string(i) + " is index " + std::to_string(got[i]) + ", want " +
                   std::to_string(want[i]));
              break;
            }
          }
          double m = -INFINITY, ref = 0.0;
          for (float v : x) m = std::max<double>(m, v);
          for (float v : x)
            if (v > -INFINITY) ref += std::exp2((static_cast<double>(v) - m) * s);
          if (!(std::fabs(sum - ref) <= 2e-6 * ref))
            Fail(at + ": sum " + std::to_string(sum) + ", want " + std::to_string(ref));
        }
      }
    }
  }
}

// ---- Softpick -----------------------------------------------------------------------------------

using SoftpickRow = void (*)(const float*, float*, int64_t, float);

void SweepSoftpick(const char* variant, SoftpickRow row, int lanes) {
  std::mt19937 rng(2);
  for (int64_t n : Sizes(lanes, {1024})) {
    for (int kind = 0; kind < kKinds; ++kind) {
      const std::vector<float> x = MakeRow(n, static_cast<Kind>(kind), rng, true);
      for (float eps : {1e-6f, 0.0f, 0.5f}) {
        std::vector<float> y(static_cast<size_t>(n), -1.0f);
        row(x.data(), y.data(), n, eps);
        ++g_checks;
        const std::string at = std::string("Softpick ") + variant + " n=" + std::to_string(n) +
                               " eps=" + std::to_string(eps) + " " + kKindName[kind];
        double m = -INFINITY;
        for (float v : x)
          if (std::isfinite(v)) m = std::max<double>(m, v);
        double d = eps;
        for (float v : x)
          if (std::isfinite(v)) d += std::fabs(std::exp(v - m) - std::exp(-m));
        for (int64_t j = 0; j < n; ++j) {
          const float v = x[j];
          double want;
          if (m == -INFINITY) want = 0.0;  // no finite entry: all 0
          else if (std::isnan(v)) want = NAN;
          else if (v == INFINITY) want = INFINITY;
          else if (v == -INFINITY) want = 0.0;
          else want = std::max(std::exp(v - m) - std::exp(-m), 0.0) / d;
          const double got = y[j];
          const bool ok = std::isnan(want) ? std::isnan(got)
                                           : (std::isinf(want) ? got == want
                                                               : std::fabs(got - want) <= 2e-6 * std::fabs(want) + 1e-37);
          if (!ok) {
            Fail(at + " j=" + std::to_string(j) + ": " + std::to_string(got) + ", want " + std::to_string(want));
            break;
          }
        }
      }
    }
  }
}

// ---- TwoPassSoftmax ----------------------------------------------------------------------------

using TwoPassRow = bool (*)(const float*, float*, int64_t, float*);

bool TwoPassAvx512(const float* x, float* y, int64_t n, float* scratch) {
  return sd::two_pass::RowAvx512(x, y, n, scratch, false);
}
bool TwoPassAvx512Hinted(const float* x, float* y, int64_t n, float* scratch) {
  return sd::two_pass::RowAvx512(x, y, n, scratch, true);
}

void SweepTwoPass(const char* variant, TwoPassRow row, int lanes) {
  std::mt19937 rng(3);
  for (int64_t n : Sizes(lanes, {1024})) {
    for (int kind = 0; kind < kKinds; ++kind) {
      const std::vector<float> x = MakeRow(n, static_cast<Kind>(kind), rng, true);
      std::vector<float> y(static_cast<size_t>(n), -1.0f);
      std::vector<float> scratch(static_cast<size_t>((n + sd::two_pass::kBlock - 1) / sd::two_pass::kBlock *
                                                     sd::two_pass::kMaxLanes));
      ++g_checks;
      const std::string at = std::string("TwoPassSoftmax ") + variant + " n=" + std::to_string(n) + " " + kKindName[kind];
      double m = -INFINITY;
      bool special = false;
      for (float v : x) {
        special |= std::isnan(v) || v == INFINITY;
        m = std::max<double>(m, v);
      }
      special |= m == -INFINITY;
      const bool done = row(x.data(), y.data(), n, scratch.data());
      if (done == special) {  // the special rows, and only they, belong to RowSafe
        Fail(at + (done ? ": a row with NaN, +inf or no finite entry was computed" : ": refused"));
        continue;
      }
      if (!done) continue;
      double d = 0.0;
      for (float v : x) d += std::exp(v - m);
      for (int64_t j = 0; j < n; ++j) {
        const double want = std::exp(x[j] - m) / d, got = y[j];
        if (!(std::fabs(got - want) <= 1e-6 * want + 1e-37)) {
          Fail(at + " j=" + std::to_string(j) + ": " + std::to_string(got) + ", want " + std::to_string(want));
          break;
        }
      }
    }
  }
}

}  // namespace

int main() {
  const sd::Isa isa = sd::ChooseIsa().detected;  // SOFTDEPLOY_TEST_CPU lowers it, as for the library
  std::vector<std::string> ran;
  if (isa >= sd::Isa::kAvx2) {
    SweepSoftmaxTopK("avx2", sd::softmax_topk::FastRowAvx2, 8);
    SweepSoftpick("avx2", sd::softpick::RowAvx2, 8);
    SweepTwoPass("avx2", sd::two_pass::RowAvx2, 8);
    ran.push_back("avx2");
  }
  if (isa >= sd::Isa::kAvx512) {
    SweepSoftmaxTopK("avx512", sd::softmax_topk::FastRowAvx512, 16);
    SweepSoftpick("avx512", sd::softpick::RowAvx512, 16);
    SweepTwoPass("avx512", TwoPassAvx512, 16);
    SweepTwoPass("avx512 (prefetchnta)", TwoPassAvx512Hinted, 16);
    ran.push_back("avx512");
  }
  std::string list;
  for (const auto& r : ran) list += (list.empty() ? "" : ",") + r;
  std::printf("sweep: variants [%s] (cpu: %s), %d checks, %d failures\n", list.c_str(), sd::IsaName(isa), g_checks,
              g_failures);
  return g_failures == 0 ? 0 : 1;
}
