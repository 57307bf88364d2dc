// MultiMax's vector row, written once over the vector traits of ops/common/vec.h and instantiated per
// ISA translation unit (ops/multi_max_avx2.cc, ops/multi_max_avx512.cc); the design (z in double,
// block-wise online normalizer) is in ops/multi_max.cc's header. What differs by ISA is the lane count
// and one Policy per variant: how the float polynomial is scaled by 2^n (AVX-512: vscalefps, one
// rounding, subnormal results kept; AVX2: times 2^n built in the exponent field, 0 below 2^-126). Each
// variant gives the results its former hand-written twin gave, bit for bit (the same operations in
// the same operand order, block sums alternating between two accumulators per vector, reduced as
// V::reduce_add does; -ffp-contract=off from CMakeLists.txt).
//
// What must stay true: lanes past the row's end carry z = -inf (so they add nothing to the max and
// exactly 0 to the sum: sigma(0) is finite for finite parameters, and the mask lanes past the end
// load as -inf); a NaN or +inf z anywhere makes the row all NaN; an all -inf block stages +0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/simd_math.h"
#include "common/vec.h"
#include "multi_max_row.h"

namespace sd {
namespace multi_max {
namespace {  // internal linkage on purpose: see ops/common/vec.h

template <class V>
struct Policy;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
template <>
struct Policy<vec::Avx512> {
  using V = vec::Avx512;
  // p * 2^n in one rounding (n integer-valued, in [-289, 0]). Lanes with n <= -151 are set to +0 by the
  // write mask instead of computed: p < 2 there, so p * 2^n < 2^-150 rounds to +0 anyway (the same bits),
  // and an underflowing vscalefps takes a microcode assist per instruction (without FTZ): a padding mask
  // (z = -inf, n = -289 in its lanes) made [8, 12, 128, 128] rows 1.9x slower than unmasked ones (3.96 vs
  // 2.10 ms; perf: ~40% of the row's samples on the vscalefps).
  static SD_VEC_INLINE V::F scale(V::F p, V::F n) {
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(n, _mm512_set1_ps(-151.0f), _CMP_GT_OQ), p, n);
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
template <>
struct Policy<vec::Avx2> {
  using V = vec::Avx2;
  // p * 2^n with 2^n from the exponent field, flushed to 0 below -126 (as simd::ExpScale<Avx2> in ops/common/simd_math.h).
  static SD_VEC_INLINE V::F scale(V::F p, V::F n) {
    const __m256 ec = _mm256_max_ps(n, _mm256_set1_ps(-127.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_add_ps(ec, _mm256_set1_ps(127.0f))), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  }
};
#endif

template <class V>
struct Sigma {
  using D = typename V::D;
  D r0, r1, r2, r3, t0, t1, t2, t3, neg, pos;
  SD_VEC_INLINE explicit Sigma(const SigmaParams& p)
      : r0(V::set1d(p.r[0])), r1(V::set1d(p.r[1])), r2(V::set1d(p.r[2])), r3(V::set1d(p.r[3])),
        t0(V::set1d(p.t[0])), t1(V::set1d(p.t[1])), t2(V::set1d(p.t[2])), t3(V::set1d(p.t[3])),
        neg(V::set1d(p.neg)), pos(V::set1d(p.pos)) {}

  SD_VEC_INLINE D operator()(D x) const {
    const D zero = V::zerod();
    // max(NaN, 0) is 0, but x itself is the first addend, so sigma(NaN) stays NaN.
    const D a = V::maxd(V::subd(r0, x), zero), b = V::maxd(V::subd(x, r1), zero);
    const D c = V::maxd(V::subd(r2, x), zero), d = V::maxd(V::subd(x, r3), zero);
    D s = V::fmad(t0, a, x);
    s = V::fmad(t1, b, s);
    s = V::fmad(V::muld(t2, c), c, s);
    return V::fmad(V::muld(t3, d), d, s);
  }
  // sigma with its limits at +-inf (the formula gives NaN there); only for vectors holding an inf.
  SD_VEC_INLINE D WithLimits(D x) const {
    const D s = (*this)(x);
    const D s1 = V::selectd(V::eqd(x, V::set1d(-INFINITY)), s, neg);
    return V::selectd(V::eqd(x, V::set1d(INFINITY)), s1, pos);
  }
};

// The exp polynomial of ops/common/simd_math.h.
template <class V>
SD_VEC_INLINE typename V::F Poly(typename V::F t) {
  return simd::Poly5<V>(t);
}

// (t, n) of exp(d) = exp(t) * 2^n for d = z - M_b <= 0, reduced in double, then narrowed to float.
template <class V>
SD_VEC_INLINE void Reduce(typename V::D d, typename V::D* t, typename V::D* n) {
  d = V::maxd(d, V::set1d(kMinDiff));  // -inf -> kMinDiff (NaN rows never get here)
  const typename V::D nn = V::roundd(V::muld(d, V::set1d(kLog2eD)));
  *t = V::fnmad(nn, V::set1d(kLn2D), d);
  *n = nn;
}

// Folds a block (max mb, sum sb of exp(z - mb)) into the row's running (M, S).
inline void FoldBlock(double mb, double sb, double* m, double* s) {
  if (mb == -INFINITY) return;  // an all -inf block adds nothing
  if (mb > *m) {
    *s = *s * std::exp(*m - mb) + sb;  // exp(-inf) = 0 for the first block
    *m = mb;
  } else {
    *s += sb * std::exp(mb - *m);
  }
}

inline void FillNan(float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = NAN;
}

template <class V>
void Row(const RowArgs& a, const SigmaParams& p) {
  using F = typename V::F;
  using D = typename V::D;
  using MD = typename V::MD;
  using P = Policy<V>;
  constexpr int L = V::kLanes;
  constexpr int H = L / 2;  // lanes of a double vector
  static_assert(kBlock % L == 0, "a block is whole vectors: zb holds every lane of the last one");
  const Sigma<V> s(p);
  const int64_t n = a.n;
  alignas(64) double zb[kBlock];
  const D minus_inf = V::set1d(-INFINITY), inf = V::set1d(INFINITY);
  const F inf_f = V::set1(INFINITY), minus_inf_f = V::set1(-INFINITY);
  MD bad = V::noned();  // NaN or +inf z seen
  double row_m = -INFINITY, row_s = 0.0;
  for (int64_t j0 = 0, b = 0; j0 < n; j0 += kBlock, ++b) {
    const int64_t len = std::min(kBlock, n - j0);
    const float* x = a.x + j0;
    const float* mk = a.mask + j0 * a.mask_step;
    D vmax = minus_inf;
    for (int64_t j = 0; j < len; j += L) {
      F xv, mv;
      if (j + L <= len) {
        xv = V::loadu(x + j);
        mv = a.mask_step ? V::loadu(mk + j) : V::set1(a.mask[0]);
      } else {  // x lanes past the end 0, mask lanes -inf: z = sigma(0) - inf = -inf there
        const int count = static_cast<int>(len - j);
        xv = V::loadu_tail(x + j, count);
        mv = a.mask_step ? V::loadu_fill(mk + j, count, -INFINITY)
                         : V::select(V::tail_mask(count), minus_inf_f, V::set1(a.mask[0]));
      }
      const D xlo = V::cvt_lo(xv), xhi = V::cvt_hi(xv);
      D slo, shi;
      if (V::bits(V::eq(V::abs(xv), inf_f)) == 0) {  // no +-inf (the common case)
        slo = s(xlo);
        shi = s(xhi);
      } else {
        slo = s.WithLimits(xlo);
        shi = s.WithLimits(xhi);
      }
      const D zlo = V::addd(slo, V::cvt_lo(mv));
      const D zhi = V::addd(shi, V::cvt_hi(mv));
      bad = V::mask_ord(bad, V::mask_ord(V::mask_ord(V::unordd(zlo, zlo), V::eqd(zlo, inf)),
                                         V::mask_ord(V::unordd(zhi, zhi), V::eqd(zhi, inf))));
      vmax = V::maxd(vmax, V::maxd(zlo, zhi));
      V::stored(zb + j, zlo);
      V::stored(zb + j + H, zhi);
    }
    const double mb = V::reduce_maxd(vmax);
    a.block_max[b] = mb;
    float* y = a.y + j0;
    if (mb == -INFINITY || V::bitsd(bad) != 0) {  // an all -inf block stages 0 (a NaN row is refilled below)
      std::memset(y, 0, static_cast<size_t>(len) * sizeof(float));
      continue;
    }
    const D mbv = V::set1d(mb);
    F acc0 = V::zero(), acc1 = acc0;
    for (int64_t j = 0; j < len; j += L) {
      D tlo, thi, nlo, nhi;
      Reduce<V>(V::subd(V::loadd(zb + j), mbv), &tlo, &nlo);
      Reduce<V>(V::subd(V::loadd(zb + j + H), mbv), &thi, &nhi);
      // n in [-289, 0]; lanes past the end (-200) give 0.
      const F w = P::scale(Poly<V>(V::cvt_ps(tlo, thi)), V::cvt_ps(nlo, nhi));
      if (j + L <= len) V::storeu(y + j, w);
      else V::storeu_tail(y + j, static_cast<int>(len - j), w);
      if ((j & L) == 0) acc0 = V::add(acc0, w);
      else acc1 = V::add(acc1, w);
    }
    FoldBlock(mb, static_cast<double>(V::reduce_add(V::add(acc0, acc1))), &row_m, &row_s);
  }
  if (V::bitsd(bad) != 0 || row_m == -INFINITY) return FillNan(a.y, n);  // NaN / +inf z, or only -inf
  for (int64_t j0 = 0, b = 0; j0 < n; j0 += kBlock, ++b) {
    const int64_t len = std::min(kBlock, n - j0);
    // Block b times exp(M_b - M) / S (0 for an all -inf block, whose staged values are 0).
    const double mb = a.block_max[b];
    const F f = V::set1(mb == -INFINITY ? 0.0f : static_cast<float>(std::exp(mb - row_m) / row_s));
    float* y = a.y + j0;
    int64_t j = 0;
    for (; j + L <= len; j += L) V::storeu(y + j, V::mul(V::loadu(y + j), f));
    if (j < len) {
      const int left = static_cast<int>(len - j);
      V::storeu_tail(y + j, left, V::mul(V::loadu_tail(y + j, left), f));
    }
  }
}

}  // namespace
}  // namespace multi_max
}  // namespace sd
