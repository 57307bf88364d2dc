// Size-sweep tester for the kernels written over the vector traits (ops/common/vec.h), built by CMake
// (target softdeploy_sweep, never installed) and run by tests/ops/test_sweep.py. For every variant this
// CPU runs (SOFTDEPLOY_TEST_CPU lowers it, as for the library) it sweeps row lengths n = 1 .. 3W + 1
// around the variant's vector width and group (W = 4 vectors per loop iteration), and the sizes around
// each kernel's tiles (SoftmaxTopK: the 512-entry partial sums, the candidate buffer's cut at k + 48;
// Softpick, TwoPassSoftmax, MultiMax: the 1024-entry blocks; AdaptiveTemperatureSoftmax: the kFold
// vectors summed in float; SoftNMS: 1 .. 3L + 1 blocks of 16 slots, L blocks a step; MaxSim: the
// register block R and the query tile; LoRAMixer, whose pieces are in ops/lora_mixer_tiles.h rather than
// over the traits: its dot tile's 16-lane steps and the 384 of MiniLM, its up-projection's 32- and 64-wide
// steps and their tails, the r = 8 register transpose's 16-row blocks), over several kinds of rows, against float64 references
// computed here from the operators' equations -- not from another kernel. Generated sizes, not
// hand-listed samples. Prints one line per failure and a summary; exit status 1 on any failure.
// Tolerances (each with its reason where it is not the contract's):
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
//   MultiMax row (AVX2, AVX-512): softmax(sigma(x) + mask), every mask layout (none, one value, a row).
//   AdaptiveTemperatureSoftmax passes (AVX2, AVX-512): the row statistics and the output pass.
//   SoftNMS passes (AVX2, AVX-512; the AVX-512 weights): exactly, the IoU's float expressions.
//   MaxSim / SignedMaxSim tiles: float32 (AVX2, AVX-512), float16's widening (F16C), int8 (AVX2
//     vpmaddwd, AVX-VNNI and AVX-512 VNNI where the CPU has them; the AVX-VNNI tile's source also with
//     vpdpbusd's EVEX encoding on every CPU with AVX-512 VNNI, ops/common/avxvnni.h).
//   LoRAMixer pieces (portable, AVX2, AVX-512; the routing once): the up-projection bit-identical to
//     the scalar fma chain, the transpose and the finiteness flags exactly, dot tiles to the float64 dot
//     within (n + 2) u sum |terms| and bit-identical where the kernel promises it (see SweepLoRAMixerDot).
//   RowwiseInt8MatMul (not over the traits either: its tiles are integer): the AVX2 row quantization bit-identical
//     to the portable one; every GEMM path (portable loops, AVX2 and AVX-512 BW int16 groups 4 / 2 / 1, AVX-VNNI
//     (also as EVEX, like MaxSim's), AVX-512 VNNI) exactly: the int64 sums recomputed here, then the contract's float32 epilogue, bit for bit.
// (Each sweep's own comment below states its equations and tolerances.)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "adaptive_temperature_softmax_row.h"
#include "avxvnni_evex.h"  // the sweep's own EVEX twins of the AVX-VNNI units
#include "common/cpu.h"
#include "common/simd_math.h"
#include "common/weight_arena.h"
#include "lora_mixer_tiles.h"
#include "max_sim_tile.h"
#include "multi_max_row.h"
#include "rowwise_int8_matmul_common.h"
#include "soft_nms_row.h"
#include "softmax_topk_row.h"
#include "softpick_row.h"
#include "two_pass_softmax_row.h"

namespace {

int g_failures = 0, g_checks = 0;
std::map<std::string, int> g_op_checks;  // checks per operator (the test asserts every op was swept)

template <class F>
void Run(const char* op, F&& sweep) {
  const int before = g_checks;
  sweep();
  g_op_checks[op] += g_checks - before;
}

void Fail(const std::string& what) {
  if (++g_failures <= (std::getenv("SWEEP_ALL") ? 100000 : 30)) std::printf("FAIL %s\n", what.c_str());
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
          if (count < k || count > k + sd::softmax_topk::CutSlack(k)) {
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

// ---- MultiMax -----------------------------------------------------------------------------------

using MultiMaxRow = void (*)(const sd::multi_max::RowArgs&, const sd::multi_max::SigmaParams&);

// sigma's parameters with its limits at -inf / +inf, from the equation (sigma ~ t2 x^2 + (1 - t0) x
// as x -> -inf, ~ t3 x^2 + (1 + t1) x as x -> +inf).
sd::multi_max::SigmaParams SigmaParamsOf(const double (&r)[4], const double (&t)[4]) {
  sd::multi_max::SigmaParams p{};
  for (int k = 0; k < 4; ++k) p.r[k] = r[k], p.t[k] = t[k];
  p.finite = true;
  p.neg = t[2] != 0 ? (t[2] > 0 ? INFINITY : -INFINITY) : (t[0] < 1 ? -INFINITY : (t[0] > 1 ? INFINITY : r[0]));
  p.pos = t[3] != 0 ? (t[3] > 0 ? INFINITY : -INFINITY) : (t[1] > -1 ? INFINITY : (t[1] < -1 ? -INFINITY : r[1]));
  return p;
}

double SigmaRef(const sd::multi_max::SigmaParams& p, double x) {
  if (x == -INFINITY) return p.neg;
  if (x == INFINITY) return p.pos;
  auto relu = [](double v) { return v > 0 ? v : 0.0; };
  const double a = relu(p.r[0] - x), b = relu(x - p.r[1]), c = relu(p.r[2] - x), d = relu(x - p.r[3]);
  return x + p.t[0] * a + p.t[1] * b + p.t[2] * c * c + p.t[3] * d * d;
}

//   y = softmax(sigma(x) + mask) with z in float64; a row whose z holds NaN or +inf, or only -inf, all
//   NaN; to 2e-6 relative + 1e-37 absolute (AVX2 flushes terms below 2^-126 of a block's largest).
void SweepMultiMax(const char* variant, MultiMaxRow row, int lanes) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  struct Params {
    const char* name;
    double r[4], t[4];
  };
  const Params params[] = {
      {"softmax", {0, 0, 0, 0}, {0, 0, 0, 0}},
      {"linear", {-1.0, 1.0, -2.0, 2.0}, {1.7, 0.3, 0.0, 0.0}},
      {"quadratic", {-1.0, 1.0, -2.0, 2.0}, {0.5, -0.4, 0.05, 0.02}},
  };
  const auto sizes = Sizes(lanes, {sd::multi_max::kBlock});
  for (int64_t n : sizes) {
    for (int kind = 0; kind < kKinds; ++kind) {
      const std::vector<float> x = MakeRow(n, static_cast<Kind>(kind), rng, true);
      std::vector<float> mask_row(static_cast<size_t>(n));
      for (auto& v : mask_row) v = unit(rng) < 0.1f ? -INFINITY : normal(rng);
      for (const Params& prm : params) {
        const sd::multi_max::SigmaParams p = SigmaParamsOf(prm.r, prm.t);
        // mask: none (0 repeated), one value repeated, a row of its own
        for (int mode = 0; mode < 3; ++mode) {
          const float repeated = mode == 0 ? 0.0f : -3.5f;
          const float* mask = mode == 2 ? mask_row.data() : &repeated;
          std::vector<float> y(static_cast<size_t>(n), -1.0f);
          std::vector<double> block_max(static_cast<size_t>((n + sd::multi_max::kBlock - 1) / sd::multi_max::kBlock));
          sd::multi_max::RowArgs a{x.data(), mask, mode == 2 ? 1 : 0, y.data(), n, block_max.data()};
          row(a, p);
          ++g_checks;
          const std::string at = std::string("MultiMax ") + variant + " n=" + std::to_string(n) + " " + prm.name +
                                 " mask" + std::to_string(mode) + " " + kKindName[kind];
          std::vector<double> z(static_cast<size_t>(n));
          double m = -INFINITY;
          bool nan_row = false;
          for (int64_t j = 0; j < n; ++j) {
            z[j] = SigmaRef(p, x[j]) + mask[mode == 2 ? j : 0];
            nan_row |= std::isnan(z[j]) || z[j] == INFINITY;
            m = std::max(m, z[j]);
          }
          nan_row |= m == -INFINITY;
          double d = 0.0;
          if (!nan_row)
            for (double v : z) d += std::exp(v - m);
          for (int64_t j = 0; j < n; ++j) {
            const double got = y[j];
            const bool ok = nan_row ? std::isnan(got)
                                    : std::fabs(got - std::exp(z[j] - m) / d) <= 2e-6 * std::exp(z[j] - m) / d + 1e-37;
            if (!ok) {
              Fail(at + " j=" + std::to_string(j) + ": " + std::to_string(got) + ", want " +
                   std::to_string(nan_row ? NAN : std::exp(z[j] - m) / d));
              break;
            }
          }
        }
      }
    }
  }
}

// ---- AdaptiveTemperatureSoftmax ----------------------------------------------------------------

struct AtsPasses {
  sd::ats::Stats1 (*pass1)(const float*, int64_t);
  sd::ats::Stats2 (*pass2)(const float*, int64_t, float, float, float);
  void (*write)(const float*, float*, int64_t, float, float, float, bool);
};

bool Near(double got, double want, double rel, double abs = 0.0) {
  return std::fabs(got - want) <= rel * std::fabs(want) + abs;
}

// With z_j = x_j - m (m = max x), e_j = exp(z_j), -inf entries adding exactly 0:
//   pass 1: m exactly, whether a NaN was seen, d = sum e_j and s = sum e_j z_j to 4e-6 relative;
//   pass 2 at beta_hat: W_k = sum exp(beta_hat z_j) z_j^k (k = 0..3, terms of one sign) to 4e-6 + 1.2e-7
//     |beta_hat z_j| of each term (z is formed in float),
//     G = sum g(v_j), g(v) = log1p(e^v) e^-v, v_j = log(1e-9 d) - z_j, to 1e-5 relative;
//   output pass: y_j = exp(beta z_j) * inv to 2e-6 + 1.2e-7 |beta z_j| relative + 2^-126 absolute, streamed or not, at
//     every alignment of y mod 64 bytes (the AVX-512 peel, the AVX2 aligned streaming stores).
void SweepAts(const char* variant, const AtsPasses& v, int lanes) {
  std::mt19937 rng(5);
  for (int64_t n : Sizes(lanes, {static_cast<int64_t>(sd::ats::kFold) * lanes})) {
    for (int kind = 0; kind < kKinds; ++kind) {
      const std::vector<float> x = MakeRow(n, static_cast<Kind>(kind), rng, true);
      const std::string at = std::string("AdaptiveTemperatureSoftmax ") + variant + " n=" + std::to_string(n) + " " +
                             kKindName[kind];
      ++g_checks;
      const sd::ats::Stats1 st = v.pass1(x.data(), n);
      bool nan = false;
      float m = -INFINITY;
      for (float e : x) nan |= std::isnan(e), m = std::isnan(e) ? m : std::max(m, e);
      if (st.bad != nan) {
        Fail(at + ": pass 1 NaN flag " + std::to_string(st.bad));
        continue;
      }
      if (nan) continue;  // the driver writes NaN; nothing else of the pass is used
      if (st.m != m) {
        Fail(at + ": pass 1 max " + std::to_string(st.m) + ", want " + std::to_string(m));
        continue;
      }
      if (!std::isfinite(m)) continue;  // +inf or only -inf: all NaN in the driver
      double d = 0.0, s = 0.0;
      for (float e : x) {
        if (e == -INFINITY) continue;
        const double z = static_cast<double>(e) - m;
        d += std::exp(z), s += std::exp(z) * z;
      }
      // Absolute allowance: terms below 2^-126 may flush to 0 (AVX2's exp; float underflow), each at most
      // 2^-126 |z|^k; relative to W0 >= 1 (the max's own term) it is nothing.
      double zmax = 0.0;
      for (float e : x)
        if (e != -INFINITY) zmax = std::max(zmax, static_cast<double>(m) - e);
      auto flush = [&](int k) { return static_cast<double>(n) * 1.2e-38 * std::pow(std::max(zmax, 1.0), k); };
      if (!Near(st.d, d, 4e-6) || !Near(st.s, s, 4e-6, flush(1))) {
        Fail(at + ": pass 1 d " + std::to_string(st.d) + " s " + std::to_string(st.s) + ", want " + std::to_string(d) +
             " " + std::to_string(s));
        continue;
      }
      const float log_eps_d = static_cast<float>(std::log(1e-9 * d));
      for (double beta_hat : {1.0, 1.37, 2.42}) {
        ++g_checks;
        const sd::ats::Stats2 s2 = v.pass2(x.data(), n, m, static_cast<float>(beta_hat), log_eps_d);
        // Each term's allowance: 4e-6 of it, plus 1.2e-7 |beta_hat z| of it (z = x - m is formed in float).
        double w[4] = {0, 0, 0, 0}, wtol[4] = {0, 0, 0, 0}, g = 0.0;
        for (float e : x) {
          if (e == -INFINITY) continue;
          const double z = static_cast<double>(e) - m, wz = std::exp(beta_hat * z);
          for (int k = 0; k < 4; ++k) {
            w[k] += wz * std::pow(z, k);
            wtol[k] += (4e-6 + 1.2e-7 * std::fabs(beta_hat * z)) * std::fabs(wz * std::pow(z, k));
          }
          const double vv = log_eps_d - z;
          g += (vv < 0 ? std::log1p(std::exp(vv)) : vv + std::log1p(std::exp(-vv))) * std::exp(-vv);  // no inf * 0
        }
        const double got[4] = {s2.w0, s2.w1, s2.w2, s2.w3};
        for (int k = 0; k < 4; ++k) {
          if (!Near(got[k], w[k], 0.0, wtol[k] + flush(k))) {
            char buf[96];
            std::snprintf(buf, sizeof buf, "%.9g, want %.9g", got[k], w[k]);
            Fail(at + " beta_hat=" + std::to_string(beta_hat) + ": pass 2 W" + std::to_string(k) + " " + buf);
          }
        }
        if (!Near(s2.g, g, 1e-5, flush(1) + 1.2e-38 * n * std::fabs(log_eps_d)))
          Fail(at + " beta_hat=" + std::to_string(beta_hat) + ": pass 2 G " + std::to_string(s2.g) + ", want " +
               std::to_string(g));
      }
      for (double beta : {1.0, 1.9}) {
        const double inv = 1.0 / d;
        for (int offset : {0, 1, 3}) {
          for (bool stream : {false, true}) {
            ++g_checks;
            std::unique_ptr<float[]> mem(new float[static_cast<size_t>(n) + 32]);
            float* y = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(mem.get()) + 63) / 64 * 64) + offset;
            v.write(x.data(), y, n, m, static_cast<float>(beta), static_cast<float>(inv), stream);
            for (int64_t j = 0; j < n; ++j) {
              // beta (x - m) is formed in float (two roundings: 1.2e-7 |beta z| relative in y); terms
              // below 2^-126 may flush to 0.
              const double arg = beta * (static_cast<double>(x[j]) - m);
              const double want = std::exp(arg) * static_cast<float>(inv);
              if (x[j] == -INFINITY ? y[j] != 0.0f : !Near(y[j], want, 2e-6 + 1.2e-7 * std::fabs(arg), 1.2e-38)) {
                Fail(at + " beta=" + std::to_string(beta) + " offset=" + std::to_string(offset) +
                     (stream ? " stream" : "") + " j=" + std::to_string(j) + ": " + std::to_string(y[j]) + ", want " +
                     std::to_string(want));
                break;
              }
            }
          }
        }
      }
    }
  }
}

// ---- SoftNMS -------------------------------------------------------------------------------------

struct NmsPasses {
  int64_t (*scan)(const sd::soft_nms::Selected&, const sd::soft_nms::Slots&, float);
  float (*max)(const float*, int64_t, int64_t);
  int64_t (*first_equal)(const float*, int64_t, int64_t, float);
};

// Scan: the live slots (pos >= 0) with iw > 0 and ih > 0, iw = (min(hi0, t.hi0) - max(lo0, t.lo0)) +
//   offset (ih likewise), in slot order, as (iw * ih, (t.area + area) - iw * ih, pos), exactly (the
//   float expressions of the IoU: every variant gives the oracle's bits); the blocks' boxes from their
//   live slots as the kernel keeps them, tombstones pos -1 / hi0 -inf.
// Max / FirstEqual: the largest of s[begin, end) and the first position holding a value, exactly.
void SweepSoftNms(const char* variant, const NmsPasses& v, int lanes) {
  using sd::soft_nms::kBlock;
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<int64_t> block_counts;
  for (int64_t b = 1; b <= 3 * lanes + 1; ++b) block_counts.push_back(b);
  for (int64_t blocks : block_counts) {
    for (float offset : {0.0f, 1.0f}) {
      for (int round = 0; round < 3; ++round) {
        const int64_t slots = blocks * kBlock;
        std::vector<float> lo0(slots), hi0(slots), lo1(slots), hi1(slots), area(slots);
        std::vector<int32_t> pos(slots);
        // The last block partly padding, some tombstones, some degenerate boxes (width 0).
        const int64_t live_end = slots - static_cast<int64_t>(rng() % kBlock);
        for (int64_t k = 0; k < slots; ++k) {
          const float x = 100.0f * unit(rng), y = 100.0f * unit(rng);
          const float w = unit(rng) < 0.1f ? 0.0f : 30.0f * unit(rng), h = 30.0f * unit(rng);
          lo0[k] = x, hi0[k] = x + w, lo1[k] = y, hi1[k] = y + h;
          area[k] = (w + offset) * (h + offset);
          pos[k] = static_cast<int32_t>(k * 7 % 1000);
          if (k >= live_end || unit(rng) < 0.2f) {
            pos[k] = -1, hi0[k] = -INFINITY;
            if (k >= live_end) lo0[k] = lo1[k] = hi1[k] = area[k] = 0.0f;
          }
        }
        std::vector<float> blo0(blocks), bhi0(blocks), blo1(blocks), bhi1(blocks);
        for (int64_t b = 0; b < blocks; ++b) {
          float l0 = INFINITY, h0 = -INFINITY, l1 = INFINITY, h1 = -INFINITY;
          for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) {
            if (pos[k] < 0) continue;
            l0 = std::min(l0, lo0[k]), h0 = std::max(h0, hi0[k]), l1 = std::min(l1, lo1[k]), h1 = std::max(h1, hi1[k]);
          }
          blo0[b] = l0, bhi0[b] = h0, blo1[b] = l1, bhi1[b] = h1;
        }
        std::vector<float> near_inter(slots + 16), near_union(slots + 16);
        std::vector<int32_t> near_pos(slots + 16);
        const sd::soft_nms::Slots w{lo0.data(),  hi0.data(),  lo1.data(),        hi1.data(),        area.data(),
                                    pos.data(),  blo0.data(), bhi0.data(),       blo1.data(),       bhi1.data(),
                                    blocks,      near_inter.data(), near_union.data(), near_pos.data()};
        for (int sel = 0; sel < 4; ++sel) {
          const float x = 100.0f * unit(rng), y = 100.0f * unit(rng), bw = sel == 3 ? 0.0f : 40.0f * unit(rng);
          const float bh = 40.0f * unit(rng);
          const sd::soft_nms::Selected t{x, x + bw, y, y + bh, (bw + offset) * (bh + offset)};
          ++g_checks;
          const std::string at = std::string("SoftNMS scan ") + variant + " blocks=" + std::to_string(blocks) +
                                 " offset=" + std::to_string(static_cast<int>(offset)) + " sel=" + std::to_string(sel);
          const int64_t got = v.scan(t, w, offset);
          int64_t want = 0;
          bool ok = true;
          for (int64_t k = 0; k < slots && ok; ++k) {
            if (pos[k] < 0) continue;
            const float iw = (std::min(t.hi0, hi0[k]) - std::max(t.lo0, lo0[k])) + offset;
            const float ih = (std::min(t.hi1, hi1[k]) - std::max(t.lo1, lo1[k])) + offset;
            if (!(iw > 0.0f && ih > 0.0f)) continue;
            const float inter = iw * ih, uni = (t.area + area[k]) - inter;
            if (want >= got || near_pos[want] != pos[k] || near_inter[want] != inter || near_union[want] != uni) {
              Fail(at + ": near entry " + std::to_string(want) + " (slot " + std::to_string(k) + ") differs");
              ok = false;
            }
            ++want;
          }
          if (ok && got != want) Fail(at + ": near list of " + std::to_string(got) + ", want " + std::to_string(want));
        }
      }
    }
  }
  // Max and FirstEqual over every [begin, end) near the vector width and the 4-vector step.
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t len = 4 * 3 * lanes + 3;
  for (int round = 0; round < 4; ++round) {
    std::vector<float> s(static_cast<size_t>(len));
    for (auto& e : s) e = round == 1 ? std::round(normal(rng)) : normal(rng);  // round 1: many ties
    if (round == 2) s[static_cast<size_t>(rng() % len)] = -0.0f, s[static_cast<size_t>(rng() % len)] = INFINITY;
    if (round == 3) std::fill(s.begin(), s.end(), -INFINITY);
    for (int64_t begin = 0; begin <= 3; ++begin) {
      for (int64_t end = begin + 1; end <= len; ++end) {
        ++g_checks;
        const std::string at = std::string("SoftNMS ") + variant + " [" + std::to_string(begin) + ", " +
                               std::to_string(end) + ") round " + std::to_string(round);
        float mx = -INFINITY;
        for (int64_t p = begin; p < end; ++p) mx = std::max(mx, s[p]);
        const float got = v.max(s.data(), begin, end);
        if (got != mx) Fail(at + ": max " + std::to_string(got) + ", want " + std::to_string(mx));
        const float probe[] = {mx, s[static_cast<size_t>(end - 1)], 1234.5f};
        for (float value : probe) {
          int64_t first = end;
          for (int64_t p = begin; p < end; ++p)
            if (s[p] == value) {
              first = p;
              break;
            }
          const int64_t at_p = v.first_equal(s.data(), begin, end, value);
          if (at_p != first)
            Fail(at + ": first " + std::to_string(value) + " at " + std::to_string(at_p) + ", want " +
                 std::to_string(first));
        }
      }
    }
  }
}

// WeighAvx512: inter_j = weight(inter_j / union_j): linear (1 - IoU above the threshold, else 1),
//   gaussian (exp(-IoU^2 / sigma) as float(exp(double)), 1 at IoU 0), hard (0 above the threshold),
//   exactly, at every near-list length around its 8-row step.
void SweepSoftNmsWeigh(const char* variant, void (*weigh)(float*, const float*, int64_t, int, float, float)) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int64_t n = 1; n <= 3 * 8 * 4 + 1; ++n) {
    std::vector<float> inter(static_cast<size_t>(n)), uni(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      uni[j] = 1.0f + 100.0f * unit(rng);
      const float r = unit(rng);
      inter[j] = r < 0.1f ? 0.0f : (r < 0.2f ? uni[j] * 0.5f : uni[j] * unit(rng));  // IoU 0, at the threshold, any
    }
    for (int method = 0; method < 3; ++method) {
      for (float sigma : {0.5f, 0.01f}) {
        std::vector<float> got = inter;
        weigh(got.data(), uni.data(), n, method, 0.5f, sigma);
        ++g_checks;
        for (int64_t j = 0; j < n; ++j) {
          const float iou = inter[j] / uni[j];
          float want;
          if (method == 0) want = iou > 0.5f ? 1.0f - iou : 1.0f;
          else if (method == 2) want = iou > 0.5f ? 0.0f : 1.0f;
          else want = iou == 0.0f ? 1.0f : static_cast<float>(std::exp(static_cast<double>(-(iou * iou) / sigma)));
          if (got[j] != want) {
            Fail(std::string("SoftNMS weigh ") + variant + " n=" + std::to_string(n) + " method " +
                 std::to_string(method) + " j=" + std::to_string(j) + ": " + std::to_string(got[j]) + ", want " +
                 std::to_string(want));
            break;
          }
        }
      }
    }
  }
}

// ---- MaxSim / SignedMaxSim tiles ------------------------------------------------------------------

// 64-byte aligned zeroed bytes (the packed Q tiles are read with aligned loads).
struct Aligned {
  std::unique_ptr<uint8_t[]> mem;
  uint8_t* p;
  explicit Aligned(size_t bytes) : mem(new uint8_t[bytes + 64]()) {
    p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mem.get()) + 63) / 64 * 64);
  }
};

enum class MsPath { kF32, kI8Avx2I16, kI8Avx2Ubs, kI8Avx2Ubs2, kI8Avx2Tab, kI8AvxVnni, kI8Avx512Vnni };

struct MsVariant {
  const char* name;
  MsPath path;
  int lanes;  // query lanes per tile (2 vectors)
  int block;  // document tokens per register block
  void (*f32)(const sd::maxsim::TileArgs&, bool, const sd::maxsim::Doc&, sd::maxsim::TileResult*);
  // kI8AvxVnni: the tile (the library's VEX one, or its EVEX twin)
  void (*avx_vnni)(const sd::maxsim::TileArgs&, const sd::maxsim::Doc&, sd::maxsim::TileResult*) = nullptr;
};

// MaxSim's per-lane result against float64: best_i = max over valid j of qscale_i * dscale_j * <Q_i, D_j>
//   (float32: to (dim + 2) * 1.2e-7 of sum_k |q d| scaled; int8: the exact int32 sum, so exactly equal
//   without scales and to 2.5e-7 relative with), nan_i = a valid pair is NaN, and with argmax the
//   lowest valid j reaching the max (checked exactly where the float32 sums are exact: small
//   integers; elsewhere the index must be valid and reach the max within the tolerance). Sizes: every
//   Ld = 1 .. 3R + 1 around the register block R, dim around the 2- and 4-byte groups and the widening
//   loops' 16 / 32 steps, Lq around the tile (2 vectors) and the float32 pass's 4-tile chunks.
void SweepMaxSim(const MsVariant& v) {
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> i8(-128, 127), small(-3, 3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const bool int8 = v.path != MsPath::kF32;
  const int T = v.lanes;
  struct Shape {
    int64_t Lq, Ld, dim;
  };
  std::vector<Shape> shapes;
  for (int64_t Ld = 1; Ld <= 3 * v.block + 1; ++Ld)
    for (int64_t dim : {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 66})
      shapes.push_back({Ld % 3 == 0 ? T : T + 1 + Ld % T, Ld, dim});
  for (int64_t Lq : {1, T / 2 - 1, T / 2, T / 2 + 1, T - 1, T, T + 1, 2 * T - 1, 2 * T + 1, 4 * T, 4 * T + 1, 5 * T + 3})
    for (int64_t Ld : {static_cast<int64_t>(v.block), static_cast<int64_t>(2 * v.block + 1)})
      shapes.push_back({Lq, Ld, 9});
  // scaled: positive scales (the int8 tiles defer the query scale); signed scales: in [-1, 1], one query scale 0
  // (they apply it per token)
  enum { kRandom, kIntegers, kMasked, kNanPair, kScaled, kSignedScales, kMsKinds };
  const char* kind_name[] = {"random", "integers", "masked", "nan", "scaled", "signed scales"};
  for (const Shape& sh : shapes) {
    const int64_t Lq = sh.Lq, Ld = sh.Ld, dim = sh.dim, tiles = (Lq + T - 1) / T;
    for (int kind = 0; kind < kMsKinds; ++kind) {
      if (int8 && kind == kNanPair) continue;
      std::vector<float> qf(static_cast<size_t>(Lq * dim)), df(static_cast<size_t>(Ld * dim));
      std::vector<int8_t> qi(qf.size()), di(df.size());
      auto fill = [&](std::vector<float>& f, std::vector<int8_t>& b) {
        for (size_t i = 0; i < f.size(); ++i) {
          b[i] = static_cast<int8_t>(i8(rng));
          f[i] = kind == kIntegers ? static_cast<float>(small(rng)) : normal(rng);
        }
      };
      fill(qf, qi);
      fill(df, di);
      const bool ubs = v.path == MsPath::kI8Avx2Ubs || v.path == MsPath::kI8Avx2Ubs2;
      if (ubs) {  // 7-bit documents, both ends of [-64, 63] reached; Q's ends too (8-bit: -128 and 127)
        for (auto& e : di) e = static_cast<int8_t>(e >> 1);
        di[0] = -64;
        di[di.size() - 1] = 63;
        if (v.path == MsPath::kI8Avx2Ubs2)
          for (auto& e : qi) e = static_cast<int8_t>(e >> 1);
        qi[0] = v.path == MsPath::kI8Avx2Ubs2 ? -64 : -128;
        qi[qi.size() - 1] = v.path == MsPath::kI8Avx2Ubs2 ? 63 : 127;
      }
      if (v.path == MsPath::kI8Avx2Tab) {  // queries without -128 (their ends -127 and 127), documents at both ends
        for (auto& e : qi) e = static_cast<int8_t>(e == -128 ? -127 : e);
        qi[0] = -127;
        qi[qi.size() - 1] = 127;
        di[0] = -128;
        di[di.size() - 1] = 127;
      }
      if (kind == kNanPair) df[static_cast<size_t>(rng() % df.size())] = NAN;
      std::vector<uint8_t> valid(static_cast<size_t>(Ld), 1);
      if (kind == kMasked) {
        for (auto& e : valid) e = unit(rng) < 0.5f;
        valid[0] = 0;  // the first valid token is not 0
        valid[static_cast<size_t>(Ld - 1)] = 1;
      }
      std::vector<float> dscale, qscale;
      if (kind == kScaled) {
        for (int64_t j = 0; j < Ld; ++j) dscale.push_back(0.01f + unit(rng));
        for (int64_t i = 0; i < Lq; ++i) qscale.push_back(0.01f + unit(rng));
      }
      const bool scaled = kind == kScaled || kind == kSignedScales;
      if (kind == kSignedScales) {
        for (int64_t j = 0; j < Ld; ++j) dscale.push_back(2.0f * unit(rng) - 1.0f);
        for (int64_t i = 0; i < Lq; ++i) qscale.push_back(2.0f * unit(rng) - 1.0f);
        qscale[static_cast<size_t>(rng() % Lq)] = 0.0f;
      }
      sd::maxsim::Doc doc;
      doc.valid = valid.data();
      doc.scale = dscale.empty() ? nullptr : dscale.data();
      doc.first_valid = std::find(valid.begin(), valid.end(), 1) - valid.begin();
      doc.stride = Ld * dim;
      doc.scale_finite = std::all_of(dscale.begin(), dscale.end(), [](float x) { return std::isfinite(x); });
      std::vector<sd::maxsim::TileResult> res(static_cast<size_t>(tiles));
      for (bool argmax : {false, true}) {
        if (argmax && (int8 || scaled)) continue;  // SignedMaxSim: float32, no scales
        if (v.path == MsPath::kF32) {
          const int64_t tile_bytes = dim * T * 4;
          Aligned qp(static_cast<size_t>(tiles * tile_bytes));
          float* q = reinterpret_cast<float*>(qp.p);
          for (int64_t i = 0; i < Lq; ++i)
            for (int64_t k = 0; k < dim; ++k) q[(i / T) * dim * T + k * T + i % T] = qf[i * dim + k];
          sd::maxsim::TileArgs a;
          a.Ld = Ld, a.dim = dim, a.qp = qp.p, a.qscale = qscale.empty() ? nullptr : qscale.data();
          a.count = Lq, a.tiles = tiles, a.tile_stride = tile_bytes;
          doc.data = df.data();
          v.f32(a, argmax, doc, res.data());
        } else {
          // Per-document layout and the per-tile packs of max_sim_tile.h.
          const int64_t dim2 = (dim + 1) / 2, dim4 = (dim + 3) / 4;
          std::vector<int16_t> dwide;
          std::vector<uint8_t> dbias;
          std::vector<int32_t> dsum(static_cast<size_t>(Ld));
          Aligned dtab(v.path == MsPath::kI8Avx2Tab ? static_cast<size_t>(sd::maxsim::TabDocBytes(Ld, dim4)) : 0);
          if (v.path == MsPath::kI8Avx2Tab) {
            std::memset(dtab.p, 0x55, static_cast<size_t>(sd::maxsim::TabDocBytes(Ld, dim4)));
            sd::maxsim::PrepTabAvx2(di.data(), Ld, dim, dtab.p);
            doc.data = dtab.p;
          } else if (v.path == MsPath::kI8Avx2I16) {
            dwide.assign(static_cast<size_t>(Ld * dim2 * 2), 0x5555);
            sd::maxsim::WidenI8Avx2(di.data(), Ld, dim, dwide.data());
            doc.data = dwide.data();
          } else if (v.path == MsPath::kI8AvxVnni) {
            dbias.assign(static_cast<size_t>(Ld * dim4 * 4), 0x55);
            sd::maxsim::BiasI8Avx2(di.data(), Ld, dim, dbias.data());
            doc.data = dbias.data();
          } else if (ubs) {
            // the range check on both sides: one entry out of [-64, 63] refuses the document; the sums exact
            std::vector<int8_t> wide(di);
            wide[wide.size() / 2] = static_cast<int8_t>(wide.size() % 2 ? -65 : 64);
            if (sd::maxsim::DocSums7Avx2(wide.data(), Ld, dim, dsum.data()))
              Fail(std::string("MaxSim ") + v.name + ": a document with an entry out of [-64, 63] was accepted");
            std::fill(dsum.begin(), dsum.end(), 0x55555555);
            if (!sd::maxsim::DocSums7Avx2(di.data(), Ld, dim, dsum.data()))
              Fail(std::string("MaxSim ") + v.name + ": a 7-bit document was refused");
            for (int64_t j = 0; j < Ld; ++j) {
              int32_t sum = 0;
              for (int64_t k = 0; k < dim; ++k) sum += di[j * dim + k];
              if (dsum[j] != sum) Fail(std::string("MaxSim ") + v.name + ": DocSums7Avx2 row " + std::to_string(j));
            }
            doc.data = di.data();
          } else {
            sd::maxsim::DocSums128Avx512Vnni(di.data(), Ld, dim, dsum.data());
            doc.data = di.data();
          }
          for (int64_t t = 0; t < tiles; ++t) {
            const int64_t i0 = t * T, count = std::min<int64_t>(T, Lq - i0);
            const int64_t tile_bytes = v.path == MsPath::kI8Avx2I16   ? dim2 * 2 * T * 2
                                       : v.path == MsPath::kI8Avx2Tab ? dim4 * 16 * 4 * T
                                                                      : dim4 * 4 * T;
            Aligned qp(static_cast<size_t>(tile_bytes));
            std::vector<int32_t> qbias(static_cast<size_t>(T), 0);
            for (int64_t l = 0; l < count; ++l) {
              int32_t sum = 0;
              for (int64_t k = 0; k < dim; ++k) {
                const int8_t q = qi[(i0 + l) * dim + k];
                sum += q;
                if (v.path == MsPath::kI8Avx512Vnni) qp.p[(k / 4) * T * 4 + l * 4 + k % 4] = static_cast<uint8_t>(q + 128);
                else if (v.path == MsPath::kI8Avx2Ubs) qp.p[(k / 4) * T * 4 + l * 4 + k % 4] = static_cast<uint8_t>(q + 128);
                else if (v.path == MsPath::kI8Avx2Ubs2) qp.p[(k / 4) * T * 4 + l * 4 + k % 4] = static_cast<uint8_t>(q + 64);
                else if (v.path == MsPath::kI8AvxVnni) qp.p[(k / 4) * T * 4 + l * 4 + k % 4] = static_cast<uint8_t>(q);
                else if (v.path == MsPath::kI8Avx2Tab)
                  for (int pattern = 0; pattern < 16; ++pattern)
                    qp.p[(k / 4) * 16 * T * 4 + pattern * T * 4 + l * 4 + k % 4] =
                        static_cast<uint8_t>((pattern >> (k % 4)) & 1 ? -q : q);
                else {
                  const int16_t w = q;
                  std::memcpy(qp.p + ((k / 2) * T * 2 + l * 2 + k % 2) * 2, &w, 2);
                }
              }
              qbias[l] = 128 * sum;
            }
            sd::maxsim::TileArgs a;
            a.Ld = Ld, a.dim = dim, a.qp = qp.p, a.count = count;
            a.qscale = qscale.empty() ? nullptr : qscale.data() + i0;
            a.qscale_positive = a.qscale != nullptr && std::all_of(a.qscale, a.qscale + count, [](float x) {
                                  return std::isfinite(x) && x > 0;
                                });
            a.bias = v.path == MsPath::kI8AvxVnni ? qbias.data() : dsum.data();
            if (v.path == MsPath::kI8Avx2I16) sd::maxsim::TileI8Avx2I16(a, doc, &res[t]);
            else if (v.path == MsPath::kI8Avx2Ubs) sd::maxsim::TileI8Avx2Ubs(a, doc, &res[t]);
            else if (v.path == MsPath::kI8Avx2Ubs2) sd::maxsim::TileI8Avx2Ubs2(a, doc, &res[t]);
            else if (v.path == MsPath::kI8Avx2Tab) sd::maxsim::TileI8Avx2Tab(a, doc, &res[t]);
            else if (v.path == MsPath::kI8AvxVnni) v.avx_vnni(a, doc, &res[t]);
            else sd::maxsim::TileI8Avx512Vnni(a, doc, &res[t]);
          }
        }
        ++g_checks;
        const std::string at = std::string("MaxSim ") + v.name + " Lq=" + std::to_string(Lq) + " Ld=" +
                               std::to_string(Ld) + " dim=" + std::to_string(dim) + " " + kind_name[kind] +
                               (argmax ? " argmax" : "");
        for (int64_t i = 0; i < Lq; ++i) {
          const sd::maxsim::TileResult& r = res[static_cast<size_t>(i / T)];
          const int lane = static_cast<int>(i % T);
          double best = -INFINITY, bound = 0.0;
          int64_t arg = -1;
          bool nan = false;
          std::vector<double> sim(static_cast<size_t>(Ld));
          for (int64_t j = 0; j < Ld; ++j) {
            double dot = 0.0, mag = 0.0;
            for (int64_t k = 0; k < dim; ++k) {
              const double q = int8 ? qi[i * dim + k] : qf[i * dim + k];
              const double d = int8 ? di[j * dim + k] : df[j * dim + k];
              dot += q * d, mag += std::fabs(q * d);
            }
            const double scale = (dscale.empty() ? 1.0 : dscale[j]) * (qscale.empty() ? 1.0 : qscale[i]);
            sim[j] = dot * scale;
            if (!valid[j]) continue;
            nan |= std::isnan(sim[j]);
            bound = std::max(bound, mag * std::fabs(scale));
            if (sim[j] > best) best = sim[j], arg = j;
          }
          if (arg < 0) arg = doc.first_valid;
          const double tol = int8 ? (scaled ? 2.5e-7 * std::fabs(best) : 0.0)
                                  : (dim + 2) * 1.2e-7 * bound + 1e-30;
          std::string err;
          if ((r.nan[lane] != 0) != nan) err = "NaN flag " + std::to_string(r.nan[lane]);
          else if (!nan && !(std::fabs(r.best[lane] - best) <= tol))
            err = "best " + std::to_string(r.best[lane]) + ", want " + std::to_string(best);
          else if (argmax && !nan) {
            const int32_t got = r.idx[lane];
            if (kind == kIntegers ? got != arg
                                  : (got < 0 || got >= Ld || !valid[got] || !(sim[got] >= best - 2 * tol)))
              err = "argmax " + std::to_string(got) + ", want " + std::to_string(arg);
          }
          if (!err.empty()) {
            Fail(at + " i=" + std::to_string(i) + ": " + err);
            break;
          }
        }
      }
    }
  }
}

// float16 documents (WidenF16Avx2, then the float32 tile above): every float16 bit pattern (normal,
// subnormal, +-0, +-inf, NaN) against its value decoded from the IEEE 754 binary16 fields, exactly,
// and every length n = 1 .. 3W + 1 around the 8-value step, at three starting alignments.
double HalfValue(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  double v;
  if (exp == 31) v = man != 0 ? NAN : INFINITY;
  else if (exp == 0) v = std::ldexp(static_cast<double>(man), -24);
  else v = std::ldexp(static_cast<double>(1024 + man), exp - 25);
  return sign ? -v : v;
}

void SweepWidenF16(const char* variant, void (*widen)(const uint16_t*, float*, int64_t)) {
  std::vector<uint16_t> all(65536 + 3);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i * 40503u);  // odd: every pattern
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= 3 * 4 * 8 + 1; ++n) sizes.push_back(n);
  sizes.push_back(65536);
  for (int64_t n : sizes) {
    for (int64_t start = 0; start < 3; ++start) {
      std::vector<float> y(static_cast<size_t>(n) + 1, -7.0f);
      widen(all.data() + start, y.data(), n);
      ++g_checks;
      for (int64_t i = 0; i <= n; ++i) {
        const double want = i < n ? HalfValue(all[start + i]) : -7.0;  // nothing written past n
        const bool ok = std::isnan(want) ? std::isnan(y[i])
                                         : (y[i] == want && std::signbit(y[i]) == std::signbit(want));
        if (!ok) {
          Fail(std::string("MaxSim float16 widen ") + variant + " n=" + std::to_string(n) + " start=" +
               std::to_string(start) + " i=" + std::to_string(i) + ": " + std::to_string(y[i]) + ", want " +
               std::to_string(want));
          break;
        }
      }
    }
  }
}

}  // namespace

// ---- LoRAMixer ----------------------------------------------------------------------------------
//
// The kernel's pieces (ops/lora_mixer_tiles.h), each variant against references computed here:
//   dot tile: out_t[j] = rows[j] . x_t (2 tokens x 8 rows) to (n + 2) u sum_i |rows_ji x_ti| of the
//     float64 dot (any summation order), and bit-identical outputs where the tile's promise says so:
//     the same token in both slots, and 8 equal rows (exact ties of logits);
//   up-projection: d_t[o] = start + sum_j c_t[j] BT[j][o] (start 0 for a token's first expert, else
//     d_t[o]), bit-identical to the scalar fma chain over j = 0..r-1 (the order the kernel's comment
//     promises in every lane and chunking), also with both slots the same token (d0 == d1);
//   transpose of Bm_e [out, r] to [r, out]: exact, and its finiteness flag exact (a NaN, +inf or
//     -inf planted in every position of small shapes);
//   finiteness scan: exact at every length and position;
//   routing of a token (scalar, one for all variants): the top k by the contract's order (larger
//     logit, then lower index) exactly, gates to 1e-6 relative of the float64 softmax over them,
//     a non-finite logit -> refused with experts 0..k-1 and NaN gates.
constexpr double kU = 1.0 / 16777216.0;  // 2^-24

void SweepLoRAMixerDot(const char* variant, sd::lora_mixer::DotTileFn tile, int lanes) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : Sizes(lanes, {static_cast<int64_t>(lanes), 384})) {
    for (int kind = 0; kind < 3; ++kind) {  // 0: random; 1: x1 == x0; 2: all 8 rows equal
      std::vector<float> w(static_cast<size_t>(8 * n)), x0(static_cast<size_t>(n)), x1(x0.size());
      for (auto& v : w) v = normal(rng);
      for (auto& v : x0) v = normal(rng);
      for (auto& v : x1) v = normal(rng);
      if (kind == 1) x1 = x0;
      const float* rows[8];
      for (int k = 0; k < 8; ++k) rows[k] = w.data() + (kind == 2 ? 0 : k) * n;
      float o0[8], o1[8];
      tile(x0.data(), x1.data(), rows, n, o0, o1);
      for (int t = 0; t < 2; ++t) {
        const std::vector<float>& x = t == 0 ? x0 : x1;
        const float* o = t == 0 ? o0 : o1;
        for (int k = 0; k < 8; ++k) {
          double ref = 0.0, mag = 0.0;
          for (int64_t i = 0; i < n; ++i) {
            ref += static_cast<double>(rows[k][i]) * x[i];
            mag += std::fabs(static_cast<double>(rows[k][i]) * x[i]);
          }
          ++g_checks;
          if (!(std::fabs(o[k] - ref) <= (n + 2) * kU * mag + 1e-37)) {
            Fail(std::string("LoRAMixer dot ") + variant + " n=" + std::to_string(n) + " kind=" + std::to_string(kind) +
                 " token " + std::to_string(t) + " row " + std::to_string(k) + ": " + std::to_string(o[k]) + " vs " +
                 std::to_string(ref));
          }
        }
      }
      for (int k = 0; k < 8; ++k) {
        ++g_checks;
        if (kind == 1 && std::memcmp(&o0[k], &o1[k], 4) != 0) {
          Fail(std::string("LoRAMixer dot ") + variant + " n=" + std::to_string(n) + ": the same token differs by slot");
        }
        if (kind == 2 && (std::memcmp(&o0[k], &o0[0], 4) != 0 || std::memcmp(&o1[k], &o1[0], 4) != 0)) {
          Fail(std::string("LoRAMixer dot ") + variant + " n=" + std::to_string(n) + ": equal rows give unequal sums");
        }
      }
    }
  }
}

void SweepLoRAMixerAxpy(const char* variant, sd::lora_mixer::AxpyFn axpy, int lanes) {
  std::mt19937 rng(22);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t out : Sizes(lanes, {32, 64, 384})) {
    for (int64_t r : {1, 2, 3, 7, 8, 9, 16, 17}) {
      for (int mode = 0; mode < 5; ++mode) {  // fresh0, fresh1 in {0, 1}^2; 4: both slots one token
        const bool same = mode == 4, fresh0 = same ? true : (mode & 1) != 0, fresh1 = same ? true : (mode & 2) != 0;
        std::vector<float> bt(static_cast<size_t>(r * out)), c0(static_cast<size_t>(r)), c1(c0.size());
        std::vector<float> d0(static_cast<size_t>(out)), d1(d0.size());
        for (auto& v : bt) v = normal(rng);
        for (auto& v : c0) v = normal(rng);
        for (auto& v : c1) v = normal(rng);
        for (auto& v : d0) v = normal(rng);
        for (auto& v : d1) v = normal(rng);
        if (same) c1 = c0;
        std::vector<float> want0(d0.size()), want1(d1.size());
        for (int64_t o = 0; o < out; ++o) {
          float a0 = fresh0 ? 0.0f : d0[o], a1 = fresh1 ? 0.0f : d1[o];
          for (int64_t j = 0; j < r; ++j) {
            a0 = std::fma(c0[j], bt[j * out + o], a0);
            a1 = std::fma(c1[j], bt[j * out + o], a1);
          }
          want0[o] = a0;
          want1[o] = a1;
        }
        float* p1 = same ? d0.data() : d1.data();
        axpy(bt.data(), r, out, c0.data(), c1.data(), d0.data(), p1, fresh0, fresh1);
        ++g_checks;
        const bool ok0 = std::memcmp(d0.data(), want0.data(), 4 * out) == 0;
        const bool ok1 = same || std::memcmp(d1.data(), want1.data(), 4 * out) == 0;
        if (!ok0 || !ok1) {
          Fail(std::string("LoRAMixer up-projection ") + variant + " out=" + std::to_string(out) + " r=" +
               std::to_string(r) + " mode=" + std::to_string(mode) + ": not the scalar fma chain");
        }
      }
    }
  }
}

using TransposeFn = bool (*)(const float*, int64_t, int64_t, float*);

bool TransposePortableChecked(const float* src, int64_t out, int64_t r, float* dst) {
  sd::lora_mixer::TransposePortable(src, out, r, dst);
  return sd::lora_mixer::AllFinitePortable(src, out * r);
}

void SweepLoRAMixerTranspose(const char* variant, TransposeFn transpose) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float bad[] = {NAN, INFINITY, -INFINITY};
  for (int64_t out : {1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 49, 384}) {
    for (int64_t r : {1, 3, 7, 8, 9}) {
      std::vector<float> src(static_cast<size_t>(out * r)), dst(src.size());
      for (auto& v : src) v = normal(rng);
      ++g_checks;
      bool finite = transpose(src.data(), out, r, dst.data());
      bool exact = finite;
      for (int64_t q = 0; q < r; ++q)
        for (int64_t o = 0; o < out; ++o) exact &= std::memcmp(&dst[q * out + o], &src[o * r + q], 4) == 0;
      if (!exact) {
        Fail(std::string("LoRAMixer transpose ") + variant + " out=" + std::to_string(out) + " r=" + std::to_string(r));
      }
      // every position for small shapes, every 37th beyond
      const int64_t stride = out * r <= 400 ? 1 : 37;
      for (int64_t at = 0; at < out * r; at += stride) {
        const float keep = src[at];
        src[at] = bad[at % 3];
        ++g_checks;
        if (transpose(src.data(), out, r, dst.data())) {
          Fail(std::string("LoRAMixer transpose ") + variant + " out=" + std::to_string(out) + " r=" +
               std::to_string(r) + ": missed a non-finite value at " + std::to_string(at));
        }
        src[at] = keep;
      }
    }
  }
}

void SweepLoRAMixerFinite(const char* variant, bool (*finite)(const float*, int64_t), int lanes) {
  const float bad[] = {NAN, INFINITY, -INFINITY};
  for (int64_t n : Sizes(lanes, {static_cast<int64_t>(lanes)})) {
    std::vector<float> x(static_cast<size_t>(n), 1.0f);
    x[0] = std::numeric_limits<float>::max();  // large and subnormal values are finite
    x[static_cast<size_t>(n - 1)] = std::numeric_limits<float>::denorm_min();
    ++g_checks;
    if (!finite(x.data(), n)) Fail(std::string("LoRAMixer finite ") + variant + " n=" + std::to_string(n) + ": refused finite values");
    for (int64_t at = 0; at < n; ++at) {
      const float keep = x[at];
      x[at] = bad[at % 3];
      ++g_checks;
      if (finite(x.data(), n)) {
        Fail(std::string("LoRAMixer finite ") + variant + " n=" + std::to_string(n) + ": missed position " + std::to_string(at));
      }
      x[at] = keep;
    }
  }
}

void SweepLoRAMixerRoute() {
  std::mt19937 rng(24);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t e = 1; e <= 20; ++e) {
    for (int64_t k = 1; k <= e; ++k) {
      for (int kind = 0; kind < 4; ++kind) {  // random, ties (half-integers), all equal, one non-finite
        std::vector<float> l(static_cast<size_t>(e));
        for (auto& v : l) v = kind == 2 ? 0.5f : normal(rng);
        if (kind == 1)
          for (auto& v : l) v = std::round(v);
        if (kind == 3) l[static_cast<size_t>(rng() % e)] = (rng() & 1) ? NAN : -INFINITY;
        std::vector<int32_t> sel(static_cast<size_t>(k));
        std::vector<float> gate(static_cast<size_t>(k));
        const bool ok = sd::lora_mixer::Route(l.data(), e, k, sel.data(), gate.data());
        ++g_checks;
        std::string what = "LoRAMixer route E=" + std::to_string(e) + " k=" + std::to_string(k) + " kind=" + std::to_string(kind);
        if (kind == 3) {
          bool good = !ok;
          for (int64_t s = 0; s < k; ++s) good &= sel[s] == s && std::isnan(gate[s]);
          if (!good) Fail(what + ": a non-finite logit not refused");
          continue;
        }
        std::vector<int32_t> order(static_cast<size_t>(e));
        for (int64_t j = 0; j < e; ++j) order[j] = static_cast<int32_t>(j);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
        double sum = 0.0;
        for (int64_t s = 0; s < k; ++s) sum += std::exp(static_cast<double>(l[order[s]]) - l[order[0]]);
        bool good = ok;
        for (int64_t s = 0; s < k; ++s) {
          const double g = std::exp(static_cast<double>(l[order[s]]) - l[order[0]]) / sum;
          good &= sel[s] == order[s] && std::fabs(gate[s] - g) <= 1e-6 * g;
        }
        if (!good) Fail(what + ": not the top k by (logit, lower index) or its gates");
      }
    }
  }
}

// ---- RowwiseInt8MatMul ------------------------------------------------------------------------------
// Rows M = 1 .. 25 (the AVX2 tile's 6 and the VNNI tile's 8, with every remainder), columns around the 16-column
// panels and the VNNI tile's pairs of them, k around the 4-byte steps and 16-k blocks, weights whose bound allows
// each lane-group count (|w| <= 16, 32, 64 at L = 255: groups 4, 2, 1 at least; full range: 0, the widened tile,
// but for the smallest K), with and without a bias, each epilogue (no activation or GELU, with and without a residual, in turn over the calls),
// and each call also split at a panel boundary as the binding's tasks split it. Full-range weights run the vpmaddubsw
// paths' widened vpmaddwd tile (its int16 rows from QuantizeRowsWideAvx2, checked against the portable integers).
// Expected: acc = sum_k xq[m, k] B[k, n] in int64, y = fma(float(acc - z colsum), s * BScale, bias), then GELU by
// the scalar GeluErf and + residual -- every path exactly.
namespace rw = sd::rowwise_int8;
using RowwiseGemm = void (*)(const rw::PackedView&, const uint8_t*, const float*, const int32_t*, int64_t,
                             const float*, const float*, float*, int64_t, rw::Activation, const float*);

using RowwiseQuantize = int64_t (*)(const float*, int64_t, int64_t, int64_t, int, uint8_t*, float*, int32_t*);

// quantize: the path's vector row quantization (nullptr: the portable one alone).
// The weight storage RowwiseInt8MatMul packs into (ops/common/weight_arena.h): every block 64-byte aligned and its
// own (filled with distinct bytes, all intact once every block exists), sizes around the chunk's, a block larger than
// a chunk, and new blocks after every earlier one is freed.
void SweepWeightArena() {
  const size_t chunk = sd::kWeightChunk;
  const std::vector<size_t> sizes = {0, 1, 63, 64, 65, 4096, 3 << 20, chunk - 64, chunk, chunk + 1, 100, 5 << 20, 1};
  for (int round = 0; round < 2; ++round) {
    std::vector<std::shared_ptr<uint8_t>> blocks;
    for (size_t i = 0; i < sizes.size(); ++i) {
      blocks.push_back(sd::AllocateWeightStorage(sizes[i]));
      ++g_checks;
      if (reinterpret_cast<uintptr_t>(blocks.back().get()) % 64 != 0) {
        Fail("weight storage: a block is not 64-byte aligned");
      }
      std::memset(blocks.back().get(), static_cast<int>(i + 1), sizes[i]);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      ++g_checks;
      const uint8_t* data = blocks[i].get();
      if (!std::all_of(data, data + sizes[i], [&](uint8_t v) { return v == i + 1; })) {
        Fail("weight storage: block " + std::to_string(i) + " (" + std::to_string(sizes[i]) + " bytes) overlaps another");
      }
    }
  }
}

void SweepRowwise(const char* variant, rw::Path path, RowwiseGemm gemm, RowwiseQuantize quantize) {
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  std::vector<int64_t> ns, ks = {1, 2, 3, 4, 5, 7, 8, 12, 15, 16, 17, 20, 31, 32, 33, 64};
  for (int64_t n = 1; n <= 18; ++n) ns.push_back(n);
  for (int64_t n : {31, 32, 33, 47, 48, 49, 63, 64, 65, 80}) ns.push_back(n);
  const int levels = 255;
  for (int64_t K : ks) {
    for (int64_t N : ns) {
      for (int bound : {16, 32, 64, 128}) {
        std::uniform_int_distribution<int> wdist(-bound, bound - (bound == 128 ? 1 : 0));
        std::vector<int8_t> b(static_cast<size_t>(K * N));
        for (auto& v : b) v = static_cast<int8_t>(wdist(rng));
        const rw::Packed packed = rw::Pack(b.data(), K, N, levels, path, /*kept=*/(K + N) % 2 == 0);  // both storages
        const bool bounded = path == rw::Path::kAvx2 || path == rw::Path::kAvx512Bw;  // the vpmaddubsw tiles
        const bool tile = path != rw::Path::kPortable;
        const bool wide = packed.width == 2;  // the widened packing: int16 rows
        if (wide != (bounded && packed.groups == 0)) {
          Fail(std::string("RowwiseInt8MatMul ") + variant + ": widened packing where the lane bound allows a tile");
        }
        if (bounded && packed.groups != rw::LaneGroups(b.data(), K, N, levels)) {
          Fail(std::string("RowwiseInt8MatMul ") + variant + ": Pack's groups differ from LaneGroups");
        }
        std::vector<float> sb(static_cast<size_t>(N)), bias(static_cast<size_t>(N));
        for (auto& v : sb) v = unit(rng) / 127.0f;
        for (auto& v : bias) v = normal(rng);
        const int64_t M = 25, kp = packed.kp;
        std::vector<float> x(static_cast<size_t>(M * K));
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t k = 0; k < K; ++k) {
            float v = normal(rng) * (m % 3 == 0 ? 40.0f : 1.0f);
            if (m % 5 == 1) v = std::round(v * 4.0f) / 4.0f;  // ties at half steps of some scales
            if (m % 7 == 2) v = 0.0f;                          // an all-zero row: scale 1, zero point 0
            x[m * K + k] = v;
          }
        }
        std::vector<uint8_t> xq(static_cast<size_t>(M * kp)), xq_ref(xq.size());
        std::vector<float> sa(static_cast<size_t>(M)), sa_ref(sa.size());
        std::vector<int32_t> za(static_cast<size_t>(M)), za_ref(za.size());
        rw::QuantizeRowsPortable(x.data(), M, K, kp, levels, xq_ref.data(), sa_ref.data(), za_ref.data());
        if (quantize != nullptr) {
          quantize(x.data(), M, K, kp, levels, xq.data(), sa.data(), za.data());
          ++g_checks;
          if (xq != xq_ref || sa != sa_ref || za != za_ref) {
            Fail(std::string("RowwiseInt8MatMul ") + variant + ": row quantization differs from the portable one, K=" +
                 std::to_string(K));
          }
        }
        // The tiles' rows: uint8, or int16 on the widened packing (the AVX2 unit's int16 quantization, every vector
        // path's).
        std::vector<int16_t> xw(wide ? static_cast<size_t>(M * kp) : 0);
        if (wide) {
          std::vector<float> sw(static_cast<size_t>(M));
          std::vector<int32_t> zw(static_cast<size_t>(M));
          rw::QuantizeRowsWideAvx2(x.data(), M, K, kp, levels, xw.data(), sw.data(), zw.data());
          ++g_checks;
          if (!std::equal(xw.begin(), xw.end(), xq_ref.begin()) || sw != sa_ref || zw != za_ref) {
            Fail(std::string("RowwiseInt8MatMul ") + variant + ": int16 row quantization differs from the portable " +
                 "one, K=" + std::to_string(K));
          }
        }
        const uint8_t* rows = wide ? reinterpret_cast<const uint8_t*>(xw.data()) : xq_ref.data();
        std::vector<float> residual(static_cast<size_t>(M * N));
        for (auto& v : residual) v = normal(rng) * 3.0f;
        for (int64_t m_count = 1; m_count <= M; ++m_count) {
          for (bool with_bias : {false, true}) {
            const float* bias_p = with_bias ? bias.data() : nullptr;
            const int epilogue = static_cast<int>((m_count + (with_bias ? 1 : 0)) % 4);  // each in turn
            const rw::Activation act = epilogue % 2 ? rw::Activation::kGelu : rw::Activation::kNone;
            const float* res_p = epilogue >= 2 ? residual.data() : nullptr;
            std::vector<float> y(static_cast<size_t>(m_count * N), NAN);
            if (!tile) {
              rw::GemmPortable(b.data(), K, N, packed.colsum.data(), xq_ref.data(), kp, sa_ref.data(), za_ref.data(),
                               m_count, sb.data(), bias_p, y.data(), 0, N, act, res_p);
            } else {
              // as the binding's tasks call it: the whole packing, or two parts split at panel 1
              const rw::PackedView whole = packed.View();
              const int64_t split = packed.np > rw::kNR && (m_count % 2 == 0) ? rw::kNR : packed.np;
              for (int64_t n0 = 0; n0 < packed.np; n0 = split) {
                const int64_t n1 = n0 == 0 ? split : packed.np;
                rw::PackedView part = whole;
                part.panels = whole.panels + n0 * kp * whole.width;
                part.colsum = whole.colsum + n0;
                part.np = n1 - n0;
                part.readable_np = whole.np - n0;
                part.N = std::min(N, n1) - n0;
                gemm(part, rows, sa_ref.data(), za_ref.data(), m_count, sb.data() + n0,
                     bias_p == nullptr ? nullptr : bias_p + n0, y.data() + n0, N, act,
                     res_p == nullptr ? nullptr : res_p + n0);
                if (n1 == packed.np) break;
              }
            }
            for (int64_t m = 0; m < m_count; ++m) {
              for (int64_t n = 0; n < N; ++n) {
                int64_t acc = 0;
                for (int64_t k = 0; k < K; ++k) acc += int64_t{xq_ref[m * kp + k]} * b[k * N + n];
                const float v = static_cast<float>(acc - int64_t{za_ref[m]} * packed.colsum[n]);
                float want = std::fma(v, sa_ref[m] * sb[n], with_bias ? bias[n] : 0.0f);
                if (act == rw::Activation::kGelu) want = sd::simd::GeluErf(want);
                if (res_p != nullptr) want += res_p[m * N + n];
                ++g_checks;
                if (std::memcmp(&want, &y[m * N + n], sizeof(float)) != 0) {
                  Fail(std::string("RowwiseInt8MatMul ") + variant + (tile ? " tile" : " portable loops") +
                       ": M=" + std::to_string(m_count) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                       " groups=" + std::to_string(packed.groups) + " width=" + std::to_string(packed.width) +
                       " epilogue=" + std::to_string(epilogue) + " y[" + std::to_string(m) + "," +
                       std::to_string(n) + "]=" + std::to_string(y[m * N + n]) + " want " + std::to_string(want));
                }
              }
            }
          }
        }
      }
    }
  }
}

int main() {
  const sd::IsaChoice choice = sd::ChooseIsa();
  const sd::Isa isa = choice.detected;  // SOFTDEPLOY_TEST_CPU lowers it, as for the library
  __builtin_cpu_init();
  std::vector<std::string> ran, int8, rowwise;  // the variants, MaxSim int8 dots, RowwiseInt8MatMul paths
  if (isa >= sd::Isa::kAvx2) {
    Run("SoftmaxTopK", [&] { SweepSoftmaxTopK("avx2", sd::softmax_topk::FastRowAvx2, 8); });
    Run("Softpick", [&] { SweepSoftpick("avx2", sd::softpick::RowAvx2, 8); });
    Run("TwoPassSoftmax", [&] { SweepTwoPass("avx2", sd::two_pass::RowAvx2, 8); });
    Run("MultiMax", [&] { SweepMultiMax("avx2", sd::multi_max::RowAvx2, 8); });
    Run("AdaptiveTemperatureSoftmax", [&] { SweepAts("avx2", {sd::ats::Pass1Avx2, sd::ats::Pass2Avx2, sd::ats::WriteAvx2}, 8); });
    Run("SoftNMS", [&] { SweepSoftNms("avx2", {sd::soft_nms::ScanAvx2, sd::soft_nms::MaxAvx2, sd::soft_nms::FirstEqualAvx2}, 8); });
    Run("MaxSim", [&] { SweepMaxSim({"avx2 float32", MsPath::kF32, 16, 6, sd::maxsim::TileF32Avx2}); });
    Run("LoRAMixer", [&] {
      SweepLoRAMixerDot("avx2", sd::lora_mixer::DotTileAvx2, 8);
      SweepLoRAMixerAxpy("avx2", sd::lora_mixer::AxpyAvx2, 8);
      SweepLoRAMixerTranspose("avx2 (portable transpose + avx2 scan)", [](const float* src, int64_t out, int64_t r, float* dst) {
        sd::lora_mixer::TransposePortable(src, out, r, dst);
        return sd::lora_mixer::AllFiniteAvx2(src, out * r);
      });
      SweepLoRAMixerFinite("avx2", sd::lora_mixer::AllFiniteAvx2, 8);
      // The scalar pieces every variant shares (the reference forms of the portable variant).
      SweepLoRAMixerDot("portable", sd::lora_mixer::DotTilePortable, 8);
      SweepLoRAMixerAxpy("portable", sd::lora_mixer::AxpyPortable, 8);
      SweepLoRAMixerTranspose("portable", TransposePortableChecked);
      SweepLoRAMixerFinite("portable", sd::lora_mixer::AllFinitePortable, 8);
      SweepLoRAMixerRoute();
    });
    if (sd::CpuHasF16c()) Run("MaxSim", [&] { SweepWidenF16("avx2", sd::maxsim::WidenF16Avx2); });  // as the library checks
    Run("MaxSim", [&] { SweepMaxSim({"avx2 int8 vpmaddwd", MsPath::kI8Avx2I16, 16, 6, nullptr}); });
    int8.push_back("vpmaddwd");
    Run("MaxSim", [&] { SweepMaxSim({"avx2 int8 vpmaddubsw (7-bit documents)", MsPath::kI8Avx2Ubs, 16, 4, nullptr}); });
    int8.push_back("vpmaddubsw");
    Run("MaxSim", [&] { SweepMaxSim({"avx2 int8 vpmaddubsw pairs (7-bit documents and queries)", MsPath::kI8Avx2Ubs2, 16, 3, nullptr}); });
    int8.push_back("vpmaddubsw-pairs");
    Run("MaxSim", [&] { SweepMaxSim({"avx2 int8 sign table (queries without -128)", MsPath::kI8Avx2Tab, 16, 3, nullptr}); });
    int8.push_back("sign-table");
    // AVX-VNNI as the library uses it: where the CPU has it and SOFTDEPLOY_TEST_CPU does not hide it.
    if (sd::KernelsUseAvxVnni()) {
      Run("MaxSim", [&] { SweepMaxSim({"avx2 int8 avx-vnni", MsPath::kI8AvxVnni, 16, 6, nullptr, sd::maxsim::TileI8AvxVnni}); });
      int8.push_back("avx-vnni");
    }
    Run("RowwiseInt8MatMul", [&] { SweepRowwise("avx2", rw::Path::kAvx2, rw::GemmAvx2, rw::QuantizeRowsAvx2); });
    Run("RowwiseInt8MatMul", [&] { SweepRowwise("portable", rw::Path::kPortable, nullptr, nullptr); });
    Run("RowwiseInt8MatMul", SweepWeightArena);
    rowwise.insert(rowwise.end(), {"avx2", "portable"});
    if (sd::KernelsUseAvxVnni()) {  // as the library: the avx2 variant's VNNI tile
      Run("RowwiseInt8MatMul", [&] { SweepRowwise("avx2 avx-vnni", rw::Path::kAvxVnni, rw::GemmAvxVnni, rw::QuantizeRowsAvx2); });
      rowwise.push_back("avx-vnni");
    }
    ran.push_back("avx2");
  }
  if (isa >= sd::Isa::kAvx512) {
    Run("SoftmaxTopK", [&] { SweepSoftmaxTopK("avx512", sd::softmax_topk::FastRowAvx512, 16); });
    Run("Softpick", [&] { SweepSoftpick("avx512", sd::softpick::RowAvx512, 16); });
    Run("TwoPassSoftmax", [&] { SweepTwoPass("avx512", TwoPassAvx512, 16); });
    Run("TwoPassSoftmax", [&] { SweepTwoPass("avx512 (prefetchnta)", TwoPassAvx512Hinted, 16); });
    Run("MultiMax", [&] { SweepMultiMax("avx512", sd::multi_max::RowAvx512, 16); });
    Run("AdaptiveTemperatureSoftmax", [&] { SweepAts("avx512", {sd::ats::Pass1Avx512, sd::ats::Pass2Avx512, sd::ats::WriteAvx512}, 16); });
    Run("SoftNMS", [&] { SweepSoftNms("avx512", {sd::soft_nms::ScanAvx512, sd::soft_nms::MaxAvx512, sd::soft_nms::FirstEqualAvx512}, 16); });
    Run("SoftNMS", [&] { SweepSoftNmsWeigh("avx512", sd::soft_nms::WeighAvx512); });
    Run("MaxSim", [&] { SweepMaxSim({"avx512 float32", MsPath::kF32, 32, 8, sd::maxsim::TileF32Avx512}); });
    // the zmm form of the AVX2 tile: what the library runs on AVX-512 CPUs without VNNI (swept on every AVX-512 CPU)
    Run("RowwiseInt8MatMul", [&] { SweepRowwise("avx512 bw", rw::Path::kAvx512Bw, rw::GemmAvx512Bw, rw::QuantizeRowsAvx2); });
    rowwise.push_back("avx512-bw");
    Run("LoRAMixer", [&] {
      SweepLoRAMixerDot("avx512", sd::lora_mixer::DotTileAvx512, 16);
      SweepLoRAMixerAxpy("avx512", sd::lora_mixer::AxpyAvx512, 16);
      SweepLoRAMixerTranspose("avx512", sd::lora_mixer::TransposeAvx512);
      SweepLoRAMixerFinite("avx512", sd::lora_mixer::AllFiniteAvx512, 16);
    });
    if (__builtin_cpu_supports("avx512vnni")) {
      Run("MaxSim", [&] { SweepMaxSim({"avx512 int8 vnni", MsPath::kI8Avx512Vnni, 32, 8, nullptr}); });
      int8.push_back("avx512-vnni");
      // as the library: the VNNI tile where the avx512 variant runs on a CPU with AVX-512 VNNI
      Run("RowwiseInt8MatMul", [&] { SweepRowwise("avx512 vnni", rw::Path::kAvx512Vnni, rw::GemmAvx512Vnni, rw::QuantizeRowsAvx2); });
      rowwise.push_back("avx512-vnni");
      // The AVX-VNNI tiles' source with vpdpbusd's EVEX encoding (ops/common/avxvnni.h), whether or not this CPU
      // also has AVX-VNNI: their logic is swept on every CPU with AVX-512 VNNI.
      Run("MaxSim", [&] {
        SweepMaxSim({"avx2 int8 avx-vnni tile, EVEX encoding", MsPath::kI8AvxVnni, 16, 6, nullptr,
                     sd::maxsim::TileI8AvxVnniEvex});
      });
      int8.push_back("avx-vnni-as-evex");
      Run("RowwiseInt8MatMul", [&] {
        SweepRowwise("avx2 avx-vnni tile, EVEX encoding", rw::Path::kAvxVnni, rw::GemmAvxVnniEvex, rw::QuantizeRowsAvx2);
      });
      rowwise.push_back("avx-vnni-as-evex");
    }
    ran.push_back("avx512");
  }
  std::string list;
  for (const auto& r : ran) list += (list.empty() ? "" : ",") + r;
  std::string dots;
  for (const auto& r : int8) dots += (dots.empty() ? "" : ",") + r;
  std::printf("sweep: MaxSim int8 dot products [%s]\n", dots.c_str());
  std::string paths;
  for (const auto& r : rowwise) paths += (paths.empty() ? "" : ",") + r;
  std::printf("sweep: RowwiseInt8MatMul paths [%s]\n", paths.c_str());
  std::string per_op;
  for (const auto& [op, count] : g_op_checks) per_op += (per_op.empty() ? "" : ",") + op + "=" + std::to_string(count);
  std::printf("sweep: checks per op [%s]\n", per_op.c_str());
  std::printf("sweep: variants [%s] (cpu: %s), %d checks, %d failures\n", list.c_str(), sd::IsaName(isa), g_checks,
              g_failures);
  return g_failures == 0 ? 0 : 1;
}
