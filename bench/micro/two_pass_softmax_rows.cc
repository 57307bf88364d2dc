// Micro-benchmark of the TwoPassSoftmax row functions without onnxruntime in the loop: minimum
// time over repetitions (robust on a shared machine), cycles per element at the measured clock.
//   g++ -O3 -march=x86-64-v4 -std=c++17 -DORT_API_MANUAL_INIT -Iops -I$ORT_HEADERS bench/micro/two_pass_softmax_rows.cc \
//       ops/common/cpu.cc -o /tmp/tps && /tmp/tps
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "../../ops/two_pass_softmax.cc"

int main() {
  using clk = std::chrono::steady_clock;
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
    double a512 = time([&] { sd::RowAvx512(x.data(), y.data(), n); });
    double a2 = time([&] { sd::RowAvx2(x.data(), y.data(), n); });
    std::printf("n=%7lld avx512 %.3f ns/elem  avx2 %.3f ns/elem\n", (long long)n, a512 / n * 1e9, a2 / n * 1e9);
  }
}
