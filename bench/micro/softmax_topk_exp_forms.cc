// What the AVX2 SoftmaxTopK row's per-entry work costs, piece by piece: the row's exp-sum loop (ops/
// softmax_topk_kernels.h, Design<Avx2>) over a 16 KB buffer in L1, so that only the core's issue rate
// bounds it, in cycles per 8 entries (one vector). The clock is measured in the same run by a chain of
// dependent integer adds (one cycle each).
//   g++ -O3 -mavx2 -mfma -std=c++17 bench/micro/softmax_topk_exp_forms.cc -o /tmp/exp_forms && /tmp/exp_forms
// Forms (vector operations per 8 entries in brackets):
//   exp alone           t = fma(x, s, K), r = x*s - (t - K), table lookup, 2^n into the exponent, degree-3
//                       polynomial, accumulate [10]
//   row (float check)   + clamp max(x, xlo) and the candidate compare x > thr, one branch per 4 vectors,
//                       4 accumulators: the row as it is [12 + 1 per 4 for the mask reduction]
//   int range check     + the candidate and clamp checks as one unsigned range check on bits(t) (sub, signed
//                       compare), one branch per 2 vectors, 2 accumulators [12.5]
//   one int compare     the same with the compare alone (not a complete check: what the sub costs) [11.5]
//   degree 2            exp alone with a degree-2 polynomial (not accurate enough: 3.4e-6) [9]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace {

enum Form { kExpAlone, kRowFloatCheck, kIntRangeCheck, kOneIntCompare, kDegree2 };

template <Form kForm>
__attribute__((noinline)) float Run(const float* x, int64_t n, int reps) {
  const __m256 vs = _mm256_set1_ps(1.4426950f), vk = _mm256_set1_ps(1572864.0f), xlo = _mm256_set1_ps(-60.0f);
  const __m256 thr = _mm256_set1_ps(30.0f);  // above every entry: the candidate branch is never taken
  const __m256 tab = _mm256_setr_ps(1.0f, 1.09f, 1.19f, 1.30f, 1.41f, 1.54f, 1.68f, 1.83f);
  const __m256 q1 = _mm256_set1_ps(0.6931472f), q2 = _mm256_set1_ps(0.2402576f), q3 = _mm256_set1_ps(0.0554962f);
  const __m256 one = _mm256_set1_ps(1.0f);
  // bits(t) in [lo, hi) as (bits - bias) < span, signed; every entry passes
  const __m256i bias = _mm256_set1_epi32(static_cast<int32_t>(0x49000000u + 0x80000000u));
  const __m256i span = _mm256_set1_epi32(static_cast<int32_t>(0x01000000u + 0x80000000u));
  const __m256i hi = _mm256_set1_epi32(0x4A000000);  // the one compare: bits(t) < hi
  auto term = [&](__m256 v, __m256 t, __m256 acc) __attribute__((always_inline)) {
    const __m256 r = _mm256_fmsub_ps(v, vs, _mm256_sub_ps(t, vk));
    const __m256i tb = _mm256_castps_si256(t);
    const __m256 scaled = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_castps_si256(_mm256_permutevar8x32_ps(tab, tb)), _mm256_slli_epi32(tb, 20)));
    __m256 p;
    if constexpr (kForm == kDegree2) {
      p = _mm256_fmadd_ps(_mm256_fmadd_ps(q2, r, q1), r, one);
    } else {
      p = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_fmadd_ps(q3, r, q2), r, q1), r, one);
    }
    return _mm256_fmadd_ps(scaled, p, acc);
  };
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int rep = 0; rep < reps; ++rep) {
    if constexpr (kForm == kRowFloatCheck) {
      for (int64_t i = 0; i < n; i += 32) {
        const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        const __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
        const __m256 c = _mm256_or_ps(
            _mm256_or_ps(_mm256_cmp_ps(v0, thr, _CMP_NLE_UQ), _mm256_cmp_ps(v1, thr, _CMP_NLE_UQ)),
            _mm256_or_ps(_mm256_cmp_ps(v2, thr, _CMP_NLE_UQ), _mm256_cmp_ps(v3, thr, _CMP_NLE_UQ)));
        if (_mm256_movemask_ps(c) != 0) __builtin_trap();
        auto clamped = [&](__m256 v, __m256 acc) __attribute__((always_inline)) {
          const __m256 xc = _mm256_max_ps(v, xlo);
          return term(xc, _mm256_fmadd_ps(xc, vs, vk), acc);
        };
        a0 = clamped(v0, a0);
        a1 = clamped(v1, a1);
        a2 = clamped(v2, a2);
        a3 = clamped(v3, a3);
      }
    } else {
      for (int64_t i = 0; i < n; i += 16) {
        const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        const __m256 t0 = _mm256_fmadd_ps(v0, vs, vk), t1 = _mm256_fmadd_ps(v1, vs, vk);
        if constexpr (kForm == kIntRangeCheck || kForm == kOneIntCompare) {
          const __m256i b0 = _mm256_castps_si256(t0), b1 = _mm256_castps_si256(t1);
          const __m256i c0 = kForm == kIntRangeCheck ? _mm256_cmpgt_epi32(span, _mm256_sub_epi32(b0, bias))
                                                     : _mm256_cmpgt_epi32(hi, b0);
          const __m256i c1 = kForm == kIntRangeCheck ? _mm256_cmpgt_epi32(span, _mm256_sub_epi32(b1, bias))
                                                     : _mm256_cmpgt_epi32(hi, b1);
          if (_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_and_si256(c0, c1))) != 0xFF) __builtin_trap();
        }
        a0 = term(v0, t0, a0);
        a1 = term(v1, t1, a1);
      }
    }
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return lanes[0];
}

// Cycles per second: a chain of dependent adds, one cycle each on every x86 core.
double ClockHz() {
  double best = 0.0;
  for (int rep = 0; rep < 5; ++rep) {
    uint64_t v = 0;
    constexpr int64_t kAdds = 200'000'000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < kAdds / 8; ++i) {
      asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                   "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
                   : "+r"(v));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, kAdds / s);
  }
  return best;
}

}  // namespace

int main() {
  constexpr int64_t n = 4096;  // 16 KB: in L1
  constexpr int kReps = 2000;
  std::vector<float> x(n);
  std::mt19937 rng(0);
  std::normal_distribution<float> dist(-10.0f, 2.0f);
  for (auto& v : x) v = dist(rng);
  const double hz = ClockHz();
  std::printf("clock %.2f GHz (dependent adds); cycles per 8 entries, minimum of 15 runs, data in L1\n", hz * 1e-9);
  auto time = [&](auto fn, const char* name) {
    double best = 1e30;
    for (int run = 0; run < 15; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      volatile float sink = fn();
      (void)sink;
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("  %-20s %.2f\n", name, best * hz / (static_cast<double>(n) * kReps / 8));
  };
  time([&] { return Run<kExpAlone>(x.data(), n, kReps); }, "exp alone");
  time([&] { return Run<kRowFloatCheck>(x.data(), n, kReps); }, "row (float check)");
  time([&] { return Run<kIntRangeCheck>(x.data(), n, kReps); }, "int range check");
  time([&] { return Run<kOneIntCompare>(x.data(), n, kReps); }, "one int compare");
  time([&] { return Run<kDegree2>(x.data(), n, kReps); }, "degree 2");
}
