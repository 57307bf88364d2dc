// SoftpickAttention's vector kernels, written once over the vector traits of ops/common/vec.h and
// instantiated per ISA translation unit (ops/softpick_attention_avx2.cc, _avx512.cc); the design, the tasks
// and the portable variant are in ops/softpick_attention.cc. Three pieces: the register-tiled GEMM
// (ops/common/vec_gemm.h), the row pass of the softpick terms over one row's key block (Row), and the
// scores' GEMM with the terms in its epilogue (ScoresTerms). What differs by ISA is stated by one Policy per
// variant: how 2^(n - R) is formed and whether unmasked rows take the plain form of the row pass.
//
// What must stay true: only finite scores (or -inf) reach these; a lane that is masked, hidden (causal) or
// past the block adds nothing to the sum or the max and stages 0; -ffp-contract=off (CMakeLists.txt), so
// the FMAs are the written ones.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/simd_math.h"
#include "common/vec.h"
#include "common/vec_gemm.h"
#include "softpick_attention_row.h"
#include "softpick_kernels.h"

namespace sd {
namespace softpick_attention {
namespace {  // internal linkage on purpose: see ops/common/vec.h

template <class V>
struct Policy;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
template <>
struct Policy<vec::Avx512> {
  using F = __m512;
  // Unmasked rows with nothing hidden take the row pass's plain form (see RowT).
  static constexpr bool kPlainRow = true;
  // 2^(n - R). kSmallR (R <= 126, 2^-R a normal float): sc_base = 2^-R times 2^n by one vscalefps, which
  // equals scalef(1, n - R) exactly (both are the power of two 2^(n-R), rounded alike where subnormal).
  template <bool kSmallR>
  static SD_VEC_INLINE F pow2(F n, F sc_base, F minus_r) {
    if constexpr (kSmallR) return _mm512_maskz_scalef_ps(0xFFFF, sc_base, n);
    return _mm512_maskz_scalef_ps(0xFFFF, sc_base, _mm512_add_ps(n, minus_r));
  }
  // The fused path's minus_r argument for a row with scale R (see pow2; unused there).
  static SD_VEC_INLINE F fused_minus_r(float minus_r) { return _mm512_set1_ps(minus_r); }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
template <>
struct Policy<vec::Avx2> {
  using F = __m256;
  static constexpr bool kPlainRow = false;
  // 2^(n - R) in the exponent field, 0 at n - R <= -127. Row pass: clamped to [2^-127, 2^127] (V::pow2i).
  // kSmallR (the fused path): minus_r holds 127 - R (fused_minus_r), and n - R stays below 2^7 (the block
  // max is within kSlack of R, else the row is flagged and redone on the row path, which overwrites what
  // the fused path wrote), so only the lower clamp is needed: the same powers of two in 4 operations, not 6.
  template <bool kSmallR>
  static SD_VEC_INLINE F pow2(F n, F /*sc_base*/, F minus_r) {
    if constexpr (kSmallR) {
      const __m256 e = _mm256_max_ps(_mm256_add_ps(n, minus_r), _mm256_setzero_ps());
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtps_epi32(e), 23));
    }
    return vec::Avx2::pow2i(_mm256_add_ps(n, minus_r));
  }
  static SD_VEC_INLINE F fused_minus_r(float minus_r) { return _mm256_set1_ps(minus_r + 127.0f); }
};
#endif

// The softpick term of kLanes scores, expm1(x) 2^-r (sc_base: 2^-r when kSmallR, else 1; minus_r = -r;
// c = 2^-r). kClamp: see softpick::Expm1Reduced. Without a mask every score is bounded by kExactLimit
// (RunTask's bound), where the reduction is exact and 2^(n - r) underflows to 0 below kMinX, giving -2^-r
// as the clamp would: no clamp needed there.
template <class V, bool kClamp, bool kSmallR>
SD_VEC_INLINE typename V::F Term(typename V::F x, typename V::F sc_base, typename V::F minus_r, typename V::F c) {
  typename V::F n;
  const typename V::F q = softpick::Expm1Reduced<V, kClamp>(x, &n);
  const typename V::F sc = Policy<V>::template pow2<kSmallR>(n, sc_base, minus_r);
  return V::fma(sc, q, V::sub(sc, c));
}

// One pass over a row's key block (RowPortable in ops/softpick_attention.cc: x_j = s[j] + mask, -inf for
// j >= hidden; p[j] = expm1(x_j) 2^-r where x_j > 0, else 0; returns sum |expm1(x_j)| 2^-r over x_j > -inf,
// *block_max = max x_j). kPlain: no mask and nothing hidden, so every lane in the row is a finite score
// (the common case): whole vectors go without lane masks or clamp, and sum |term| is 2 sum(positive
// terms) - sum(terms) (the numerator P is the positive part anyway), one add in place of an abs and a
// masked add.
template <class V, bool kPlain, bool kSmallR>
SD_VEC_INLINE float RowT(const float* s, float* pr, int64_t n, const float* mrow, int64_t msk, int64_t hidden,
                         float r, float* block_max) {
  using F = typename V::F;
  using M = typename V::M;
  constexpr int L = V::kLanes;
  const F minus_r = V::set1(-r), c = V::set1(simd::Scale2(1.0f, -r));
  const F sc_base = kSmallR ? c : V::set1(1.0f);
  const F zero = V::zero(), neg_inf = V::set1(-INFINITY);
  F acc = zero, vmax = neg_inf;
  if constexpr (kPlain) {
    F acc_pos = zero;
    int64_t j = 0;
    for (; j + L <= n; j += L) {
      const F x = V::loadu(s + j);
      vmax = V::max(vmax, x);
      const F term = Term<V, false, kSmallR>(x, sc_base, minus_r, c);
      const F pos = V::select(V::gt(x, zero), zero, term);
      acc = V::add(acc, term);
      acc_pos = V::add(acc_pos, pos);
      V::storeu(pr + j, pos);
    }
    if (j < n) {
      const int count = static_cast<int>(n - j);
      const M valid = V::tail_mask(count);
      const F x = V::loadu_tail(s + j, count);  // lanes past the tail: 0
      vmax = V::select(valid, vmax, V::max(vmax, x));
      const F term = V::select(valid, zero, Term<V, false, kSmallR>(x, sc_base, minus_r, c));
      const F pos = V::select(V::gt(x, zero), zero, term);
      acc = V::add(acc, term);
      acc_pos = V::add(acc_pos, pos);
      V::storeu_tail(pr + j, count, pos);
    }
    *block_max = V::reduce_max(vmax);
    return 2.0f * V::reduce_add(acc_pos) - V::reduce_add(acc);
  } else {
    for (int64_t j = 0; j < n; j += L) {
      const int count = static_cast<int>(std::min<int64_t>(L, n - j));
      const bool full = count == L;
      F x = full ? V::loadu(s + j) : V::loadu_tail(s + j, count);
      if (mrow != nullptr) {
        x = V::add(x, msk == 0 ? V::set1(mrow[0]) : full ? V::loadu(mrow + j) : V::loadu_tail(mrow + j, count));
      }
      const int shown_count = static_cast<int>(std::clamp<int64_t>(hidden - j, 0, L));
      // lanes past the tail or hidden count as -inf: neither term nor numerator
      x = V::select(V::mask_and(V::tail_mask(count), V::tail_mask(shown_count)), neg_inf, x);
      const M seen = V::neq(x, neg_inf);
      vmax = V::max(vmax, x);
      const F term = Term<V, true, kSmallR>(x, sc_base, minus_r, c);
      acc = V::add(acc, V::select(seen, zero, V::abs(term)));
      const F out = V::select(V::gt(x, zero), zero, term);
      if (full) V::storeu(pr + j, out);
      else V::storeu_tail(pr + j, count, out);
    }
    *block_max = V::reduce_max(vmax);
    return V::reduce_add(acc);
  }
}

template <class V>
float Row(const float* s, float* pr, int64_t n, const float* mrow, int64_t msk, int64_t hidden, float r,
          float* block_max) {
  const bool small_r = r <= 126.0f;
  if constexpr (Policy<V>::kPlainRow) {
    if (mrow == nullptr && hidden >= n) {
      return small_r ? RowT<V, true, true>(s, pr, n, mrow, msk, hidden, r, block_max)
                     : RowT<V, true, false>(s, pr, n, mrow, msk, hidden, r, block_max);
    }
    return small_r ? RowT<V, false, true>(s, pr, n, mrow, msk, hidden, r, block_max)
                   : RowT<V, false, false>(s, pr, n, mrow, msk, hidden, r, block_max);
  } else {
    return RowT<V, false, false>(s, pr, n, mrow, msk, hidden, r, block_max);
  }
}

// ---- no mask: the scores' GEMM with the softpick terms in its epilogue -----------------------------
//
// For a full key block of a task without Mask that no causal limit cuts, S = Qs Kt is computed a strip of
// query rows at a time (RI <= 6 rows x kBlockK keys: the register tiles of ops/common/vec_gemm.h's k loop,
// 6 rows x TileVecs vectors each, left to right) and turned into terms while the strip is in L1: P (the
// positive terms) overwrites the strip's S, and per row the block's sum |term| and max score are formed
// in kLanes lanes in registers over the whole row. The row pass (still used for masked, causal and tail
// blocks) reads S back after the whole block's GEMM and pays, per row and block, a call, its constants and
// three horizontal reductions. Per row, cr = 2^-R (R <= 126: kSmallR), mr = -R and thr = (R + kSlack) ln 2.
// Then, per row: a block max above thr (the row needs a larger R) sets flag[row] = 1 and leaves the row's
// lacc / vmx as they were -- RunTask redoes that row on the row path --, else lacc += sum |term| and vmx =
// max(vmx, block max) (lane-wise, float: as the o sums).

// The terms of RI rows x kBlockK scores s (row stride kBlockK), in place, and the rows' fold into lacc /
// vmx (or flag). The numerator max(term, 0) is the term where s > 0 and 0 elsewhere: expm1(s) 2^-R has
// the sign of s (2^(n-R) (1 + q) - 2^-R with 1 + q in [0.70, 1.42] is > 0 iff n >= 1 or, at n = 0, q > 0,
// i.e. t = s > 0), one max in place of a compare and a mask. Out of line on purpose: in line after the k
// loop its constants stayed live across it and GCC spilled accumulators there (5 stack round trips per k).
template <class V, int RI>
__attribute__((noinline)) void TermsStrip(float* s, const float* cr, const float* mr, const float* thr, float* lacc,
                                          float* vmx, uint8_t* flag) {
  using F = typename V::F;
  constexpr int L = V::kLanes, NB = static_cast<int>(kBlockK) / L;
  const F zero = V::zero();
  for (int r = 0; r < RI; ++r) {
    const F c = V::set1(cr[r]), minus_r = Policy<V>::fused_minus_r(mr[r]);
    float* sr = s + r * kBlockK;
    F labs0 = zero, labs1 = zero, mx0 = V::loadu(sr), mx1 = mx0;
    for (int x = 0; x < NB; x += 2) {
      const F s0 = V::loadu(sr + L * x), s1 = V::loadu(sr + L * (x + 1));
      const F t0 = Term<V, false, true>(s0, c, minus_r, c), t1 = Term<V, false, true>(s1, c, minus_r, c);
      V::storeu(sr + L * x, V::max(t0, zero));
      V::storeu(sr + L * (x + 1), V::max(t1, zero));
      labs0 = V::add(labs0, V::abs(t0));
      labs1 = V::add(labs1, V::abs(t1));
      mx0 = V::max(mx0, s0);
      mx1 = V::max(mx1, s1);
    }
    const F labs = V::add(labs0, labs1), mx = V::max(mx0, mx1);
    flag[r] = V::bits(V::gt(mx, V::set1(thr[r]))) != 0;
    if (flag[r]) continue;
    V::storeu(lacc + L * r, V::add(V::loadu(lacc + L * r), labs));
    V::storeu(vmx + L * r, V::max(V::loadu(vmx + L * r), mx));
  }
}

// RI rows x TileVecs vectors of keys of S = Qs Kt (full tiles: no lane masks), stored to pr.
template <class V, int RI>
SD_VEC_INLINE void ScoreTile(const float* a, int64_t D, const float* kt, float* pr) {
  using F = typename V::F;
  constexpr int L = V::kLanes, NV = tile::TileVecs<V>();
  F acc[RI][NV];
  for (int r = 0; r < RI; ++r) {
    for (int x = 0; x < NV; ++x) acc[r][x] = V::zero();
  }
  for (int64_t kk = 0; kk < D; ++kk) {
    F bv[NV];
    for (int x = 0; x < NV; ++x) bv[x] = V::loadu(kt + kk * kBlockK + L * x);
    for (int r = 0; r < RI; ++r) {
      const F av = V::broadcast(a + r * D + kk);
      for (int x = 0; x < NV; ++x) acc[r][x] = V::fma(av, bv[x], acc[r][x]);
    }
  }
  for (int r = 0; r < RI; ++r) {
    for (int x = 0; x < NV; ++x) V::storeu(pr + r * kBlockK + L * x, acc[r][x]);
  }
}

// One strip of RI query rows (a, row stride D) against the key block kt: its scores tile by tile, then
// their terms (TermsStrip).
template <class V, int RI>
SD_VEC_INLINE void ScoreStrip(const float* a, int64_t D, const float* kt, float* pr, const float* cr, const float* mr,
                              const float* thr, float* lacc, float* vmx, uint8_t* flag) {
  constexpr int kCols = tile::TileVecs<V>() * V::kLanes;
  for (int64_t c0 = 0; c0 < kBlockK; c0 += kCols) ScoreTile<V, RI>(a, D, kt + c0, pr + c0);
  TermsStrip<V, RI>(pr, cr, mr, thr, lacc, vmx, flag);
}

// rows query rows (qs, row stride D) against one full key block kt ([D][kBlockK]); see above.
template <class V>
void ScoresTerms(const float* qs, int64_t D, const float* kt, int64_t rows, const float* cr, const float* mr,
                 const float* thr, float* pbuf, float* lacc, float* vmx, uint8_t* flag) {
  constexpr int L = V::kLanes, kCols = tile::TileVecs<V>() * L;
  static_assert(kBlockK % kCols == 0 && kBlockK % (2 * L) == 0, "a key block is whole tiles");
  int64_t r = 0;
  for (; r + tile::kTileRows <= rows; r += tile::kTileRows) {
    ScoreStrip<V, tile::kTileRows>(qs + r * D, D, kt, pbuf + r * kBlockK, cr + r, mr + r, thr + r, lacc + L * r,
                                   vmx + L * r, flag + r);
  }
  const float* ar = qs + r * D;
  float* pr = pbuf + r * kBlockK;
  float* la = lacc + L * r;
  float* vm = vmx + L * r;
  switch (rows - r) {
    case 5: ScoreStrip<V, 5>(ar, D, kt, pr, cr + r, mr + r, thr + r, la, vm, flag + r); break;
    case 4: ScoreStrip<V, 4>(ar, D, kt, pr, cr + r, mr + r, thr + r, la, vm, flag + r); break;
    case 3: ScoreStrip<V, 3>(ar, D, kt, pr, cr + r, mr + r, thr + r, la, vm, flag + r); break;
    case 2: ScoreStrip<V, 2>(ar, D, kt, pr, cr + r, mr + r, thr + r, la, vm, flag + r); break;
    case 1: ScoreStrip<V, 1>(ar, D, kt, pr, cr + r, mr + r, thr + r, la, vm, flag + r); break;
    default: break;
  }
}

// ---- P V over the nonzero numerators only ---------------------------------------------------------
//
// o[rows x Dv] += P[rows x kBlockK] V[kBlockK x Dv] for a full key block, one query row at a time with its
// Dv = NVO * kLanes outputs in NVO accumulators, over the keys whose numerator is nonzero: P is 0 wherever
// the score is <= 0 (about half of a block when scores centre on 0, more under a Mask or causal limit), and
// the register-tiled GEMM multiplies those zeros like any other entry. Each row's sum runs over k in the
// same order as the GEMM's and skips only exact zeros (0 * V_j = +-0 for the finite V of the fast path), so
// o is what the GEMM gives. The key block's V (kBlockK x Dv floats) is reread by every row: it must stay in
// L1 for this to pay (Dv <= 64 at kBlockK = 128).
template <class V, int NVO>
void PvSparseT(const float* p, const float* v, float* o, int64_t rows) {
  using F = typename V::F;
  constexpr int L = V::kLanes, Dv = NVO * L, kWord = 64;
  static_assert(kBlockK % kWord == 0 && kWord % L == 0, "whole words of keys");
  const F zero = V::zero();
  for (int64_t r = 0; r < rows; ++r) {
    const float* pr = p + r * kBlockK;
    float* orow = o + r * Dv;
    F acc[NVO];
    for (int x = 0; x < NVO; ++x) acc[x] = V::loadu(orow + L * x);
    for (int64_t j0 = 0; j0 < kBlockK; j0 += kWord) {
      uint64_t nz = 0;  // bit j: P[r][j0 + j] != 0
      for (int x = 0; x < kWord / L; ++x) {
        nz |= static_cast<uint64_t>(V::bits(V::neq(V::loadu(pr + j0 + L * x), zero))) << (L * x);
      }
      while (nz != 0) {
        const int64_t j = j0 + __builtin_ctzll(nz);
        nz &= nz - 1;
        const F pj = V::broadcast(pr + j);
        const float* vj = v + j * Dv;
        for (int x = 0; x < NVO; ++x) acc[x] = V::fma(pj, V::loadu(vj + L * x), acc[x]);
      }
    }
    for (int x = 0; x < NVO; ++x) V::storeu(orow + L * x, acc[x]);
  }
}

// PvSparseT for Dv = nvo kLanes, 1 <= nvo <= 8 (RunTask checks).
template <class V>
void PvSparse(const float* p, const float* v, int64_t Dv, float* o, int64_t rows) {
  switch (Dv / V::kLanes) {
    case 1: PvSparseT<V, 1>(p, v, o, rows); break;
    case 2: PvSparseT<V, 2>(p, v, o, rows); break;
    case 3: PvSparseT<V, 3>(p, v, o, rows); break;
    case 4: PvSparseT<V, 4>(p, v, o, rows); break;
    case 5: PvSparseT<V, 5>(p, v, o, rows); break;
    case 6: PvSparseT<V, 6>(p, v, o, rows); break;
    case 7: PvSparseT<V, 7>(p, v, o, rows); break;
    default: PvSparseT<V, 8>(p, v, o, rows); break;
  }
}

}  // namespace
}  // namespace softpick_attention
}  // namespace sd
