// A/B of two builds of a TwoPassSoftmax vector row (e.g. the committed ops/two_pass_softmax_kernels.h against a
// change), in one process, alternating call by call, minimum over repetitions (robust on a shared machine, where
// the absolute times of separate runs moved by up to 1.4x in the session that measured the rows' changes):
//   git show HEAD:ops/two_pass_softmax_kernels.h > /tmp/a.h; cp ops/two_pass_softmax_kernels.h /tmp/b.h
//   for w in a b; do mkdir -p /tmp/ab_$w && cp /tmp/$w.h /tmp/ab_$w/two_pass_softmax_kernels.h && \
//     cp ops/two_pass_softmax_avx2.cc ops/two_pass_softmax_row.h /tmp/ab_$w/ && \
//     g++ -O3 -mavx2 -mfma -ffp-contract=off -std=c++17 -Iops -DRowAvx2=Row_$w -c /tmp/ab_$w/two_pass_softmax_avx2.cc \
//       -o /tmp/ab_$w/row.o; done
//   g++ -O2 bench/micro/two_pass_softmax_ab.cc /tmp/ab_a/row.o /tmp/ab_b/row.o -o /tmp/tps_ab && /tmp/tps_ab 64
// For the AVX-512 row: two_pass_softmax_avx512.cc with the AVX-512 flags of CMakeLists.txt, -DRowAvx512=Row_$w, and
// -DSD_AB_AVX512 here. Argument: rows per call (64: 64 x n, in L2 up to n = 2000; 1: one row).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace sd {
namespace two_pass {
#ifdef SD_AB_AVX512
bool Row_a(const float* x, float* y, int64_t n, float* lane_exponents, bool non_temporal_x);
bool Row_b(const float* x, float* y, int64_t n, float* lane_exponents, bool non_temporal_x);
#define SD_AB_CALL(f, x, y, n, s) f(x, y, n, s, false)
#else
bool Row_a(const float* x, float* y, int64_t n, float* lane_exponents);
bool Row_b(const float* x, float* y, int64_t n, float* lane_exponents);
#define SD_AB_CALL(f, x, y, n, s) f(x, y, n, s)
#endif
}  // namespace two_pass
}  // namespace sd

int main(int argc, char** argv) {
  using clk = std::chrono::steady_clock;
  const int rows = argc > 1 ? std::atoi(argv[1]) : 64;
  for (int64_t n : {1000, 4000, 32000}) {
    std::vector<float> x(static_cast<size_t>(n * rows)), y(x.size()), scratch(4096);
    std::mt19937 rng(0);
    std::normal_distribution<float> dist(0.f, 2.f);  // bench/two_pass_softmax.py's logits
    for (auto& v : x) v = dist(rng);
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < 400; ++rep) {
      for (int w = 0; w < 2; ++w) {
        const auto t0 = clk::now();
        for (int r = 0; r < rows; ++r) {
          float* xr = x.data() + r * n;
          float* yr = y.data() + r * n;
          if (w == 0) SD_AB_CALL(sd::two_pass::Row_a, xr, yr, n, scratch.data());
          else SD_AB_CALL(sd::two_pass::Row_b, xr, yr, n, scratch.data());
        }
        best[w] = std::min(best[w], std::chrono::duration<double>(clk::now() - t0).count());
      }
    }
    std::printf("%d x %6lld  a %.3f  b %.3f ns per entry  b/a %.3f\n", rows, static_cast<long long>(n),
                best[0] / n / rows * 1e9, best[1] / n / rows * 1e9, best[1] / best[0]);
  }
}
