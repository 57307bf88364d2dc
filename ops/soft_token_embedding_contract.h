// SoftTokenEmbedding's contract on the inputs and attributes, for every kernel binding (the CPU kernel
// in ops/soft_token_embedding.cc, the CUDA one in ops/cuda/ort_cuda.cc): one set of checks and
// messages (they match softdeploy/ops/soft_token_embedding.py's validate, in its order). Baseline code
// only: not for the per-ISA translation units.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/kernel.h"

namespace sd {

constexpr const char* kSoftTokenEmbedding = "SoftTokenEmbedding";

// The filters of one mode (thinking, or after thinking).
struct Filters {
  double temperature;
  int64_t top_k;
  double top_p;
  double min_p;
};

struct SoftTokenEmbeddingContract {
  Filters thinking, after;
  int64_t max_topk;
  std::string noise;
  float tau, noise_factor, clamp_min, clamp_max;

  explicit SoftTokenEmbeddingContract(const Attrs& attrs)
      : thinking{attrs.Float("temperature", 1.0f), attrs.Int("top_k", 0), attrs.Float("top_p", 1.0f),
                 attrs.Float("min_p", 0.0f)},
        after{attrs.Float("after_thinking_temperature", 1.0f), attrs.Int("after_thinking_top_k", 0),
              attrs.Float("after_thinking_top_p", 1.0f), attrs.Float("after_thinking_min_p", 0.0f)},
        max_topk(attrs.Int("max_topk", 10)),
        noise(attrs.String("noise", "none")),
        tau(attrs.Float("tau", 1.0f)),
        noise_factor(attrs.Float("noise_factor", 1.0f)),
        clamp_min(attrs.Float("clamp_min", -1.5f)),
        clamp_max(attrs.Float("clamp_max", 3.0f)) {}

  // From plain values (the CUDA C ABI, ops/cuda/c_api.cc).
  SoftTokenEmbeddingContract(const Filters& thinking_filters, const Filters& after_filters, int64_t k,
                             std::string noise_kind, float tau_value, float factor, float lo, float hi)
      : thinking(thinking_filters),
        after(after_filters),
        max_topk(k),
        noise(std::move(noise_kind)),
        tau(tau_value),
        noise_factor(factor),
        clamp_min(lo),
        clamp_max(hi) {}

  static void CheckFilters(const char* prefix, const Filters& f) {
    const char* op = kSoftTokenEmbedding;
    if (!(f.temperature > 0.0)) {
      Fail(op, prefix, "temperature ", static_cast<float>(f.temperature), " is out of range (rule: temperature > 0)");
    }
    if (f.top_k < 0) Fail(op, prefix, "top_k ", f.top_k, " is out of range (rule: top_k >= 0, 0 = off)");
    if (!(f.top_p > 0.0 && f.top_p <= 1.0)) {
      Fail(op, prefix, "top_p ", static_cast<float>(f.top_p), " is out of range (rule: 0 < top_p <= 1, 1 = off)");
    }
    if (!(f.min_p >= 0.0 && f.min_p < 1.0)) {
      Fail(op, prefix, "min_p ", static_cast<float>(f.min_p), " is out of range (rule: 0 <= min_p < 1, 0 = off)");
    }
  }

  // Shapes of Logits and Embedding; of Noise and Mode when present (nullptr: omitted). A rank-0 Noise is an
  // omitted one (the fill exported models feed). mode_values: Mode's values in host memory, or nullptr when
  // they live on a device (the CUDA binding: its kernel gives a NaN row for a value other than 0 / 1).
  void Check(const std::vector<int64_t>& xs, const std::vector<int64_t>& es, const std::vector<int64_t>* noise_shape,
             const std::vector<int64_t>* mode_shape, const int64_t* mode_values) const {
    const char* op = kSoftTokenEmbedding;
    if (xs.size() != 2) Fail(op, "Logits must have rank 2 [B, V], got shape ", ShapeStr(xs));
    if (es.size() != 2) Fail(op, "Embedding must have rank 2 [V, E], got shape ", ShapeStr(es));
    const int64_t b = xs[0], v = xs[1];
    if (es[0] != v) {
      Fail(op, "Embedding has ", es[0], " rows but Logits has V = ", v,
           " (rule: Embedding [V, E] has one row per logit)");
    }
    if (max_topk < 1) Fail(op, "max_topk ", max_topk, " is out of range (rule: 1 <= max_topk <= V)");
    if (max_topk > v) Fail(op, "max_topk ", max_topk, " is larger than V = ", v, " (rule: 1 <= max_topk <= V)");
    CheckFilters("", thinking);
    CheckFilters("after_thinking_", after);
    if (noise != "none" && noise != "gumbel") {
      Fail(op, "noise '", noise, "' is not supported (rule: noise is 'none' or 'gumbel')");
    }
    if (!(tau > 0.0f)) Fail(op, "tau ", tau, " is out of range (rule: tau > 0)");
    if (!std::isfinite(noise_factor)) Fail(op, "noise_factor ", noise_factor, " is not finite (rule: finite)");
    if (!(clamp_min <= clamp_max)) {
      Fail(op, "clamp_min ", clamp_min, " is above clamp_max ", clamp_max, " (rule: clamp_min <= clamp_max)");
    }
    const bool has_noise = HasNoise(noise_shape);
    if (has_noise && *noise_shape != std::vector<int64_t>{b, v}) {
      Fail(op, "Noise has shape ", ShapeStr(*noise_shape), ", expected [B, V] = [", b, ", ", v,
           "] (rule: one uniform per logit)");
    }
    if (noise == "gumbel" && !has_noise) {
      Fail(op, "noise 'gumbel' needs the Noise input (rule: Noise [B, V] uniform in (0, 1))");
    }
    if (mode_shape != nullptr) {
      if (*mode_shape != std::vector<int64_t>{b}) {
        Fail(op, "Mode has shape ", ShapeStr(*mode_shape), ", expected [B] = [", b, "]");
      }
      for (int64_t i = 0; mode_values != nullptr && i < b; ++i) {
        if (mode_values[i] != 0 && mode_values[i] != 1) {
          Fail(op, "Mode[", i, "] = ", mode_values[i], " is not a mode (rule: 0 = thinking, 1 = after thinking)");
        }
      }
    }
  }

  static bool HasNoise(const std::vector<int64_t>* noise_shape) {
    return noise_shape != nullptr && !noise_shape->empty();
  }

  // Candidates a row with filters f needs: max_topk, or top_k's kk when top_k is on and larger.
  int64_t NumCandidates(const Filters& f, int64_t v) const {
    const bool top_k_on = f.top_k > 0 && f.top_k < v;
    return std::min(v, std::max(max_topk, top_k_on ? f.top_k : int64_t{0}));
  }
};

}  // namespace sd
