// SoftpickAttention -- attention with Softpick weights, flash-style (one pass over key blocks).
//
//   S = Q K^T * scale + Mask   (causal: S_ij = -inf for j > i + Tk - Tq),   W = Softpick(S),   O = W V
//
// Python half (the contract, the special-value rules, the float64 oracle, the function body):
// softdeploy/ops/softpick_attention.py; docs/ops/SoftpickAttention.md and docs/ops/Softpick.md.
//
// Online softpick. With m = max of the finite scores of a row, Softpick's weights are
//   w_j = [s_j > 0] expm1(s_j) / (sum_{finite j} |expm1(s_j)| + eps * e^m)
// (numerator and denominator of the contract's form times e^m). Any common factor 2^-R cancels, so the
// kernel carries, per query row, a running integer scale R >= 0 with 2^R >= e^(running max), and
//   l = sum |expm1(s_j)| 2^-R   (double),      o = sum [s_j > 0] expm1(s_j) 2^-R V_j   (float, Dv)
// over the key blocks seen so far; every term is <= 1, so neither sum can overflow. When a block's
// max needs a larger R, l and o are multiplied by 2^(R_old - R_new) -- the exp(m_old - m_new) rescale
// of FlashAttention, here an exact power of two -- and only then (R moves rarely: never while the
// scores stay <= 0). At the end O = o / (l + eps e^(m - R ln2)); a row with m <= 0 (or no finite
// score) has no positive numerator and outputs 0. expm1(s) 2^-R comes from the range-reduced
// expm1 polynomial of ops/softpick.cc (2^(n-R) q + (2^(n-R) - 2^-R)): no cancellation near s = 0
// and no exp(-m) that could overflow when every score is very negative.
//
// Blocking: tasks are (batch, head, block of kBlockQ query rows) on onnxruntime's pool. Per task, the
// scaled query rows stay in scratch; for each block of kBlockK keys, S = Qs Kt (Kt: K transposed and
// packed once per (batch, key head) before the tasks), the softpick terms overwrite S in place, and
// o += P V. Nothing of size Tq x Tk exists; memory is O(size of K) + O(kBlockQ * (kBlockK + Dv)) per
// task. Causal: key blocks past the tile's last visible key are skipped, the diagonal block masked.
// Register tiles (ops/common/vec_gemm.h): C[6 x 64] += A[6 x k] B[k x 64] (AVX-512: 24 accumulators),
// C[6 x 16] (AVX2); the portable variant is the same loop nest left to the compiler's baseline vectoriser.
// The vector variants are written once over ops/common/vec.h's traits (ops/softpick_attention_kernels.h) and
// compiled per ISA (ops/softpick_attention_avx2.cc, _avx512.cc). Both vector variants without Mask: full key
// blocks that every row of the task sees compute their softpick terms per strip of 6 query rows x kBlockK keys
// right after the strip's GEMM (ScoresTerms), with lane-wise (16 / 8) per-row sums and maxima kept in
// registers over the row and folded once per block -- the separate row pass's per-row call, constants and
// horizontal reductions were ~10% of a call at
// T = 2048 (bench/results/softpick_attention.md). AVX2, Dv <= 64: P V of a full key block runs over P's
// nonzero entries only (PvSparse: P is 0 wherever a score is <= 0), a row at a time with V's block in L1.
//
// What must stay true:
//  * The fast path sees only finite scores or -inf: a query row whose Q row, K, V or Mask row holds a
//    NaN or +-inf (Mask: NaN or +inf), or whose scores may exceed kExactLimit (2^16, bounded as
//    D * max|q scale| * max|k| + max finite Mask), is computed by ExactRow in double precision, the
//    composition literally (NaN weights, 0 * NaN in W V, hidden keys included) -- so the four forms
//    agree on special values.
//  * Results of a row do not depend on the thread count or on which tile holds it.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/kernel.h"
#include "common/simd_math.h"
#include "common/vec_gemm.h"
#include "softpick_attention_row.h"
#include "softpick_row.h"

namespace sd {
namespace {

using softpick_attention::kBlockK;

constexpr const char* kOp = "SoftpickAttention";
constexpr const char* kLayout = "rule: Q [B, H, Tq, D], K [B, Hk, Tk, D], V [B, Hk, Tk, Dv]";

constexpr int64_t kBlockQ = 48;  // query rows per task (a multiple of the 6-row register tile)
constexpr float kExactLimit = 65536.0f;  // scores beyond: float32 range reduction loses t's bits
constexpr float kSlack = 20.0f;          // terms expm1(s) 2^-R stay <= 2^kSlack (see RunTask)
// Softpick's own constants (ops/softpick_row.h): expm1(x) = -1 in float below kMinX, and the expm1
// polynomial on |t| <= 0.4 (relative error 1.0e-7) -- one definition, so the op and its attention agree.
using softpick::kLn2;
using softpick::kMinX;
using softpick::kQ0;
using softpick::kQ1;
using softpick::kQ2;
using softpick::kQ3;
using softpick::kQ4;
using softpick::TermScalar;

// Everything a task needs, as float32 views (float16 inputs are converted first).
struct Problem {
  int64_t B = 0, H = 0, Hk = 0, G = 1, Tq = 0, Tk = 0, D = 0, Dv = 0;
  float scale = 1.0f, eps = 0.0f;
  bool causal = false;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* mask = nullptr;  // nullptr: no mask
  int64_t msB = 0, msH = 0, msQ = 0, msK = 0, mask_row_len = 1;  // element strides, 0 = broadcast
  float* o = nullptr;
  // prepared once per call
  int64_t nkb = 0;                 // key blocks
  std::unique_ptr<float[]> kt;     // per (b, hk): nkb blocks of [D][kBlockK], zero padded
  std::vector<uint8_t> kv_bad;     // per (b, hk): K or V holds a non-finite value
  std::vector<float> kmax;         // per (b, hk): max |K|
  std::vector<uint8_t> mrow_bad;   // per mask row: NaN or +inf present
  std::vector<float> mrow_max;     // per mask row: max finite value (-inf if none)
  std::vector<uint8_t> mblk_hidden;  // per mask row and key block: the Mask is -inf on every key of it

  const float* Kt(int64_t b, int64_t hk) const { return kt.get() + (b * Hk + hk) * nkb * D * kBlockK; }
  int64_t MaskOffset(int64_t b, int64_t h, int64_t i) const { return b * msB + h * msH + i * msQ; }
};

// max over x[0, n) of the magnitude's bit pattern (x & 0x7fffffff): an unsigned integer max, which the
// compiler vectorises (a float max reduction it may not reorder); the result >= kInfBits iff an element
// is +-inf or NaN, else its float is max |x|. The scalar float loops this replaced were ~6% of a call.
constexpr uint32_t kInfBits = 0x7f800000u;

inline uint32_t MaxAbsBits(const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t e = 0; e < n; ++e) {
    uint32_t b;
    std::memcpy(&b, x + e, sizeof b);
    b &= 0x7fffffffu;
    m = b > m ? b : m;
  }
  return m;
}

inline float BitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// ---- the exact path -------------------------------------------------------------------------------

// Row i of head h, batch b, in double: the composition of the contract evaluated literally.
void ExactRow(const Problem& p, int64_t b, int64_t h, int64_t i, std::vector<double>& s) {
  const int64_t hk = h / p.G;
  const float* q = p.q + ((b * p.H + h) * p.Tq + i) * p.D;
  const float* k = p.k + (b * p.Hk + hk) * p.Tk * p.D;
  const float* v = p.v + (b * p.Hk + hk) * p.Tk * p.Dv;
  const float* mrow = p.mask ? p.mask + p.MaskOffset(b, h, i) : nullptr;
  s.resize(static_cast<size_t>(p.Tk));
  const int64_t limit = i + p.Tk - p.Tq;
  double m = -INFINITY;
  for (int64_t j = 0; j < p.Tk; ++j) {
    double dot = 0.0;
    for (int64_t d = 0; d < p.D; ++d) dot += static_cast<double>(q[d]) * k[j * p.D + d];
    double x = dot * static_cast<double>(p.scale);
    if (mrow) x += mrow[j * p.msK];
    if (p.causal && j > limit) x = -INFINITY;
    s[j] = x;
    if (std::isfinite(x)) m = std::max(m, x);
  }
  float* out = p.o + ((b * p.H + h) * p.Tq + i) * p.Dv;
  std::vector<double> acc(static_cast<size_t>(p.Dv), 0.0);
  if (m == -INFINITY) {  // no finite score: all weights 0 (0 * V still meets NaN and inf in V)
    for (int64_t j = 0; j < p.Tk; ++j) {
      for (int64_t c = 0; c < p.Dv; ++c) acc[c] += 0.0 * v[j * p.Dv + c];
    }
  } else {
    double den = p.eps;
    for (int64_t j = 0; j < p.Tk; ++j) {
      if (std::isfinite(s[j])) den += std::exp(std::max(s[j], 0.0) - m) * -std::expm1(-std::fabs(s[j]));
    }
    for (int64_t j = 0; j < p.Tk; ++j) {
      const double x = s[j];
      double w;
      if (std::isnan(x) || x == INFINITY) w = x;
      else if (x > 0.0) w = std::exp(x - m) * -std::expm1(-x) / den;
      else w = 0.0;
      for (int64_t c = 0; c < p.Dv; ++c) acc[c] += w * v[j * p.Dv + c];
    }
  }
  for (int64_t c = 0; c < p.Dv; ++c) out[c] = static_cast<float>(acc[c]);
}

// ---- softpick terms of one row block: s[0, n) -> P in place; returns sum |term| of finite s -------

// One pass over a row's key block: x_j = s[j] + mask (mrow[j * msk]; none when mrow is null), -inf
// for j >= hidden (causal); p[j] = expm1(x_j) 2^-r where x_j > 0, else 0. Returns sum |expm1(x_j)| 2^-r
// over x_j > -inf and stores max_j x_j in *block_max. s is left as it was, so that a block whose max
// needs a larger r can be redone.
float RowPortable(const float* s, float* pr, int64_t n, const float* mrow, int64_t msk, int64_t hidden, float r,
                  float* block_max) {
  const float c = simd::Scale2(1.0f, -r);
  float sum = 0.0f, mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    float x = s[j];
    if (mrow != nullptr) x += mrow[j * msk];
    if (j >= hidden || x == -INFINITY) {
      pr[j] = 0.0f;
      continue;
    }
    mx = std::max(mx, x);
    const float t = TermScalar(x, r, c);
    sum += std::fabs(t);
    pr[j] = x > 0.0f ? t : 0.0f;
  }
  *block_max = mx;
  return sum;
}

// ---- one task: query rows [i0, i1) of head h, batch b ---------------------------------------------

// One block of keys transposed: col[d * kBlockK + jj] = kr[jj * D + d] for jj < nk, zeros for nk <= jj <
// kBlockK (the GEMM reads the padding columns; their P entries are 0, their scores unused).
void PackPortable(const float* kr, int64_t nk, int64_t D, float* blk) {
  // key loop innermost: the writes are contiguous and the strided reads stay within one block of K
  for (int64_t d = 0; d < D; ++d) {
    float* col = blk + d * kBlockK;
    for (int64_t jj = 0; jj < nk; ++jj) col[jj] = kr[jj * D + d];
    if (nk < kBlockK) std::memset(col + nk, 0, static_cast<size_t>(kBlockK - nk) * sizeof(float));
  }
}

struct Ops {
  softpick_attention::GemmFn gemm;
  softpick_attention::RowFn row;
  // full unmasked key blocks with the terms fused into the scores' GEMM (nullptr: the row path)
  softpick_attention::FusedFn fused;
  int lanes;  // the fused path's lanes per row of its sums and maxima
  // P V of a full key block over P's nonzero entries (nullptr: the GEMM)
  softpick_attention::PvFn pv;
};

void RunTask(const Problem& p, const Ops& ops, int64_t b, int64_t h, int64_t i0, int64_t i1) {
  const int64_t rows = i1 - i0;
  const int64_t hk = h / p.G;
  std::vector<double> exact_scratch;
  float* out = p.o + ((b * p.H + h) * p.Tq + i0) * p.Dv;
  if (p.kv_bad[b * p.Hk + hk]) {
    for (int64_t i = i0; i < i1; ++i) ExactRow(p, b, h, i, exact_scratch);
    return;
  }
  const int64_t D = p.D, Dv = p.Dv;
  // Scratch written before it is read, so left uninitialised (zeroing them was ~2% of a call at T = 2048).
  const std::unique_ptr<float[]> qs_buf(new float[rows * D]), sbuf_buf(new float[rows * kBlockK]),
      pbuf_buf(new float[rows * kBlockK]);
  float* const qs = qs_buf.get();
  float* const sbuf = sbuf_buf.get();
  float* const pbuf = pbuf_buf.get();
  std::vector<float> oacc(static_cast<size_t>(rows * Dv), 0.0f);
  std::vector<float> m(rows, -INFINITY), r(rows, 0.0f);
  std::vector<double> l(rows, 0.0);
  std::vector<uint8_t> exact(rows, 0);
  const float kmax = p.kmax[b * p.Hk + hk];
  for (int64_t rr = 0; rr < rows; ++rr) {
    const float* q = p.q + ((b * p.H + h) * p.Tq + i0 + rr) * D;
    for (int64_t d = 0; d < D; ++d) qs[rr * D + d] = q[d] * p.scale;
    const uint32_t qbits = MaxAbsBits(&qs[rr * D], D);
    bool finite = qbits < kInfBits;
    const float qmax = BitsToFloat(qbits);
    float mask_max = 0.0f;
    if (p.mask) {
      const int64_t row = p.MaskOffset(b, h, i0 + rr) / p.mask_row_len;
      if (p.mrow_bad[row]) finite = false;
      mask_max = std::max(0.0f, p.mrow_max[row]);
    }
    // |score| <= D max|q scale| max|k| + max finite mask (float, rounded up generously by the 2^16)
    const double bound = static_cast<double>(D) * qmax * kmax + mask_max;
    if (!finite || !(bound <= kExactLimit)) {
      exact[rr] = 1;
      std::memset(&qs[rr * D], 0, static_cast<size_t>(D) * sizeof(float));  // keep the fast path finite
    }
  }
  // causal: row i sees keys j <= i + Tk - Tq; the tile's last row sees the most
  int64_t nkb = p.nkb;
  if (p.causal) {
    const int64_t last = i1 - 1 + p.Tk - p.Tq;
    nkb = last < 0 ? 0 : std::min(nkb, last / kBlockK + 1);
  }
  const float* kt = p.Kt(b, hk);
  const float* v = p.v + (b * p.Hk + hk) * p.Tk * Dv;
  // The fused path's per-row state (ScoresTerms in ops/softpick_attention_kernels.h): lane-wise sums of |term|
  // and maxima over its blocks (ops.lanes per row), 2^-R, -R and the rescale bound per
  // row; folded into l and m after the last block.
  const bool fusable = ops.fused != nullptr && p.mask == nullptr;
  const int64_t lanes = ops.lanes;
  std::vector<float> lacc, vmx, cr, mr, thr;
  std::vector<uint8_t> flag;
  if (fusable) {
    lacc.assign(static_cast<size_t>(rows * lanes), 0.0f);
    vmx.assign(static_cast<size_t>(rows * lanes), -INFINITY);
    cr.assign(static_cast<size_t>(rows), 1.0f);
    mr.assign(static_cast<size_t>(rows), 0.0f);
    thr.assign(static_cast<size_t>(rows), kSlack * kLn2);
    flag.resize(static_cast<size_t>(rows));
  }
  // P V over P's nonzeros: Dv whole vectors, at most 8 (the row's outputs in registers, V's block in L1)
  const bool sparse_pv = ops.pv != nullptr && Dv % ops.lanes == 0 && Dv <= 8 * ops.lanes;
  bool small_r = true;  // every R <= 126 (2^-R a normal float): what the fused path needs
  // Row rr of key block [j0, j0 + nk) on the row path, its scores in sbuf.
  auto row_step = [&](int64_t rr, int64_t j0, int64_t nk) {
    const float* s = &sbuf[rr * kBlockK];
    float* pr = &pbuf[rr * kBlockK];
    if (exact[rr]) {
      std::memset(pr, 0, static_cast<size_t>(nk) * sizeof(float));
      return;
    }
    const int64_t i = i0 + rr;
    const float* mrow = p.mask ? p.mask + p.MaskOffset(b, h, i) + j0 * p.msK : nullptr;
    const int64_t hidden = p.causal ? i + p.Tk - p.Tq + 1 - j0 : nk;
    float bm;
    float sum = ops.row(s, pr, nk, mrow, p.msK, hidden, r[rr], &bm);
    m[rr] = std::max(m[rr], bm);
    // Terms must stay <= 2^kSlack: R only grows, to ceil(max log2 e) (terms <= 1 again), and the
    // sums rescale exactly by 2^(R_old - R_new); the block is redone at the new R. With R = 0 this
    // happens only for scores above kSlack ln2 ~ 14.
    if (bm > (r[rr] + kSlack) * kLn2) {
      const float r_new = std::ceil(bm * simd::kLog2e);
      const float f = simd::Scale2(1.0f, r[rr] - r_new);
      l[rr] *= f;
      float* orow = &oacc[rr * Dv];
      for (int64_t c = 0; c < Dv; ++c) orow[c] *= f;
      if (fusable) {
        for (int64_t c = 0; c < lanes; ++c) lacc[rr * lanes + c] *= f;
        cr[rr] = simd::Scale2(1.0f, -r_new);
        mr[rr] = -r_new;
        thr[rr] = (r_new + kSlack) * kLn2;
      }
      r[rr] = r_new;
      small_r = small_r && r_new <= 126.0f;
      sum = ops.row(s, pr, nk, mrow, p.msK, hidden, r[rr], &bm);
    }
    l[rr] += sum;
  };
  for (int64_t kb = 0; kb < nkb; ++kb) {
    const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, p.Tk - j0);
    if (p.mask) {
      bool all_hidden = true;
      for (int64_t rr = 0; all_hidden && rr < rows; ++rr) {
        all_hidden = p.mblk_hidden[p.MaskOffset(b, h, i0 + rr) / p.mask_row_len * p.nkb + kb] != 0;
      }
      if (all_hidden) continue;
    }
    const float* ktb = kt + kb * D * kBlockK;
    // causal: fused only where every row of the task sees the whole block (the tile's first row sees least)
    const bool visible = !p.causal || i0 + p.Tk - p.Tq + 1 - j0 >= nk;
    if (fusable && small_r && nk == kBlockK && visible) {
      ops.fused(qs, D, ktb, rows, cr.data(), mr.data(), thr.data(), pbuf, lacc.data(),
                vmx.data(), flag.data());
      for (int64_t rr = 0; rr < rows; ++rr) {
        if (!flag[rr]) continue;
        // (rare) a score above the row's bound: its scores again, then the row path with its rescale
        ops.gemm(&qs[rr * D], D, ktb, kBlockK, D, &sbuf[rr * kBlockK], kBlockK, 1, kBlockK, false);
        row_step(rr, j0, nk);
      }
    } else {
      ops.gemm(qs, D, ktb, kBlockK, D, sbuf, kBlockK, rows, kBlockK, false);
      for (int64_t rr = 0; rr < rows; ++rr) row_step(rr, j0, nk);
    }
    if (sparse_pv && nk == kBlockK) ops.pv(pbuf, v + j0 * Dv, Dv, oacc.data(), rows);
    else ops.gemm(pbuf, kBlockK, v + j0 * Dv, Dv, nk, oacc.data(), Dv, rows, Dv, true);
  }
  if (fusable) {  // fold the fused blocks' lanes into m and l (in double)
    for (int64_t rr = 0; rr < rows; ++rr) {
      double sum = 0.0;
      for (int64_t c = 0; c < lanes; ++c) {
        m[rr] = std::max(m[rr], vmx[rr * lanes + c]);
        sum += lacc[rr * lanes + c];
      }
      l[rr] += sum;
    }
  }
  for (int64_t rr = 0; rr < rows; ++rr) {
    float* orow = out + rr * Dv;
    if (exact[rr]) {
      ExactRow(p, b, h, i0 + rr, exact_scratch);
      continue;
    }
    if (!(m[rr] > 0.0f)) {  // no positive score: every numerator is 0 (V is finite here)
      std::memset(orow, 0, static_cast<size_t>(Dv) * sizeof(float));
      continue;
    }
    const double den = l[rr] + static_cast<double>(p.eps) * std::exp(static_cast<double>(m[rr]) - r[rr] * 0.6931471805599453);
    // one division per row, not per element (Dv double divisions per row were ~2% of the call); the
    // double product rounds once more, ~1e-16 relative, far below float32's rounding of the result
    const double inv = 1.0 / den;
    for (int64_t c = 0; c < Dv; ++c) orow[c] = static_cast<float>(oacc[rr * Dv + c] * inv);
  }
}

// ---- preparation: packed K^T, finiteness flags, bounds ---------------------------------------------

void PrepareKv(Problem& p, int64_t bh) {
  const float* k = p.k + bh * p.Tk * p.D;
  const float* v = p.v + bh * p.Tk * p.Dv;
  float* kt = p.kt.get() + bh * p.nkb * p.D * kBlockK;
  // Transposed block by block (column by column over the whole of K, the writes 512 bytes apart,
  // cost ~4% of the call at T = 2048; an AVX-512 gather per 16 keys measured no faster than this).
  for (int64_t kb = 0; kb < p.nkb; ++kb) {
    const int64_t j0 = kb * kBlockK;
    PackPortable(k + j0 * p.D, std::min(kBlockK, p.Tk - j0), p.D, kt + kb * p.D * kBlockK);
  }
  // finiteness and max |K|, max |V|: contiguous scans of the magnitude bits (MaxAbsBits)
  const uint32_t kbits = MaxAbsBits(k, p.Tk * p.D), vbits = MaxAbsBits(v, p.Tk * p.Dv);
  bool bad = kbits >= kInfBits || vbits >= kInfBits;
  const float kmax = BitsToFloat(kbits), vmax = BitsToFloat(vbits);
  // o sums Tk terms <= 2^kSlack times V: keep it far from float overflow, else the exact path
  bad = bad || static_cast<double>(vmax) * static_cast<double>(p.Tk) * std::ldexp(1.0, static_cast<int>(kSlack) + 1) > 1e37;
  p.kv_bad[bh] = bad;
  p.kmax[bh] = kmax;
}

void PrepareMaskRow(Problem& p, int64_t row) {
  const float* m = p.mask + row * p.mask_row_len;
  bool bad = false;
  float mx = -INFINITY;
  for (int64_t j = 0; j < p.mask_row_len; ++j) {
    const float x = m[j];
    if (std::isnan(x) || x == INFINITY) bad = true;
    else if (x != -INFINITY) mx = std::max(mx, x);
  }
  p.mrow_bad[row] = bad;
  p.mrow_max[row] = mx;
  // key blocks the row's Mask hides entirely (a padding mask's tail): RunTask skips a block hidden for
  // every row of its tile -- its keys add no term and no numerator, exactly as if computed
  for (int64_t kb = 0; kb < p.nkb; ++kb) {
    const int64_t j0 = kb * kBlockK, j1 = std::min(p.Tk, j0 + kBlockK);
    bool hidden = true;
    for (int64_t j = j0; hidden && j < j1; ++j) hidden = m[j * p.msK] == -INFINITY;
    p.mblk_hidden[row * p.nkb + kb] = hidden;
  }
}

struct SoftpickAttentionKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kT}, {Elem::kT, true}};
  static constexpr Port kOutputs[] = {{Elem::kT}};

  float scale;
  int64_t causal;
  float eps;
  Isa isa;

  explicit SoftpickAttentionKernel(const Attrs& attrs)
      : scale(attrs.Float("scale", 0.0f)),
        causal(attrs.Int("causal", 0)),
        eps(attrs.Float("eps", 1e-6f)),
        isa(SelectIsa()) {
    if (!std::isfinite(scale)) Fail(kOp, "scale ", scale, " is not a finite number (rule: finite; 0 means 1/sqrt(D))");
    if (causal != 0 && causal != 1) Fail(kOp, "causal ", causal, " is not 0 or 1 (rule: causal in {0, 1})");
    if (!(std::isfinite(eps) && eps >= 0.0f)) {
      Fail(kOp, "eps ", eps, " is not a finite number >= 0 (rule: 0 <= eps < inf)");
    }
  }

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> q = GetInput<T>(ctx, 0), k = GetInput<T>(ctx, 1), v = GetInput<T>(ctx, 2);
    const Input<T> mask = GetInput<T>(ctx, 3);
    const char* names[] = {"Q", "K", "V"};
    const Input<T>* ins[] = {&q, &k, &v};
    for (int n = 0; n < 3; ++n) {
      if (ins[n]->rank() != 4) Fail(kOp, names[n], " must have rank 4, got rank ", ins[n]->rank(), " (", kLayout, ")");
    }
    if (k.shape[0] != q.shape[0] || v.shape[0] != q.shape[0]) {
      Fail(kOp, "batch sizes differ: Q ", q.shape[0], ", K ", k.shape[0], ", V ", v.shape[0], " (", kLayout, ")");
    }
    if (k.shape[3] != q.shape[3]) Fail(kOp, "K has head size D=", k.shape[3], " but Q has D=", q.shape[3], " (", kLayout, ")");
    if (v.shape[1] != k.shape[1] || v.shape[2] != k.shape[2]) {
      Fail(kOp, "V has Hk=", v.shape[1], ", Tk=", v.shape[2], " but K has Hk=", k.shape[1], ", Tk=", k.shape[2], " (",
           kLayout, ")");
    }
    if (q.shape[3] == 0) Fail(kOp, "head size D=0 (rule: D >= 1)");
    if (k.shape[1] == 0) Fail(kOp, "Hk=0 key/value heads (rule: Hk >= 1)");
    if (q.shape[1] % k.shape[1] != 0) {
      Fail(kOp, "H=", q.shape[1], " query heads is not a multiple of Hk=", k.shape[1],
           " key/value heads (rule: H % Hk == 0)");
    }
    Problem p;
    p.B = q.shape[0], p.H = q.shape[1], p.Tq = q.shape[2], p.D = q.shape[3];
    p.Hk = k.shape[1], p.Tk = k.shape[2], p.Dv = v.shape[3], p.G = p.H / p.Hk;
    const std::vector<int64_t> target = {p.B, p.H, p.Tq, p.Tk};
    if (mask.present) {
      const auto& ms = mask.shape;
      bool ok = ms.size() <= 4;
      for (size_t n = 0; ok && n < ms.size(); ++n) {
        const int64_t md = ms[ms.size() - 1 - n], td = target[3 - n];
        ok = md == 1 || md == td;
      }
      if (!ok) {
        Fail(kOp, "Mask of shape ", ShapeStr(ms), " is not broadcastable to [B, H, Tq, Tk] = ", ShapeStr(target),
             " (rule: Mask rank <= 4 and each Mask dim equals the target's or is 1)");
      }
    }
    T* out = AllocOutput<T>(ctx, 0, {p.B, p.H, p.Tq, p.Dv});
    const int64_t out_size = p.B * p.H * p.Tq * p.Dv;
    if (out_size == 0) return;
    std::vector<float> out_buf;
    if constexpr (std::is_same_v<T, float>) {
      p.o = out;
    } else {
      out_buf.resize(static_cast<size_t>(out_size));
      p.o = out_buf.data();
    }
    if (p.Tk == 0) {
      std::memset(p.o, 0, static_cast<size_t>(out_size) * sizeof(float));
    } else {
      std::vector<float> qb, kb, vb, mb;
      p.q = AsFloat(q, qb), p.k = AsFloat(k, kb), p.v = AsFloat(v, vb);
      p.scale = scale == 0.0f ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.D))) : scale;
      p.eps = eps;
      p.causal = causal != 0;
      // A one-element zero Mask is no mask (x + 0 == x for every score): it is what
      // softdeploy.export.attach_function_bodies feeds an omitted Mask (the function body needs a
      // value), and dropping it keeps such models on the unmasked fast path.
      const bool zero_mask = mask.present && mask.size() == 1 && ToFloat(mask.data[0]) == 0.0f;
      if (mask.present && !zero_mask) {
        p.mask = AsFloat(mask, mb);
        // right-aligned mask dims [mB, mH, mQ, mK]; contiguous strides, 0 where broadcast
        int64_t md[4] = {1, 1, 1, 1};
        for (size_t n = 0; n < mask.shape.size(); ++n) md[4 - mask.shape.size() + n] = mask.shape[n];
        p.msK = md[3] == 1 ? 0 : 1;
        p.msQ = md[2] == 1 ? 0 : md[3];
        p.msH = md[1] == 1 ? 0 : md[2] * md[3];
        p.msB = md[0] == 1 ? 0 : md[1] * md[2] * md[3];
        p.mask_row_len = md[3];
      }
      Run(ctx, p);
    }
    if constexpr (!std::is_same_v<T, float>) {
      for (int64_t e = 0; e < out_size; ++e) out[e] = FromFloat<T>(out_buf[e]);
    }
  }

  void Run(Ort::KernelContext& ctx, Problem& p) const {
    Ops ops;
    switch (isa) {
      case Isa::kAvx512:
        ops = {softpick_attention::GemmAvx512, softpick_attention::RowAvx512, softpick_attention::ScoresTermsAvx512, 16,
               nullptr};
        break;
      case Isa::kAvx2:
        ops = {softpick_attention::GemmAvx2, softpick_attention::RowAvx2, softpick_attention::ScoresTermsAvx2, 8,
               softpick_attention::PvSparseAvx2};
        break;
      default: ops = {tile::GemmPortable<false>, RowPortable, nullptr, 1, nullptr};
    }
    p.nkb = (p.Tk + kBlockK - 1) / kBlockK;
    const int64_t bhk = p.B * p.Hk;
    p.kt.reset(new float[bhk * p.nkb * p.D * kBlockK]);  // every entry written by PrepareKv
    p.kv_bad.assign(bhk, 0);
    p.kmax.assign(bhk, 0.0f);
    {
      const size_t tasks = NumTasks(bhk, p.Tk * (p.D + p.Dv));
      ParallelFor(ctx, tasks, [&](size_t t) {
        int64_t a, e;
        TaskRange(t, tasks, bhk, &a, &e);
        for (int64_t x = a; x < e; ++x) PrepareKv(p, x);
      });
    }
    if (p.mask) {
      int64_t mask_size = 1;
      // number of mask rows = mask elements / row length
      mask_size = (p.msB ? p.B : 1) * (p.msH ? p.H : 1) * (p.msQ ? p.Tq : 1);
      p.mrow_bad.assign(mask_size, 0);
      p.mrow_max.assign(mask_size, -INFINITY);
      p.mblk_hidden.assign(static_cast<size_t>(mask_size * p.nkb), 0);
      const size_t tasks = NumTasks(mask_size, p.mask_row_len);
      ParallelFor(ctx, tasks, [&](size_t t) {
        int64_t a, e;
        TaskRange(t, tasks, mask_size, &a, &e);
        for (int64_t x = a; x < e; ++x) PrepareMaskRow(p, x);
      });
    }
    const int64_t qblocks = (p.Tq + kBlockQ - 1) / kBlockQ;
    const int64_t n = p.B * p.H * qblocks;
    // one task per (b, h, query block): each costs ~kBlockQ * Tk * (D + Dv) multiply-adds, far above
    // NumTasks' grain, so every block is its own task
    const Problem& cp = p;
    ParallelFor(ctx, static_cast<size_t>(n), [&](size_t t) {
      const int64_t task = static_cast<int64_t>(t);
      const int64_t qb = task % qblocks, bh = task / qblocks;
      const int64_t i0 = qb * kBlockQ, i1 = std::min(p.Tq, i0 + kBlockQ);
      RunTask(cp, ops, bh / p.H, bh % p.H, i0, i1);
    });
  }
};

}  // namespace

SD_REGISTER_KERNEL(SoftpickAttention, SoftpickAttentionKernel)

}  // namespace sd
