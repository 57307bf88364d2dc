// SoftNMS -- Soft non-maximum suppression (Bodla et al., ICCV 2017), the original swap-based loop
// (bharatsingh430/soft-nms lib/nms/cpu_nms.pyx::cpu_soft_nms) reproduced bit for bit in float32.
//
//   per (batch, class): working rows = boxes with score >= ScoreThreshold, in index order (n rows)
//   for i = 0, 1, ... while i < n (and i < MaxOutputBoxesPerClass when > 0):
//     m = first row in [i, n) with the largest score; swap rows i and m; emit row i
//     every row p in (i, n): s_p *= weight(IoU(row i, row p))
//         linear: IoU > Nt ? 1 - IoU : 1   hard: IoU > Nt ? 0 : 1
//         gaussian: float(exp(double(-(IoU*IoU) / sigma)))
//     for p = i+1 while p < n: if !(s_p >= ScoreThreshold): row n-1 moves into p, n -= 1; else p++
//   IoU: iw = min(hi0) - max(lo0) + off, ih likewise; IoU = iw*ih / ((area_i + area_p) - iw*ih) when
//   iw > 0 and ih > 0, else 0; area = (hi0 - lo0 + off) * (hi1 - lo1 + off).
//
// Python half, the contract, the rules for NaN and the float32 oracle: softdeploy/ops/soft_nms.py; OPS.md.
//
// What must stay true:
//  * Every float operation is the oracle's, in the oracle's order, with no FMA contraction (the
//    pragma below): the selection is discrete, so one rounding difference can pick another box.
//  * The max search keeps the first row of the current working order among equal scores; NaN never
//    enters the working rows (`!(s >= threshold)` removes it), so max/compare need no NaN care.
//  * Memory is O(N) per task: the IoU of the selected box against the remaining rows is computed on
//    the fly (SoA rows, SIMD over rows), never an N x N matrix.
//  * One (batch, class) is one unit of work; threads split (batch, class) pairs, never one of them.
//  * gaussian (AVX-512): the IoU pass only gathers the overlapping rows; their weights come from an
//    8-lane double exp whose float32 rounding is used only where it is provably the same as
//    float(std::exp(double)) (GaussianNearAvx512), so the scores stay bit-identical to the oracle.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "common/kernel.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

// a*b - c and a + b*c must stay two roundings, as in the oracle (the AVX2/AVX-512 functions would
// otherwise fuse them into FMAs: -std=c++17 does not turn contraction off in GCC).
#pragma GCC optimize("fp-contract=off")

namespace sd {
namespace {

constexpr const char* kOp = "SoftNMS";

enum class Method { kLinear, kGaussian, kHard };

struct Params {
  Method method = Method::kLinear;
  float iou_threshold = 0.3f;
  float score_threshold = 0.001f;
  float sigma = 0.5f;
  float offset = 0.0f;
  int64_t max_output = 0;  // <= 0: no limit
  // weight(IoU 0) == 1, so rows that do not overlap the selected box keep their scores and the SIMD
  // passes may skip them (false only for "hard" with IouThreshold < 0, where IoU 0 > Nt).
  bool skip_disjoint = true;
};

// The working rows of one (batch, class), structure of arrays so that SIMD lanes are rows.
struct Rows {
  std::vector<float> lo0, hi0, lo1, hi1, area, score;
  std::vector<int64_t> index;
  // gaussian (AVX-512): row, intersection and union of the rows that overlap the selected box,
  // gathered by the SIMD pass so that the division and the double exp run over a dense list
  // (+16: whole-vector stores at the end)
  std::vector<float> near_inter, near_union;
  std::vector<int32_t> near_row;
  void Resize(size_t n) {
    for (auto* v : {&lo0, &hi0, &lo1, &hi1, &area, &score}) v->resize(n);
    index.resize(n);
    near_inter.resize(n + 16);
    near_union.resize(n + 16);
    near_row.resize(n + 16);
  }
  void Swap(int64_t a, int64_t b) {
    for (auto* v : {&lo0, &hi0, &lo1, &hi1, &area, &score}) std::swap((*v)[a], (*v)[b]);
    std::swap(index[a], index[b]);
  }
  void Move(int64_t from, int64_t to) {
    for (auto* v : {&lo0, &hi0, &lo1, &hi1, &area, &score}) (*v)[to] = (*v)[from];
    index[to] = index[from];
  }
};

// The selected box, broadcast once per round.
struct Selected {
  float lo0, hi0, lo1, hi1, area;
};

// ---- portable (also the tails of the SIMD passes) ----------------------------------------------------

inline float Iou(const Selected& t, const Rows& r, int64_t p, float off) {
  const float iw = (std::min(t.hi0, r.hi0[p]) - std::max(t.lo0, r.lo0[p])) + off;
  const float ih = (std::min(t.hi1, r.hi1[p]) - std::max(t.lo1, r.lo1[p])) + off;
  if (!(iw > 0.0f && ih > 0.0f)) return 0.0f;
  const float inter = iw * ih;
  return inter / ((t.area + r.area[p]) - inter);
}

inline float GaussianWeight(float iou, float sigma) {
  const float t = -(iou * iou) / sigma;
  return static_cast<float>(std::exp(static_cast<double>(t)));
}

inline float Weight(float iou, const Params& prm) {
  switch (prm.method) {
    case Method::kLinear: return iou > prm.iou_threshold ? 1.0f - iou : 1.0f;
    case Method::kHard: return iou > prm.iou_threshold ? 0.0f : 1.0f;
    default: return iou == 0.0f ? 1.0f : GaussianWeight(iou, prm.sigma);  // exp(-0) is exactly 1
  }
}

// Decays rows [begin, end) against t. Returns how many fell below the threshold; *best is the max
// of the surviving decayed scores (not lowered when none survives).
int64_t DecayPortable(const Selected& t, Rows& r, int64_t begin, int64_t end, const Params& prm, float* best) {
  int64_t dead = 0;
  float m = *best;
  for (int64_t p = begin; p < end; ++p) {
    const float s = r.score[p] * Weight(Iou(t, r, p, prm.offset), prm);
    r.score[p] = s;
    if (s >= prm.score_threshold) m = std::max(m, s);
    else ++dead;
  }
  *best = m;
  return dead;
}

// First row in [begin, end) whose score is not >= threshold (dead); end when none.
int64_t FirstDeadPortable(const float* s, int64_t begin, int64_t end, float threshold) {
  for (int64_t p = begin; p < end; ++p)
    if (!(s[p] >= threshold)) return p;
  return end;
}

int64_t FirstEqualPortable(const float* s, int64_t begin, int64_t end, float value) {
  for (int64_t p = begin; p < end; ++p)
    if (s[p] == value) return p;
  return end;
}

// ---- AVX-512 ---------------------------------------------------------------------------------

#if defined(__x86_64__) || defined(_M_X64)

// One vector of rows [p, p + 16) under mask k (all-ones except at the tail, where the compiler
// then drops the masking from the loads of the main loop).
struct Avx512Decay {
  __m512 tlo0, thi0, tlo1, thi1, tarea, off, nt, thr;
  const float *lo0, *hi0, *lo1, *hi1, *area;
  float* score;
  float *near_inter, *near_union;
  int32_t* near_row;
  int64_t* near_n;
  Method method;

  SD_TARGET_AVX512 inline void Step(int64_t p, __mmask16 k, __m512& m, int64_t& dead) const {
    const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    const __m512 iw = _mm512_add_ps(
        _mm512_sub_ps(_mm512_min_ps(thi0, _mm512_maskz_loadu_ps(k, hi0 + p)), _mm512_max_ps(tlo0, _mm512_maskz_loadu_ps(k, lo0 + p))),
        off);
    const __m512 ih = _mm512_add_ps(
        _mm512_sub_ps(_mm512_min_ps(thi1, _mm512_maskz_loadu_ps(k, hi1 + p)), _mm512_max_ps(tlo1, _mm512_maskz_loadu_ps(k, lo1 + p))),
        off);
    const __mmask16 overlap = _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(iw, zero, _CMP_GT_OQ) & k, ih, zero, _CMP_GT_OQ);
    const __m512 s_old = _mm512_maskz_loadu_ps(k, score + p);
    // No branch on "any lane overlaps": which vectors overlap the selected box is random, and the
    // mispredictions cost more than the IoU of a vector that needs none.
    const __m512 inter = _mm512_mul_ps(iw, ih);
    const __m512 uni = _mm512_sub_ps(_mm512_add_ps(tarea, _mm512_maskz_loadu_ps(k, area + p)), inter);
    if (method == Method::kGaussian) {
      // Overlapping rows go (branch-free) to the near list with their IoU's numerator and
      // denominator; GaussianNear divides and decays them. The others keep their scores (weight
      // exactly 1) and all survive.
      const __m512i rows = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(p)),
                                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
      _mm512_storeu_ps(near_inter + *near_n, _mm512_maskz_compress_ps(overlap, inter));
      _mm512_storeu_ps(near_union + *near_n, _mm512_maskz_compress_ps(overlap, uni));
      _mm512_storeu_si512(near_row + *near_n, _mm512_maskz_compress_epi32(overlap, rows));
      *near_n += __builtin_popcount(static_cast<unsigned>(overlap));
      m = _mm512_mask_max_ps(m, k & ~overlap, m, s_old);
      return;
    }
    const __m512 iou = _mm512_maskz_div_ps(overlap, inter, uni);
    const __m512 w = method == Method::kLinear
                         ? _mm512_mask_blend_ps(_mm512_cmp_ps_mask(iou, nt, _CMP_GT_OQ), one, _mm512_sub_ps(one, iou))
                         : _mm512_mask_blend_ps(_mm512_cmp_ps_mask(iou, nt, _CMP_GT_OQ), one, zero);  // hard
    const __m512 s = _mm512_mul_ps(s_old, w);
    _mm512_mask_storeu_ps(score + p, k, s);
    const __mmask16 alive = _mm512_mask_cmp_ps_mask(k, s, thr, _CMP_GE_OQ);
    dead += __builtin_popcount(static_cast<unsigned>(k & ~alive));
    m = _mm512_mask_max_ps(m, alive, m, s);
  }
};

// exp(t) in double for 8 lanes, within a few ulp (Taylor degree 12 on |r| <= ln2/2 after
// t = n*ln2 + r). Only used where the float32 rounding of the result is unambiguous (below).
SD_TARGET_AVX512 inline __m512d ExpPd(__m512d t) {
  t = _mm512_max_pd(_mm512_set1_pd(-800.0), t);  // exp(-800) is 0 in double; NaN stays NaN (2nd operand)
  const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(t, _mm512_set1_pd(1.4426950408889634)), _MM_FROUND_TO_NEAREST_INT);
  __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), t);
  r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);
  static constexpr double kInvFact[] = {1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320,
                                        1.0 / 5040,      1.0 / 720,      1.0 / 120,     1.0 / 24,     1.0 / 6,
                                        1.0 / 2,         1.0,            1.0};
  __m512d p = _mm512_set1_pd(kInvFact[0]);
  for (int j = 1; j < 13; ++j) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kInvFact[j]));
  return _mm512_scalef_pd(p, n);
}

// Decays the rows of the near list (gaussian): IoU = inter / union (as the oracle, float32), weight
// float(exp(double(-(IoU*IoU) / sigma))). ExpPd and glibc's exp are both within 2^-50 (relative) of
// the true value, so whenever [y - y*2^-50, y + y*2^-50] rounds to one float32 that float32 is the
// oracle's weight, bit for bit; the (about 2^-26-rare) lanes where it does not use std::exp itself.
SD_TARGET_AVX512 int64_t GaussianNearAvx512(Rows& r, int64_t near_n, const Params& prm, float* best) {
  const __m256 sigma = _mm256_set1_ps(prm.sigma), thr = _mm256_set1_ps(prm.score_threshold);
  const __m512d band = _mm512_set1_pd(0x1p-50);
  float* score = r.score.data();
  __m256 m = _mm256_set1_ps(*best);
  int64_t dead = 0, j = 0;
  for (; j + 8 <= near_n; j += 8) {
    const __m256 iou = _mm256_div_ps(_mm256_loadu_ps(&r.near_inter[j]), _mm256_loadu_ps(&r.near_union[j]));
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(iou, iou)), sigma);
    const __m512d y = ExpPd(_mm512_cvtps_pd(t));
    const __m512d dy = _mm512_mul_pd(_mm512_abs_pd(y), band);
    __m256 w = _mm512_cvtpd_ps(y);
    const __mmask8 unsure = _mm256_cmp_ps_mask(_mm512_cvtpd_ps(_mm512_sub_pd(y, dy)), _mm512_cvtpd_ps(_mm512_add_pd(y, dy)),
                                               _CMP_NEQ_OQ);
    if (unsure != 0) {
      alignas(32) float iou_lanes[8], w_lanes[8];
      _mm256_store_ps(iou_lanes, iou);
      _mm256_store_ps(w_lanes, w);
      for (unsigned bits = unsure; bits != 0; bits &= bits - 1) {
        const int lane = __builtin_ctz(bits);
        w_lanes[lane] = GaussianWeight(iou_lanes[lane], prm.sigma);
      }
      w = _mm256_load_ps(w_lanes);
    }
    const __m256i rows = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&r.near_row[j]));
    const __m256 s = _mm256_mul_ps(_mm256_i32gather_ps(score, rows, 4), w);
    _mm256_i32scatter_ps(score, rows, s, 4);  // rows are distinct
    const __mmask8 alive = _mm256_cmp_ps_mask(s, thr, _CMP_GE_OQ);
    dead += 8 - __builtin_popcount(static_cast<unsigned>(alive));
    m = _mm256_mask_max_ps(m, alive, m, s);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float mx = lanes[0];
  for (float v : lanes) mx = std::max(mx, v);
  for (; j < near_n; ++j) {
    const int32_t row = r.near_row[j];
    const float iou = r.near_inter[j] / r.near_union[j];
    const float sc = score[row] * GaussianWeight(iou, prm.sigma);
    score[row] = sc;
    if (sc >= prm.score_threshold) mx = std::max(mx, sc);
    else ++dead;
  }
  *best = mx;
  return dead;
}

SD_TARGET_AVX512 int64_t DecayAvx512(const Selected& t, Rows& r, int64_t begin, int64_t end, const Params& prm,
                                     float* best) {
  int64_t near_n = 0;
  const Avx512Decay d{_mm512_set1_ps(t.lo0), _mm512_set1_ps(t.hi0), _mm512_set1_ps(t.lo1), _mm512_set1_ps(t.hi1),
                      _mm512_set1_ps(t.area), _mm512_set1_ps(prm.offset), _mm512_set1_ps(prm.iou_threshold),
                      _mm512_set1_ps(prm.score_threshold), r.lo0.data(), r.hi0.data(), r.lo1.data(), r.hi1.data(),
                      r.area.data(), r.score.data(), r.near_inter.data(), r.near_union.data(), r.near_row.data(), &near_n,
                      prm.method};
  __m512 m = _mm512_set1_ps(*best);
  int64_t dead = 0;
  int64_t p = begin;
  for (; p + 16 <= end; p += 16) d.Step(p, 0xFFFF, m, dead);
  if (p < end) d.Step(p, static_cast<__mmask16>((1u << (end - p)) - 1), m, dead);
  // (not _mm512_reduce_max_ps: GCC 12's version warns about an uninitialised temporary)
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, m);
  float mx = lanes[0];
  for (float v : lanes) mx = std::max(mx, v);
  *best = mx;
  if (prm.method == Method::kGaussian) dead += GaussianNearAvx512(r, near_n, prm, best);
  return dead;
}

SD_TARGET_AVX512 int64_t FirstDeadAvx512(const float* s, int64_t begin, int64_t end, float threshold) {
  const __m512 v = _mm512_set1_ps(threshold);
  for (int64_t p = begin; p < end; p += 16) {
    const __mmask16 k = static_cast<__mmask16>(end - p >= 16 ? 0xFFFF : (1u << (end - p)) - 1);
    const __mmask16 dead = k & ~_mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, s + p), v, _CMP_GE_OQ);
    if (dead != 0) return p + __builtin_ctz(dead);
  }
  return end;
}

SD_TARGET_AVX512 int64_t FirstEqualAvx512(const float* s, int64_t begin, int64_t end, float value) {
  const __m512 v = _mm512_set1_ps(value);
  for (int64_t p = begin; p < end; p += 16) {
    const __mmask16 k = static_cast<__mmask16>(end - p >= 16 ? 0xFFFF : (1u << (end - p)) - 1);
    const __mmask16 eq = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, s + p), v, _CMP_EQ_OQ);
    if (eq != 0) return p + __builtin_ctz(eq);
  }
  return end;
}

// ---- AVX2 ------------------------------------------------------------------------------------

SD_TARGET_AVX2 int64_t DecayAvx2(const Selected& t, Rows& r, int64_t begin, int64_t end, const Params& prm,
                                 float* best) {
  const __m256 tlo0 = _mm256_set1_ps(t.lo0), thi0 = _mm256_set1_ps(t.hi0);
  const __m256 tlo1 = _mm256_set1_ps(t.lo1), thi1 = _mm256_set1_ps(t.hi1);
  const __m256 tarea = _mm256_set1_ps(t.area), off = _mm256_set1_ps(prm.offset);
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
  const __m256 nt = _mm256_set1_ps(prm.iou_threshold), thr = _mm256_set1_ps(prm.score_threshold);
  // Lanes start at -inf; a lane's max only takes surviving scores (the blend below).
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t dead = 0;
  int64_t p = begin;
  for (; p + 8 <= end; p += 8) {
    const __m256 iw = _mm256_add_ps(
        _mm256_sub_ps(_mm256_min_ps(thi0, _mm256_loadu_ps(&r.hi0[p])), _mm256_max_ps(tlo0, _mm256_loadu_ps(&r.lo0[p]))),
        off);
    const __m256 ih = _mm256_add_ps(
        _mm256_sub_ps(_mm256_min_ps(thi1, _mm256_loadu_ps(&r.hi1[p])), _mm256_max_ps(tlo1, _mm256_loadu_ps(&r.lo1[p]))),
        off);
    const __m256 overlap = _mm256_and_ps(_mm256_cmp_ps(iw, zero, _CMP_GT_OQ), _mm256_cmp_ps(ih, zero, _CMP_GT_OQ));
    const __m256 s_old = _mm256_loadu_ps(&r.score[p]);
    if (_mm256_movemask_ps(overlap) == 0 && prm.skip_disjoint) {
      m = _mm256_max_ps(m, s_old);  // unchanged scores: all >= threshold already
      continue;
    }
    const __m256 inter = _mm256_mul_ps(iw, ih);
    const __m256 uni = _mm256_sub_ps(_mm256_add_ps(tarea, _mm256_loadu_ps(&r.area[p])), inter);
    // Non-overlapping lanes may divide 0 by 0 here; the and-mask makes their IoU exactly 0.
    const __m256 iou = _mm256_and_ps(overlap, _mm256_div_ps(inter, uni));
    __m256 w;
    if (prm.method == Method::kLinear) {
      w = _mm256_blendv_ps(one, _mm256_sub_ps(one, iou), _mm256_cmp_ps(iou, nt, _CMP_GT_OQ));
    } else if (prm.method == Method::kHard) {
      w = _mm256_blendv_ps(one, zero, _mm256_cmp_ps(iou, nt, _CMP_GT_OQ));
    } else {
      alignas(32) float iou_lanes[8], w_lanes[8];
      _mm256_store_ps(iou_lanes, iou);
      _mm256_store_ps(w_lanes, one);
      for (unsigned bits = _mm256_movemask_ps(_mm256_cmp_ps(iou, zero, _CMP_NEQ_UQ)); bits != 0; bits &= bits - 1) {
        const int lane = __builtin_ctz(bits);
        w_lanes[lane] = GaussianWeight(iou_lanes[lane], prm.sigma);
      }
      w = _mm256_load_ps(w_lanes);
    }
    const __m256 s = _mm256_mul_ps(s_old, w);
    _mm256_storeu_ps(&r.score[p], s);
    const __m256 alive = _mm256_cmp_ps(s, thr, _CMP_GE_OQ);
    dead += 8 - __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(alive)));
    m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()), s, alive));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float mx = *best;
  for (float v : lanes) mx = std::max(mx, v);
  *best = mx;
  return dead + DecayPortable(t, r, p, end, prm, best);
}

SD_TARGET_AVX2 int64_t FirstDeadAvx2(const float* s, int64_t begin, int64_t end, float threshold) {
  const __m256 v = _mm256_set1_ps(threshold);
  int64_t p = begin;
  for (; p + 8 <= end; p += 8) {
    const int alive = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + p), v, _CMP_GE_OQ));
    if (alive != 0xFF) return p + __builtin_ctz(static_cast<unsigned>(~alive & 0xFF));
  }
  return FirstDeadPortable(s, p, end, threshold);
}

SD_TARGET_AVX2 int64_t FirstEqualAvx2(const float* s, int64_t begin, int64_t end, float value) {
  const __m256 v = _mm256_set1_ps(value);
  int64_t p = begin;
  for (; p + 8 <= end; p += 8) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + p), v, _CMP_EQ_OQ));
    if (eq != 0) return p + __builtin_ctz(static_cast<unsigned>(eq));
  }
  return FirstEqualPortable(s, p, end, value);
}

#endif  // x86-64

// ---- the loop -------------------------------------------------------------------------------------

struct Pick {
  int64_t index;
  float score;
};

using DecayFn = int64_t (*)(const Selected&, Rows&, int64_t, int64_t, const Params&, float*);
using FirstEqualFn = int64_t (*)(const float*, int64_t, int64_t, float);  // also FirstDead*

struct Isafns {
  DecayFn decay;
  FirstEqualFn first_equal, first_dead;
};

// One (batch, class). `ext` holds the batch's boxes as [N][5] (lo0, hi0, lo1, hi1, area); `rows` is
// the task's scratch (capacity N).
void SoftNmsOne(const float* ext, const float* scores, int64_t num_boxes, const Params& prm, const Isafns& fn,
                Rows& rows, std::vector<Pick>& out) {
  int64_t n = 0;
  float best = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < num_boxes; ++j) {
    const float s = scores[j];
    if (!(s >= prm.score_threshold)) continue;  // NaN is never >=: dropped
    const float* e = ext + j * 5;
    rows.lo0[n] = e[0], rows.hi0[n] = e[1], rows.lo1[n] = e[2], rows.hi1[n] = e[3], rows.area[n] = e[4];
    rows.score[n] = s;
    rows.index[n] = j;
    best = std::max(best, s);
    ++n;
  }
  const int64_t limit = prm.max_output > 0 ? std::min(prm.max_output, n) : n;
  for (int64_t i = 0; i < n && i < limit; ++i) {
    // best = max over rows [i, n); its first row is the selection (ties: earlier working row).
    const int64_t m = fn.first_equal(rows.score.data(), i, n, best);
    if (m != i) rows.Swap(i, m);
    out.push_back({rows.index[i], rows.score[i]});
    const Selected t{rows.lo0[i], rows.hi0[i], rows.lo1[i], rows.hi1[i], rows.area[i]};
    best = -std::numeric_limits<float>::infinity();
    const int64_t dead = fn.decay(t, rows, i + 1, n, prm, &best);
    if (dead == 0) continue;
    // The original's removal: the last working row moves into a dead slot, which is looked at again
    // (so dead rows at the tail are dropped first, then the last live row fills the slot).
    const float* s = rows.score.data();
    for (int64_t p = fn.first_dead(s, i + 1, n, prm.score_threshold); p < n;) {
      while (n - 1 > p && !(s[n - 1] >= prm.score_threshold)) --n;
      rows.Move(n - 1, p);  // n - 1 == p: the dead row is the last one and just goes
      --n;
      p = fn.first_dead(s, p + 1, n, prm.score_threshold);
    }
  }
}

// Boxes of one batch -> [N][5] (lo0, hi0, lo1, hi1, area); a box with a NaN corner overlaps nothing.
template <class T>
void Extents(const T* boxes, int64_t num_boxes, bool center, float off, float* ext) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < num_boxes; ++j) {
    const float a0 = ToFloat(boxes[j * 4 + 0]), a1 = ToFloat(boxes[j * 4 + 1]);
    const float a2 = ToFloat(boxes[j * 4 + 2]), a3 = ToFloat(boxes[j * 4 + 3]);
    float p0 = a0, q0 = a2, p1 = a1, q1 = a3;
    if (center) {
      p0 = a0 - a2 * 0.5f, q0 = a0 + a2 * 0.5f, p1 = a1 - a3 * 0.5f, q1 = a1 + a3 * 0.5f;
    }
    float* e = ext + j * 5;
    if (std::isnan(p0) || std::isnan(q0) || std::isnan(p1) || std::isnan(q1)) {
      e[0] = kInf, e[1] = -kInf, e[2] = kInf, e[3] = -kInf;
    } else {
      e[0] = std::min(p0, q0), e[1] = std::max(p0, q0), e[2] = std::min(p1, q1), e[3] = std::max(p1, q1);
    }
    e[4] = ((e[1] - e[0]) + off) * ((e[3] - e[2]) + off);
  }
}

template <class T>
float ScalarOr(const Input<T>& in, float fallback) {
  return in.present ? ToFloat(in.data[0]) : fallback;
}

struct SoftNmsKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {
      {Elem::kT}, {Elem::kT}, {Elem::kInt64, true}, {Elem::kFloat, true}, {Elem::kFloat, true}};
  static constexpr Port kOutputs[] = {{Elem::kInt64}, {Elem::kT}};

  std::string method;
  float sigma;
  int64_t center_point_box, coordinate_offset;
  Isa isa;

  explicit SoftNmsKernel(const Attrs& attrs)
      : method(attrs.String("method", "linear")),
        sigma(attrs.Float("sigma", 0.5f)),
        center_point_box(attrs.Int("center_point_box", 0)),
        coordinate_offset(attrs.Int("coordinate_offset", 0)),
        isa(SelectIsa()) {}

  // Same rules, order and words as validate() in softdeploy/ops/soft_nms.py.
  Method Validate(const std::vector<int64_t>& boxes, const std::vector<int64_t>& scores) const {
    Method m = Method::kLinear;
    if (method == "linear") m = Method::kLinear;
    else if (method == "gaussian") m = Method::kGaussian;
    else if (method == "hard") m = Method::kHard;
    else Fail(kOp, "method '", method, "' is not supported (rule: method is one of 'linear', 'gaussian', 'hard')");
    if (!(sigma > 0.0f)) Fail(kOp, "sigma ", sigma, " must be > 0 (rule: sigma > 0)");
    if (center_point_box != 0 && center_point_box != 1)
      Fail(kOp, "center_point_box ", center_point_box, " is not supported (rule: center_point_box is 0 or 1)");
    if (coordinate_offset != 0 && coordinate_offset != 1)
      Fail(kOp, "coordinate_offset ", coordinate_offset, " is not supported (rule: coordinate_offset is 0 or 1)");
    if (boxes.size() != 3 || boxes[2] != 4)
      Fail(kOp, "Boxes shape ", ShapeStr(boxes), " is not [B, N, 4] (rule: Boxes is [num_batches, num_boxes, 4])");
    if (scores.size() != 3)
      Fail(kOp, "Scores shape ", ShapeStr(scores),
           " is not [B, C, N] (rule: Scores is [num_batches, num_classes, num_boxes])");
    if (scores[0] != boxes[0] || scores[2] != boxes[1])
      Fail(kOp, "Scores shape ", ShapeStr(scores), " does not match Boxes shape ", ShapeStr(boxes),
           " (rule: Scores is [B, C, N] for Boxes [B, N, 4])");
    return m;
  }

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> boxes = GetInput<T>(ctx, 0);
    const Input<T> scores = GetInput<T>(ctx, 1);
    const Input<int64_t> max_out = GetInput<int64_t>(ctx, 2);
    const Input<float> iou = GetInput<float>(ctx, 3);
    const Input<float> score_thr = GetInput<float>(ctx, 4);
    Params prm;
    prm.method = Validate(boxes.shape, scores.shape);
    const char* names[] = {"MaxOutputBoxesPerClass", "IouThreshold", "ScoreThreshold"};
    const std::vector<int64_t>* shapes[] = {&max_out.shape, &iou.shape, &score_thr.shape};
    const bool present[] = {max_out.present, iou.present, score_thr.present};
    for (int k = 0; k < 3; ++k) {
      if (present[k] && NumElements(*shapes[k]) != 1)
        Fail(kOp, names[k], " has shape ", ShapeStr(*shapes[k]), " (rule: the optional inputs hold one value each)");
    }
    prm.max_output = max_out.present ? max_out.data[0] : 0;
    prm.iou_threshold = ScalarOr(iou, 0.3f);
    prm.score_threshold = ScalarOr(score_thr, 0.001f);
    prm.sigma = sigma;
    prm.offset = static_cast<float>(coordinate_offset);
    prm.skip_disjoint = Weight(0.0f, prm) == 1.0f;

    const int64_t num_batches = boxes.shape[0], num_boxes = boxes.shape[1], num_classes = scores.shape[1];
    // rows are addressed as int32 in the SIMD passes (2^31 boxes would be 32 GiB of Boxes per batch)
    if (num_boxes > std::numeric_limits<int32_t>::max())
      Fail(kOp, "Boxes holds ", num_boxes, " boxes per batch (kernel limit: 2147483647)");
    std::vector<float> ext(static_cast<size_t>(num_batches * num_boxes * 5));
    for (int64_t b = 0; b < num_batches; ++b)
      Extents(boxes.data + b * num_boxes * 4, num_boxes, center_point_box == 1, prm.offset, &ext[b * num_boxes * 5]);

    Isafns fn{DecayPortable, FirstEqualPortable, FirstDeadPortable};
#if defined(__x86_64__) || defined(_M_X64)
    if (isa == Isa::kAvx512) fn = {DecayAvx512, FirstEqualAvx512, FirstDeadAvx512};
    else if (isa == Isa::kAvx2) fn = {DecayAvx2, FirstEqualAvx2, FirstDeadAvx2};
#endif
    const int64_t pairs = num_batches * num_classes;
    std::vector<std::vector<Pick>> picks(static_cast<size_t>(pairs));
    // Cost of one pair ~ N^2/2 IoUs in the worst case; NumTasks keeps tasks >= its grain.
    const size_t tasks = NumTasks(pairs, num_boxes * num_boxes / 2 + 1);
    ParallelFor(ctx, tasks, [&](size_t task) {
      int64_t p0, p1;
      TaskRange(task, tasks, pairs, &p0, &p1);
      Rows rows;
      rows.Resize(static_cast<size_t>(num_boxes));
      std::vector<float> s32(static_cast<size_t>(num_boxes));
      for (int64_t pair = p0; pair < p1; ++pair) {
        const int64_t b = pair / num_classes;
        const T* s = scores.data + pair * num_boxes;
        for (int64_t j = 0; j < num_boxes; ++j) s32[j] = ToFloat(s[j]);
        SoftNmsOne(&ext[b * num_boxes * 5], s32.data(), num_boxes, prm, fn, rows, picks[pair]);
      }
    });

    int64_t total = 0;
    for (const auto& p : picks) total += static_cast<int64_t>(p.size());
    int64_t* out_rows = AllocOutput<int64_t>(ctx, 0, {total, 3});
    T* out_scores = AllocOutput<T>(ctx, 1, {total});
    int64_t k = 0;
    for (int64_t pair = 0; pair < pairs; ++pair) {
      for (const Pick& p : picks[pair]) {
        out_rows[k * 3 + 0] = pair / num_classes;
        out_rows[k * 3 + 1] = pair % num_classes;
        out_rows[k * 3 + 2] = p.index;
        out_scores[k] = FromFloat<T>(p.score);
        ++k;
      }
    }
  }
};

}  // namespace

SD_REGISTER_KERNEL(SoftNMS, SoftNmsKernel)

}  // namespace sd
