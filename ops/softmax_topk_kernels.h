// The SoftmaxTopK fast row, written once over the vector traits of ops/common/vec.h and instantiated
// per ISA translation unit (ops/softmax_topk_avx2.cc). One read of the row, no per-element branch:
//
//  * normaliser: d = sum_j 2^(x_j*s - C) against ONE reference C per row (s = log2(e)/T), a multiple
//    of 1/L (L = V::kLanes) taken from the first 64 entries and raised when a candidate would make a
//    term above 2^kRaiseAt (the sums so far are rescaled by 2^(C_old - C_new) in double). Every entry
//    that could raise C is a candidate (it beats the running maximum, which is >= the threshold) and
//    candidates are handled before their group's exps are taken, so C is never stale for an exp.
//    Entries below C - kClampBelow are clamped there: each adds < 2^-120 to a sum >= 1 (it holds the
//    term of the entry that set C), -inf entries included; tail lanes past n add nothing.
//  * exp: 2^u = 2^n * 2^(j/L) * 2^r, u = x*s - C = n + j/L + r, |r| <= 1/(2L), from ONE fma:
//    t = x*s + (kMagic - C) lands in [2^(23-g), 2^(24-g)) (L = 2^g) where the float grid is 1/L, so
//    bits(t) = bits(kMagic) + round(L*u) = ... + L*n + j. 2^(j/L) comes from an L-entry table in one
//    register (V::lookup reads the low g bits), 2^n is added to its exponent field as the integer
//    bits(t) << (23 - g) -- the table entries carry -(j << (23 - g)) to cancel the j bits that shift
//    brings along, and bits(kMagic) << (23 - g) is 0 in 32 bits -- and 2^r is a degree-3 polynomial
//    (AVX2, L = 8: relative error 8.6e-8 on [-1/16, 1/16] evaluated in float). r = x*s - (t - K) is
//    exact up to the fma's one rounding because t - K is exact (both on the 1/L grid). K = kMagic - C
//    is exact for |C| < 2^18; rows with larger scaled logits take the generic path.
//  * selection: entries above the threshold (compare NLE_UQ: NaN passes) are appended, in index
//    order, to the candidate buffer; when it holds more than k + kSlack, it is cut back to k .. k + 16
//    entries, those at or above a bound t that at least k of them reach (CutCandidates), and the
//    threshold rises to t. No entry at or below t can be in the top k (k entries rank above it), so
//    the cut loses nothing; the caller ranks the final buffer exactly (value, then lower index). A
//    candidate that is NaN or +inf sends the row to the generic path.
//
// What must stay true: the result does not depend on how rows are split among threads (one row is
// one call); the top is exact (the cut ranks every candidate by the contract's order); the caller's
// final emit sees sum relative to the row maximum M = buf[0].value, computed in double from C.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/vec.h"
#include "softmax_topk_row.h"

// For the hot loop's lambdas: one left out of line makes every variable it captures by reference
// live in memory across the loop.
#define SD_LAMBDA_INLINE __attribute__((always_inline))

namespace sd {
namespace softmax_topk {
namespace {  // internal linkage on purpose: see ops/common/vec.h

constexpr float kRaiseAt = 64.0f;      // C is raised when a candidate's x*s - C exceeds this
constexpr float kClampBelow = 120.0f;  // entries are clamped to x*s - C >= -kClampBelow (~)
constexpr int64_t kFlush = 512;        // entries per float partial sum before it is added in double

// 2^r ~ 1 + r*(q1 + r*(q2 + r*q3)) per grid: minimax (relative error, Lawson iterations) on
// [-1/(2L), 1/(2L)], coefficients rounded to float.
template <int L>
struct Exp2Poly;
template <>
struct Exp2Poly<8> {
  static constexpr float q1 = 0.6931472420692444f, q2 = 0.2402576357126236f, q3 = 0.0554962232708931f;
};

template <int L>
struct Exp2Table {
  alignas(64) float v[L];
  Exp2Table() {
    constexpr int kShift = 23 - __builtin_ctz(L);
    for (int j = 0; j < L; ++j) {
      const float e = static_cast<float>(std::exp2(static_cast<double>(j) / L));
      int32_t b;
      std::memcpy(&b, &e, sizeof b);
      b -= j << kShift;
      std::memcpy(&v[j], &b, sizeof b);
    }
  }
};

// Keys: an int32 whose order is the float order of the (non-NaN) value, b ^ ((b >> 31) & 0x7FFFFFFF) for
// b = bits(v + 0) (-0 is made +0 first, so equal values get equal keys; CutCandidates computes them a
// vector at a time). The map is its own inverse.
inline float FromOrderKey(int32_t key) {
  const int32_t b = key ^ ((key >> 31) & 0x7FFFFFFF);
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// Cuts the buffer (m > k entries in index order, no NaN or +inf) back to its k best by the contract's
// order, still in index order; returns the k-th best key, the new threshold's. Every key is >= lo (the
// caller passes the previous threshold's key). The k-th key is found by bisection with vector counts
// (<= 32 rounds of m/L compares), stopping early when a bound leaves exactly k; the k are then kept by
// compress, or, when entries tie at the k-th key, the first of the equal ones in index order.
// (Measured at k = 50, V = 32000, 1 thread: std::nth_element by (value, index) took 2.3x the row time;
// scalar keys and a scalar compaction loop 0.44 ns per entry, vector ones 0.31. A cut that stops at a
// bound keeping k .. k + 16 was tried: half the bisection rounds, twice the candidates at k = 1.)
template <class V>
int32_t CutCandidates(const Candidates& b, int64_t m, int64_t k, int64_t lo, int64_t* kept) {
  constexpr int L = V::kLanes;
  const int64_t vecs = (m + L - 1) / L;
  // Keys (OrderKey, a vector at a time) and their maximum; the lanes past m get INT32_MIN, below every
  // real key: never counted, never kept.
  typename V::I kmax = V::set1i(INT32_MIN);
  for (int64_t v = 0; v < vecs; ++v) {
    const int left = m - L * v >= L ? L : static_cast<int>(m - L * v);
    const typename V::I bits = V::as_int(V::add(V::loadu_fill(b.values + L * v, left, -INFINITY), V::zero()));
    typename V::I key = V::xori(bits, V::andi(V::template srai<31>(bits), V::set1i(0x7FFFFFFF)));
    key = V::selecti(V::tail_mask(left), V::set1i(INT32_MIN), key);
    kmax = V::maxi(kmax, key);
    V::storeui(b.keys + L * v, key);
  }
  alignas(64) int32_t lanes[L];
  V::storeui(lanes, kmax);
  int64_t hi = static_cast<int64_t>(*std::max_element(lanes, lanes + L)) + 1;
  auto count_above = [&](int32_t x) SD_LAMBDA_INLINE {  // keys > x
    const typename V::I vx = V::set1i(x);
    typename V::I c0 = V::zeroi(), c1 = V::zeroi();
    int64_t v = 0;
    for (; v + 2 <= vecs; v += 2) {
      c0 = V::count_gt(c0, V::loadui(b.keys + L * v), vx);
      c1 = V::count_gt(c1, V::loadui(b.keys + L * v + L), vx);
    }
    if (v < vecs) c0 = V::count_gt(c0, V::loadui(b.keys + L * v), vx);
    return V::reduce_addi(V::addi(c0, c1));
  };
  // Invariant: count(key >= lo) >= k > count(key >= hi); count(key >= x) = count_above(x - 1).
  bool exact = false;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    const int64_t c = count_above(static_cast<int32_t>(mid - 1));
    if (c == k) {
      lo = mid;
      exact = true;
      break;
    }
    const bool above = c > k;  // branch-free updates: the direction is a coin flip
    lo = above ? mid : lo;
    hi = above ? hi : mid;
  }
  // lo is the k-th key, or (exact) a bound that exactly k keys reach.
  const int32_t t = static_cast<int32_t>(lo);
  if (exact || count_above(t - 1) == k) {  // keep every key >= t: compress
    const typename V::I vt = V::set1i(t - 1);
    int64_t w = 0;
    int32_t kept_min = INT32_MAX;
    for (int64_t v = 0; v < vecs; ++v) {  // w <= L * v: only entries already read are overwritten
      const typename V::I key = V::loadui(b.keys + L * v);
      const typename V::M keep = V::gti(key, vt);
      V::compress_storeui(b.indices + w, V::loadui(b.indices + L * v), keep);
      V::compress_storeui(b.keys + w, key, keep);
      w += V::compress_storeu(b.values + w, V::loadu(b.values + L * v), keep);
    }
    for (int64_t i = 0; i < w; ++i) kept_min = std::min(kept_min, b.keys[i]);
    *kept = w;
    return kept_min;  // t itself unless an exact stop fell between two keys
  }
  int64_t need = k - count_above(t);  // ties at t (rare): the first `need` of them, in index order
  int64_t w = 0;
  for (int64_t i = 0; i < m; ++i) {
    const int32_t key = b.keys[i];
    const bool eq = key == t;
    const bool keep = key > t || (eq && need > 0);
    need -= eq;
    b.values[w] = b.values[i];  // w <= i: only entries already read are overwritten
    b.indices[w] = b.indices[i];
    b.keys[w] = key;
    w += keep;
  }
  *kept = w;
  return t;
}

template <class V>
bool FastRow(const float* x, int64_t n, int64_t k, float s, const Candidates& buf, double* sum_out,
             int64_t* count_out) {
  using F = typename V::F;
  using I = typename V::I;
  constexpr int L = V::kLanes;
  constexpr int kShift = 23 - __builtin_ctz(L);
  constexpr float kMagic = 1.5f * static_cast<float>(1 << kShift);  // the float grid is 1/L there
  static_assert((1 << __builtin_ctz(L)) == L, "the table needs a power-of-two lane count");
  static const Exp2Table<L> table;
  using P = Exp2Poly<L>;
  if (n >= (int64_t{1} << 31)) return false;  // int32 indices in the buffer

  // C from the first 64 entries, or (a masked row) from the first vector holding a finite entry: C only
  // has to be finite, it is raised as larger entries come.
  float m0 = -INFINITY;
  for (int64_t j = 0; j < n && j < 64; ++j) m0 = std::max(m0, x[j]);  // a NaN is skipped: a candidate
  for (int64_t j = 64; m0 == -INFINITY && j < n; j += L) {
    const int left = n - j >= L ? L : static_cast<int>(n - j);
    alignas(64) float lanes[L];
    V::storeu(lanes, V::loadu_fill(x + j, left, -INFINITY));
    for (int l = 0; l < L; ++l)
      if (lanes[l] > -INFINITY && lanes[l] < INFINITY) m0 = std::max(m0, lanes[l]);
  }
  if (!std::isfinite(m0)) return false;  // all -inf, or +inf only: the generic path's cases

  float c = std::nearbyint(m0 * s * L) / L;  // the reference C
  if (!(std::fabs(c) < 0x1p18f)) return false;
  if (!std::isfinite((c - kClampBelow) / s)) return false;  // huge temperatures
  const F tab = V::load(table.v);
  const F vs = V::set1(s), q1 = V::set1(P::q1), q2 = V::set1(P::q2), q3 = V::set1(P::q3), one = V::set1(1.0f);
  F vk, xlo;
  auto set_reference = [&](float new_c) SD_LAMBDA_INLINE {
    c = new_c;
    vk = V::set1(kMagic - c);  // exact: C is a multiple of 1/L, |C| < 2^18
    xlo = V::set1((c - kClampBelow) / s);
  };
  set_reference(c);
  // acc + 2^(x*s - C); x must not be NaN (max(NaN, xlo) = xlo).
  auto term = [&](F xv, F acc) SD_LAMBDA_INLINE {
    const F xc = V::max(xv, xlo);
    const F tt = V::fma(xc, vs, vk);
    const F r = V::fms(xc, vs, V::sub(tt, vk));
    const I tbits = V::as_int(tt);
    const F scaled = V::as_float(V::addi(V::as_int(V::lookup(tab, tbits)), V::template slli<kShift>(tbits)));
    const F p = V::fma(V::fma(V::fma(q3, r, q2), r, q1), r, one);
    return V::fma(scaled, p, acc);
  };
  F acc[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
  double lane_sum[L] = {};  // sum of 2^(x*s - C) per lane, in double
  auto flush = [&]() SD_LAMBDA_INLINE {
    alignas(64) float part[L];
    V::storeu(part, V::add(V::add(acc[0], acc[1]), V::add(acc[2], acc[3])));
    for (int l = 0; l < L; ++l) lane_sum[l] += part[l];
    for (int a = 0; a < 4; ++a) acc[a] = V::zero();
  };
  auto raise_reference = [&](float top) SD_LAMBDA_INLINE {
    const float new_c = std::nearbyint(top * s * L) / L;
    if (!(std::fabs(new_c) < 0x1p18f)) return false;
    flush();
    const double scale = std::exp2(static_cast<double>(c) - new_c);
    for (int l = 0; l < L; ++l) lane_sum[l] *= scale;
    set_reference(new_c);
    return true;
  };
  int64_t count = 0;
  const int64_t cut_at = k + kSlack;
  // Every key in the buffer is >= key_thr, the threshold's (INT32_MIN + 1 before the first cut: below the
  // key of every finite value).
  int32_t key_thr = INT32_MIN + 1;
  F thr = V::set1(-INFINITY);
  const I lanes = V::lane_index();
  // A group's candidates (masks cm[0..vecs) of the vectors xv at i, i + L, ...), before any of its exps is
  // taken, branch-free but for rare events: a NaN or +inf among them ends the fast path; C is raised if one
  // of them would make a term above 2^kRaiseAt; they are appended in index order (compress); the buffer is
  // cut when full. (Scalar appends, one branch per candidate: ~120 cycles per group with candidates;
  // k = 1, V = 32000: 0.22 ns per entry.)
  auto candidates = [&](int64_t i, const F (&xv)[4], const typename V::M (&cm)[4], int vecs) SD_LAMBDA_INLINE {
    typename V::M special = V::none(), raising = V::none();
    for (int q = 0; q < vecs; ++q) {
      special = V::mask_or(special, V::mask_and(cm[q], V::nlt(xv[q], V::set1(INFINITY))));
      raising = V::mask_or(raising, V::mask_and(cm[q], V::gt(V::fms(xv[q], vs, V::set1(c)), V::set1(kRaiseAt))));
    }
    if (V::bits(special) != 0) return false;
    if (V::bits(raising) != 0) [[unlikely]] {
      float top = -INFINITY;
      for (int q = 0; q < vecs; ++q) {
        alignas(64) float lv[L];
        V::storeu(lv, V::select(cm[q], V::set1(-INFINITY), xv[q]));
        for (int l = 0; l < L; ++l) top = std::max(top, lv[l]);
      }
      if (!raise_reference(top)) return false;
    }
    for (int q = 0; q < vecs; ++q) {
      V::compress_storeui(buf.indices + count, V::addi(lanes, V::set1i(static_cast<int32_t>(i + q * L))), cm[q]);
      count += V::compress_storeu(buf.values + count, xv[q], cm[q]);
    }
    if (count > cut_at) {
      key_thr = CutCandidates<V>(buf, count, k, key_thr, &count);
      thr = V::set1(FromOrderKey(key_thr));
    }
    return true;
  };
  static_assert(4 * L <= kGroup, "one group of appends must fit the buffer's slack");
  int64_t i = 0;
  while (i + 4 * L <= n) {
    const int64_t end = std::min(n / (4 * L) * (4 * L), i + kFlush);
    for (; i < end; i += 4 * L) {
      const F v0 = V::loadu(x + i), v1 = V::loadu(x + i + L), v2 = V::loadu(x + i + 2 * L), v3 = V::loadu(x + i + 3 * L);
      const typename V::M c0 = V::nle(v0, thr), c1 = V::nle(v1, thr), c2 = V::nle(v2, thr), c3 = V::nle(v3, thr);
      if (V::bits(V::mask_or(V::mask_or(c0, c1), V::mask_or(c2, c3))) != 0) [[unlikely]] {
        const F xv[4] = {v0, v1, v2, v3};
        const typename V::M cm[4] = {c0, c1, c2, c3};
        if (!candidates(i, xv, cm, 4)) return false;
      }
      acc[0] = term(v0, acc[0]);
      acc[1] = term(v1, acc[1]);
      acc[2] = term(v2, acc[2]);
      acc[3] = term(v3, acc[3]);
    }
    flush();
  }
  for (; i < n; i += L) {  // the last < 4L entries, one vector at a time; lanes past n are -inf
    const int left = n - i >= L ? L : static_cast<int>(n - i);
    const F v = V::loadu_fill(x + i, left, -INFINITY);
    const F xv[4] = {v, v, v, v};
    const typename V::M cm[4] = {V::nle(v, thr), V::none(), V::none(), V::none()};
    if (V::bits(cm[0]) != 0 && !candidates(i, xv, cm, 1)) return false;
    acc[0] = V::select(V::tail_mask(left), acc[0], term(v, acc[0]));
  }
  flush();
  // Fewer than k entries above -inf (a masked row: constrained decoding): every other entry is -inf,
  // and the rest of the top are the first of them by index (ties keep the lower index). They add
  // (almost) nothing to d: see the clamp above.
  for (int64_t j = 0; count < k && j < n; ++j) {
    if (x[j] == -INFINITY) {
      buf.values[count] = x[j];
      buf.indices[count] = static_cast<int32_t>(j);
      ++count;
    }
  }
  float top = -INFINITY;
  for (int64_t j = 0; j < count; ++j) top = std::max(top, buf.values[j]);
  // d = sum_j 2^(x_j*s - C); relative to M: D = d * 2^(C - M*s), M*s exact in double.
  double d = 0.0;
  for (int l = 0; l < L; ++l) d += lane_sum[l];
  const double sum = d * std::exp2(static_cast<double>(c) - static_cast<double>(top) * s);
  if (!(sum > 0.0) || !std::isfinite(sum)) return false;
  *sum_out = sum;
  *count_out = count;
  return true;
}

}  // namespace
}  // namespace softmax_topk
}  // namespace sd
