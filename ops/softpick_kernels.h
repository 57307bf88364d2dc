// Softpick's vector row, written once over the vector traits of ops/common/vec.h and instantiated per
// ISA translation unit (ops/softpick_avx2.cc, ops/softpick_avx512.cc): passes 1 and 2 of the design in
// ops/softpick.cc's header. What differs between the variants is only in the traits -- the lane
// count, and V::pow2i (AVX-512: vscalefps, subnormal down to 2^-149; AVX2: clamped to [-127, 127],
// 0 below) -- so each variant's results are the ones its former hand-written twin gave, bit for bit
// (block sums in lane order, the same FMAs, -ffp-contract=off from CMakeLists.txt).
//
// What must stay true: only finite lanes add to the sum and the max; staged NaN / +inf / exact 0 pass
// through pass 2 unchanged; the double block totals are summed as V::reduce_addd does.
#pragma once

#include <algorithm>
#include <cmath>

#include "common/vec.h"
#include "softpick_row.h"

namespace sd {
namespace softpick {
namespace {  // internal linkage on purpose: see ops/common/vec.h

// expm1(x) = 2^n (1 + q) - 1 per lane: returns q = expm1(t) on the reduced t, *n_out = n. kClamp: x
// clamped at kMinX first (below it the term is -2^-r either way; a Mask can push a finite score to -3e38,
// where x log2 e overflows and the reduction would give NaN); without, |x| must stay where x log2 e is
// finite. The one copy of the polynomial: Softpick's rows and SoftpickAttention's terms.
template <class V, bool kClamp = true>
SD_VEC_INLINE typename V::F Expm1Reduced(typename V::F x, typename V::F* n_out) {
  using F = typename V::F;
  const F xc = kClamp ? V::max(x, V::set1(kMinX)) : x;
  const F n = V::round(V::mul(xc, V::set1(kLog2e)));
  F t = V::fma(n, V::set1(kMinusLn2Hi), xc);
  t = V::fma(n, V::set1(kMinusLn2Lo), t);
  F p = V::set1(kQ4);
  p = V::fma(p, t, V::set1(kQ3));
  p = V::fma(p, t, V::set1(kQ2));
  p = V::fma(p, t, V::set1(kQ1));
  p = V::fma(p, t, V::set1(kQ0));
  *n_out = n;
  return V::fma(V::mul(t, t), p, t);
}

// expm1(x) * 2^-r per lane for finite x (minus_r = -r, c = 2^-r): 2^-r * (2^n * (1 + q) - 1).
template <class V>
SD_VEC_INLINE typename V::F Term(typename V::F x, typename V::F minus_r, typename V::F c) {
  using F = typename V::F;
  F n;
  const F q = Expm1Reduced<V>(x, &n);
  const F s = V::pow2i(V::add(n, minus_r));
  return V::fma(s, q, V::sub(s, c));
}

// One vector of pass 1 on its first `count` lanes (1 <= count <= kLanes): stages numerators at y, adds
// |term| of finite lanes to acc, folds finite lanes into the running max.
template <class V>
SD_VEC_INLINE void Stage(const float* x, float* y, int count, typename V::F minus_r, typename V::F c,
                         typename V::F& acc, typename V::F& vmax) {
  using F = typename V::F;
  using M = typename V::M;
  const bool full = count == V::kLanes;
  const F v = full ? V::loadu(x) : V::loadu_tail(x, count);  // lanes past the tail: 0 (finite), masked off
  const F inf = V::set1(INFINITY);
  const M finite = V::mask_and(V::lt(V::abs(v), inf), V::tail_mask(count));
  const M keep = V::mask_or(V::isnan(v), V::eq(v, inf));  // NaN and +inf are staged as themselves
  const M pos = V::mask_and(V::gt(v, V::zero()), finite);
  const F term = Term<V>(v, minus_r, c);
  acc = V::add(acc, V::select(finite, V::zero(), V::abs(term)));  // + 0 elsewhere: acc >= +0 stays
  vmax = V::max(vmax, V::select(finite, V::set1(-INFINITY), v));
  const F out = V::select(keep, V::select(pos, V::zero(), term), v);
  if (full) V::storeu(y, out);
  else V::storeu_tail(y, count, out);
}

template <class V>
void Row(const float* x, float* y, int64_t n, float eps) {
  using F = typename V::F;
  using D = typename V::D;
  constexpr int L = V::kLanes;
  float r = 0.0f;
  float limit = kMaxTermExponent * kLn2;
  D total_lo = V::zerod(), total_hi = V::zerod();
  F vmax = V::set1(-INFINITY);
  float m = -INFINITY;
  for (int64_t b = 0; b < n;) {
    const int64_t block_end = std::min(n, b + kBlock);
    const F minus_r = V::set1(-r), c = V::set1(Pow2(-r));
    F a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0;
    F bmax = vmax;
    int64_t j = b;
    for (; j + 4 * L <= block_end; j += 4 * L) {
      Stage<V>(x + j, y + j, L, minus_r, c, a0, bmax);
      Stage<V>(x + j + L, y + j + L, L, minus_r, c, a1, bmax);
      Stage<V>(x + j + 2 * L, y + j + 2 * L, L, minus_r, c, a2, bmax);
      Stage<V>(x + j + 3 * L, y + j + 3 * L, L, minus_r, c, a3, bmax);
    }
    for (; j < block_end; j += L) {
      const int count = block_end - j >= L ? L : static_cast<int>(block_end - j);
      Stage<V>(x + j, y + j, count, minus_r, c, a0, bmax);
    }
    const float block_max = V::reduce_max(bmax);
    if (block_max > limit) {  // terms may have reached 2^(kMaxTermExponent + 1): raise R, redo
      if (block_max > kFastMaxLogit) return RowExact(x, y, n, eps);
      const float r_new = std::nearbyint(block_max * kLog2e);
      const D f = V::set1d(std::ldexp(1.0, static_cast<int>(std::max(r - r_new, -1100.0f))));
      total_lo = V::muld(total_lo, f);
      total_hi = V::muld(total_hi, f);
      RescaleStaged(y, b, r - r_new);
      r = r_new;
      limit = (r + kMaxTermExponent) * kLn2;
      continue;  // same b
    }
    vmax = bmax;
    m = block_max;
    const F sum = V::add(V::add(a0, a1), V::add(a2, a3));
    total_lo = V::addd(total_lo, V::cvt_lo(sum));
    total_hi = V::addd(total_hi, V::cvt_hi(sum));
    b = block_end;
  }
  const Finish f = PlanFinish(m, V::reduce_addd(V::addd(total_lo, total_hi)), r, eps);
  if (f.kind != Finish::kScale) return FinishScalar(f, y, n);
  const F inv = V::set1(f.inv);
  int64_t j = 0;
  for (; j + L <= n; j += L) V::storeu(y + j, V::mul(V::loadu(y + j), inv));
  if (j < n) {
    const int left = static_cast<int>(n - j);
    V::storeu_tail(y + j, left, V::mul(V::loadu_tail(y + j, left), inv));
  }
}

}  // namespace
}  // namespace softpick
}  // namespace sd
