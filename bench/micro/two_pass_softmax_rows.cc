// Micro-benchmark of the TwoPassSoftmax row functions without onnxruntime in the loop.
//   g++ -O3 -march=x86-64-v4 -std=c++17 -DORT_API_MANUAL_INIT -Iops -I$ORT_HEADERS bench/micro/two_pass_softmax_rows.cc \
//       ops/common/cpu.cc -o /tmp/tps && /tmp/tps
// 1. One row, minimum time over repetitions (robust on a shared machine; the row stays in cache).
// 2. 64 rows of 32000 / 128000 / 256000 (8 / 31 / 62 MiB: x from L3 or DRAM) with and without the
//    non-temporal hint on x (kNonTemporalMinElements), next to a plain AVX-512 copy of the same data;
//    the variants interleaved, medians of 41 rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "../../ops/two_pass_softmax.cc"

using clk = std::chrono::steady_clock;

static void OneRow() {
  for (int64_t n : {1000, 32000, 256000}) {
    std::vector<float> x(n), y(n);
    std::mt19937 rng(0);
    std::normal_distribution<float> dist(0.f, 2.f);
    for (auto& v : x) v = dist(rng);
    auto time = [&](auto fn) {
      double best = 1e30;
      for (int rep = 0; rep < 200; ++rep) {
        auto t0 = clk::now();
        fn();
        best = std::min(best, std::chrono::duration<double>(clk::now() - t0).count());
      }
      return best;
    };
    double a512 = time([&] { sd::RowAvx512<false>(x.data(), y.data(), n); });
    double a2 = time([&] { sd::RowAvx2<false>(x.data(), y.data(), n); });
    std::printf("n=%7lld avx512 %.3f ns/elem  avx2 %.3f ns/elem\n", (long long)n, a512 / n * 1e9, a2 / n * 1e9);
  }
}

static void SixtyFourRows() {
  for (int64_t n : {32000, 128000, 256000}) {
    const int64_t rows = 64, total = rows * n;
    float* x = static_cast<float*>(std::aligned_alloc(64, total * 4));
    float* y = static_cast<float*>(std::aligned_alloc(64, total * 4));
    std::mt19937 rng(0);
    std::normal_distribution<float> dist(0.f, 2.f);
    for (int64_t i = 0; i < total; ++i) x[i] = dist(rng), y[i] = 0.f;
    const char* names[] = {"avx512", "avx512 + hint", "avx2", "avx2 + hint", "copy"};
    std::vector<double> t[5];
    for (int round = 0; round < 41; ++round) {
      for (int v = 0; v < 5; ++v) {
        auto t0 = clk::now();
        for (int64_t r = 0; r < rows && v < 4; ++r) {
          const float* a = x + r * n;
          float* b = y + r * n;
          if (v == 0) sd::RowAvx512<false>(a, b, n);
          if (v == 1) sd::RowAvx512<true>(a, b, n);
          if (v == 2) sd::RowAvx2<false>(a, b, n);
          if (v == 3) sd::RowAvx2<true>(a, b, n);
        }
        if (v == 4)
          for (int64_t i = 0; i < total; i += 16) _mm512_store_ps(y + i, _mm512_load_ps(x + i));
        t[v].push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count());
      }
    }
    for (int v = 0; v < 5; ++v) {
      std::sort(t[v].begin(), t[v].end());
      std::printf("64x%-7lld %-14s median %8.0f us  (quartiles %.0f - %.0f)\n", (long long)n, names[v], t[v][20],
                  t[v][10], t[v][30]);
    }
    std::free(x);
    std::free(y);
  }
}

int main() {
  OneRow();
  SixtyFourRows();
}
