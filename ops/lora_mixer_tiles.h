// The compute pieces of the LoRAMixer kernel (ops/lora_mixer.cc), without onnxruntime: the dot tile
// (2 tokens x 8 rows), the up-projection (Delta rows += Bm_e^T c for 2 tokens), the transpose of Bm_e,
// the weights' finiteness scan and the routing of one token. Included by ops/lora_mixer.cc and by the
// size sweep (tests/native/sweep.cc), which checks each variant against float64 and the scalar fma
// chains at generated sizes. The portable pieces and the routing are defined here, in an anonymous namespace
// (internal linkage: see ops/common/vec.h on why); the vector variants are written once over the vector
// traits (ops/lora_mixer_kernels.h), compiled per ISA (ops/lora_mixer_avx2.cc, _avx512.cc) and declared at
// the end; ops/lora_mixer.cc chooses one at run time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace sd {
namespace lora_mixer {
namespace {

constexpr int kRows = 8;  // rows of A_e / Router per dot tile

// ---- dot tiles: out[t][j] = rows[j] . x_t for 2 tokens x 8 rows ---------------------------------

// Portable: one accumulator per dot product, in i order.
inline void DotTilePortable(const float* x0, const float* x1, const float* const* rows, int64_t n, float* out0,
                     float* out1) {
  for (int j = 0; j < kRows; ++j) {
    float s0 = 0.0f, s1 = 0.0f;
    const float* w = rows[j];
    for (int64_t i = 0; i < n; ++i) {
      s0 = std::fma(w[i], x0[i], s0);
      s1 = std::fma(w[i], x1[i], s1);
    }
    out0[j] = s0;
    out1[j] = s1;
  }
}

using DotTileFn = void (*)(const float*, const float*, const float* const*, int64_t, float*, float*);

// out_t[j] = W[j] . x_t for all `m` rows of W [m, n] (row stride n), in tiles of 8 rows; the last
// tile repeats row m-1 (its extra results are dropped).
inline void DotRows(DotTileFn tile, const float* x0, const float* x1, const float* w, int64_t m, int64_t n,
                    float* out0, float* out1) {
  float t0[kRows], t1[kRows];
  const float* rows[kRows];
  if (m == kRows) {  // E = 8 router rows or r = 8 ranks, the usual case: straight into out
    for (int k = 0; k < kRows; ++k) rows[k] = w + k * n;
    tile(x0, x1, rows, n, out0, out1);
    return;
  }
  for (int64_t j0 = 0; j0 < m; j0 += kRows) {
    for (int k = 0; k < kRows; ++k) rows[k] = w + std::min<int64_t>(j0 + k, m - 1) * n;
    tile(x0, x1, rows, n, t0, t1);
    const int64_t cnt = std::min<int64_t>(kRows, m - j0);
    for (int64_t k = 0; k < cnt; ++k) {
      out0[j0 + k] = t0[k];
      out1[j0 + k] = t1[k];
    }
  }
}

// ---- up-projection: d_t += sum_j c_t[j] * BT[j, :] for 2 tokens (BT = Bm_e^T, [r, out]) ----------

// Outputs [begin, out) one element at a time: the fma chain j = 0..r-1 every vector lane also runs (the
// portable variant, and the vector variants' tails).
inline void AxpyScalar(const float* bt, int64_t r, int64_t out, int64_t begin, const float* c0, const float* c1,
                       float* d0, float* d1, bool fresh0, bool fresh1) {
  for (int64_t o = begin; o < out; ++o) {
    float a0 = fresh0 ? 0.0f : d0[o], a1 = fresh1 ? 0.0f : d1[o];
    for (int64_t j = 0; j < r; ++j) {
      a0 = std::fma(c0[j], bt[j * out + o], a0);
      a1 = std::fma(c1[j], bt[j * out + o], a1);
    }
    d0[o] = a0;
    d1[o] = a1;
  }
}

inline void AxpyPortable(const float* bt, int64_t r, int64_t out, const float* c0, const float* c1, float* d0, float* d1,
                  bool fresh0, bool fresh1) {
  AxpyScalar(bt, r, out, 0, c0, c1, d0, d1, fresh0, fresh1);
}

// Bm_e [out, r] -> Bm_e^T [r, out] (rows of the up-projection for AxpyXxx). The AVX-512 build of the
// same loop lets gcc vectorise it (gathers along out).
inline void TransposePortable(const float* src, int64_t out, int64_t r, float* dst) {
  for (int64_t q = 0; q < r; ++q)
    for (int64_t o = 0; o < out; ++o) dst[q * out + o] = src[o * r + q];
}

using AxpyFn = void (*)(const float*, int64_t, int64_t, const float*, const float*, float*, float*, bool, bool);

// ---- routing ------------------------------------------------------------------------------------

// Top-k of one token's logits l[0..E) (larger first, equal -> lower index), its gates, and whether
// the token is finite. sel/gate hold top_k entries.
inline bool Route(const float* l, int64_t e, int64_t k, int32_t* sel, float* gate) {
  for (int64_t j = 0; j < e; ++j) {
    if (!std::isfinite(l[j])) {
      for (int64_t s = 0; s < k; ++s) {
        sel[s] = static_cast<int32_t>(s);
        gate[s] = std::numeric_limits<float>::quiet_NaN();
      }
      return false;
    }
  }
  // Selection by repeated max over the not-yet-chosen experts: E is small (tens). The scan keeps the
  // best value and index in registers and compares with no data-dependent branch (a branch on random
  // logits mispredicts about once per token and pass, which cost more than the compares); a chosen
  // expert's value is replaced by -inf, below every finite logit, in a copy of the logits (on the stack
  // for E <= 64, the usual case: no allocation per token). Strict `>`: an equal logit keeps the lower
  // index, and an unchosen finite logit always beats a chosen one.
  float lv_small[64];
  std::vector<float> lv_big(e > 64 ? static_cast<size_t>(e) : 0);
  float* lv = e > 64 ? lv_big.data() : lv_small;
  std::copy(l, l + e, lv);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < k; ++s) {
    float bv = lv[0];
    int64_t best = 0;
    for (int64_t j = 1; j < e; ++j) {
      const bool gt = lv[j] > bv;
      bv = gt ? lv[j] : bv;
      best = gt ? j : best;
    }
    sel[s] = static_cast<int32_t>(best);
    lv[best] = ninf;
  }
  // The top expert's term is exp(l_max - l_max) = exp(0) = 1 exactly, so it is set, not computed (the
  // same value: top_k = 1 gives gate 1 with no exp at all).
  if (k == 1) {
    gate[0] = 1.0f;
    return true;
  }
  const double m = l[sel[0]];
  double ex[64];
  std::vector<double> ex_big(k > 64 ? static_cast<size_t>(k) : 0);
  double* exs = k > 64 ? ex_big.data() : ex;
  double sum = exs[0] = 1.0;
  for (int64_t s = 1; s < k; ++s) sum += (exs[s] = std::exp(static_cast<double>(l[sel[s]]) - m));
  for (int64_t s = 0; s < k; ++s) gate[s] = static_cast<float>(exs[s] / sum);
  return true;
}

// ---- finiteness of the weights ----------------------------------------------------------------------

inline bool AllFinitePortable(const float* p, int64_t n) {
  uint32_t bad = 0;  // exponent all ones: NaN or +-inf (a loop gcc vectorises)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, p + i, 4);
    bad |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace

// The vector variants (ops/lora_mixer_kernels.h over the vector traits, compiled in ops/lora_mixer_avx2.cc and
// ops/lora_mixer_avx512.cc with their own flags); called only after the run-time ISA check of ops/lora_mixer.cc.
void DotTileAvx2(const float* x0, const float* x1, const float* const* rows, int64_t n, float* out0, float* out1);
void AxpyAvx2(const float* bt, int64_t r, int64_t out, const float* c0, const float* c1, float* d0, float* d1,
              bool fresh0, bool fresh1);
bool AllFiniteAvx2(const float* p, int64_t n);
void DotTileAvx512(const float* x0, const float* x1, const float* const* rows, int64_t n, float* out0, float* out1);
void AxpyAvx512(const float* bt, int64_t r, int64_t out, const float* c0, const float* c1, float* d0, float* d1,
                bool fresh0, bool fresh1);
bool AllFiniteAvx512(const float* p, int64_t n);
// Bm_e [out, r] -> Bm_e^T [r, out] with register-lane transposes where r = 8; returns whether Bm_e is all
// finite (the check fused into the loads).
bool TransposeAvx512(const float* src, int64_t out, int64_t r, float* dst);

}  // namespace lora_mixer
}  // namespace sd
