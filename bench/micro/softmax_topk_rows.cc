// Micro-benchmark of the SoftmaxTopK row functions without onnxruntime in the loop: minimum time over
// repetitions (robust on a shared machine) of B rows x V, N(0, 2^2) logits like bench/softmax_topk.py,
// next to a read-once floor (an AVX-512 row max over the same rows; at V = 256000 the 64 MB input comes
// from DRAM, so the floor is the in-run DRAM read rate) and the AVX2 row's exp work alone (ExpSumAvx2: what
// any AVX2 row with that exp costs at least).
//   g++ -O3 -march=x86-64-v4 -std=c++17 -DORT_API_MANUAL_INIT -Iops -I$ORT_HEADERS bench/micro/softmax_topk_rows.cc \
//       ops/common/cpu.cc -c -o /tmp/stk.o && \
//   g++ -O3 -mavx2 -mfma -ffp-contract=off -fno-tree-pre -std=c++17 -Iops -c ops/softmax_topk_avx2.cc -o /tmp/stk2.o && \
//   g++ -O3 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -ffp-contract=off -fno-tree-pre -std=c++17 \
//       -Iops -c ops/softmax_topk_avx512.cc -o /tmp/stk512.o && \
//   g++ /tmp/stk.o /tmp/stk2.o /tmp/stk512.o ... (as one link) -o /tmp/stk && /tmp/stk
// (the fast rows live in their own translation units, compiled with the flags CMakeLists.txt gives them).
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "../../ops/softmax_topk.cc"
#include "common/vec.h"

SD_TARGET_AVX512 float RowMax(const float* x, int64_t n) {
  __m512 a0 = _mm512_set1_ps(-INFINITY), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    a0 = _mm512_max_ps(a0, _mm512_loadu_ps(x + j));
    a1 = _mm512_max_ps(a1, _mm512_loadu_ps(x + j + 16));
    a2 = _mm512_max_ps(a2, _mm512_loadu_ps(x + j + 32));
    a3 = _mm512_max_ps(a3, _mm512_loadu_ps(x + j + 48));
  }
  float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a0, a1), _mm512_max_ps(a2, a3)));
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// The AVX2 row's exp work alone: sum_j 2^(x_j*s - C) with the row's exp (ops/softmax_topk_kernels.h,
// Design<Avx2>: t = fma(x, s, K) on the grid 1/8, r = x*s - (t - K), 2^(j/8) from an 8-entry table in one
// register, 2^n into the exponent, degree-3 polynomial Exp2Poly<8>), with no clamp, no candidate check and
// no selection: 10 vector operations per 8 entries against the row's 13. What any AVX2 row with this exp
// costs at least; the degree-3 polynomial is the least that keeps 1e-6 (degree 2 on [-1/16, 1/16]: 3.4e-6).
// Entries must lie within 2^19 of C (N(0, 2^2) logits and C = 0 here).
SD_TARGET_AVX2 double ExpSumAvx2(const float* x, int64_t n, float s) {
  static const sd::vec::Exp2Table<8> table;  // the row's table: 2^(j/8) less j << 20 in its bits
  const __m256 tab = _mm256_load_ps(table.v), vs = _mm256_set1_ps(s), vk = _mm256_set1_ps(1.5f * (1 << 20));
  const __m256 q1 = _mm256_set1_ps(0.6931472420692444f), q2 = _mm256_set1_ps(0.2402576357126236f);
  const __m256 q3 = _mm256_set1_ps(0.0554962232708931f), one = _mm256_set1_ps(1.0f);
  auto term = [&](__m256 v, __m256 acc) __attribute__((always_inline)) {
    const __m256 t = _mm256_fmadd_ps(v, vs, vk);
    const __m256 r = _mm256_fmsub_ps(v, vs, _mm256_sub_ps(t, vk));
    const __m256i tb = _mm256_castps_si256(t);
    const __m256 scaled = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_castps_si256(_mm256_permutevar8x32_ps(tab, tb)), _mm256_slli_epi32(tb, 20)));
    const __m256 p = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_fmadd_ps(q3, r, q2), r, q1), r, one);
    return _mm256_fmadd_ps(scaled, p, acc);
  };
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    a0 = term(_mm256_loadu_ps(x + j), a0);
    a1 = term(_mm256_loadu_ps(x + j + 8), a1);
    a2 = term(_mm256_loadu_ps(x + j + 16), a2);
    a3 = term(_mm256_loadu_ps(x + j + 24), a3);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  double d = 0.0;
  for (float l : lanes) d += l;
  for (; j < n; ++j) d += std::exp2(static_cast<double>(x[j]) * s);
  return d;
}

int main(int argc, char** argv) {
  using clk = std::chrono::steady_clock;
  // Arguments: [repetitions] [V (0: 1000, 32000, 128000, 256000)] [k (0: 1, 5, 50)] [avx2: 1 to time it too]
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  const int64_t only_v = argc > 2 ? std::atoll(argv[2]) : 0, only_k = argc > 3 ? std::atoll(argv[3]) : 0;
  const bool with_avx2 = argc > 4 ? std::atoi(argv[4]) != 0 : true;
  const int64_t rows = 64;
  for (int64_t n : {1000, 32000, 128000, 256000}) {
    if (only_v != 0 && n != only_v) continue;
    std::vector<float> x(rows * n);
    std::mt19937 rng(0);
    std::normal_distribution<float> dist(0.f, 2.f);
    for (auto& v : x) v = dist(rng);
    auto time = [&](auto fn) {
      double best = 1e30;
      for (int rep = 0; rep < reps; ++rep) {
        auto t0 = clk::now();
        fn();
        best = std::min(best, std::chrono::duration<double>(clk::now() - t0).count());
      }
      return best / (rows * n) * 1e9;
    };
    volatile float sink = 0;
    const double floor = time([&] {
      for (int64_t r = 0; r < rows; ++r) sink = sink + RowMax(x.data() + r * n, n);
    });
    const double exp_only = time([&] {
      for (int64_t r = 0; r < rows; ++r) sink = sink + static_cast<float>(ExpSumAvx2(x.data() + r * n, n, 1.4426950f));
    });
    std::printf("B=%lld V=%7lld floor(max) %.3f ns/elem; AVX2 exp-sum alone %.3f ns/elem (%.2fx floor)\n", (long long)rows,
                (long long)n, floor, exp_only, exp_only / floor);
    const std::vector<int64_t> ks = only_k != 0 ? std::vector<int64_t>{only_k} : std::vector<int64_t>{1, 5, 50};
    for (int64_t k : ks) {
      std::vector<float> vals(k);
      std::vector<int64_t> idx(k);
      const float s = static_cast<float>(1.4426950408889634);
      const size_t cap2 = static_cast<size_t>(sd::softmax_topk::CandidateCapacity(k));
      std::vector<float> c2v(cap2);
      std::vector<int32_t> c2i(cap2), c2k(cap2);
      const sd::softmax_topk::Candidates cand2{c2v.data(), c2i.data(), c2k.data()};
      // The row as the kernel runs it: the fast row, then the top k ranked and emitted.
      std::vector<sd::Entry> top;
      auto run512 = [&] {
        return time([&] {
          for (int64_t r = 0; r < rows; ++r) {
            double sum;
            int64_t count;
            if (!sd::softmax_topk::FastRowAvx512(x.data() + r * n, n, k, s, cand2, &sum, &count)) std::abort();
            top.clear();
            for (int64_t j = 0; j < count; ++j) top.push_back(sd::Entry{cand2.values[j], cand2.indices[j]});
            auto order = [](const sd::Entry& p, const sd::Entry& q) { return sd::RanksAboveNoNan(p, q); };
            if (count == k) {
              std::sort(top.begin(), top.end(), order);
            } else {
              std::partial_sort(top.begin(), top.begin() + k, top.end(), order);
              top.resize(static_cast<size_t>(k));
            }
            sd::RowOut out{vals.data(), idx.data(), 0.0f};
            sd::EmitFinite(top, top.front().value, sum, 1.0, out);
            sink = sink + out.lse;
          }
        });
      };
      auto run2 = [&] {
        return time([&] {
          for (int64_t r = 0; r < rows; ++r) {
            double sum;
            int64_t count;
            if (!sd::softmax_topk::FastRowAvx2(x.data() + r * n, n, k, s, cand2, &sum, &count)) std::abort();
            sink = sink + static_cast<float>(sum);
          }
        });
      };
      const double a512 = run512(), a2 = with_avx2 ? run2() : 0.0;
      std::printf("  k=%2lld avx512 %.3f ns/elem (%.2fx floor)  avx2 %.3f ns/elem (%.2fx floor, %.0f%% of its read rate)\n",
                  (long long)k, a512, a512 / floor, a2, a2 / floor, 100.0 * floor / a2);
    }
  }
}
