// MultiMax -- softmax of sigma-modulated logits (Zhou, Fritz & Keuper, ICML 2024, arXiv 2406.01189).
//
//   sigma(x) = x + t0*relu(r0 - x) + t1*relu(x - r1) + t2*relu(r2 - x)^2 + t3*relu(x - r3)^2
//   Y = softmax(sigma(X) + Mask, axis)          (the additive Mask, broadcast to X, AFTER sigma)
//
// Python half, the contract, the special-value rules and the float64 oracle:
// softdeploy/ops/multi_max.py; docs/ops/MultiMax.md. sigma(+-inf) is sigma's limit (SigmaParams::Of), a non-finite
// parameter makes every output NaN, quadratic terms are (t*relu)*relu.
//
// Per row, z_j = sigma(x_j) + mask_j is computed on the fly and never stored:
//   pass 1 reads x (and the mask row) once and accumulates sum_j exp(z_j) as a (mantissa, exponent)
//          pair with the exponent held in float (Dukhan & Ablavatski's two-pass softmax, as in
//          two_pass_softmax.cc): no max pass, no overflow;
//   pass 2 reads them again and writes y_j = (m_j / v) * 2^(n_j - e).
//
// What must stay true:
//  * A row whose z holds NaN or +inf, or only -inf, is all NaN (softmax parity); -inf z gives 0.
//  * The Mask is read through strides: any shape broadcastable to X. Rows whose x and mask are
//    contiguous along the axis (or whose mask is constant along it, e.g. a [B, 1, 1, T] padding mask
//    against [B, H, Tq, T] scores, or an omitted mask) run in place; others are gathered.
//  * Validation happens before ParallelFor; nothing inside it throws. Rows are split across threads,
//    never a row, so results do not depend on the thread count.
#include <cmath>
#include <cstring>

#include "common/kernel.h"
#include "common/simd_math.h"

namespace sd {
namespace {

constexpr const char* kOp = "MultiMax";

struct SigmaParams {
  float r[4], t[4];
  float neg, pos;  // sigma(-inf), sigma(+inf): the limits of sigma
  bool finite;     // every parameter finite (otherwise every output is NaN)

  static SigmaParams Of(const float* ranges, const float* ts) {
    SigmaParams p;
    p.finite = true;
    for (int k = 0; k < 4; ++k) {
      p.r[k] = ranges[k];
      p.t[k] = ts[k];
      p.finite &= std::isfinite(ranges[k]) && std::isfinite(ts[k]);
    }
    // x -> -inf: only the r0 and r2 terms are active, sigma ~ t2*x^2 + (1 - t0)*x + const.
    if (p.t[2] != 0) p.neg = p.t[2] > 0 ? INFINITY : -INFINITY;
    else p.neg = p.t[0] < 1 ? -INFINITY : (p.t[0] > 1 ? INFINITY : p.r[0]);
    // x -> +inf: only the r1 and r3 terms, sigma ~ t3*x^2 + (1 + t1)*x + const.
    if (p.t[3] != 0) p.pos = p.t[3] > 0 ? INFINITY : -INFINITY;
    else p.pos = p.t[1] > -1 ? INFINITY : (p.t[1] < -1 ? -INFINITY : p.r[1]);
    return p;
  }

  float operator()(float x) const {
    if (x == -INFINITY) return neg;
    if (x == INFINITY) return pos;
    const float a = std::max(r[0] - x, 0.0f), b = std::max(x - r[1], 0.0f);
    const float c = std::max(r[2] - x, 0.0f), d = std::max(x - r[3], 0.0f);
    // Plain multiply-add: std::fma is a libm call (~50 ns) on the portable x86-64 baseline.
    return x + t[0] * a + t[1] * b + (t[2] * c) * c + (t[3] * d) * d;  // NaN x stays NaN
  }
};

// A row: n elements of x (contiguous), the mask row (contiguous when mask_step == 1, one value
// repeated when mask_step == 0), and the output.
struct RowArgs {
  const float* x;
  const float* mask;
  int64_t mask_step;
  float* y;
  int64_t n;
};

void FillNan(float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = NAN;
}

// ---- portable -----------------------------------------------------------------------------------

void RowPortable(const RowArgs& a, const SigmaParams& p, bool /*stream*/) {
  float zmax = -INFINITY;
  bool bad = false;
  for (int64_t j = 0; j < a.n; ++j) {
    const float z = p(a.x[j]) + a.mask[j * a.mask_step];
    bad |= std::isnan(z) || z == INFINITY;
    zmax = std::max(zmax, z);
  }
  if (bad || zmax == -INFINITY) return FillNan(a.y, a.n);
  double sum = 0;
  for (int64_t j = 0; j < a.n; ++j) sum += std::exp(static_cast<double>(p(a.x[j]) + a.mask[j * a.mask_step]) - zmax);
  const double inv = 1.0 / sum;
  for (int64_t j = 0; j < a.n; ++j) {
    a.y[j] = static_cast<float>(std::exp(static_cast<double>(p(a.x[j]) + a.mask[j * a.mask_step]) - zmax) * inv);
  }
}

constexpr int64_t kBlock = 1024;  // elements per block of the two-level summation

// ---- AVX-512 ------------------------------------------------------------------------------------

struct SigmaAvx512 {
  __m512 r0, r1, r2, r3, t0, t1, t2, t3, neg, pos;
  SD_TARGET_AVX512 explicit SigmaAvx512(const SigmaParams& p)
      : r0(_mm512_set1_ps(p.r[0])), r1(_mm512_set1_ps(p.r[1])), r2(_mm512_set1_ps(p.r[2])),
        r3(_mm512_set1_ps(p.r[3])), t0(_mm512_set1_ps(p.t[0])), t1(_mm512_set1_ps(p.t[1])),
        t2(_mm512_set1_ps(p.t[2])), t3(_mm512_set1_ps(p.t[3])), neg(_mm512_set1_ps(p.neg)),
        pos(_mm512_set1_ps(p.pos)) {}

  SD_TARGET_AVX512 __m512 operator()(__m512 x) const {
    const __m512 zero = _mm512_setzero_ps();
    // max_ps(NaN, 0) is 0, but x itself is the first addend, so sigma(NaN) stays NaN.
    const __m512 a = _mm512_max_ps(_mm512_sub_ps(r0, x), zero), b = _mm512_max_ps(_mm512_sub_ps(x, r1), zero);
    const __m512 c = _mm512_max_ps(_mm512_sub_ps(r2, x), zero), d = _mm512_max_ps(_mm512_sub_ps(x, r3), zero);
    __m512 s = _mm512_fmadd_ps(t0, a, x);
    s = _mm512_fmadd_ps(t1, b, s);
    s = _mm512_fmadd_ps(_mm512_mul_ps(t2, c), c, s);
    s = _mm512_fmadd_ps(_mm512_mul_ps(t3, d), d, s);
    s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), neg);
    return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(x, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ), pos);
  }
};

SD_TARGET_AVX512 inline void Accumulate(__m512& v, __m512& e, __m512 m, __m512 n) {
  const __m512 max_e = _mm512_max_ps(e, n);
  v = _mm512_add_ps(_mm512_scalef_ps(v, _mm512_sub_ps(e, max_e)), _mm512_scalef_ps(m, _mm512_sub_ps(n, max_e)));
  e = max_e;
}

// z for the 16 (or, with k, fewer) elements at j; lanes outside k are -inf.
SD_TARGET_AVX512 inline __m512 LoadZ(const RowArgs& a, const SigmaAvx512& s, int64_t j, __mmask16 k) {
  const __m512 x = _mm512_maskz_loadu_ps(k, a.x + j);
  const __m512 m = a.mask_step ? _mm512_maskz_loadu_ps(k, a.mask + j) : _mm512_set1_ps(a.mask[0]);
  return _mm512_mask_blend_ps(k, _mm512_set1_ps(-INFINITY), _mm512_add_ps(s(x), m));
}

SD_TARGET_AVX512 void RowAvx512(const RowArgs& a, const SigmaParams& p, bool stream) {
  const SigmaAvx512 s(p);
  const int64_t n = a.n;
  __m512 tv = _mm512_setzero_ps(), te = _mm512_set1_ps(simd::kNoExponent);
  __mmask16 bad = 0;  // lanes that saw NaN or +inf in z
  constexpr int kBad = 0x01 | 0x80 | 0x08;  // fpclass: QNaN | SNaN | +inf
  for (int64_t j = 0; j < n;) {
    const int64_t block_end = std::min(n, j + kBlock);
    __m512 v0 = _mm512_setzero_ps(), v1 = v0;
    __m512 e0 = _mm512_set1_ps(simd::kNoExponent), e1 = e0;
    for (; j + 32 <= block_end; j += 32) {
      const __m512 za = LoadZ(a, s, j, 0xFFFF), zb = LoadZ(a, s, j + 16, 0xFFFF);
      bad |= _mm512_fpclass_ps_mask(za, kBad) | _mm512_fpclass_ps_mask(zb, kBad);
      __m512 m, e;
      simd::ExtExp(za, &m, &e);
      Accumulate(v0, e0, m, e);
      simd::ExtExp(zb, &m, &e);
      Accumulate(v1, e1, m, e);
    }
    for (; j < block_end; j += 16) {
      const __m512 z = LoadZ(a, s, j, simd::TailMask16(block_end - j));
      bad |= _mm512_fpclass_ps_mask(z, kBad);
      __m512 m, e;
      simd::ExtExp(z, &m, &e);
      Accumulate(v0, e0, m, e);
    }
    Accumulate(v0, e0, v1, e1);
    Accumulate(tv, te, v0, e0);
  }
  // Lane reduction in registers (scalar ldexp per lane costs more than a 128-element row).
  alignas(64) float vv[16], ee[16];
  _mm512_store_ps(ee, te);
  float e = simd::kNoExponent;
  for (int i = 0; i < 16; ++i) e = std::max(e, ee[i]);
  _mm512_store_ps(vv, _mm512_scalef_ps(tv, _mm512_sub_ps(te, _mm512_set1_ps(e))));
  float v = 0.0f;
  for (int i = 0; i < 16; ++i) v += vv[i];
  if (bad != 0 || !(v > 0.0f) || !std::isfinite(v)) return FillNan(a.y, n);  // NaN/+inf, or all -inf

  const __m512 inv = _mm512_set1_ps(1.0f / v);
  const __m512 minus_e = _mm512_set1_ps(-e);
  auto out = [&](int64_t at, __mmask16 k) SD_TARGET_AVX512 {
    __m512 m, ne;
    simd::ExtExp(LoadZ(a, s, at, k), &m, &ne);
    return _mm512_scalef_ps(_mm512_mul_ps(m, inv), _mm512_add_ps(ne, minus_e));
  };
  int64_t j = 0;
  if (stream) {
    // Peel to a 64-byte aligned output address: streaming stores need it.
    const int64_t peel = std::min<int64_t>(n, ((64 - (reinterpret_cast<uintptr_t>(a.y) & 63)) & 63) / 4);
    if (peel > 0) _mm512_mask_storeu_ps(a.y, simd::TailMask16(peel), out(0, simd::TailMask16(peel)));
    for (j = peel; j + 16 <= n; j += 16) _mm512_stream_ps(a.y + j, out(j, 0xFFFF));
    _mm_sfence();
  } else {
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(a.y + j, out(j, 0xFFFF));
  }
  if (j < n) _mm512_mask_storeu_ps(a.y + j, simd::TailMask16(n - j), out(j, simd::TailMask16(n - j)));
}

// ---- AVX2 ---------------------------------------------------------------------------------------

struct SigmaAvx2 {
  __m256 r0, r1, r2, r3, t0, t1, t2, t3, neg, pos;
  SD_TARGET_AVX2 explicit SigmaAvx2(const SigmaParams& p)
      : r0(_mm256_set1_ps(p.r[0])), r1(_mm256_set1_ps(p.r[1])), r2(_mm256_set1_ps(p.r[2])),
        r3(_mm256_set1_ps(p.r[3])), t0(_mm256_set1_ps(p.t[0])), t1(_mm256_set1_ps(p.t[1])),
        t2(_mm256_set1_ps(p.t[2])), t3(_mm256_set1_ps(p.t[3])), neg(_mm256_set1_ps(p.neg)),
        pos(_mm256_set1_ps(p.pos)) {}

  SD_TARGET_AVX2 __m256 operator()(__m256 x) const {
    const __m256 zero = _mm256_setzero_ps();
    const __m256 a = _mm256_max_ps(_mm256_sub_ps(r0, x), zero), b = _mm256_max_ps(_mm256_sub_ps(x, r1), zero);
    const __m256 c = _mm256_max_ps(_mm256_sub_ps(r2, x), zero), d = _mm256_max_ps(_mm256_sub_ps(x, r3), zero);
    __m256 s = _mm256_fmadd_ps(t0, a, x);
    s = _mm256_fmadd_ps(t1, b, s);
    s = _mm256_fmadd_ps(_mm256_mul_ps(t2, c), c, s);
    s = _mm256_fmadd_ps(_mm256_mul_ps(t3, d), d, s);
    s = _mm256_blendv_ps(s, neg, _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
    return _mm256_blendv_ps(s, pos, _mm256_cmp_ps(x, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ));
  }
};

SD_TARGET_AVX2 inline void Accumulate(__m256& v, __m256& e, __m256 m, __m256 n) {
  const __m256 max_e = _mm256_max_ps(e, n);
  v = _mm256_fmadd_ps(m, simd::Exp2NonPositive(_mm256_sub_ps(n, max_e)),
                      _mm256_mul_ps(v, simd::Exp2NonPositive(_mm256_sub_ps(e, max_e))));
  e = max_e;
}

SD_TARGET_AVX2 inline __m256 LoadZAvx2(const RowArgs& a, const SigmaAvx2& s, int64_t j) {
  const __m256 m = a.mask_step ? _mm256_loadu_ps(a.mask + j) : _mm256_set1_ps(a.mask[0]);
  return _mm256_add_ps(s(_mm256_loadu_ps(a.x + j)), m);
}

SD_TARGET_AVX2 void RowAvx2(const RowArgs& a, const SigmaParams& p, bool stream) {
  const SigmaAvx2 s(p);
  const int64_t n = a.n;
  const int64_t n8 = n & ~int64_t{7};
  // NaN and +inf are detected explicitly: AVX2's max_ps and the exponent emulation drop NaNs.
  __m256 bad = _mm256_setzero_ps();
  const __m256 inf = _mm256_set1_ps(INFINITY);
  __m256 tv = _mm256_setzero_ps(), te = _mm256_set1_ps(simd::kNoExponent);
  for (int64_t j = 0; j < n8;) {
    const int64_t block_end = std::min(n8, j + kBlock);
    __m256 v0 = _mm256_setzero_ps(), v1 = v0;
    __m256 e0 = _mm256_set1_ps(simd::kNoExponent), e1 = e0;
    for (; j + 16 <= block_end; j += 16) {
      const __m256 za = LoadZAvx2(a, s, j), zb = LoadZAvx2(a, s, j + 8);
      bad = _mm256_or_ps(bad, _mm256_or_ps(_mm256_cmp_ps(za, zb, _CMP_UNORD_Q),
                                           _mm256_cmp_ps(_mm256_max_ps(za, zb), inf, _CMP_EQ_OQ)));
      __m256 m, e;
      simd::ExtExp(za, &m, &e);
      Accumulate(v0, e0, m, e);
      simd::ExtExp(zb, &m, &e);
      Accumulate(v1, e1, m, e);
    }
    for (; j < block_end; j += 8) {
      const __m256 z = LoadZAvx2(a, s, j);
      bad = _mm256_or_ps(bad, _mm256_or_ps(_mm256_cmp_ps(z, z, _CMP_UNORD_Q), _mm256_cmp_ps(z, inf, _CMP_EQ_OQ)));
      __m256 m, e;
      simd::ExtExp(z, &m, &e);
      Accumulate(v0, e0, m, e);
    }
    Accumulate(v0, e0, v1, e1);
    Accumulate(tv, te, v0, e0);
  }
  alignas(32) float vv[8], ee[8];
  _mm256_store_ps(ee, te);
  float e = simd::kNoExponent;
  for (int i = 0; i < 8; ++i) e = std::max(e, ee[i]);
  _mm256_store_ps(vv, _mm256_mul_ps(tv, simd::Exp2NonPositive(_mm256_sub_ps(te, _mm256_set1_ps(e)))));
  float v = 0.0f;
  for (int i = 0; i < 8; ++i) v += vv[i];
  bool scalar_bad = false;
  for (int64_t t = n8; t < n; ++t) {  // scalar tail
    const float z = p(a.x[t]) + a.mask[t * a.mask_step];
    scalar_bad |= std::isnan(z) || z == INFINITY;
    float m, ne;
    simd::ExtExp(z, &m, &ne);
    const float max_e = std::max(e, ne);
    v = simd::Scale2(v, e - max_e) + simd::Scale2(m, ne - max_e);
    e = max_e;
  }
  if (scalar_bad || _mm256_movemask_ps(bad) != 0 || !(v > 0.0f) || !std::isfinite(v)) return FillNan(a.y, n);
  const __m256 inv = _mm256_set1_ps(1.0f / v);
  const __m256 minus_e = _mm256_set1_ps(-e);
  for (int64_t j = 0; j < n8; j += 8) {
    __m256 m, ne;
    simd::ExtExp(LoadZAvx2(a, s, j), &m, &ne);
    const __m256 r = _mm256_mul_ps(_mm256_mul_ps(m, inv), simd::Exp2NonPositive(_mm256_add_ps(ne, minus_e)));
    if (stream && (reinterpret_cast<uintptr_t>(a.y + j) & 31) == 0) _mm256_stream_ps(a.y + j, r);
    else _mm256_storeu_ps(a.y + j, r);
  }
  if (stream) _mm_sfence();
  for (int64_t j = n8; j < n; ++j) {
    float m, ne;
    simd::ExtExp(p(a.x[j]) + a.mask[j * a.mask_step], &m, &ne);
    a.y[j] = simd::Scale2(m / v, ne - e);
  }
}

// ---- binding ------------------------------------------------------------------------------------

using RowFn = void (*)(const RowArgs&, const SigmaParams&, bool);

struct MultiMaxKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}, {Elem::kT}, {Elem::kT}, {Elem::kT, /*optional=*/true}};
  static constexpr Port kOutputs[] = {{Elem::kT}};

  int64_t axis;
  Isa isa;

  explicit MultiMaxKernel(const Attrs& attrs) : axis(attrs.Int("axis", -1)), isa(SelectIsa()) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    const Input<T> ranges = GetInput<T>(ctx, 1);
    const Input<T> ts = GetInput<T>(ctx, 2);
    const Input<T> mask = GetInput<T>(ctx, 3);
    if (x.rank() == 0) Fail(kOp, "input must have rank >= 1, got a scalar");
    const int64_t ax = NormalizeAxis(kOp, axis, x.rank());
    if (ranges.shape != std::vector<int64_t>{4}) {
      Fail(kOp, "Ranges has shape ", ShapeStr(ranges.shape), " (rule: Ranges must have shape [4])");
    }
    if (ts.shape != std::vector<int64_t>{4}) Fail(kOp, "Ts has shape ", ShapeStr(ts.shape), " (rule: Ts must have shape [4])");
    // Mask strides aligned to X's dims (0 along broadcast dims).
    const int64_t rank = x.rank();
    std::vector<int64_t> mstride(static_cast<size_t>(rank), 0);
    if (mask.present) {
      bool ok = mask.rank() <= rank;
      for (int64_t k = 0; ok && k < mask.rank(); ++k) {
        const int64_t md = mask.shape[mask.rank() - 1 - k], xd = x.shape[rank - 1 - k];
        ok = md == 1 || md == xd;
      }
      if (!ok) {
        Fail(kOp, "Mask of shape ", ShapeStr(mask.shape), " is not broadcastable to X of shape ", ShapeStr(x.shape),
             " (rule: Mask rank <= X rank and each Mask dim equals X's or is 1)");
      }
      int64_t stride = 1;
      for (int64_t k = mask.rank() - 1; k >= 0; --k) {
        const int64_t xk = rank - mask.rank() + k;
        mstride[xk] = mask.shape[k] == 1 ? 0 : stride;
        stride *= mask.shape[k];
      }
    }
    T* y = AllocOutput<T>(ctx, 0, x.shape);
    if (x.size() == 0) return;

    float r[4], t[4];
    for (int k = 0; k < 4; ++k) {
      r[k] = ToFloat(ranges.data[k]);
      t[k] = ToFloat(ts.data[k]);
    }
    const SigmaParams params = SigmaParams::Of(r, t);
    const AxisLayout l = AxisLayout::Of(x.shape, ax);
    const bool stream = x.size() * static_cast<int64_t>(sizeof(float)) >= kStreamBytes;
    const RowFn row_fn = isa == Isa::kAvx512 ? RowAvx512 : (isa == Isa::kAvx2 ? RowAvx2 : RowPortable);
    const int64_t mask_axis_stride = mstride[static_cast<size_t>(ax)];
    static const float kZero = 0.0f;

    const int64_t rows = l.rows();
    const size_t tasks = NumTasks(rows, l.n * 4);
    ParallelFor(ctx, tasks, [&](size_t task) {
      int64_t r0, r1;
      TaskRange(task, tasks, rows, &r0, &r1);
      const bool direct_x = std::is_same_v<T, float> && l.inner == 1;
      const bool direct_mask = !mask.present || (std::is_same_v<T, float> && mask_axis_stride <= 1);
      std::vector<float> x_buf, y_buf, m_buf;
      if (!direct_x) {
        x_buf.resize(static_cast<size_t>(l.n));
        y_buf.resize(static_cast<size_t>(l.n));
      }
      if (!direct_mask) m_buf.resize(static_cast<size_t>(mask_axis_stride == 0 ? 1 : l.n));
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t o = row / l.inner, i = row % l.inner;
        const int64_t base = o * l.n * l.inner + i;
        RowArgs a{};
        a.n = l.n;
        if (!params.finite) {
          for (int64_t j = 0; j < l.n; ++j) y[base + j * l.inner] = FromFloat<T>(NAN);
          continue;
        }
        if (direct_x) {
          a.x = reinterpret_cast<const float*>(x.data) + base;
          a.y = reinterpret_cast<float*>(y) + base;
        } else {
          for (int64_t j = 0; j < l.n; ++j) x_buf[j] = ToFloat(x.data[base + j * l.inner]);
          a.x = x_buf.data();
          a.y = y_buf.data();
        }
        if (!mask.present) {
          a.mask = &kZero;
          a.mask_step = 0;
        } else {
          // Offset of this row's first mask element: unravel (o, i) over X's dims.
          int64_t off = 0, rem_o = o, rem_i = i;
          for (int64_t k = rank - 1; k > ax; --k) {
            off += (rem_i % x.shape[k]) * mstride[k];
            rem_i /= x.shape[k];
          }
          for (int64_t k = ax - 1; k >= 0; --k) {
            off += (rem_o % x.shape[k]) * mstride[k];
            rem_o /= x.shape[k];
          }
          a.mask_step = mask_axis_stride == 0 ? 0 : 1;
          if (direct_mask) {
            a.mask = reinterpret_cast<const float*>(mask.data) + off;
          } else {
            for (size_t j = 0; j < m_buf.size(); ++j) m_buf[j] = ToFloat(mask.data[off + j * mask_axis_stride]);
            a.mask = m_buf.data();
          }
        }
        row_fn(a, params, stream && direct_x);
        if (!direct_x) {
          for (int64_t j = 0; j < l.n; ++j) y[base + j * l.inner] = FromFloat<T>(y_buf[j]);
        }
      }
    });
  }
};

}  // namespace

SD_REGISTER_KERNEL(MultiMax, MultiMaxKernel)

}  // namespace sd
