// TwoPassSoftmax -- softmax without a max pass (Dukhan & Ablavatski 2020, arXiv 2001.04438).
//
//   y_i = exp(x_i) / sum_j exp(x_j)       along `axis` (same values as ai.onnx.Softmax-13)
//
// Python half, the contract and the float64 oracle: softdeploy/ops/two_pass_softmax.py; OPS.md.
//
// Pass 1 reads x once and accumulates sum_j exp(x_j) as a (mantissa v, exponent e) pair with the
// exponent held in float ("ExtExp", common/simd_math.h): exp(x_j) = m_j * 2^n_j and
//   e' = max(e, n_j),  v' = v * 2^(e - e') + m_j * 2^(n_j - e')
// which cannot overflow for any |x| < 2^127 / log2(e), so no max pass is needed.
// Pass 2 reads x again and writes y_j = (m_j / v) * 2^(n_j - e).
//
// What must stay true:
//  * -inf inputs give exactly 0 (masks); a row with no finite entry, or with +inf or NaN, is
//    recomputed by the reference three-pass loop (RowSafe) so that it matches ai.onnx.Softmax / torch
//    bit-for-bit in which entries are NaN.
//  * Sums are accumulated in blocks (kBlock elements per lane accumulator, then merged) to keep the
//    float32 summation error of long rows (V = 256000) below ~1e-7 relative.
//  * Rows are independent: threads split rows (MapRows), never a row.
//  * Large outputs are written with non-temporal stores: the output is not re-read by this kernel,
//    and skipping the write-allocate read is what beats a three-pass softmax out of cache.
#include <cmath>
#include <cstring>

#include "common/kernel.h"
#include "common/simd_math.h"

namespace sd {
namespace {

constexpr const char* kOp = "TwoPassSoftmax";

// Reference three-pass softmax for the rows the fast path does not handle (all -inf, +inf, NaN).
void RowSafe(const float* x, float* y, int64_t n) {
  float m = -INFINITY;
  bool has_nan = false;
  for (int64_t j = 0; j < n; ++j) {
    has_nan |= std::isnan(x[j]);
    m = std::max(m, x[j]);
  }
  if (has_nan || m == -INFINITY || m == INFINITY) {
    // NaN anywhere, all -inf (0/0) or +inf (inf - inf): the whole row is NaN, as in ai.onnx.Softmax.
    for (int64_t j = 0; j < n; ++j) y[j] = NAN;
    return;
  }
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(static_cast<double>(x[j]) - m);
  for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(std::exp(static_cast<double>(x[j]) - m) / s);
}

// ---- portable -----------------------------------------------------------------------------------

void AccumulatePortable(float& v, float& e, float m, float n) {
  const float max_e = std::max(e, n);
  v = simd::Scale2(v, e - max_e) + simd::Scale2(m, n - max_e);
  e = max_e;
}

void RowPortable(const float* x, float* y, int64_t n) {
  // Two-level summation; one scalar accumulator needs shorter blocks than the 48-lane SIMD ones.
  constexpr int64_t kBlock = 64;
  float acc_v = 0.0f, acc_e = simd::kNoExponent;
  for (int64_t j = 0; j < n;) {
    const int64_t block_end = std::min(n, j + kBlock);
    float v = 0.0f, e = simd::kNoExponent;
    for (; j < block_end; ++j) {
      float m, ne;
      simd::ExtExp(x[j], &m, &ne);
      if (std::isnan(m) || std::isnan(ne)) return RowSafe(x, y, n);
      AccumulatePortable(v, e, m, ne);
    }
    AccumulatePortable(acc_v, acc_e, v, e);
  }
  if (!(acc_v > 0.0f) || !std::isfinite(acc_v)) return RowSafe(x, y, n);
  const float inv = 1.0f / acc_v;
  for (int64_t j = 0; j < n; ++j) {
    float m, e;
    simd::ExtExp(x[j], &m, &e);
    y[j] = simd::Scale2(m * inv, e - acc_e);
  }
}

constexpr int64_t kBlock = 1024;  // elements per block of the two-level summation

// ---- AVX-512 ------------------------------------------------------------------------------------

SD_TARGET_AVX512 inline void Accumulate(__m512& v, __m512& e, __m512 m, __m512 n) {
  const __m512 max_e = _mm512_max_ps(e, n);
  v = _mm512_add_ps(_mm512_scalef_ps(v, _mm512_sub_ps(e, max_e)), _mm512_scalef_ps(m, _mm512_sub_ps(n, max_e)));
  e = max_e;
}

// Sum of exp over x[0, n) as (v, e) pairs per lane.
SD_TARGET_AVX512 void Pass1Avx512(const float* x, int64_t n, __m512* out_v, __m512* out_e) {
  __m512 tv = _mm512_setzero_ps(), te = _mm512_set1_ps(simd::kNoExponent);
  int64_t j = 0;
  while (j < n) {
    const int64_t block_end = std::min(n, j + kBlock);
    __m512 v0 = _mm512_setzero_ps(), v1 = v0, v2 = v0;
    __m512 e0 = _mm512_set1_ps(simd::kNoExponent), e1 = e0, e2 = e0;
    for (; j + 48 <= block_end; j += 48) {
      __m512 m, e;
      simd::ExtExp(_mm512_loadu_ps(x + j), &m, &e);
      Accumulate(v0, e0, m, e);
      simd::ExtExp(_mm512_loadu_ps(x + j + 16), &m, &e);
      Accumulate(v1, e1, m, e);
      simd::ExtExp(_mm512_loadu_ps(x + j + 32), &m, &e);
      Accumulate(v2, e2, m, e);
    }
    for (; j < block_end; j += 16) {
      const __mmask16 k = static_cast<__mmask16>(block_end - j >= 16 ? 0xFFFF : (1u << (block_end - j)) - 1);
      __m512 m, e;
      simd::ExtExp(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + j), &m, &e);
      Accumulate(v0, e0, m, e);
    }
    Accumulate(v0, e0, v1, e1);
    Accumulate(v0, e0, v2, e2);
    Accumulate(tv, te, v0, e0);
  }
  *out_v = tv;
  *out_e = te;
}

SD_TARGET_AVX512 void RowAvx512(const float* x, float* y, int64_t n, bool stream) {
  __m512 lv, le;
  Pass1Avx512(x, n, &lv, &le);
  // Reduce the 16 lanes.
  alignas(64) float vv[16], ee[16];
  _mm512_store_ps(vv, lv);
  _mm512_store_ps(ee, le);
  float e = simd::kNoExponent;
  for (int i = 0; i < 16; ++i) e = std::isnan(ee[i]) ? NAN : std::max(e, ee[i]);
  float v = 0.0f;
  for (int i = 0; i < 16; ++i) v += simd::Scale2(vv[i], ee[i] - e);
  if (!(v > 0.0f) || !std::isfinite(v) || std::isnan(e)) return RowSafe(x, y, n);

  const __m512 inv = _mm512_set1_ps(1.0f / v);
  const __m512 minus_e = _mm512_set1_ps(-e);
  int64_t j = 0;
  auto out = [&](int64_t at) SD_TARGET_AVX512 {
    __m512 m, ne;
    simd::ExtExp(_mm512_loadu_ps(x + at), &m, &ne);
    return _mm512_scalef_ps(_mm512_mul_ps(m, inv), _mm512_add_ps(ne, minus_e));
  };
  if (stream) {
    // Peel to a 64-byte aligned output address: streaming stores need it.
    while (j < n && (reinterpret_cast<uintptr_t>(y + j) & 63) != 0) {
      float m, ne;
      simd::ExtExp(x[j], &m, &ne);
      y[j] = simd::Scale2(m / v, ne - e);
      ++j;
    }
    for (; j + 16 <= n; j += 16) _mm512_stream_ps(y + j, out(j));
    _mm_sfence();
  } else {
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, out(j));
  }
  if (j < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - j)) - 1);
    __m512 m, ne;
    simd::ExtExp(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + j), &m, &ne);
    _mm512_mask_storeu_ps(y + j, k, _mm512_scalef_ps(_mm512_mul_ps(m, inv), _mm512_add_ps(ne, minus_e)));
  }
}

// ---- AVX2 ---------------------------------------------------------------------------------------

SD_TARGET_AVX2 inline void Accumulate(__m256& v, __m256& e, __m256 m, __m256 n) {
  const __m256 max_e = _mm256_max_ps(e, n);
  v = _mm256_fmadd_ps(m, simd::Exp2NonPositive(_mm256_sub_ps(n, max_e)),
                      _mm256_mul_ps(v, simd::Exp2NonPositive(_mm256_sub_ps(e, max_e))));
  e = max_e;
}

SD_TARGET_AVX2 void RowAvx2(const float* x, float* y, int64_t n, bool stream) {
  // A NaN anywhere is detected up front: AVX2's max_ps and the exponent emulation drop NaNs.
  __m256 tv = _mm256_setzero_ps(), te = _mm256_set1_ps(simd::kNoExponent);
  __m256 nan_seen = _mm256_setzero_ps();
  int64_t j = 0;
  while (j < n) {
    const int64_t block_end = std::min(n, j + kBlock);
    __m256 v0 = _mm256_setzero_ps(), v1 = v0;
    __m256 e0 = _mm256_set1_ps(simd::kNoExponent), e1 = e0;
    for (; j + 16 <= block_end; j += 16) {
      const __m256 xa = _mm256_loadu_ps(x + j), xb = _mm256_loadu_ps(x + j + 8);
      nan_seen = _mm256_or_ps(nan_seen, _mm256_cmp_ps(xa, xb, _CMP_UNORD_Q));
      __m256 m, e;
      simd::ExtExp(xa, &m, &e);
      Accumulate(v0, e0, m, e);
      simd::ExtExp(xb, &m, &e);
      Accumulate(v1, e1, m, e);
    }
    for (; j + 8 <= block_end; j += 8) {
      const __m256 xa = _mm256_loadu_ps(x + j);
      nan_seen = _mm256_or_ps(nan_seen, _mm256_cmp_ps(xa, xa, _CMP_UNORD_Q));
      __m256 m, e;
      simd::ExtExp(xa, &m, &e);
      Accumulate(v0, e0, m, e);
    }
    Accumulate(v0, e0, v1, e1);
    Accumulate(tv, te, v0, e0);
    if (j < block_end) break;  // fewer than 8 left: scalar tail below
  }
  alignas(32) float vv[8], ee[8];
  _mm256_store_ps(vv, tv);
  _mm256_store_ps(ee, te);
  float e = simd::kNoExponent;
  for (int i = 0; i < 8; ++i) e = std::max(e, ee[i]);
  float v = 0.0f;
  for (int i = 0; i < 8; ++i) v += simd::Scale2(vv[i], ee[i] - e);
  for (int64_t t = j; t < n; ++t) {  // scalar tail
    float m, ne;
    simd::ExtExp(x[t], &m, &ne);
    if (std::isnan(m) || std::isnan(ne)) return RowSafe(x, y, n);
    const float max_e = std::max(e, ne);
    v = simd::Scale2(v, e - max_e) + simd::Scale2(m, ne - max_e);
    e = max_e;
  }
  if (_mm256_movemask_ps(nan_seen) != 0 || !(v > 0.0f) || !std::isfinite(v) || !std::isfinite(e)) {
    return RowSafe(x, y, n);
  }
  const __m256 inv = _mm256_set1_ps(1.0f / v);
  const __m256 minus_e = _mm256_set1_ps(-e);
  j = 0;
  if (stream) {
    while (j < n && (reinterpret_cast<uintptr_t>(y + j) & 31) != 0) {
      float m, ne;
      simd::ExtExp(x[j], &m, &ne);
      y[j] = simd::Scale2(m / v, ne - e);
      ++j;
    }
  }
  for (; j + 8 <= n; j += 8) {
    __m256 m, ne;
    simd::ExtExp(_mm256_loadu_ps(x + j), &m, &ne);
    const __m256 r = _mm256_mul_ps(_mm256_mul_ps(m, inv), simd::Exp2NonPositive(_mm256_add_ps(ne, minus_e)));
    if (stream) _mm256_stream_ps(y + j, r);
    else _mm256_storeu_ps(y + j, r);
  }
  if (stream) _mm_sfence();
  for (; j < n; ++j) {
    float m, ne;
    simd::ExtExp(x[j], &m, &ne);
    y[j] = simd::Scale2(m / v, ne - e);
  }
}

// Outputs at least this large are streamed past the cache (half the 32 MiB L3 of the machines we
// measure on; a smaller output is likely to be read back from cache by the next node).
constexpr int64_t kStreamBytes = 16 << 20;

struct TwoPassSoftmaxKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {{Elem::kT}};
  static constexpr Port kOutputs[] = {{Elem::kT}};

  int64_t axis;
  Isa isa;

  explicit TwoPassSoftmaxKernel(const Attrs& attrs) : axis(attrs.Int("axis", -1)), isa(SelectIsa()) {}

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> x = GetInput<T>(ctx, 0);
    T* y = AllocOutput<T>(ctx, 0, x.shape);
    if (x.rank() == 0) Fail(kOp, "input must have rank >= 1, got a scalar");
    const AxisLayout l = AxisLayout::Of(x.shape, NormalizeAxis(kOp, axis, x.rank()));
    if (x.size() == 0) return;
    const bool stream = x.size() * static_cast<int64_t>(sizeof(float)) >= kStreamBytes;
    switch (isa) {
      case Isa::kAvx512:
        MapRows<T>(ctx, x.data, y, l, [stream](const float* a, float* b, int64_t n) { RowAvx512(a, b, n, stream); });
        break;
      case Isa::kAvx2:
        MapRows<T>(ctx, x.data, y, l, [stream](const float* a, float* b, int64_t n) { RowAvx2(a, b, n, stream); });
        break;
      default:
        MapRows<T>(ctx, x.data, y, l, RowPortable);
    }
  }
};

}  // namespace

SD_REGISTER_KERNEL(TwoPassSoftmax, TwoPassSoftmaxKernel)

}  // namespace sd
