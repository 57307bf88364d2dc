// SoftNMS's vector passes for AVX-512: ops/soft_nms_kernels.h instantiated with the Avx512 traits,
// and the gaussian/linear/hard weights of the near rows (AVX-512 only: the 8-lane double exp). Compiled
// with the AVX-512 flags and -ffp-contract=off (CMakeLists.txt); called only after the run-time ISA
// check of ops/soft_nms.cc.
#include <cmath>

#include "soft_nms_kernels.h"

namespace sd {
namespace soft_nms {

int64_t ScanAvx512(const Selected& t, const Slots& w, float offset) { return Scan<vec::Avx512>(t, w, offset); }
float MaxAvx512(const float* s, int64_t begin, int64_t end) { return Max<vec::Avx512>(s, begin, end); }
int64_t FirstEqualAvx512(const float* s, int64_t begin, int64_t end, float value) {
  return FirstEqual<vec::Avx512>(s, begin, end, value);
}

namespace {

constexpr int kLinear = 0, kGaussian = 1;  // WeighAvx512's method (2: hard)

// ops/soft_nms.cc's GaussianWeight: float(exp(double(-(IoU*IoU) / sigma))).
inline float GaussianWeight(float iou, float sigma) {
  const float t = -(iou * iou) / sigma;
  return static_cast<float>(std::exp(static_cast<double>(t)));
}

// exp(t) in double for 8 lanes, within a few ulp (Taylor degree 12 on |r| <= ln2/2 after
// t = n*ln2 + r). Only used where the float32 rounding of the result is unambiguous (below).
inline __m512d ExpPd(__m512d t) {
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

// Gaussian weights of 8 near rows: IoU = inter / union (as the oracle, float32), weight
// float(exp(double(-(IoU*IoU) / sigma))). ExpPd and glibc's exp are both within 2^-50 (relative) of
// the true value, so whenever [y - y*2^-50, y + y*2^-50] rounds to one float32 that float32 is the
// oracle's weight, bit for bit; the (about 2^-26-rare) lanes where it does not use std::exp itself.
inline __m256 GaussianWeights8(__m256 iou, float sigma) {
  const __m256 t = _mm256_div_ps(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(iou, iou)), _mm256_set1_ps(sigma));
  const __m512d y = ExpPd(_mm512_cvtps_pd(t));
  const __m512d dy = _mm512_mul_pd(_mm512_abs_pd(y), _mm512_set1_pd(0x1p-50));
  const __m256 w = _mm512_cvtpd_ps(y);
  const __mmask8 unsure =
      _mm256_cmp_ps_mask(_mm512_cvtpd_ps(_mm512_sub_pd(y, dy)), _mm512_cvtpd_ps(_mm512_add_pd(y, dy)), _CMP_NEQ_OQ);
  if (unsure == 0) return w;
  alignas(32) float iou_lanes[8], w_lanes[8];
  _mm256_store_ps(iou_lanes, iou);
  _mm256_store_ps(w_lanes, w);
  for (unsigned bits = unsure; bits != 0; bits &= bits - 1) {
    const int lane = __builtin_ctz(bits);
    w_lanes[lane] = GaussianWeight(iou_lanes[lane], sigma);
  }
  return _mm256_load_ps(w_lanes);
}

}  // namespace

// ops/soft_nms.cc's WeighPortable, 8 near rows a step (the tail masked: its lanes compute 0 / 1, stored nowhere).
void WeighAvx512(float* inter, const float* uni, int64_t near_n, int method, float iou_threshold, float sigma) {
  const __m256 one = _mm256_set1_ps(1.0f), nt = _mm256_set1_ps(iou_threshold);
  for (int64_t j = 0; j < near_n; j += 8) {
    const __mmask8 m = static_cast<__mmask8>(near_n - j >= 8 ? 0xFF : (1u << (near_n - j)) - 1);
    const __m256 iou = _mm256_div_ps(_mm256_maskz_loadu_ps(m, inter + j), _mm256_mask_loadu_ps(one, m, uni + j));
    __m256 wt;
    if (method == kGaussian) wt = GaussianWeights8(iou, sigma);
    else if (method == kLinear)
      wt = _mm256_mask_blend_ps(_mm256_cmp_ps_mask(iou, nt, _CMP_GT_OQ), one, _mm256_sub_ps(one, iou));
    else wt = _mm256_mask_blend_ps(_mm256_cmp_ps_mask(iou, nt, _CMP_GT_OQ), one, _mm256_setzero_ps());
    _mm256_mask_storeu_ps(inter + j, m, wt);
  }
}


}  // namespace soft_nms
}  // namespace sd
