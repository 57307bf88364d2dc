// SoftmaxTopK -- fused softmax + top-k (Milakov & Gimelshein 2018, arXiv 1805.02867, Algorithm 4).
//
//   z = x / temperature
//   Values, Indices = TopK(Softmax(z), k)      (descending; equal logits -> lower index first)
//   LogSumExp       = m + log sum_j exp(z_j - m)
//
// Python half, the contract, the ranking rule for NaN/+inf/-inf rows and the float64 oracle:
// softdeploy/ops/softmax_topk.py; docs/ops/SoftmaxTopK.md.
//
// One read of x per row, never a probability row. Two designs share the entry points and the
// final emit (values: exp((x_i - M)/T) / D for the k winners only, in double):
//  * AVX-512 (RowAvx512, the fast path; described at its section): one pass per row -- a candidate
//    buffer filled by compress and cut back exactly, and the normaliser against ONE reference per
//    row with a table-based exp, about 11 vector ops per 16 entries.
//  * AVX2 (ops/softmax_topk_kernels.h, written over the vector traits and compiled in its own
//    translation unit, ops/softmax_topk_avx2.cc): the same one-pass design with an L-entry table
//    (L = 8 lanes) in one register, a degree-3 polynomial, and scalar appends of the (rare) candidates
//    where AVX-512 compresses; the cut is an nth_element by the contract's order.
//  * portable: RowGeneric, in double, with a heap of the k best (logit, index) pairs.
//
// What must stay true:
//  * The fast variants (AVX-512, AVX2) handle rows of finite and -inf entries. A NaN or +inf entry is
//    always a candidate (the compare is NLE_UQ: NaN passes), and the candidate path hands the row to
//    RowGeneric, which implements every special row of the contract in double. So does a row whose
//    scaled logits leave the supported range (tiny temperatures, huge logits).
//  * -inf entries contribute 0 in RowGeneric; in the fast variants less than 2^-120 of the row's
//    largest term each (they are clamped there), far below float resolution.
//  * Rows are independent: threads split rows, never a row; results do not depend on the thread
//    count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/kernel.h"
#include "common/simd_math.h"
#include "softmax_topk_contract.h"
#include "softmax_topk_row.h"

namespace sd {
namespace {

constexpr const char* kOp = "SoftmaxTopK";

// ---- selection ----------------------------------------------------------------------------------

struct Entry {
  float value;
  int64_t index;
};

// The contract's ranking: NaN above everything, then larger value, then lower index.
struct RanksAbove {
  bool operator()(const Entry& a, const Entry& b) const {
    const bool an = std::isnan(a.value), bn = std::isnan(b.value);
    if (an != bn) return an;
    if (!an && a.value != b.value) return a.value > b.value;
    return a.index < b.index;
  }
};

// The same order for entries that are never NaN (the fast variants' candidates).
inline bool RanksAboveNoNan(const Entry& a, const Entry& b) {
  return a.value != b.value ? a.value > b.value : a.index < b.index;
}

// The k best entries seen so far, as a heap whose root is the worst of them (every parent ranks
// below its children).
class Selection {
 public:
  explicit Selection(int64_t k) : k_(static_cast<size_t>(k)) { heap_.reserve(k_); }
  void Reset() { heap_.clear(); }
  bool full() const { return heap_.size() == k_; }
  // Offers entry (v, i), any value; i must be larger than every index offered before.
  void Offer(float v, int64_t i) {
    const Entry e{v, i};
    if (!full()) {
      heap_.push_back(e);
      std::push_heap(heap_.begin(), heap_.end(), RanksAbove());
    } else if (RanksAbove()(e, heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), RanksAbove());
      heap_.back() = e;
      std::push_heap(heap_.begin(), heap_.end(), RanksAbove());
    }
  }
  // The kept entries, best first (destroys the heap).
  const std::vector<Entry>& Sorted() {
    std::sort(heap_.begin(), heap_.end(), RanksAbove());
    return heap_;
  }

 private:
  size_t k_;
  std::vector<Entry> heap_;
};

// One row's results, contiguous, in float; the caller scatters (and converts) them.
struct RowOut {
  float* values;
  int64_t* indices;
  float lse;
};

// Values and LogSumExp of a row with finite maximum m (of x) and D = sum_j exp((x_j - m) / T).
void EmitFinite(const std::vector<Entry>& top, float m, double d, double t, RowOut& out) {
  const double inv_d = 1.0 / d;
  for (size_t i = 0; i < top.size(); ++i) {
    out.values[i] = static_cast<float>(std::exp((static_cast<double>(top[i].value) - m) / t) * inv_d);
    out.indices[i] = top[i].index;
  }
  out.lse = static_cast<float>(static_cast<double>(m) / t + std::log(d));
}

// A row without a finite maximum (NaN, +inf or only -inf): NaN values, indices by the ranking rule.
void EmitSpecial(Selection& sel, float lse, RowOut& out) {
  const std::vector<Entry>& top = sel.Sorted();
  for (size_t i = 0; i < top.size(); ++i) {
    out.values[i] = NAN;
    out.indices[i] = top[i].index;
  }
  out.lse = lse;
}

// ---- portable, and every special row -------------------------------------------------------------

// The online normalizer in double, one exp per element, fused with the selection; handles every row
// of the contract (NaN, +inf, all -inf, scaled logits beyond the float range).
void RowGeneric(const float* x, int64_t n, double t, Selection& sel, RowOut& out) {
  sel.Reset();
  bool nan = false, pos_inf = false;
  double m = -INFINITY, d = 0.0;  // running max and sum of exp(z - m), z = x / t
  for (int64_t j = 0; j < n; ++j) {
    sel.Offer(x[j], j);
    const double z = static_cast<double>(x[j]) / t;
    if (std::isnan(z)) {
      nan = true;
    } else if (z == INFINITY) {
      pos_inf = true;
    } else if (z > m) {
      d = d * std::exp(m - z) + 1.0;  // exp(-inf) = 0 when m was -inf
      m = z;
    } else if (z > -INFINITY) {
      d += std::exp(z - m);
    }
  }
  if (nan) return EmitSpecial(sel, NAN, out);
  if (pos_inf) return EmitSpecial(sel, INFINITY, out);
  if (m == -INFINITY) return EmitSpecial(sel, -INFINITY, out);
  const std::vector<Entry>& top = sel.Sorted();
  for (size_t i = 0; i < top.size(); ++i) {
    out.values[i] = static_cast<float>(std::exp(static_cast<double>(top[i].value) / t - m) / d);
    out.indices[i] = top[i].index;
  }
  out.lse = static_cast<float>(m + std::log(d));
}

// ---- AVX-512 ------------------------------------------------------------------------------------
//
// One pass per row, no probability row, no per-element branch:
//  * normaliser: d = sum_j 2^(x_j*s - C) against ONE reference C per row, a multiple of 1/32 taken
//    from a row maximum seen so far (the first 64 entries, raised when a candidate exceeds it by more
//    than kRaiseAt, so every term stays below 2^kRaiseAt). Candidates are tested before their vector's
//    exps are taken, and every entry that could raise C is a candidate (it beats the running maximum,
//    which is >= the threshold), so C is never stale for an exp. Entries below C - 120 are clamped
//    there: each adds < 2^-120 to a sum that is >= 1 (it holds the term of the entry that set C).
//  * exp: 2^u = 2^n * 2^(j/32) * 2^r, u = n + j/32 + r, |r| <= 1/64, from ONE fma:
//    t = x*s + (kMagic - C) lands in [2^18, 2^19) where the float grid is 1/32, so the bits of t are
//    bits(kMagic) + round(32u) = ... + 32n + j. 2^(j/32) comes from a 32-entry table in two registers
//    (vpermt2ps), 2^n is added to its exponent field as the integer (bits(t) << 18) -- the table
//    entries carry -(j << 18) to cancel the j bits that shift brings along -- and 2^r is a degree-2
//    polynomial (relative error 5.3e-8 on [-1/64, 1/64]). r = x*s - (t - K) is exact up to the fma's
//    one rounding because t - K is exact (Sterbenz). 11 vector ops per 16 entries, the threshold
//    compare included; Zen 4 issues about two 512-bit ops per cycle.
//    That needs |C| < 2^16 (K exact); rows with larger scaled logits take kWide: u = x*s - C first,
//    then the same steps (one op more), for |C| < 2^20.
//  * selection: entries above the threshold go, in index order, into a candidate buffer by compress
//    (values and int32 indices); when it holds more than k + kSlack, KeepTopK cuts it back to exactly the
//    k best and raises the threshold to the k-th value. The cut is exact (lower index first among
//    equal values, the buffer being in index order), so a later entry equal to the threshold never
//    enters and ties keep the lower index. Extra candidates are harmless: the cut ranks them exactly.
// A candidate that is NaN or +inf sends the row to RowGeneric; so does a row whose first 64 entries
// hold no finite value and that is all -inf, or one whose scaled logits leave the supported range.

constexpr float kMagic = 0x1.8p18f;  // 1.5 * 2^18: the float grid is 1/32 on [2^18, 2^19)
constexpr float kQ1 = 0.6931573152542114f, kQ2 = 0.24022649228572845f;  // 2^r ~ 1 + r*(kQ1 + r*kQ2)
constexpr float kRaiseAt = 64.0f;   // C is raised when a candidate's x*s - C exceeds this
constexpr float kClampBelow = 120.0f;  // entries are clamped to x*s - C >= -kClampBelow (~)
// The candidate buffer holds k + kSlack (+64 for the last group of compresses) before a cut. Small:
// the threshold then rises soon after each k-th value is passed, which beats rarer, larger cuts
// (bench/micro/softmax_topk_rows.cc, k = 50, V = 32000: k + 16 ... k + 64 alike, 4k + 64 slower).
constexpr int64_t kSlack = 32;
constexpr int64_t kFlush = 512;     // entries per float partial sum before it is added in double

// bits(2^(j/32)) - (j << 18), j = 0..31: the term's 2^n is added as (bits(t) << 18), which also
// carries j << 18 (see above).
struct Exp2Table {
  alignas(64) int32_t bits[32];
  Exp2Table() {
    for (int j = 0; j < 32; ++j) {
      const float v = static_cast<float>(std::exp2(j / 32.0));
      int32_t b;
      std::memcpy(&b, &v, sizeof b);
      bits[j] = b - (j << 18);
    }
  }
};

// A row's candidates for the AVX-512 variant, in index order; reused across rows.
struct CandidateBuffer {
  explicit CandidateBuffer(int64_t k)
      : k(k),
        cap(k + kSlack),
        // Up to 4 appends of 16 between checks, and KeepTopK reads whole vectors: cap + 64 + 15.
        values(static_cast<size_t>(cap + 80)),
        indices(static_cast<size_t>(cap + 80)),
        keys(static_cast<size_t>(cap + 80)) {
    top.reserve(static_cast<size_t>(k));
  }
  int64_t k, cap, count = 0;
  std::vector<float> values;
  std::vector<int32_t> indices;
  std::vector<int32_t> keys;  // scratch of KeepTopK
  std::vector<Entry> top;     // the final k, best first
};

// An int32 whose order is the float order of the (non-NaN) value: -0 is made +0 first, so equal
// values get equal keys. The map is its own inverse.
SD_TARGET_AVX512 inline __m512i OrderKey(__m512 v) {
  const __m512i b = _mm512_castps_si512(_mm512_add_ps(v, _mm512_setzero_ps()));
  return _mm512_xor_si512(b, _mm512_and_si512(_mm512_srai_epi32(b, 31), _mm512_set1_epi32(0x7FFFFFFF)));
}
// Lane minimum / maximum (GCC 12's _mm512_reduce_min_epi32 warns about its own header).
SD_TARGET_AVX512 inline int32_t LaneMin(__m512i v) {
  alignas(64) int32_t l[16];
  _mm512_store_si512(l, v);
  return *std::min_element(l, l + 16);
}
SD_TARGET_AVX512 inline int32_t LaneMax(__m512i v) {
  alignas(64) int32_t l[16];
  _mm512_store_si512(l, v);
  return *std::max_element(l, l + 16);
}
inline float FromOrderKey(int32_t key) {
  const int32_t b = key ^ ((key >> 31) & 0x7FFFFFFF);
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// Cuts the buffer (count > k entries, no NaN or +inf) back to its k best in index order; returns the
// k-th best value, the new threshold. The k-th key is found by bisection over the key range with
// vector counts (<= 32 rounds of count/16 compares), stopping early when a bound leaves exactly k.
SD_TARGET_AVX512 __attribute__((noinline)) float KeepTopK(CandidateBuffer& b) {
  const int64_t m = b.count, k = b.k, vecs = (m + 15) / 16;
  float* vals = b.values.data();
  int32_t* idx = b.indices.data();
  int32_t* keys = b.keys.data();
  __m512i kmin = _mm512_set1_epi32(INT32_MAX), kmax = _mm512_set1_epi32(INT32_MIN);
  for (int64_t v = 0; v < vecs; ++v) {
    const int64_t left = m - 16 * v;
    const __mmask16 valid = simd::TailMask16(left);
    const __m512i key = OrderKey(_mm512_maskz_loadu_ps(valid, vals + 16 * v));
    kmin = _mm512_mask_min_epi32(kmin, valid, kmin, key);
    kmax = _mm512_mask_max_epi32(kmax, valid, kmax, key);
    _mm512_storeu_si512(keys + 16 * v, _mm512_mask_mov_epi32(_mm512_set1_epi32(INT32_MIN), valid, key));
  }
  // Padding keys are INT32_MIN, below every real key (the key of -inf is above it): never counted.
  auto count_at_least = [&](int32_t x) SD_TARGET_AVX512 {
    const __m512i vx = _mm512_set1_epi32(x);
    int64_t c = 0;
    for (int64_t v = 0; v < vecs; ++v)
      c += __builtin_popcount(_mm512_cmpge_epi32_mask(_mm512_loadu_si512(keys + 16 * v), vx));
    return c;
  };
  // Invariant: count(key >= lo) >= k > count(key >= hi).
  int64_t lo = LaneMin(kmin), hi = static_cast<int64_t>(LaneMax(kmax)) + 1;
  int64_t cut = 0;  // when nonzero-found: keep exactly the keys >= cut
  bool exact = false;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    const int64_t c = count_at_least(static_cast<int32_t>(mid));
    if (c == k) {
      cut = mid;
      exact = true;
      break;
    }
    const bool above = c > k;  // branch-free updates: the direction is a coin flip
    lo = above ? mid : lo;
    hi = above ? hi : mid;
  }
  // Not exact: lo is the k-th key; keep all above it and the first `need` equal to it.
  const int32_t kth = static_cast<int32_t>(exact ? cut : lo);
  int64_t need = exact ? 0 : k - count_at_least(static_cast<int32_t>(lo + 1));
  const __m512i vkth = _mm512_set1_epi32(kth);
  __m512i kept_min = _mm512_set1_epi32(INT32_MAX);
  int64_t w = 0;
  for (int64_t v = 0; v < vecs; ++v) {
    const __m512i key = _mm512_loadu_si512(keys + 16 * v);
    uint32_t keep = exact ? _mm512_cmpge_epi32_mask(key, vkth) : _mm512_cmpgt_epi32_mask(key, vkth);
    if (need > 0) {
      const uint32_t eq = _mm512_cmpeq_epi32_mask(key, vkth);
      for (uint32_t rest = eq; rest != 0 && need > 0; rest &= rest - 1, --need) keep |= rest & (0u - rest);
    }
    const __mmask16 km = static_cast<__mmask16>(keep);
    kept_min = _mm512_mask_min_epi32(kept_min, km, kept_min, key);
    const __m512 vv = _mm512_loadu_ps(vals + 16 * v);
    const __m512i vi = _mm512_loadu_si512(idx + 16 * v);
    // w <= 16 * v: the stores only overwrite entries already loaded.
    _mm512_storeu_ps(vals + w, _mm512_maskz_compress_ps(km, vv));
    _mm512_storeu_si512(idx + w, _mm512_maskz_compress_epi32(km, vi));
    w += __builtin_popcount(keep);
  }
  b.count = w;  // == k
  return FromOrderKey(LaneMin(kept_min));
}

enum class RowResult { kDone, kGeneric, kWide };

// The new reference C for a candidate x_max that would make a term above 2^kRaiseAt; NaN when it
// leaves the range of the variant (the row then goes to the kWide variant or to RowGeneric).
template <bool kWide>
__attribute__((noinline)) float RaisedReference(float x_max, float s) {
  const float c = std::nearbyint(x_max * s * 32.0f) / 32.0f;
  return std::fabs(c) < (kWide ? 0x1p20f : 0x1p16f) ? c : NAN;
}

template <bool kWide>
SD_TARGET_AVX512 RowResult RowAvx512(const float* x, int64_t n, float s, double t, CandidateBuffer& b, RowOut& out) {
  static const Exp2Table table;
  if (n >= (int64_t{1} << 31)) return RowResult::kGeneric;  // int32 indices in the buffer
  b.count = 0;
  // C from the first 64 entries (or the first finite entries after them).
  float m0 = -INFINITY;
  for (int64_t j = 0; j < n && j < 64; ++j) m0 = std::max(m0, x[j]);  // a NaN is skipped: a candidate
  if (m0 == -INFINITY) {  // (a masked row) the first vector holding a finite entry: C only has to be
    // finite, it is raised as larger entries come. (A scalar max over the row cost ~20 us per 32000.)
    int64_t j = 64;
    for (; j < n; j += 16) {
      const __mmask16 valid = n - j >= 16 ? __mmask16(0xFFFF) : simd::TailMask16(n - j);
      const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), valid, x + j);
      const __mmask16 finite = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-INFINITY), _CMP_GT_OQ);  // NaN: no
      if (finite != 0) {
        m0 = _mm512_mask_reduce_max_ps(finite, v);
        break;
      }
    }
  }
  if (!std::isfinite(m0)) return RowResult::kGeneric;  // all -inf (or +inf): RowGeneric's cases

  const __m512 tlo = _mm512_load_ps(reinterpret_cast<const float*>(table.bits));
  const __m512 thi = _mm512_load_ps(reinterpret_cast<const float*>(table.bits + 16));
  const __m512 vs = _mm512_set1_ps(s), q1 = _mm512_set1_ps(kQ1), q2 = _mm512_set1_ps(kQ2), one = _mm512_set1_ps(1.0f);
  const __m512 magic = _mm512_set1_ps(kMagic);
  float c = std::nearbyint(m0 * s * 32.0f) / 32.0f;  // the reference C
  if (!(std::fabs(c) < (kWide ? 0x1p20f : 0x1p16f))) return kWide ? RowResult::kGeneric : RowResult::kWide;
  if (!std::isfinite((c - kClampBelow) / s)) return RowResult::kGeneric;  // huge temperatures
  __m512 thr = _mm512_set1_ps(-INFINITY), vc, vk, xlo;
  auto set_reference = [&](float new_c) SD_TARGET_AVX512 SD_INLINE {
    c = new_c;
    vc = _mm512_set1_ps(c);
    vk = _mm512_set1_ps(kMagic - c);  // exact: C is a multiple of 1/32, |C| < 2^16 (unless kWide)
    xlo = _mm512_set1_ps((c - kClampBelow) / s);
  };
  set_reference(c);
  // acc + 2^(x*s - C); x must not be NaN (max_ps(NaN, xlo) = xlo).
  auto term = [&](__m512 x_v, __m512 acc) SD_TARGET_AVX512 SD_INLINE {
    const __m512 xc = _mm512_max_ps(x_v, xlo);
    __m512 tt, r;
    if constexpr (kWide) {
      const __m512 u = _mm512_fmsub_ps(xc, vs, vc);
      tt = _mm512_add_ps(u, magic);
      r = _mm512_sub_ps(u, _mm512_sub_ps(tt, magic));
    } else {
      tt = _mm512_fmadd_ps(xc, vs, vk);
      r = _mm512_fmsub_ps(xc, vs, _mm512_sub_ps(tt, vk));
    }
    const __m512i tbits = _mm512_castps_si512(tt);
    const __m512i tj = _mm512_castps_si512(_mm512_permutex2var_ps(tlo, tbits, thi));
    const __m512 scaled = _mm512_castsi512_ps(_mm512_add_epi32(tj, _mm512_slli_epi32(tbits, 18)));
    const __m512 p = _mm512_fmadd_ps(_mm512_fmadd_ps(q2, r, q1), r, one);
    return _mm512_fmadd_ps(scaled, p, acc);
  };
  // The lambdas here are forced inline (SD_INLINE): when GCC 12 kept flush() out of line, the address of
  // acc escaped and the hot loop stored all four sums to the stack every 64 entries (4 x 512-bit stores;
  // 3% of the row time at V = 32000).
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  __m512d sum_lo = _mm512_setzero_pd(), sum_hi = sum_lo;  // sum of 2^(x*s - C) per lane, in double
  auto flush = [&]() SD_TARGET_AVX512 SD_INLINE {
    const __m512 part = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    sum_lo = _mm512_add_pd(sum_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(part)));
    sum_hi = _mm512_add_pd(sum_hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(part, 1)));
    for (int a = 0; a < 4; ++a) acc[a] = _mm512_setzero_ps();
  };
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // Candidates are handled per group of up to 4 vectors, before any exp of the group is taken, with
  // one branch into this path and only rarely taken ones inside it: C is raised first if one of them
  // would make a term above 2^kRaiseAt (the sums so far are rescaled), then they are appended to the
  // buffer (a vector without candidates appends nothing), which is cut back when full. In line and
  // call-free except for the rare events, so the hot loop keeps its registers.
  auto raise_reference = [&](__m512 top) SD_TARGET_AVX512 SD_INLINE {
    const float new_c = RaisedReference<kWide>(_mm512_reduce_max_ps(top), s);
    if (std::isnan(new_c)) return false;
    flush();
    const __m512d scale = _mm512_set1_pd(std::exp2(static_cast<double>(c) - new_c));
    sum_lo = _mm512_mul_pd(sum_lo, scale);
    sum_hi = _mm512_mul_pd(sum_hi, scale);
    set_reference(new_c);
    return true;
  };
  // NaN or +inf among the candidates; and the candidates that would raise C, kept in `top`.
  auto special = [&](__m512 v, __mmask16 mask) SD_TARGET_AVX512 SD_INLINE {
    return _mm512_mask_cmp_ps_mask(mask, v, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ);
  };
  auto raising = [&](__m512 v, __mmask16 mask) SD_TARGET_AVX512 SD_INLINE {
    return _mm512_mask_cmp_ps_mask(mask, _mm512_fmsub_ps(v, vs, vc), _mm512_set1_ps(kRaiseAt), _CMP_GT_OQ);
  };
  auto append = [&](__m512 v, int64_t i, __mmask16 mask) SD_TARGET_AVX512 SD_INLINE {
    const __m512i index = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(i)));
    _mm512_storeu_ps(b.values.data() + b.count, _mm512_maskz_compress_ps(mask, v));
    _mm512_storeu_si512(b.indices.data() + b.count, _mm512_maskz_compress_epi32(mask, index));
    b.count += __builtin_popcount(mask);
  };
  const RowResult out_of_range = kWide ? RowResult::kGeneric : RowResult::kWide;
  int64_t i = 0;
  while (i + 64 <= n) {
    const int64_t end = std::min(n & ~int64_t{63}, i + kFlush);
    for (; i < end; i += 64) {
      const __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
      const __m512 v2 = _mm512_loadu_ps(x + i + 32), v3 = _mm512_loadu_ps(x + i + 48);
      const __mmask16 c0 = _mm512_cmp_ps_mask(v0, thr, _CMP_NLE_UQ), c1 = _mm512_cmp_ps_mask(v1, thr, _CMP_NLE_UQ);
      const __mmask16 c2 = _mm512_cmp_ps_mask(v2, thr, _CMP_NLE_UQ), c3 = _mm512_cmp_ps_mask(v3, thr, _CMP_NLE_UQ);
      if ((c0 | c1 | c2 | c3) != 0) [[unlikely]] {
        if ((special(v0, c0) | special(v1, c1) | special(v2, c2) | special(v3, c3)) != 0) return RowResult::kGeneric;
        const __mmask16 r0 = raising(v0, c0), r1 = raising(v1, c1), r2 = raising(v2, c2), r3 = raising(v3, c3);
        if ((r0 | r1 | r2 | r3) != 0) [[unlikely]] {
          __m512 top = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), r0, v0);
          top = _mm512_mask_max_ps(top, r1, top, v1);
          top = _mm512_mask_max_ps(top, r2, top, v2);
          top = _mm512_mask_max_ps(top, r3, top, v3);
          if (!raise_reference(top)) return out_of_range;
        }
        append(v0, i, c0);
        append(v1, i + 16, c1);
        append(v2, i + 32, c2);
        append(v3, i + 48, c3);
        if (b.count > b.cap) [[unlikely]] thr = _mm512_set1_ps(KeepTopK(b));
      }
      acc[0] = term(v0, acc[0]);
      acc[1] = term(v1, acc[1]);
      acc[2] = term(v2, acc[2]);
      acc[3] = term(v3, acc[3]);
    }
    flush();
  }
  for (; i < n; i += 16) {
    const __mmask16 valid = simd::TailMask16(n - i);
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), valid, x + i);
    const __mmask16 c = _mm512_mask_cmp_ps_mask(valid, v, thr, _CMP_NLE_UQ);
    if (c != 0) {
      if (special(v, c) != 0) return RowResult::kGeneric;
      const __mmask16 r = raising(v, c);
      if (r != 0 && !raise_reference(_mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), r, v))) return out_of_range;
      append(v, i, c);
      if (b.count > b.cap) thr = _mm512_set1_ps(KeepTopK(b));
    }
    acc[0] = _mm512_mask_mov_ps(acc[0], valid, term(v, acc[0]));
  }
  flush();
  // Fewer than k entries above -inf (a masked row: constrained decoding): every other entry is -inf,
  // and the rest of the top are the first of them by index (ties keep the lower index). They add
  // nothing to d. (Sending the row to RowGeneric cost 3.5 ns per entry more: 4 x 32000, 3 entries
  // left unmasked, 455 -> ~40 us.)
  for (int64_t j = 0; b.count < b.k && j < n; ++j) {
    if (x[j] == -INFINITY) {
      b.values[static_cast<size_t>(b.count)] = x[j];
      b.indices[static_cast<size_t>(b.count)] = static_cast<int32_t>(j);
      ++b.count;
    }
  }
  if (b.count > b.k) KeepTopK(b);
  b.top.clear();
  for (int64_t j = 0; j < b.k; ++j) b.top.push_back(Entry{b.values[j], b.indices[j]});
  std::sort(b.top.begin(), b.top.end(), [](const Entry& p, const Entry& q) { return RanksAboveNoNan(p, q); });
  // d = sum_j 2^(x_j*s - C); relative to M: D = d * 2^(C - M*s), M*s exact in double.
  const double d = _mm512_reduce_add_pd(_mm512_add_pd(sum_lo, sum_hi));
  const float m = b.top.front().value;
  const double sum = d * std::exp2(static_cast<double>(c) - static_cast<double>(m) * s);
  if (!(sum > 0.0) || !std::isfinite(sum)) return RowResult::kGeneric;
  EmitFinite(b.top, m, sum, t, out);
  return RowResult::kDone;
}

// ---- kernel -------------------------------------------------------------------------------------

struct SoftmaxTopKKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}, {Elem::kInt64}, {Elem::kT, /*optional=*/true}};

  int64_t k;
  int64_t axis;
  float temperature;
  Isa isa;

  explicit SoftmaxTopKKernel(const Attrs& attrs)
      : k(attrs.RequiredInt("k")),
        axis(attrs.Int("axis", -1)),
        temperature(attrs.Float("temperature", 1.0f)),
        isa(SelectIsa()) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    // (no structured binding: lambdas below capture these, which C++17 allows only for plain variables)
    const SoftmaxTopKCall<T> call = StartSoftmaxTopK(kOp, ctx, x, k, axis, temperature);
    const AxisLayout& l = call.layout;
    T* const values = call.values;
    int64_t* const indices = call.indices;
    T* const lse = call.lse;
    const int64_t n = l.n;
    if (l.rows() == 0) return;

    const double t = temperature;
    const float s = static_cast<float>(1.4426950408889634 / t);  // log2(e) / T
    // The float pipeline needs a positive, finite scale; otherwise every row is done in double.
    const Isa row_isa = std::isfinite(s) && s > 0.0f ? isa : Isa::kPortable;
    const int64_t rows = l.rows();
    const size_t tasks = NumTasks(rows, n);
    ParallelFor(ctx, tasks, [&](size_t task) {
      int64_t r0, r1;
      TaskRange(task, tasks, rows, &r0, &r1);
      const bool direct = std::is_same_v<T, float> && l.inner == 1;
      std::vector<float> in_buf(direct ? 0 : static_cast<size_t>(n));
      std::vector<float> val_buf(static_cast<size_t>(k));
      std::vector<int64_t> idx_buf(static_cast<size_t>(k));
      Selection sel(k);
      CandidateBuffer cand(row_isa == Isa::kAvx512 ? k : 0);
      const size_t cap2 = row_isa == Isa::kAvx2 ? static_cast<size_t>(softmax_topk::CandidateCapacity(k)) : 0;
      std::vector<float> cand2_values(cap2);
      std::vector<int32_t> cand2_indices(cap2), cand2_keys(cap2);
      const softmax_topk::Candidates cand2{cand2_values.data(), cand2_indices.data(), cand2_keys.data()};
      std::vector<Entry> top;
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t o = r / l.inner, i = r % l.inner;
        const int64_t base = o * n * l.inner + i;
        const float* row;
        if (direct) {
          row = reinterpret_cast<const float*>(x.data) + base;
        } else {
          for (int64_t j = 0; j < n; ++j) in_buf[j] = ToFloat(x.data[base + j * l.inner]);
          row = in_buf.data();
        }
        RowOut out{val_buf.data(), idx_buf.data(), 0.0f};
        bool done = false;
        if (row_isa == Isa::kAvx512) {
          RowResult res = RowAvx512<false>(row, n, s, t, cand, out);
          if (res == RowResult::kWide) res = RowAvx512<true>(row, n, s, t, cand, out);
          done = res == RowResult::kDone;
        }
        else if (row_isa == Isa::kAvx2) {
          double sum;
          int64_t count;
          done = softmax_topk::FastRowAvx2(row, n, k, s, cand2, &sum, &count);
          if (done) {
            top.clear();
            for (int64_t j = 0; j < count; ++j) top.push_back(Entry{cand2.values[j], cand2.indices[j]});
            auto order = [](const Entry& p, const Entry& q) { return RanksAboveNoNan(p, q); };
            std::partial_sort(top.begin(), top.begin() + k, top.end(), order);
            top.resize(static_cast<size_t>(k));
            EmitFinite(top, top.front().value, sum, t, out);
          }
        }
        if (!done) RowGeneric(row, n, t, sel, out);
        const int64_t out_base = o * k * l.inner + i;
        for (int64_t j = 0; j < k; ++j) {
          values[out_base + j * l.inner] = FromFloat<T>(val_buf[j]);
          indices[out_base + j * l.inner] = idx_buf[j];
        }
        if (lse != nullptr) lse[o * l.inner + i] = FromFloat<T>(out.lse);
      }
    });
  }
};

}  // namespace

SD_REGISTER_KERNEL(SoftmaxTopK, SoftmaxTopKKernel)

}  // namespace sd
