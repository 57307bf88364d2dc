// Micro-benchmark of the TwoPassSoftmax row functions without onnxruntime in the loop.
//   for isa in avx2:"-mavx2 -mfma" avx512:"-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma"; do
//     g++ -O3 ${isa#*:} -ffp-contract=off -std=c++17 -Iops -c ops/two_pass_softmax_${isa%%:*}.cc -o /tmp/tps_${isa%%:*}.o; done
//   g++ -O3 -march=x86-64-v4 -std=c++17 -DORT_API_MANUAL_INIT -Iops -I$ORT_HEADERS bench/micro/two_pass_softmax_rows.cc \
//       ops/common/cpu.cc /tmp/tps_avx2.o /tmp/tps_avx512.o -o /tmp/tps
// (the vector rows live in their own translation units, built with the flags CMakeLists.txt gives them)
//   /tmp/tps                      one row, minimum over repetitions (the row stays in cache)
//   /tmp/tps --rows64 VARIANT N   64 rows of N entries (N = 128000: 31 MiB, from DRAM), median of 31
//                                 rounds; VARIANT: avx512, avx512_hint (the non-temporal hint on x,
//                                 kNonTemporalMinElements), avx2, copy (a plain AVX-512 copy)
// Run the --rows64 variants in alternating processes: within one process, what a variant leaves in
// the caches (x kept or evicted, y dirty) changes the next variant's time by up to 30%.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
    double a512 = time([&] { sd::two_pass::RowAvx512(x.data(), y.data(), n, sd::LaneExponents(n), false); });
    double a2 = time([&] { sd::two_pass::RowAvx2(x.data(), y.data(), n, sd::LaneExponents(n)); });
    std::printf("n=%7lld avx512 %.3f ns/elem  avx2 %.3f ns/elem\n", (long long)n, a512 / n * 1e9, a2 / n * 1e9);
  }
}

static int SixtyFourRows(const char* variant, int64_t n) {
  const int64_t rows = 64, total = rows * n;
  float* x = static_cast<float*>(std::aligned_alloc(64, total * 4));
  float* y = static_cast<float*>(std::aligned_alloc(64, total * 4));
  std::mt19937 rng(0);
  std::normal_distribution<float> dist(0.f, 2.f);
  for (int64_t i = 0; i < total; ++i) x[i] = dist(rng), y[i] = 0.f;
  const int v = !std::strcmp(variant, "avx512")        ? 0
                : !std::strcmp(variant, "avx512_hint") ? 1
                : !std::strcmp(variant, "avx2")        ? 2
                : !std::strcmp(variant, "copy")        ? 3
                                                       : -1;
  if (v < 0) return std::fprintf(stderr, "unknown variant %s\n", variant), 2;
  std::vector<double> t;
  for (int round = 0; round < 31; ++round) {
    auto t0 = clk::now();
    for (int64_t r = 0; r < rows && v < 3; ++r) {
      if (v == 0) sd::two_pass::RowAvx512(x + r * n, y + r * n, n, sd::LaneExponents(n), false);
      if (v == 1) sd::two_pass::RowAvx512(x + r * n, y + r * n, n, sd::LaneExponents(n), true);
      if (v == 2) sd::two_pass::RowAvx2(x + r * n, y + r * n, n, sd::LaneExponents(n));
    }
    if (v == 3)
      for (int64_t i = 0; i < total; i += 16) _mm512_store_ps(y + i, _mm512_load_ps(x + i));
    t.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  std::printf("64x%-7lld %-12s median %8.0f us  (quartiles %.0f - %.0f)\n", (long long)n, variant, t[15], t[7], t[23]);
  std::free(x);
  std::free(y);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && !std::strcmp(argv[1], "--rows64")) return SixtyFourRows(argv[2], std::atoll(argv[3]));
  OneRow();
  return 0;
}
