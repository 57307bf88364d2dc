// AdaptiveTemperatureSoftmax's vector passes, written once over the vector traits of ops/common/vec.h
// and instantiated per ISA translation unit (ops/adaptive_temperature_softmax_avx2.cc, _avx512.cc); the
// row driver and the design are in ops/adaptive_temperature_softmax.cc. What differs by ISA is stated by
// one Policy per variant: the exp (ops/common/simd_math.h's simd::Exp: AVX-512 vscalefps; AVX2 2^n in the
// exponent field, flushing below 2^-126) and how the output pass stores (AVX-512: peel to 64 bytes, then
// streaming stores, the tail masked in float; AVX2: streaming stores where y + j is 32-byte aligned, the
// tail in double by the portable writer). Each variant gives the results its former hand-written twin
// gave, bit for bit (-ffp-contract=off from CMakeLists.txt).
//
// What must stay true: lanes past n load as -inf and add exactly 0; a lane that saw only -inf holds
// nothing at the merge; float sums stay within kFold vectors before folding into double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "adaptive_temperature_softmax_row.h"
#include "common/simd_math.h"
#include "common/vec.h"

namespace sd {
namespace ats {
namespace {  // internal linkage on purpose: see ops/common/vec.h

template <class V>
struct Policy;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
template <>
struct Policy<vec::Avx512> {
  using V = vec::Avx512;
  static constexpr bool kPeelAndStream = true;
  // exact 0 below the float range, -inf -> 0, +inf -> +inf, NaN -> NaN
  static SD_VEC_INLINE V::F exp(V::F x) { return simd::Exp<V>(x); }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
template <>
struct Policy<vec::Avx2> {
  using V = vec::Avx2;
  static constexpr bool kPeelAndStream = false;
  // exp(x) for x <= 0; below -87.3 it flushes to 0; NaN propagates
  static SD_VEC_INLINE V::F exp(V::F x) { return simd::Exp<V>(x); }
};
#endif

// ((t0 + t1) + (t2 + t3)) + ... : the lanes of acc[0] + acc[1], summed as a pairwise tree.
inline double PairwiseSum(const double* t, int n) { return n == 1 ? t[0] : PairwiseSum(t, n / 2) + PairwiseSum(t + n / 2, n / 2); }

template <class V>
SD_VEC_INLINE double Sum(const typename V::D* acc) {
  constexpr int kHalf = V::kLanes / 2;
  alignas(64) double t[kHalf];
  const typename V::D s = V::addd(acc[0], acc[1]);
  std::memcpy(t, &s, sizeof t);
  return PairwiseSum(t, kHalf);
}

template <class V>
SD_VEC_INLINE void Fold(typename V::D* acc, typename V::F v) {
  acc[0] = V::addd(acc[0], V::cvt_lo(v));
  acc[1] = V::addd(acc[1], V::cvt_hi(v));
}

// Merges per-lane (max, d, S) into the row's.
inline Stats1 Merge(const float* ml, const double* dl, const double* sl, int lanes, bool nan) {
  float m = -INFINITY;
  for (int i = 0; i < lanes; ++i) m = std::max(m, ml[i]);
  Stats1 r{m, 0.0, 0.0, nan};
  if (!std::isfinite(m)) return r;
  for (int i = 0; i < lanes; ++i) {
    if (ml[i] == -INFINITY) continue;  // a lane that saw only -inf holds nothing
    const double delta = static_cast<double>(ml[i]) - m, f = std::exp(delta);
    r.d += f * dl[i];
    r.s += f * (sl[i] + delta * dl[i]);
  }
  return r;
}

template <class V>
Stats1 Pass1(const float* x, int64_t n) {
  using F = typename V::F;
  using D = typename V::D;
  using P = Policy<V>;
  constexpr int L = V::kLanes;
  F m = V::set1(-INFINITY), d = V::zero(), s = d;
  D dd[2] = {V::zerod(), V::zerod()}, sd[2] = {dd[0], dd[0]};
  typename V::M nan = V::none();
  const F floor = V::set1(kFloor);
  int fold = 0;
  for (int64_t j = 0; j < n; j += L) {
    const F xv = V::loadu_fill(x + j, n - j >= L ? L : static_cast<int>(n - j), -INFINITY);
    nan = V::mask_or(nan, V::isnan(xv));
    const typename V::M grow = V::gt(xv, m);
    if (V::bits(grow) != 0) {  // rare after the first vectors: rescale the lanes whose max grows
      const F mn = V::select(grow, m, xv);
      const F delta = V::max(V::sub(m, mn), floor);  // -inf - -inf = NaN -> floor
      const F f = P::exp(delta);
      s = V::mul(f, V::fma(delta, d, s));
      d = V::mul(f, d);
      const D flo = V::cvt_lo(f), fhi = V::cvt_hi(f), dlo = V::cvt_lo(delta), dhi = V::cvt_hi(delta);
      sd[0] = V::muld(flo, V::fmad(dlo, dd[0], sd[0]));
      sd[1] = V::muld(fhi, V::fmad(dhi, dd[1], sd[1]));
      dd[0] = V::muld(flo, dd[0]);
      dd[1] = V::muld(fhi, dd[1]);
      m = mn;
    }
    const F z = V::max(V::sub(xv, m), floor);  // -inf and NaN -> floor
    const F e = P::exp(z);
    d = V::add(d, e);
    s = V::fma(e, z, s);
    if (++fold == kFold) {
      Fold<V>(dd, d);
      Fold<V>(sd, s);
      d = s = V::zero();
      fold = 0;
    }
  }
  Fold<V>(dd, d);
  Fold<V>(sd, s);
  alignas(64) float ml[L];
  alignas(64) double dl[L], sl[L];
  V::storeu(ml, m);
  std::memcpy(dl, &dd[0], sizeof dd[0]);
  std::memcpy(dl + L / 2, &dd[1], sizeof dd[1]);
  std::memcpy(sl, &sd[0], sizeof sd[0]);
  std::memcpy(sl + L / 2, &sd[1], sizeof sd[1]);
  return Merge(ml, dl, sl, L, V::bits(nan) != 0);
}

template <class V>
Stats2 Pass2(const float* x, int64_t n, float m, float beta_hat, float log_eps_d) {
  using F = typename V::F;
  using D = typename V::D;
  using P = Policy<V>;
  constexpr int L = V::kLanes;
  const F mv = V::set1(m), bh = V::set1(beta_hat), lv = V::set1(log_eps_d);
  const F zfloor = V::set1(-1e4f), one = V::set1(1.0f), two = V::set1(2.0f);
  F g = V::zero(), w0 = g, w1 = g, w2 = g, w3 = g;
  D acc[5][2];
  for (auto& a : acc) a[0] = a[1] = V::zerod();
  int fold = 0;
  for (int64_t j = 0; j < n; j += L) {
    const F xv = V::loadu_fill(x + j, n - j >= L ? L : static_cast<int>(n - j), -INFINITY);
    const F z = V::max(V::sub(xv, mv), zfloor);
    const F w = P::exp(V::mul(bh, z));
    const F wz = V::mul(w, z), wzz = V::mul(wz, z);
    w0 = V::add(w0, w);
    w1 = V::add(w1, wz);
    w2 = V::add(w2, wzz);
    w3 = V::fma(wzz, z, w3);
    const F v = V::sub(lv, z);
    const F t = P::exp(V::neg_abs(v));  // exp(-|v|)
    const F r = V::div(one, V::add(two, t));
    const F sv = V::mul(t, r), q = V::mul(sv, sv);
    F p = V::fma(q, V::set1(1.0f / 11), V::set1(1.0f / 9));
    p = V::fma(p, q, V::set1(1.0f / 7));
    p = V::fma(p, q, V::set1(1.0f / 5));
    p = V::fma(p, q, V::set1(1.0f / 3));
    p = V::fma(p, q, one);
    const F ratio = V::mul(V::mul(two, p), r);  // log1p(t) / t
    const F pos = V::mul(V::fma(ratio, t, v), t);
    g = V::add(g, V::select(V::lt(v, V::zero()), pos, ratio));
    if (++fold == kFold) {
      Fold<V>(acc[0], g), Fold<V>(acc[1], w0), Fold<V>(acc[2], w1), Fold<V>(acc[3], w2), Fold<V>(acc[4], w3);
      g = w0 = w1 = w2 = w3 = V::zero();
      fold = 0;
    }
  }
  Fold<V>(acc[0], g), Fold<V>(acc[1], w0), Fold<V>(acc[2], w1), Fold<V>(acc[3], w2), Fold<V>(acc[4], w3);
  return {Sum<V>(acc[0]), Sum<V>(acc[1]), Sum<V>(acc[2]), Sum<V>(acc[3]), Sum<V>(acc[4])};
}

template <class V>
void Write(const float* x, float* y, int64_t n, float m, float beta, float inv, bool stream) {
  using F = typename V::F;
  constexpr int L = V::kLanes;
  const F mv = V::set1(m), bv = V::set1(beta), iv = V::set1(inv);
  auto out = [&](int64_t at, int count) SD_VEC_LAMBDA {
    const F xv = count == L ? V::loadu(x + at) : V::loadu_fill(x + at, count, -INFINITY);
    return V::mul(Policy<V>::exp(V::mul(bv, V::sub(xv, mv))), iv);
  };
  int64_t j = 0;
  if constexpr (Policy<V>::kPeelAndStream) {
    if (stream) {
      const int64_t peel = std::min<int64_t>(n, ((64 - (reinterpret_cast<uintptr_t>(y) & 63)) & 63) / 4);
      if (peel > 0) V::storeu_tail(y, static_cast<int>(peel), out(0, static_cast<int>(peel)));
      for (j = peel; j + L <= n; j += L) V::stream(y + j, out(j, L));
      _mm_sfence();
    } else {
      for (; j + L <= n; j += L) V::storeu(y + j, out(j, L));
    }
    if (j < n) V::storeu_tail(y + j, static_cast<int>(n - j), out(j, static_cast<int>(n - j)));
  } else {
    for (; j + L <= n; j += L) {
      const F r = out(j, L);
      if (stream && (reinterpret_cast<uintptr_t>(y + j) & (L * 4 - 1)) == 0) V::stream(y + j, r);
      else V::storeu(y + j, r);
    }
    if (stream) _mm_sfence();
    WriteScalar(x + j, y + j, n - j, m, beta, inv);
  }
}

}  // namespace
}  // namespace ats
}  // namespace sd
