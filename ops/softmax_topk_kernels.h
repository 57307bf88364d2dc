// The SoftmaxTopK fast row, written once over the vector traits of ops/common/vec.h and instantiated
// per ISA translation unit (ops/softmax_topk_avx2.cc, ops/softmax_topk_avx512.cc). One read of the row,
// no per-element branch. The per-ISA choices (table grid, polynomial, range, cut slack, lane-sum order)
// are the Design<V> below; everything else is one code path.
//
//  * normaliser: d = sum_j 2^(x_j*s - C) against ONE reference C per row (s = log2(e)/T), a multiple
//    of 1/L (L = Design<V>::kGrid) taken from the first 64 entries and raised when a candidate would make a
//    term above 2^kRaiseAt (the sums so far are rescaled by 2^(C_old - C_new) in double). Every entry
//    that could raise C is a candidate (it beats the running maximum, which is >= the threshold) and
//    candidates are handled before their group's exps are taken, so C is never stale for an exp.
//    Entries below C - kClampBelow are clamped there: each adds < 2^-120 to a sum >= 1 (it holds the
//    term of the entry that set C), -inf entries included; tail lanes past n add nothing.
//  * exp: 2^u = 2^n * 2^(j/L) * 2^r, u = x*s - C = n + j/L + r, |r| <= 1/(2L), from ONE fma:
//    t = x*s + (kMagic - C) lands in [2^(23-g), 2^(24-g)) (L = 2^g) where the float grid is 1/L, so
//    bits(t) = bits(kMagic) + round(L*u) = ... + L*n + j. 2^(j/L) comes from an L-entry table in one
//    register (L = lanes, V::lookup reads the low g bits) or in two (L = 2 lanes, V::lookup2), 2^n is
//    added to its exponent field as the integer bits(t) << (23 - g) -- the table entries carry
//    -(j << (23 - g)) to cancel the j bits that shift brings along, and bits(kMagic) << (23 - g) is 0
//    in 32 bits -- and 2^r is a polynomial: AVX2, L = 8: degree 3, relative error 8.6e-8 on
//    [-1/16, 1/16] evaluated in float; AVX-512, L = 32: degree 2, 5.3e-8 on [-1/64, 1/64] (11 vector
//    ops per 16 entries, the threshold compare included). r = x*s - (t - K) is exact up to the fma's
//    one rounding because t - K is exact (both on the 1/L grid). K = kMagic - C is exact for
//    |C| < Design::kLimit; rows with larger scaled logits take the wide variant where the design has
//    one (u = x*s - C first, then the same steps: one op more, for |C| < kWideLimit), else the
//    generic path.
//  * selection: entries above the threshold (compare NLE_UQ: NaN passes) are appended, in index
//    order, to the candidate buffer; when it holds more than k + CutSlack(k), it is cut back to
//    exactly the k best by the contract's order (CutCandidates), and the threshold rises to the k-th
//    value. No entry at or below it can enter the top k (k entries rank above it), so the cut loses
//    nothing; the caller ranks the final buffer exactly (value, then lower index). A
//    candidate that is NaN or +inf sends the row to the generic path.
//
//  * entropy (kEntropy, SoftTokenEmbedding's row, ops/soft_token_embedding.cc): a second sum
//    d1 = sum_j 2^u_j * u_j, u_j = x_j*s - C, taken from the same terms (t = scaled * p, then acc += t,
//    acc1 += t * u: the normaliser's fma becomes a mul and an add there). Raising C by delta rescales it
//    as d1' = 2^-delta (d1 - delta d). With p_j = 2^u_j / d, the entropy in nats is
//    H = ln d - ln 2 * d1 / d, whatever the reference C. With kEntropy false the row is SoftmaxTopK's,
//    operation for operation.
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
// [-1/(2L), 1/(2L)], coefficients rounded to float; kDegree 2 leaves q3 out (not a zero term: one fma
// fewer).
template <int L>
struct Exp2Poly;
template <>
struct Exp2Poly<8> {
  static constexpr int kDegree = 3;
  static constexpr float q1 = 0.6931472420692444f, q2 = 0.2402576357126236f, q3 = 0.0554962232708931f;
};
template <>
struct Exp2Poly<32> {
  static constexpr int kDegree = 2;
  static constexpr float q1 = 0.6931573152542114f, q2 = 0.24022649228572845f, q3 = 0.0f;
};

// The per-ISA choices of the row; the primary template is the one-register table (AVX2).
//   kGrid        L: table entries 2^(j/L), j < L -- V::kLanes (V::lookup) or 2 V::kLanes (V::lookup2)
//   kLimit       |C| below which K = kMagic - C is exact on the grid (the non-wide term)
//   kWideLimit   |C| below which the wide variant works; 0: no wide variant (the generic path instead)
//   kTreeSum     the per-lane double sums are added as a halving tree (lane l + lane l + L/2, ...),
//                else in lane order
//   kMaskCount   the cut's bisection counts by popcounts of compare masks, else in vector lanes with
//                one reduction per count
//   kFinalCut    the row ends with a cut to exactly k (the caller then sorts k entries), else it hands
//                up to k + CutSlack(k) to the caller's partial sort
// The buffer is cut when it holds more than k + CutSlack(k) (ops/softmax_topk_row.h), for every design.
template <class V>
struct Design {
  static constexpr int kGrid = V::kLanes;
  static constexpr float kLimit = 0x1p18f, kWideLimit = 0.0f;
  static constexpr bool kTreeSum = false;
  static constexpr bool kMaskCount = false, kFinalCut = false;
};
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
// AVX-512: a 32-entry table in two registers (vpermt2ps) so that a degree-2 polynomial suffices. The
// values and the order of every operation that reaches an output are those of the hand-written
// AVX-512 row this replaced (bit-exact outputs): its grid and polynomial, its range (2^16, wide to
// 2^20) and its final _mm512_reduce_add_pd order. Its cut counted by popcounts and ended with an exact
// cut; measured with bench/micro/softmax_topk_rows.cc (64 rows, k = 50, ns per entry, against that row
// in the same session): V = 1000 2.22-2.24 vs 2.09-2.13 (2.38-2.43 with vector counts, 3.95-4.10
// with the partial sort), V = 32000 0.31 vs 0.30-0.32. (That row cut at k + 32; here k + 48, the
// AVX2 slack: 2.24 vs 2.34-2.41 at V = 1000. Where the buffer is cut changes no output: a cut keeps
// exactly the k best so far, and only an entry above every one seen so far can raise C.)
template <>
struct Design<vec::Avx512> {
  static constexpr int kGrid = 32;
  static constexpr float kLimit = 0x1p16f, kWideLimit = 0x1p20f;
  static constexpr bool kTreeSum = true;
  static constexpr bool kMaskCount = true, kFinalCut = true;
};
#endif

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
    if constexpr (Design<V>::kMaskCount) {  // popcounts of the compare masks
      int64_t c = 0;
      for (int64_t v = 0; v < vecs; ++v) c += __builtin_popcount(V::bits(V::gti(V::loadui(b.keys + L * v), vx)));
      return c;
    } else {  // counts in vector lanes, one reduction
      typename V::I c0 = V::zeroi(), c1 = V::zeroi();
      int64_t v = 0;
      for (; v + 2 <= vecs; v += 2) {
        c0 = V::count_gt(c0, V::loadui(b.keys + L * v), vx);
        c1 = V::count_gt(c1, V::loadui(b.keys + L * v + L), vx);
      }
      if (v < vecs) c0 = V::count_gt(c0, V::loadui(b.keys + L * v), vx);
      return V::reduce_addi(V::addi(c0, c1));
    }
  };
  // Invariant: count(key >= lo) >= k > count(key >= hi); count(key >= x) = count_above(x - 1).
  // k = 1: the maximum key is the k-th, no bisection.
  if (k == 1) lo = hi - 1;
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
    // the smallest kept key, in vector lanes (keys are not compacted: the next cut recomputes them)
    typename V::I kept_min = V::set1i(INT32_MAX);
    for (int64_t v = 0; v < vecs; ++v) {  // w <= L * v: only entries already read are overwritten
      const typename V::I key = V::loadui(b.keys + L * v);
      const typename V::M keep = V::gti(key, vt);
      kept_min = V::mini(kept_min, V::selecti(keep, V::set1i(INT32_MAX), key));
      V::compress_storeui(b.indices + w, V::loadui(b.indices + L * v), keep);
      w += V::compress_storeu(b.values + w, V::loadu(b.values + L * v), keep);
    }
    V::storeui(lanes, kept_min);
    *kept = w;
    return *std::min_element(lanes, lanes + L);  // t itself unless an exact stop fell between two keys
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

enum class RowResult { kDone, kGeneric, kWide };

// One row; kWide: the term for |C| up to Design::kWideLimit. kWide is returned when the row needs it
// (only where the design has it), kGeneric when the generic path must take the row. kEntropy: also
// *sum_u_out = sum_j 2^((x_j - M) s) (x_j - M) s, relative to the row maximum M like *sum_out.
template <class V, bool kWide, bool kEntropy = false>
RowResult FastRowT(const float* x, int64_t n, int64_t k, float s, const Candidates& buf, double* sum_out,
                   int64_t* count_out, double* sum_u_out = nullptr) {
  using F = typename V::F;
  using I = typename V::I;
  using DS = Design<V>;
  constexpr int L = V::kLanes;
  constexpr int G = DS::kGrid;  // the exp's grid 1/G
  constexpr int kShift = 23 - __builtin_ctz(G);
  constexpr float kMagic = 1.5f * static_cast<float>(1 << kShift);  // the float grid is 1/G there
  static_assert(G == L || G == 2 * L, "the table fills one or two registers");
  static const vec::Exp2Table<G> table;
  using P = Exp2Poly<G>;
  constexpr float kRange = kWide ? DS::kWideLimit : DS::kLimit;
  // out of the non-wide range: the wide variant where there is one
  constexpr RowResult kOutOfRange = !kWide && DS::kWideLimit > 0.0f ? RowResult::kWide : RowResult::kGeneric;
  if (n >= (int64_t{1} << 31)) return RowResult::kGeneric;  // int32 indices in the buffer

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
  if (!std::isfinite(m0)) return RowResult::kGeneric;  // all -inf, or +inf only: the generic path's cases

  float c = std::nearbyint(m0 * s * G) / G;  // the reference C
  if (!(std::fabs(c) < kRange)) return kOutOfRange;
  if (!std::isfinite((c - kClampBelow) / s)) return RowResult::kGeneric;  // huge temperatures
  const F tab = V::load(table.v), tab_hi = G == L ? tab : V::load(table.v + (G - L));
  const F vs = V::set1(s), q1 = V::set1(P::q1), q2 = V::set1(P::q2), q3 = V::set1(P::q3), one = V::set1(1.0f);
  const F magic = V::set1(kMagic);
  F vk, vc, xlo;
  auto set_reference = [&](float new_c) SD_LAMBDA_INLINE {
    c = new_c;
    vc = V::set1(c);
    vk = V::set1(kMagic - c);  // exact: C is a multiple of 1/G, |C| < kLimit (unused when kWide)
    xlo = V::set1((c - kClampBelow) / s);
  };
  set_reference(c);
  F acc1[4] = {V::zero(), V::zero(), V::zero(), V::zero()};  // kEntropy: sum of 2^u * u
  // acc + 2^(x*s - C); x must not be NaN (max(NaN, xlo) = xlo). kEntropy: also acc1_out += 2^u * u.
  auto term = [&](F xv, F acc, F& acc1_out) SD_LAMBDA_INLINE {
    const F xc = V::max(xv, xlo);
    F tt, r, u;  // u = x*s - C (kEntropy)
    if constexpr (kWide) {
      u = V::fms(xc, vs, vc);
      tt = V::add(u, magic);
      r = V::sub(u, V::sub(tt, magic));
    } else {
      tt = V::fma(xc, vs, vk);
      r = V::fms(xc, vs, V::sub(tt, vk));
      if constexpr (kEntropy) u = V::fms(xc, vs, vc);
    }
    const I tbits = V::as_int(tt);
    F tj;
    if constexpr (G == L) {
      tj = V::lookup(tab, tbits);
    } else {
      tj = V::lookup2(tab, tab_hi, tbits);
    }
    const F scaled = V::as_float(V::addi(V::as_int(tj), V::template slli<kShift>(tbits)));
    F p;
    if constexpr (P::kDegree == 3) {
      p = V::fma(V::fma(V::fma(q3, r, q2), r, q1), r, one);
    } else {
      p = V::fma(V::fma(q2, r, q1), r, one);
    }
    if constexpr (kEntropy) {
      const F t = V::mul(scaled, p);
      acc1_out = V::fma(t, u, acc1_out);
      return V::add(acc, t);
    } else {
      return V::fma(scaled, p, acc);
    }
  };
  F acc[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
  // sum of 2^(x*s - C) per lane, in double: lanes [0, L/2) in sum_lo, [L/2, L) in sum_hi
  typename V::D sum_lo = V::zerod(), sum_hi = V::zerod();
  typename V::D sum1_lo = V::zerod(), sum1_hi = V::zerod();  // kEntropy
  auto flush = [&]() SD_LAMBDA_INLINE {
    const F part = V::add(V::add(acc[0], acc[1]), V::add(acc[2], acc[3]));
    sum_lo = V::addd(sum_lo, V::cvt_lo(part));
    sum_hi = V::addd(sum_hi, V::cvt_hi(part));
    for (int a = 0; a < 4; ++a) acc[a] = V::zero();
    if constexpr (kEntropy) {
      const F part1 = V::add(V::add(acc1[0], acc1[1]), V::add(acc1[2], acc1[3]));
      sum1_lo = V::addd(sum1_lo, V::cvt_lo(part1));
      sum1_hi = V::addd(sum1_hi, V::cvt_hi(part1));
      for (int a = 0; a < 4; ++a) acc1[a] = V::zero();
    }
  };
  auto raise_reference = [&](float top) SD_LAMBDA_INLINE {
    const float new_c = std::nearbyint(top * s * G) / G;
    if (!(std::fabs(new_c) < kRange)) return false;
    flush();
    const typename V::D scale = V::set1d(std::exp2(static_cast<double>(c) - new_c));
    if constexpr (kEntropy) {  // d1' = 2^-delta (d1 - delta d), before d is rescaled
      const typename V::D delta = V::set1d(static_cast<double>(new_c) - c);
      sum1_lo = V::muld(V::subd(sum1_lo, V::muld(delta, sum_lo)), scale);
      sum1_hi = V::muld(V::subd(sum1_hi, V::muld(delta, sum_hi)), scale);
    }
    sum_lo = V::muld(sum_lo, scale);
    sum_hi = V::muld(sum_hi, scale);
    set_reference(new_c);
    return true;
  };
  int64_t count = 0;
  const int64_t cut_at = k + CutSlack(k);
  // Every key in the buffer is >= key_thr, the threshold's (INT32_MIN + 1 before the first cut: below the
  // key of every finite value).
  int32_t key_thr = INT32_MIN + 1;
  F thr = V::set1(-INFINITY);
  const I lanes = V::lane_index();
  // A group's candidates (masks cm[0..vecs) of the vectors xv at i, i + L, ...), before any of its exps is
  // taken, branch-free but for rare events: a NaN or +inf among them ends the fast path; C is raised if one
  // of them would make a term above 2^kRaiseAt; they are appended in index order (compress); the buffer is
  // cut when full. (Scalar appends, one branch per candidate: ~120 cycles per group with candidates;
  // k = 1, V = 32000: 0.22 ns per entry.) Returns kDone to go on.
  auto candidates = [&](int64_t i, const F (&xv)[4], const typename V::M (&cm)[4], int vecs) SD_LAMBDA_INLINE {
    typename V::M special = V::none(), raising = V::none();
    for (int q = 0; q < vecs; ++q) {
      special = V::mask_or(special, V::mask_and(cm[q], V::nlt(xv[q], V::set1(INFINITY))));
      raising = V::mask_or(raising, V::mask_and(cm[q], V::gt(V::fms(xv[q], vs, V::set1(c)), V::set1(kRaiseAt))));
    }
    if (V::bits(special) != 0) return RowResult::kGeneric;
    if (V::bits(raising) != 0) [[unlikely]] {
      float top = -INFINITY;
      for (int q = 0; q < vecs; ++q) {
        alignas(64) float lv[L];
        V::storeu(lv, V::select(cm[q], V::set1(-INFINITY), xv[q]));
        for (int l = 0; l < L; ++l) top = std::max(top, lv[l]);
      }
      if (!raise_reference(top)) return kOutOfRange;
    }
    for (int q = 0; q < vecs; ++q) {
      V::compress_storeui(buf.indices + count, V::addi(lanes, V::set1i(static_cast<int32_t>(i + q * L))), cm[q]);
      count += V::compress_storeu(buf.values + count, xv[q], cm[q]);
    }
    if (count > cut_at) {
      key_thr = CutCandidates<V>(buf, count, k, key_thr, &count);
      thr = V::set1(FromOrderKey(key_thr));
    }
    return RowResult::kDone;
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
        const RowResult res = candidates(i, xv, cm, 4);
        if (res != RowResult::kDone) return res;
      }
      // (kEntropy: two accumulators of 2^u u, not four: AVX2 has 16 registers)
      acc[0] = term(v0, acc[0], acc1[0]);
      acc[1] = term(v1, acc[1], acc1[1]);
      acc[2] = term(v2, acc[2], acc1[0]);
      acc[3] = term(v3, acc[3], acc1[1]);
    }
    flush();
  }
  for (; i < n; i += L) {  // the last < 4L entries, one vector at a time; lanes past n are -inf
    const int left = n - i >= L ? L : static_cast<int>(n - i);
    const F v = V::loadu_fill(x + i, left, -INFINITY);
    const F xv[4] = {v, v, v, v};
    const typename V::M cm[4] = {V::nle(v, thr), V::none(), V::none(), V::none()};
    if (V::bits(cm[0]) != 0) {
      const RowResult res = candidates(i, xv, cm, 1);
      if (res != RowResult::kDone) return res;
    }
    F acc1_tail = acc1[0];
    acc[0] = V::select(V::tail_mask(left), acc[0], term(v, acc[0], acc1_tail));
    if constexpr (kEntropy) acc1[0] = V::select(V::tail_mask(left), acc1[0], acc1_tail);
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
  if constexpr (Design<V>::kFinalCut) {
    if (count > k) key_thr = CutCandidates<V>(buf, count, k, key_thr, &count);
  }
  float top = -INFINITY;
  for (int64_t j = 0; j < count; ++j) top = std::max(top, buf.values[j]);
  // d = sum_j 2^(x_j*s - C); relative to M: D = d * 2^(C - M*s), M*s exact in double.
  double d = 0.0;
  if constexpr (DS::kTreeSum) {
    d = V::reduce_addd(V::addd(sum_lo, sum_hi));
  } else {
    alignas(64) double lane_sum[L];
    V::stored(lane_sum, sum_lo);
    V::stored(lane_sum + L / 2, sum_hi);
    for (int l = 0; l < L; ++l) d += lane_sum[l];
  }
  const double to_top = std::exp2(static_cast<double>(c) - static_cast<double>(top) * s);
  const double sum = d * to_top;
  if (!(sum > 0.0) || !std::isfinite(sum)) return RowResult::kGeneric;
  if constexpr (kEntropy) {  // relative to M as well: 2^-delta (d1 - delta d), delta = M*s - C
    double d1 = 0.0;
    if constexpr (DS::kTreeSum) {
      d1 = V::reduce_addd(V::addd(sum1_lo, sum1_hi));
    } else {
      alignas(64) double lane_sum[L];
      V::stored(lane_sum, sum1_lo);
      V::stored(lane_sum + L / 2, sum1_hi);
      for (int l = 0; l < L; ++l) d1 += lane_sum[l];
    }
    const double sum_u = (d1 - (static_cast<double>(top) * s - static_cast<double>(c)) * d) * to_top;
    if (!std::isfinite(sum_u)) return RowResult::kGeneric;
    *sum_u_out = sum_u;
  }
  *sum_out = sum;
  *count_out = count;
  return RowResult::kDone;
}

// The fast row (the interface of ops/softmax_topk_row.h): the wide variant when the row needs it and
// the design has one.
template <class V>
bool FastRow(const float* x, int64_t n, int64_t k, float s, const Candidates& buf, double* sum, int64_t* count) {
  RowResult res = FastRowT<V, false>(x, n, k, s, buf, sum, count);
  if constexpr (Design<V>::kWideLimit > 0.0f) {
    if (res == RowResult::kWide) res = FastRowT<V, true>(x, n, k, s, buf, sum, count);
  }
  return res == RowResult::kDone;
}

// SoftmaxTopK's row with the entropy's sum (kEntropy above): *sum_u = sum_j 2^u_j u_j, u_j = (x_j - M) s.
template <class V>
bool FastRowEntropy(const float* x, int64_t n, int64_t k, float s, const Candidates& buf, double* sum, double* sum_u,
                    int64_t* count) {
  RowResult res = FastRowT<V, false, true>(x, n, k, s, buf, sum, count, sum_u);
  if constexpr (Design<V>::kWideLimit > 0.0f) {
    if (res == RowResult::kWide) res = FastRowT<V, true, true>(x, n, k, s, buf, sum, count, sum_u);
  }
  return res == RowResult::kDone;
}

}  // namespace
}  // namespace softmax_topk
}  // namespace sd
