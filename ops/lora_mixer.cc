// LoRAMixer: the routed low-rank delta of a LoRA-Mixer projection (equation and rules:
// softdeploy/ops/lora_mixer.py, rendered in docs/ops/LoRAMixer.md).
//
//   per token x:  l = Router . x;  S = top_k by l (ties -> lower index);
//                 w_e = exp(l_e - max l) / sum_{S} exp(l_e' - max l);
//                 Delta = scaling * sum_{e in S} w_e * Bm_e . (A_e . x)
//
// SGMV-style (Punica): the tokens of a call are routed first (router logits, top-k, gates), then
// grouped by selected expert (a counting sort: for each expert the list of (token, scaling * w) in
// token order), and each expert's A_e . x and Bm_e . u are computed for its own tokens only. An
// unselected expert is never read: the work is top_k / E of the dense form, plus the router.
//
// What must stay true:
//  * Each token's result is independent of the other tokens of the call and of the thread split:
//    the tiles pair tokens, but a token's arithmetic is the same in every lane and position (an odd
//    token is paired with itself), the 8-row tiles pad with a repeated row, and the experts of a
//    token are added to its Delta in ascending expert order. Identical router rows therefore give
//    bit-identical logits (exact ties) and 1 and 2 threads give identical results.
//  * Work is split into fixed blocks of kTokenBlock tokens (sd::ParallelFor over blocks), never by
//    the number of threads.
//  * Non-finite tokens (any logit NaN or +-inf) get NaN Delta and Gates and Experts 0..top_k-1. The
//    logits are float32 in every form (the reference rounds its float64 logits to float32 to decide
//    this): a logit beyond float32's range is +-inf, its token non-finite.
//  * A non-finite weight is an error whatever the routing: unselected experts are scanned, selected
//    ones are checked through the work (a non-finite value is absorbing in the sums of products), and
//    any sign of one runs the full scan of A, Bm and Router in that order (RequireFinite's message),
//    so the error does not depend on which check saw it first (see Compute).
//  * A token's routing is computed from its logits alone (a loop over the block's tokens after all
//    their logits), its top-k scan without data-dependent branches; the gates' arithmetic is
//    unchanged (exp in double of l_e - max l, the top expert's term exactly 1).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "common/kernel.h"
#include "lora_mixer_tiles.h"

namespace sd {
namespace {

using namespace lora_mixer;  // NOLINT: the kernel's own compute pieces

constexpr const char* kOp = "LoRAMixer";
constexpr int64_t kTokenBlock = 64;

// Fails naming the first non-finite entry of a weight input (the error path: a plain scan).
inline void RequireFinite(Isa isa, const char* name, const float* p, const std::vector<int64_t>& shape) {
  const int64_t n = NumElements(shape);
  const bool ok = isa == Isa::kAvx512 ? AllFiniteAvx512(p, n)
                  : isa == Isa::kAvx2 ? AllFiniteAvx2(p, n)
                                      : AllFinitePortable(p, n);
  if (ok) return;
  int64_t at = 0;
  while (at < n && std::isfinite(p[at])) ++at;
  std::vector<int64_t> index(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1, rest = at; d >= 0; --d) {
    index[d] = rest % shape[d];
    rest /= shape[d];
  }
  Fail(kOp, name, " holds a non-finite value (NaN or +-inf) at ", ShapeStr(index),
       " (rule: the experts' factors A, Bm and the Router are finite)");
}

struct LoRAMixerKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kT}, {Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}, {Elem::kInt64, /*optional=*/true}, {Elem::kT, /*optional=*/true}};

  int64_t top_k;
  float scaling;
  Isa isa;

  explicit LoRAMixerKernel(const Attrs& attrs)
      : top_k(attrs.Int("top_k", 1)), scaling(attrs.Float("scaling", 1.0f)), isa(SelectIsa()) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0), a = GetInput<T>(ctx, 1), bm = GetInput<T>(ctx, 2),
                   router = GetInput<T>(ctx, 3);
    if (x.rank() == 0) Fail(kOp, "X must have rank >= 1 ([..., in]), got a scalar");
    if (a.rank() != 3) Fail(kOp, "A must have rank 3 ([E, r, in]), got shape ", ShapeStr(a.shape));
    if (bm.rank() != 3) Fail(kOp, "Bm must have rank 3 ([E, out, r]), got shape ", ShapeStr(bm.shape));
    if (router.rank() != 2) Fail(kOp, "Router must have rank 2 ([E, in]), got shape ", ShapeStr(router.shape));
    const int64_t e = a.shape[0], r = a.shape[1], n_in = a.shape[2], n_out = bm.shape[1];
    const char* e_rule = "rule: A [E, r, in], Bm [E, out, r] and Router [E, in] agree on E";
    if (bm.shape[0] != e) Fail(kOp, "Bm has E = ", bm.shape[0], " experts, A has E = ", e, " (", e_rule, ")");
    if (router.shape[0] != e) Fail(kOp, "Router has E = ", router.shape[0], " experts, A has E = ", e, " (", e_rule, ")");
    if (bm.shape[2] != r) {
      Fail(kOp, "Bm has r = ", bm.shape[2], ", A has r = ", r, " (rule: A [E, r, in] and Bm [E, out, r] agree on r)");
    }
    const char* in_rule = "rule: X [..., in], A [E, r, in] and Router [E, in] agree on in";
    if (x.shape.back() != n_in) Fail(kOp, "X has in = ", x.shape.back(), " features, A has in = ", n_in, " (", in_rule, ")");
    if (router.shape[1] != n_in) {
      Fail(kOp, "Router has in = ", router.shape[1], " features, A has in = ", n_in, " (", in_rule, ")");
    }
    if (top_k < 1 || top_k > e) Fail(kOp, "top_k ", top_k, " is out of range for E = ", e, " experts (rule: 1 <= top_k <= E)");
    if (!std::isfinite(scaling)) {
      Fail(kOp, "scaling ", std::isnan(scaling) ? "nan" : (scaling > 0 ? "inf" : "-inf"),
           " is not finite (rule: scaling is a finite number)");
    }

    const int64_t k = top_k;
    std::vector<int64_t> d_shape(x.shape.begin(), x.shape.end() - 1), k_shape = d_shape;
    d_shape.push_back(n_out);
    k_shape.push_back(k);
    T* delta_out = AllocOutput<T>(ctx, 0, d_shape);
    int64_t* experts_out = nullptr;
    T* gates_out = nullptr;
    // Experts and Gates are optional: absent or omitted (named ""), onnxruntime gives no tensor.
    if (ctx.GetOutputCount() > 1) {
      Ort::UnownedValue v = ctx.GetOutput(1, k_shape);
      if (static_cast<OrtValue*>(v) != nullptr) experts_out = v.GetTensorMutableData<int64_t>();
    }
    if (ctx.GetOutputCount() > 2) {
      Ort::UnownedValue v = ctx.GetOutput(2, k_shape);
      if (static_cast<OrtValue*>(v) != nullptr) gates_out = v.GetTensorMutableData<T>();
    }
    const int64_t n_tok = NumElements(std::vector<int64_t>(x.shape.begin(), x.shape.end() - 1));
    std::vector<float> xb, ab, bb, rb;
    const float* xf = AsFloat(x, xb);
    const float* af = AsFloat(a, ab);
    const float* bf = AsFloat(bm, bb);
    const float* rf = AsFloat(router, rb);
    // Every expert, selected or not, must be finite (see the op's docstring: a NaN must not depend on
    // the routing). require_all_finite scans A, Bm and Router in that order and fails naming the first
    // non-finite entry. With tokens, most of that scan is fused into the work (one extra pass over
    // ~200 KB of weights was ~5% of a call at the benchmark shape): a non-finite value is absorbing
    // in a sum of products (NaN stays NaN, inf + finite = inf, inf - inf = NaN, inf * 0 = NaN), so
    //  * a non-finite Router entry makes every token's logits non-finite,
    //  * a non-finite entry of a selected expert's A_e makes A_e . x non-finite for each of its
    //    (finite) tokens,
    //  * a selected expert's Bm_e is classified while it is transposed (TransposeAvx512) or scanned,
    //  * an unselected expert's A_e and Bm_e are scanned as before.
    // Any of these signs (also raised by a non-finite X or an overflow, which are not errors) runs the
    // full scan after the work, which then fails exactly as the scan up front did, or passes.
    const auto finite = isa == Isa::kAvx512 ? AllFiniteAvx512 : isa == Isa::kAvx2 ? AllFiniteAvx2 : AllFinitePortable;
    auto require_all_finite = [&] {
      RequireFinite(isa, "A", af, a.shape);
      RequireFinite(isa, "Bm", bf, bm.shape);
      RequireFinite(isa, "Router", rf, router.shape);
    };
    if (n_tok == 0) {
      require_all_finite();
      return;
    }

    DotTileFn dot = DotTilePortable;
    AxpyFn axpy = AxpyPortable;
    if (isa == Isa::kAvx512) {
      dot = DotTileAvx512;
      axpy = AxpyAvx512;
    } else if (isa == Isa::kAvx2) {
      dot = DotTileAvx2;
      axpy = AxpyAvx2;
    }
    // Bm_e -> Bm_e^T, and whether Bm_e is all finite.
    auto transpose = [&](const float* src, int64_t out, int64_t rr, float* dst) {
      if (isa == Isa::kAvx512) return TransposeAvx512(src, out, rr, dst);
      TransposePortable(src, out, rr, dst);
      return finite(src, out * rr);
    };

    // Phase 1 (parallel over token blocks): logits, top-k, gates.
    std::vector<int32_t> sel(static_cast<size_t>(n_tok * k));
    std::vector<float> gate(static_cast<size_t>(n_tok * k));
    std::vector<char> ok(static_cast<size_t>(n_tok));
    const size_t blocks = static_cast<size_t>((n_tok + kTokenBlock - 1) / kTokenBlock);
    ParallelFor(ctx, blocks, [&](size_t b) {
      const int64_t t0 = static_cast<int64_t>(b) * kTokenBlock, t1 = std::min(n_tok, t0 + kTokenBlock);
      // All the block's logits first, then the routing in a loop of its own: the tokens' top-k scans
      // are independent, so their dependency chains (a compare and select per expert) overlap there,
      // where between two dot tiles each waited on its own.
      std::vector<float> l(static_cast<size_t>((t1 - t0) * e));
      for (int64_t t = t0; t < t1; t += 2) {
        const int64_t u = std::min(t + 1, t1 - 1);
        DotRows(dot, xf + t * n_in, xf + u * n_in, rf, e, n_in, &l[(t - t0) * e], &l[(u - t0) * e]);
      }
      for (int64_t t = t0; t < t1; ++t) ok[t] = Route(&l[(t - t0) * e], e, k, &sel[t * k], &gate[t * k]);
    });

    // Phase 2 (serial, O(N k + E)): group (token, coefficient) by expert, tokens ascending within an
    // expert; transpose the used experts' Bm_e to [r, out] so the up-projection reads rows.
    std::vector<int64_t> start(static_cast<size_t>(e + 1), 0);
    for (int64_t t = 0; t < n_tok; ++t) {
      if (!ok[t]) continue;
      for (int64_t s = 0; s < k; ++s) ++start[sel[t * k + s] + 1];
    }
    for (int64_t j = 0; j < e; ++j) start[j + 1] += start[j];
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    std::vector<int64_t> tok(static_cast<size_t>(start[e]));
    std::vector<float> coef(static_cast<size_t>(start[e]));
    for (int64_t t = 0; t < n_tok; ++t) {
      if (!ok[t]) continue;
      for (int64_t s = 0; s < k; ++s) {
        const int64_t j = sel[t * k + s], p = fill[j]++;
        tok[p] = t;
        coef[p] = scaling * gate[t * k + s];
      }
    }
    // Only the used experts' slices are written (and read): no zero-initialisation of the rest.
    std::unique_ptr<float[]> bt(new float[static_cast<size_t>(std::max<int64_t>(e * r * n_out, 1))]);
    bool suspect = false;  // a sign of a non-finite weight (see require_all_finite)
    for (int64_t t = 0; t < n_tok; ++t) suspect |= !ok[t];
    for (int64_t j = 0; j < e; ++j) {
      const float* bj = bf + j * n_out * r;
      if (start[j + 1] == start[j]) {  // an unselected expert is only scanned, never computed
        suspect |= !finite(af + j * r * n_in, r * n_in) || !finite(bj, n_out * r);
        continue;
      }
      suspect |= !transpose(bj, n_out, r, bt.get() + j * r * n_out);
    }

    // Phase 3 (parallel over the same token blocks): per expert, its tokens in the block, in pairs.
    const bool direct = std::is_same_v<T, float>;
    std::vector<char> u_bad(blocks, 0);  // per block: some A_e . x was not finite
    ParallelFor(ctx, blocks, [&](size_t b) {
      const int64_t t0 = static_cast<int64_t>(b) * kTokenBlock, t1 = std::min(n_tok, t0 + kTokenBlock);
      std::vector<float> scratch(direct ? 0 : static_cast<size_t>((t1 - t0) * n_out));
      float* dbase = direct ? reinterpret_cast<float*>(delta_out) + t0 * n_out : scratch.data();
      // Each token's Delta starts with its first expert's contribution (no zero-fill pass); r = 0
      // contributes nothing, so there it is zero-filled.
      if (r == 0) std::fill(dbase, dbase + (t1 - t0) * n_out, 0.0f);
      std::vector<char> seen(static_cast<size_t>(t1 - t0), r == 0 ? 1 : 0);
      bool nonfinite = false;
      std::vector<float> u0(static_cast<size_t>(std::max<int64_t>(r, 1))), u1(u0.size()), c0(u0.size()),
          c1(u0.size());
      for (int64_t j = 0; j < e; ++j) {
        const int64_t* first = tok.data() + start[j];
        const int64_t* last = tok.data() + start[j + 1];
        const int64_t p0 = std::lower_bound(first, last, t0) - tok.data();
        const int64_t p1 = std::lower_bound(first, last, t1) - tok.data();
        const float* aj = af + j * r * n_in;
        const float* btj = bt.get() + j * r * n_out;
        for (int64_t p = p0; p < p1; p += 2) {
          const int64_t q = std::min(p + 1, p1 - 1);
          const int64_t ta = tok[p], tb = tok[q];
          if (r > 0) DotRows(dot, xf + ta * n_in, xf + tb * n_in, aj, r, n_in, u0.data(), u1.data());
          for (int64_t i = 0; i < r; ++i) {
            c0[i] = coef[p] * u0[i];
            c1[i] = coef[q] * u1[i];
            // not (|u| <= FLT_MAX): NaN or +-inf (no branch)
            nonfinite |= !(std::fabs(u0[i]) <= std::numeric_limits<float>::max());
            nonfinite |= !(std::fabs(u1[i]) <= std::numeric_limits<float>::max());
          }
          axpy(btj, r, n_out, c0.data(), c1.data(), dbase + (ta - t0) * n_out, dbase + (tb - t0) * n_out,
               !seen[ta - t0], !seen[tb - t0]);
          seen[ta - t0] = seen[tb - t0] = 1;
        }
      }
      u_bad[b] = nonfinite;
      const float qnan = std::numeric_limits<float>::quiet_NaN();
      for (int64_t t = t0; t < t1; ++t) {
        float* d = dbase + (t - t0) * n_out;
        if (!ok[t]) std::fill(d, d + n_out, qnan);
        if (!direct) {
          for (int64_t o = 0; o < n_out; ++o) delta_out[t * n_out + o] = FromFloat<T>(d[o]);
        }
        for (int64_t s = 0; s < k; ++s) {
          if (experts_out != nullptr) experts_out[t * k + s] = sel[t * k + s];
          if (gates_out != nullptr) gates_out[t * k + s] = FromFloat<T>(gate[t * k + s]);
        }
      }
    });
    for (const char bad : u_bad) suspect |= bad != 0;
    if (suspect) require_all_finite();
  }
};

}  // namespace

SD_REGISTER_KERNEL(LoRAMixer, LoRAMixerKernel)

}  // namespace sd
