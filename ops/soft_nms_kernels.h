// SoftNMS's vector passes, written once over the vector traits of ops/common/vec.h and instantiated
// per ISA translation unit (ops/soft_nms_avx2.cc, ops/soft_nms_avx512.cc); the loop and the design
// are in ops/soft_nms.cc's header. Every variant gives the oracle's results bit for bit, so the
// variants agree with each other: the near list holds the same rows in the same (slot) order with the
// same float operations (iw, ih, iw * ih, (area_t + area) - inter; -ffp-contract=off from
// CMakeLists.txt), and the max / first-equal searches have one answer whatever order they look in
// (no NaN ever enters the working scores; the first position holding the max, +0 and -0 alike).
// What differs by ISA is only in the traits: the lane count and V::compress_storeu (AVX-512
// vcompressps; AVX2 a permutation from a table).
//
// What must stay true: the block test is conservative (ops/soft_nms.cc's Overlaps); block lanes past
// the last block are masked off; the near list has room for a whole vector past its last entry.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/vec.h"
#include "soft_nms_row.h"

namespace sd {
namespace soft_nms {
namespace {  // internal linkage on purpose: see ops/common/vec.h

template <class V>
struct Box {
  using F = typename V::F;
  F lo0, hi0, lo1, hi1, off;
  // iw, ih of the IoU against the boxes (lo0, hi0, lo1, hi1) and the mask where both are > 0.
  SD_VEC_INLINE typename V::M Test(F blo0, F bhi0, F blo1, F bhi1, F* iw, F* ih) const {
    *iw = V::add(V::sub(V::min(hi0, bhi0), V::max(lo0, blo0)), off);
    *ih = V::add(V::sub(V::min(hi1, bhi1), V::max(lo1, blo1)), off);
    return V::mask_and(V::gt(*iw, V::zero()), V::gt(*ih, V::zero()));
  }
};

template <class V>
int64_t Scan(const Selected& t, const Slots& w, float offset) {
  using F = typename V::F;
  constexpr int L = V::kLanes;
  static_assert(kBlock % L == 0, "a block is whole vectors");
  const Box<V> sel{V::set1(t.lo0), V::set1(t.hi0), V::set1(t.lo1), V::set1(t.hi1), V::set1(offset)};
  const F tarea = V::set1(t.area);
  int64_t near_n = 0;
  // L blocks' boxes a step; each block that passes is kBlock / L vectors of slots. Branch-free inside
  // a block: which vectors overlap the selected box is random, and mispredictions would cost more
  // than the compresses of a vector that has none.
  for (int64_t b = 0; b < w.blocks; b += L) {
    const int count = static_cast<int>(std::min<int64_t>(L, w.blocks - b));
    F iw, ih;
    const auto hit = V::mask_and(sel.Test(V::loadu_tail(w.block_lo0 + b, count), V::loadu_tail(w.block_hi0 + b, count),
                                          V::loadu_tail(w.block_lo1 + b, count), V::loadu_tail(w.block_hi1 + b, count),
                                          &iw, &ih),
                                 V::tail_mask(count));
    for (unsigned bits = V::bits(hit); bits != 0; bits &= bits - 1) {
      for (int64_t k = (b + __builtin_ctz(bits)) * kBlock, end = k + kBlock; k < end; k += L) {
        const auto overlap =
            sel.Test(V::loadu(w.lo0 + k), V::loadu(w.hi0 + k), V::loadu(w.lo1 + k), V::loadu(w.hi1 + k), &iw, &ih);
        const F inter = V::mul(iw, ih);
        const F uni = V::sub(V::add(tarea, V::loadu(w.area + k)), inter);
        V::compress_storeu(w.near_inter + near_n, inter, overlap);
        V::compress_storeu(w.near_union + near_n, uni, overlap);
        near_n += V::compress_storeui(w.near_pos + near_n, V::loadui(w.pos + k), overlap);
      }
    }
  }
  return near_n;
}

template <class V>
float Max(const float* s, int64_t begin, int64_t end) {
  using F = typename V::F;
  constexpr int L = V::kLanes;
  // four accumulators: max has a latency of several cycles, the loads do not
  F m0 = V::set1(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  int64_t p = begin;
  for (; p + 4 * L <= end; p += 4 * L) {
    m0 = V::max(m0, V::loadu(s + p));
    m1 = V::max(m1, V::loadu(s + p + L));
    m2 = V::max(m2, V::loadu(s + p + 2 * L));
    m3 = V::max(m3, V::loadu(s + p + 3 * L));
  }
  for (; p + L <= end; p += L) m0 = V::max(m0, V::loadu(s + p));
  if (p < end) m1 = V::max(m1, V::loadu_fill(s + p, static_cast<int>(end - p), -INFINITY));
  // The last fold in scalar code (not V::reduce_max: GCC 12 warns about an uninitialised temporary
  // inside its own AVX-512 headers when that is inlined here).
  float lanes[L];
  V::storeu(lanes, V::max(V::max(m0, m1), V::max(m2, m3)));
  float mx = lanes[0];
  for (float x : lanes) mx = std::max(mx, x);
  return mx;
}

template <class V>
int64_t FirstEqual(const float* s, int64_t begin, int64_t end, float value) {
  constexpr int L = V::kLanes;
  const typename V::F v = V::set1(value);
  int64_t p = begin;
  // 4 vectors a step, one branch: the value is usually far from the start
  for (; p + 4 * L <= end; p += 4 * L) {
    const unsigned e0 = V::bits(V::eq(V::loadu(s + p), v)), e1 = V::bits(V::eq(V::loadu(s + p + L), v));
    const unsigned e2 = V::bits(V::eq(V::loadu(s + p + 2 * L), v)), e3 = V::bits(V::eq(V::loadu(s + p + 3 * L), v));
    const uint64_t eq = static_cast<uint64_t>(e0) | static_cast<uint64_t>(e1) << L |
                        static_cast<uint64_t>(e2) << (2 * L) | static_cast<uint64_t>(e3) << (3 * L);
    if (eq != 0) return p + __builtin_ctzll(eq);
  }
  for (; p < end; p += L) {
    const int count = static_cast<int>(std::min<int64_t>(L, end - p));
    const unsigned eq = V::bits(V::mask_and(V::eq(V::loadu_tail(s + p, count), v), V::tail_mask(count)));
    if (eq != 0) return p + __builtin_ctz(eq);
  }
  return end;
}

}  // namespace
}  // namespace soft_nms
}  // namespace sd
