// Vector traits: one struct per ISA with the vector types and the operations the micro-kernels use,
// so that a kernel is written once as a template over V (ops/max_sim_kernels.h) and instantiated per
// ISA. A NEON traits class (float32x4_t, uint32x4_t as the mask) fits the same shape.
//
//   F / I / M       float vector, int32 vector, comparison mask (AVX-512: __mmask16; AVX2: a float
//                   vector whose lanes are all-ones or zero)
//   kLanes          float lanes per vector
//   kBlockF32       document tokens per float32 register block (2 * kBlockF32 accumulators plus two
//                   Q vectors and one broadcast must fit the register file: 16 of 32 zmm on AVX-512,
//                   12 + 3 = 15 of 16 ymm on AVX2)
//
// Only a translation unit compiled for the ISA sees its struct (ops/max_sim_avx2.cc is built with
// -mavx2 -mfma, ops/max_sim_avx512.cc with the AVX-512 flags; see CMakeLists.txt). Everything here
// sits in an anonymous namespace ON PURPOSE: an inline function with external linkage compiled in
// two translation units with different -m flags is one COMDAT symbol, and the linker may keep the
// AVX-512 encoding for the AVX2 caller (SIGILL on an AVX2-only CPU). Internal linkage gives every
// translation unit its own copy.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#define SD_VEC_INLINE __attribute__((always_inline)) inline
// For lambdas in kernels over the traits (a lambda left out of line keeps its captures in memory).
#define SD_VEC_LAMBDA __attribute__((always_inline))

namespace sd {
namespace vec {
namespace {

// 4 bytes read as one int32 whatever their alignment or declared type (the int8 broadcast groups).
typedef int32_t Word __attribute__((may_alias, aligned(1)));

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
struct Avx512 {
  using F = __m512;
  using I = __m512i;
  using M = __mmask16;
  static constexpr int kLanes = 16;
  static constexpr int kBlockF32 = 8;

  static SD_VEC_INLINE F zero() { return _mm512_setzero_ps(); }
  static SD_VEC_INLINE F set1(float x) { return _mm512_set1_ps(x); }
  static SD_VEC_INLINE F broadcast(const float* p) { return _mm512_set1_ps(*p); }  // embedded {1to16}
  static SD_VEC_INLINE F load(const float* p) { return _mm512_load_ps(p); }          // 64-byte aligned
  static SD_VEC_INLINE F loadu(const float* p) { return _mm512_loadu_ps(p); }
  // The first n lanes of p (0 <= n <= kLanes), the rest 0; never reads past p + n.
  static SD_VEC_INLINE F loadu_tail(const float* p, int n) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p);
  }
  static SD_VEC_INLINE void storeu(float* p, F x) { _mm512_storeu_ps(p, x); }
  static SD_VEC_INLINE F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c, one rounding
  static SD_VEC_INLINE F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  // (masked form: GCC 12's _mm512_max_ps warns about an uninitialised temporary in its own header; one vmaxps)
  static SD_VEC_INLINE F max(F a, F b) { return _mm512_mask_max_ps(a, 0xFFFF, a, b); }
  static SD_VEC_INLINE F cvt(I x) { return _mm512_cvtepi32_ps(x); }
  static SD_VEC_INLINE I set1i(int32_t x) { return _mm512_set1_epi32(x); }
  static SD_VEC_INLINE I broadcast4(const void* p) { return _mm512_set1_epi32(*static_cast<const Word*>(p)); }
  static SD_VEC_INLINE I zeroi() { return _mm512_setzero_si512(); }
  static SD_VEC_INLINE I loadi(const void* p) { return _mm512_load_si512(p); }
  static SD_VEC_INLINE I loadui(const void* p) { return _mm512_loadu_si512(p); }
  static SD_VEC_INLINE I addi(I a, I b) { return _mm512_add_epi32(a, b); }
  static SD_VEC_INLINE I subi(I a, I b) { return _mm512_sub_epi32(a, b); }
  static SD_VEC_INLINE void storeui(int32_t* p, I x) { _mm512_storeu_si512(p, x); }
  static SD_VEC_INLINE M none() { return 0; }
  static SD_VEC_INLINE M gt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static SD_VEC_INLINE M isnan(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static SD_VEC_INLINE M mask_or(M a, M b) { return static_cast<M>(a | b); }
  static SD_VEC_INLINE F select(M m, F a, F b) { return _mm512_mask_blend_ps(m, a, b); }  // m ? b : a
  static SD_VEC_INLINE F keep(M m, F a) { return _mm512_maskz_mov_ps(m, a); }  // m ? a : +0
  static SD_VEC_INLINE I selecti(M m, I a, I b) { return _mm512_mask_blend_epi32(m, a, b); }
  static SD_VEC_INLINE unsigned bits(M m) { return m; }  // lane l -> bit l
  // Softmax-family additions (ops/softmax_topk_kernels.h).
  static SD_VEC_INLINE F add(F a, F b) { return _mm512_add_ps(a, b); }
  static SD_VEC_INLINE F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static SD_VEC_INLINE F fms(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }  // a * b - c, one rounding
  static SD_VEC_INLINE M nle(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_NLE_UQ); }  // !(a <= b): NaN passes
  static SD_VEC_INLINE M tail_mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }  // lanes < n
  // The first n lanes of p, the rest `fill`; never reads past p + n.
  static SD_VEC_INLINE F loadu_fill(const float* p, int n, float fill) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), tail_mask(n), p);
  }
  static SD_VEC_INLINE I as_int(F x) { return _mm512_castps_si512(x); }
  static SD_VEC_INLINE F as_float(I x) { return _mm512_castsi512_ps(x); }
  template <int kShift>
  static SD_VEC_INLINE I slli(I x) { return _mm512_slli_epi32(x, kShift); }
  // table[idx & (kLanes - 1)] per lane: a kLanes-entry table held in one register.
  static SD_VEC_INLINE F lookup(F table, I idx) { return _mm512_permutexvar_ps(idx, table); }
  // (lo, hi)[idx & (2 kLanes - 1)] per lane: a 2 kLanes-entry table in two registers (vpermt2ps).
  static SD_VEC_INLINE F lookup2(F lo, F hi, I idx) { return _mm512_permutex2var_ps(lo, idx, hi); }
  // acc + 1 in the lanes where a > b (int32, signed).
  static SD_VEC_INLINE I count_gt(I acc, I a, I b) {
    return _mm512_mask_sub_epi32(acc, _mm512_cmpgt_epi32_mask(a, b), acc, _mm512_set1_epi32(-1));
  }
  static SD_VEC_INLINE int64_t reduce_addi(I x) { return _mm512_reduce_add_epi32(x); }
  static SD_VEC_INLINE M nlt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_NLT_UQ); }  // !(a < b)
  static SD_VEC_INLINE M gti(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }  // int32, signed
  template <int kShift>
  static SD_VEC_INLINE I srai(I x) { return _mm512_srai_epi32(x, kShift); }
  static SD_VEC_INLINE I andi(I a, I b) { return _mm512_and_si512(a, b); }
  static SD_VEC_INLINE I xori(I a, I b) { return _mm512_xor_si512(a, b); }
  static SD_VEC_INLINE I maxi(I a, I b) { return _mm512_max_epi32(a, b); }
  static SD_VEC_INLINE I mini(I a, I b) { return _mm512_min_epi32(a, b); }
  static SD_VEC_INLINE F min(F a, F b) { return _mm512_min_ps(a, b); }
  static SD_VEC_INLINE F abs(F a) { return _mm512_abs_ps(a); }
  // (maskz form with every lane: GCC 12's plain one can warn about an uninitialised temporary in its own header)
  static SD_VEC_INLINE F round(F a) {
    return _mm512_maskz_roundscale_ps(0xFFFF, a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // 2^e for integer-valued e, exactly as vscalefps gives it (subnormal down to 2^-149, then 0).
  static SD_VEC_INLINE F pow2i(F e) { return _mm512_scalef_ps(_mm512_set1_ps(1.0f), e); }
  static SD_VEC_INLINE M lt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static SD_VEC_INLINE M eq(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static SD_VEC_INLINE float reduce_max(F a) { return _mm512_reduce_max_ps(a); }
  static SD_VEC_INLINE float reduce_add(F a) { return _mm512_reduce_add_ps(a); }  // its own order
  static SD_VEC_INLINE M neq(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_OQ); }
  static SD_VEC_INLINE M unord(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }  // a or b NaN
  static SD_VEC_INLINE F div(F a, F b) { return _mm512_div_ps(a, b); }
  static SD_VEC_INLINE F neg_abs(F a) { return _mm512_or_ps(a, _mm512_set1_ps(-0.0f)); }  // -|a|
  static SD_VEC_INLINE void stream(float* p, F x) { _mm512_stream_ps(p, x); }  // 64-byte aligned p
  // The first n lanes of x to p (0 <= n <= kLanes); never writes past p + n.
  static SD_VEC_INLINE void storeu_tail(float* p, int n, F x) { _mm512_mask_storeu_ps(p, tail_mask(n), x); }
  // Double vectors of kLanes / 2 lanes: a float vector's low and high halves widened.
  using D = __m512d;
  static SD_VEC_INLINE D zerod() { return _mm512_setzero_pd(); }
  static SD_VEC_INLINE D set1d(double x) { return _mm512_set1_pd(x); }
  static SD_VEC_INLINE D addd(D a, D b) { return _mm512_add_pd(a, b); }
  static SD_VEC_INLINE D muld(D a, D b) { return _mm512_mul_pd(a, b); }
  // (maskz forms: the plain ones trip GCC 12's -Wuninitialized inside its own headers)
  static SD_VEC_INLINE D cvt_lo(F x) { return _mm512_maskz_cvtps_pd(0xFF, _mm512_maskz_extractf32x8_ps(0xFF, x, 0)); }
  static SD_VEC_INLINE D cvt_hi(F x) { return _mm512_maskz_cvtps_pd(0xFF, _mm512_maskz_extractf32x8_ps(0xFF, x, 1)); }
  static SD_VEC_INLINE double reduce_addd(D x) { return _mm512_reduce_add_pd(x); }  // its own order
  static SD_VEC_INLINE D fmad(D a, D b, D c) { return _mm512_fmadd_pd(a, b, c); }
  // MultiMax additions (ops/multi_max_kernels.h): double arithmetic on D and its mask MD.
  using MD = __mmask8;
  static SD_VEC_INLINE D subd(D a, D b) { return _mm512_sub_pd(a, b); }
  static SD_VEC_INLINE D maxd(D a, D b) { return _mm512_max_pd(a, b); }
  static SD_VEC_INLINE D roundd(D a) { return _mm512_roundscale_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static SD_VEC_INLINE D fnmad(D a, D b, D c) { return _mm512_fnmadd_pd(a, b, c); }  // c - a * b, one rounding
  static SD_VEC_INLINE D loadd(const double* p) { return _mm512_load_pd(p); }         // 64-byte aligned
  static SD_VEC_INLINE void stored(double* p, D x) { _mm512_store_pd(p, x); }       // 64-byte aligned
  static SD_VEC_INLINE double reduce_maxd(D x) { return _mm512_reduce_max_pd(x); }
  // Two double vectors narrowed to float (rounded to nearest) and joined: lo -> lanes 0..7, hi -> 8..15.
  static SD_VEC_INLINE F cvt_ps(D lo, D hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo))),
                                               _mm256_castps_pd(_mm512_cvtpd_ps(hi)), 1));
  }
  static SD_VEC_INLINE MD eqd(D a, D b) { return _mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ); }
  static SD_VEC_INLINE MD unordd(D a, D b) { return _mm512_cmp_pd_mask(a, b, _CMP_UNORD_Q); }
  static SD_VEC_INLINE MD mask_ord(MD a, MD b) { return static_cast<MD>(a | b); }
  static SD_VEC_INLINE MD noned() { return 0; }
  static SD_VEC_INLINE unsigned bitsd(MD m) { return m; }
  static SD_VEC_INLINE D selectd(MD m, D a, D b) { return _mm512_mask_blend_pd(m, a, b); }  // m ? b : a
  static SD_VEC_INLINE M mask_and(M a, M b) { return static_cast<M>(a & b); }
  static SD_VEC_INLINE I lane_index() { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
  // The lanes of m, in lane order, to p[0 .. popcount) (writes kLanes entries); returns the count.
  static SD_VEC_INLINE int compress_storeu(float* p, F v, M m) {
    _mm512_storeu_ps(p, _mm512_maskz_compress_ps(m, v));
    return __builtin_popcount(m);
  }
  static SD_VEC_INLINE int compress_storeui(int32_t* p, I v, M m) {
    _mm512_storeu_si512(p, _mm512_maskz_compress_epi32(m, v));
    return __builtin_popcount(m);
  }
};
#endif

// For compress on 8 lanes: row m lists the set lanes of m in order (the rest 0).
struct LeftPack8 {
  alignas(32) int32_t idx[256][8];
  constexpr LeftPack8() : idx{} {
    for (int m = 0; m < 256; ++m) {
      int w = 0;
      for (int l = 0; l < 8; ++l)
        if ((m >> l) & 1) idx[m][w++] = l;
    }
  }
};
constexpr LeftPack8 kLeftPack8{};

#if defined(__AVX2__) && defined(__FMA__)
struct Avx2 {
  using F = __m256;
  using I = __m256i;
  using M = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kBlockF32 = 6;

  static SD_VEC_INLINE F zero() { return _mm256_setzero_ps(); }
  static SD_VEC_INLINE F set1(float x) { return _mm256_set1_ps(x); }
  static SD_VEC_INLINE F broadcast(const float* p) { return _mm256_broadcast_ss(p); }  // a load-port uop
  static SD_VEC_INLINE F load(const float* p) { return _mm256_load_ps(p); }              // 32-byte aligned
  static SD_VEC_INLINE F loadu(const float* p) { return _mm256_loadu_ps(p); }
  static SD_VEC_INLINE F loadu_tail(const float* p, int n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
  }
  static SD_VEC_INLINE void storeu(float* p, F x) { _mm256_storeu_ps(p, x); }
  static SD_VEC_INLINE F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static SD_VEC_INLINE F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static SD_VEC_INLINE F max(F a, F b) { return _mm256_max_ps(a, b); }
  static SD_VEC_INLINE F cvt(I x) { return _mm256_cvtepi32_ps(x); }
  static SD_VEC_INLINE I set1i(int32_t x) { return _mm256_set1_epi32(x); }
  // The 4 bytes at p (any alignment) in every 32-bit lane: vpbroadcastd from memory.
  static SD_VEC_INLINE I broadcast4(const void* p) { return _mm256_set1_epi32(*static_cast<const Word*>(p)); }
  static SD_VEC_INLINE I zeroi() { return _mm256_setzero_si256(); }
  static SD_VEC_INLINE I loadi(const void* p) { return _mm256_load_si256(static_cast<const __m256i*>(p)); }
  static SD_VEC_INLINE I loadui(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static SD_VEC_INLINE I addi(I a, I b) { return _mm256_add_epi32(a, b); }
  static SD_VEC_INLINE I subi(I a, I b) { return _mm256_sub_epi32(a, b); }
  static SD_VEC_INLINE void storeui(int32_t* p, I x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x); }
  static SD_VEC_INLINE M none() { return _mm256_setzero_ps(); }
  static SD_VEC_INLINE M gt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static SD_VEC_INLINE M isnan(F a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static SD_VEC_INLINE M mask_or(M a, M b) { return _mm256_or_ps(a, b); }
  static SD_VEC_INLINE F select(M m, F a, F b) { return _mm256_blendv_ps(a, b, m); }
  static SD_VEC_INLINE F keep(M m, F a) { return _mm256_and_ps(a, m); }  // m ? a : +0 (m: all-ones or zero lanes)
  static SD_VEC_INLINE I selecti(M m, I a, I b) {
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), m));
  }
  static SD_VEC_INLINE unsigned bits(M m) { return static_cast<unsigned>(_mm256_movemask_ps(m)); }
  // Softmax-family additions (ops/softmax_topk_kernels.h).
  static SD_VEC_INLINE F add(F a, F b) { return _mm256_add_ps(a, b); }
  static SD_VEC_INLINE F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static SD_VEC_INLINE F fms(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
  static SD_VEC_INLINE M nle(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_NLE_UQ); }
  static SD_VEC_INLINE M tail_mask(int n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
  }
  static SD_VEC_INLINE F loadu_fill(const float* p, int n, float fill) {
    const M m = tail_mask(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, _mm256_castps_si256(m)), m);
  }
  static SD_VEC_INLINE I as_int(F x) { return _mm256_castps_si256(x); }
  static SD_VEC_INLINE F as_float(I x) { return _mm256_castsi256_ps(x); }
  template <int kShift>
  static SD_VEC_INLINE I slli(I x) { return _mm256_slli_epi32(x, kShift); }
  static SD_VEC_INLINE F lookup(F table, I idx) { return _mm256_permutevar8x32_ps(table, idx); }  // low 3 bits
  static SD_VEC_INLINE I count_gt(I acc, I a, I b) { return _mm256_sub_epi32(acc, _mm256_cmpgt_epi32(a, b)); }
  static SD_VEC_INLINE M nlt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_NLT_UQ); }
  static SD_VEC_INLINE M gti(I a, I b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)); }
  template <int kShift>
  static SD_VEC_INLINE I srai(I x) { return _mm256_srai_epi32(x, kShift); }
  static SD_VEC_INLINE I andi(I a, I b) { return _mm256_and_si256(a, b); }
  static SD_VEC_INLINE I xori(I a, I b) { return _mm256_xor_si256(a, b); }
  static SD_VEC_INLINE I maxi(I a, I b) { return _mm256_max_epi32(a, b); }
  static SD_VEC_INLINE I mini(I a, I b) { return _mm256_min_epi32(a, b); }
  static SD_VEC_INLINE F min(F a, F b) { return _mm256_min_ps(a, b); }
  static SD_VEC_INLINE F abs(F a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static SD_VEC_INLINE F round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^e for integer-valued e, clamped to [-127, 127]: e <= -127 gives 0 (no subnormals, unlike
  // AVX-512's vscalefps; each variant keeps its own results).
  static SD_VEC_INLINE F pow2i(F e) {
    const __m256 ec = _mm256_min_ps(_mm256_max_ps(e, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_add_ps(ec, _mm256_set1_ps(127.0f))), 23));
  }
  static SD_VEC_INLINE M lt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static SD_VEC_INLINE M eq(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  static SD_VEC_INLINE float reduce_max(F a) {
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 q = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(q, _mm_shuffle_ps(q, q, 1)));
  }
  // (h0 + h1) pairwise down to one lane.
  static SD_VEC_INLINE float reduce_add(F a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static SD_VEC_INLINE M neq(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_NEQ_OQ); }
  static SD_VEC_INLINE M unord(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_UNORD_Q); }
  static SD_VEC_INLINE F div(F a, F b) { return _mm256_div_ps(a, b); }
  static SD_VEC_INLINE F neg_abs(F a) { return _mm256_or_ps(a, _mm256_set1_ps(-0.0f)); }
  static SD_VEC_INLINE void stream(float* p, F x) { _mm256_stream_ps(p, x); }  // 32-byte aligned p
  static SD_VEC_INLINE void storeu_tail(float* p, int n, F x) {
    _mm256_maskstore_ps(p, _mm256_castps_si256(tail_mask(n)), x);
  }
  using D = __m256d;
  static SD_VEC_INLINE D zerod() { return _mm256_setzero_pd(); }
  static SD_VEC_INLINE D set1d(double x) { return _mm256_set1_pd(x); }
  static SD_VEC_INLINE D addd(D a, D b) { return _mm256_add_pd(a, b); }
  static SD_VEC_INLINE D muld(D a, D b) { return _mm256_mul_pd(a, b); }
  static SD_VEC_INLINE D cvt_lo(F x) { return _mm256_cvtps_pd(_mm256_castps256_ps128(x)); }
  static SD_VEC_INLINE D cvt_hi(F x) { return _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)); }
  static SD_VEC_INLINE D fmad(D a, D b, D c) { return _mm256_fmadd_pd(a, b, c); }
  static SD_VEC_INLINE double reduce_addd(D x) {  // (l0 + l1) + (l2 + l3)
    alignas(32) double l[4];
    _mm256_store_pd(l, x);
    return (l[0] + l[1]) + (l[2] + l[3]);
  }
  static SD_VEC_INLINE M mask_and(M a, M b) { return _mm256_and_ps(a, b); }
  using MD = __m256d;
  static SD_VEC_INLINE D subd(D a, D b) { return _mm256_sub_pd(a, b); }
  static SD_VEC_INLINE D maxd(D a, D b) { return _mm256_max_pd(a, b); }
  static SD_VEC_INLINE D roundd(D a) { return _mm256_round_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static SD_VEC_INLINE D fnmad(D a, D b, D c) { return _mm256_fnmadd_pd(a, b, c); }
  static SD_VEC_INLINE D loadd(const double* p) { return _mm256_load_pd(p); }  // 32-byte aligned
  static SD_VEC_INLINE void stored(double* p, D x) { _mm256_store_pd(p, x); }
  static SD_VEC_INLINE double reduce_maxd(D x) {  // max(max(l0, l1), max(l2, l3))
    alignas(32) double l[4];
    _mm256_store_pd(l, x);
    return std::max(std::max(l[0], l[1]), std::max(l[2], l[3]));
  }
  static SD_VEC_INLINE F cvt_ps(D lo, D hi) { return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo)); }
  static SD_VEC_INLINE MD eqd(D a, D b) { return _mm256_cmp_pd(a, b, _CMP_EQ_OQ); }
  static SD_VEC_INLINE MD unordd(D a, D b) { return _mm256_cmp_pd(a, b, _CMP_UNORD_Q); }
  static SD_VEC_INLINE MD mask_ord(MD a, MD b) { return _mm256_or_pd(a, b); }
  static SD_VEC_INLINE MD noned() { return _mm256_setzero_pd(); }
  static SD_VEC_INLINE unsigned bitsd(MD m) { return static_cast<unsigned>(_mm256_movemask_pd(m)); }
  static SD_VEC_INLINE D selectd(MD m, D a, D b) { return _mm256_blendv_pd(a, b, m); }
  static SD_VEC_INLINE I lane_index() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  // No compress on AVX2: a permutation from a 256-entry table (8 KB) by the mask's bits.
  static SD_VEC_INLINE int compress_storeu(float* p, F v, M m) {
    const unsigned b = bits(m);
    const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(kLeftPack8.idx[b]));
    _mm256_storeu_ps(p, _mm256_permutevar8x32_ps(v, perm));
    return __builtin_popcount(b);
  }
  static SD_VEC_INLINE int compress_storeui(int32_t* p, I v, M m) {
    const unsigned b = bits(m);
    const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(kLeftPack8.idx[b]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permutevar8x32_epi32(v, perm));
    return __builtin_popcount(b);
  }
  static SD_VEC_INLINE int64_t reduce_addi(I x) {
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    const __m128i q = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(q, _mm_shuffle_epi32(q, _MM_SHUFFLE(2, 3, 0, 1))));
  }
};
#endif

// 2^(j/L), j < L, as the table of the lookup exps (XNNPACK's lut form: ops/softmax_topk_kernels.h,
// ops/two_pass_softmax_kernels.h). Each entry's bits are less j << (23 - log2 L), so that adding an integer
// whose low log2 L bits hold j and the bits above them an exponent n, shifted left by 23 - log2 L, gives the
// bits of 2^(n + j/L); kExponentBias: also less kExponentBias << 23, for an n that carries the float bias.
template <int L, int kExponentBias = 0>
struct Exp2Table {
  static_assert((1 << __builtin_ctz(L)) == L, "the table needs a power-of-two size");
  alignas(64) float v[L];
  Exp2Table() {
    constexpr int kShift = 23 - __builtin_ctz(L);
    for (int j = 0; j < L; ++j) {
      const float e = static_cast<float>(std::exp2(static_cast<double>(j) / L));
      int32_t b;
      std::memcpy(&b, &e, sizeof b);
      b -= (kExponentBias << 23) + (j << kShift);
      std::memcpy(&v[j], &b, sizeof b);
    }
  }
};

}  // namespace
}  // namespace vec
}  // namespace sd
