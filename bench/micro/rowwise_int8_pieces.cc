// Micro-benchmark of RowwiseInt8MatMul's pieces without onnxruntime in the loop. (1) The GEMM tiles, next to the register-only
// vpdpbusd peaks of bench/micro/fma_peak.cc measured in the same rounds: the AVX-VNNI ymm tile (its source compiled
// with vpdpbusd's EVEX encoding, tests/native/rowwise_int8_matmul_avxvnni_evex.cc, so that it runs on an AVX-512 VNNI
// CPU without AVX-VNNI such as Zen 4), the AVX-512 VNNI zmm tile and the AVX2 lane tile (groups 4), at MiniLM's
// shapes. (2) The row quantization (the AVX2 unit's, which every vector path runs) at M x K = 128 x 384 and
// 128 x 1536 (the inputs of MiniLM's projections and FFN down-projection). Minimum over rounds of the median of each round's repetitions (a
// shared machine), the forms interleaved.
//   S="-O3 -std=c++17 -fno-math-errno -ffp-contract=off -fno-tree-pre -Iops"  # the library's flags; V="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma"
//   g++ $S -c ops/rowwise_int8_matmul_common.cc -o /tmp/rwb/c.o && g++ $S -c ops/common/weight_arena.cc -o /tmp/rwb/w.o && \
//   g++ $S -mavx2 -mfma -c ops/rowwise_int8_matmul_avx2.cc -o /tmp/rwb/a2.o && \
//   g++ $S $V -mavx512vnni -c ops/rowwise_int8_matmul_avx512vnni.cc -o /tmp/rwb/z.o && \
//   g++ $S $V -mavx512vnni -c tests/native/rowwise_int8_matmul_avxvnni_evex.cc -o /tmp/rwb/y.o && \
//   g++ -O3 -std=c++17 -Iops bench/micro/rowwise_int8_pieces.cc bench/micro/fma_peak.cc /tmp/rwb/*.o -o /tmp/rwb/b && \
//   /tmp/rwb/b
// Needs AVX-512 VNNI (the EVEX forms); the ymm peak is fma_peak.cc's EVEX vpdpbusd ymm loop (kind 5), the
// instruction the twin runs.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "../../tests/native/avxvnni_evex.h"  // GemmAvxVnniEvex
#include "rowwise_int8_matmul_common.h"

namespace rw = sd::rowwise_int8;

extern "C" double sd_peak(int kind, int64_t iters);

namespace {

template <class F>
double Seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main() {
  struct Shape { int64_t M, K, N; };
  const Shape shapes[] = {{128, 384, 384}, {128, 384, 1536}, {128, 1536, 384}, {8, 384, 1536}};
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> w8(-127, 127), wl(-16, 16), a8(0, 255);
  std::printf("| M x K x N | ymm VNNI tile GMAC/s | %% of ymm vpdpbusd peak | zmm VNNI tile GMAC/s | %% of zmm peak | "
              "AVX2 lane tile (groups 4) GMAC/s | ymm VNNI / AVX2 lane |\n|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    std::vector<int8_t> b(static_cast<size_t>(s.K * s.N)), bl(b.size());
    for (auto& v : b) v = static_cast<int8_t>(w8(rng));
    for (auto& v : bl) v = static_cast<int8_t>(wl(rng));  // inside the lane bound for groups 4 at 7-bit rows
    const rw::Packed pv = rw::Pack(b.data(), s.K, s.N, 255, rw::Path::kAvx512Vnni, /*kept=*/true);
    const rw::Packed pl = rw::Pack(bl.data(), s.K, s.N, 127, rw::Path::kAvx2, /*kept=*/true);
    std::vector<uint8_t> xq(static_cast<size_t>(s.M * pv.kp));
    for (auto& v : xq) v = static_cast<uint8_t>(a8(rng) / 2);
    std::vector<float> sa(s.M, 0.01f), sb(s.N, 0.02f), y(static_cast<size_t>(s.M * s.N));
    std::vector<int32_t> za(s.M, 64);
    const double macs = double(s.M) * s.K * s.N;
    const int reps = static_cast<int>(std::max<double>(3, 2e8 / macs));
    std::vector<double> t_ymm, t_zmm, t_lane, p_ymm, p_zmm;
    for (int round = 0; round < 9; ++round) {
      const auto time = [&](auto&& gemm) {
        std::vector<double> ts;
        for (int r = 0; r < reps; ++r) ts.push_back(Seconds(gemm));
        std::nth_element(ts.begin(), ts.begin() + ts.size() / 2, ts.end());
        return ts[ts.size() / 2];
      };
      t_ymm.push_back(time([&] { rw::GemmAvxVnniEvex(pv.View(), xq.data(), sa.data(), za.data(), s.M, sb.data(), nullptr, y.data(), s.N, rw::Activation::kNone, nullptr); }));
      t_zmm.push_back(time([&] { rw::GemmAvx512Vnni(pv.View(), xq.data(), sa.data(), za.data(), s.M, sb.data(), nullptr, y.data(), s.N, rw::Activation::kNone, nullptr); }));
      t_lane.push_back(time([&] { rw::GemmAvx2(pl.View(), xq.data(), sa.data(), za.data(), s.M, sb.data(), nullptr, y.data(), s.N, rw::Activation::kNone, nullptr); }));
      const int64_t iters = 2000000;
      double ops = 0;
      p_ymm.push_back(Seconds([&] { ops = sd_peak(5, iters); }) / (ops / 2));  // s per MAC; sd_peak: all iterations
      p_zmm.push_back(Seconds([&] { ops = sd_peak(4, iters); }) / (ops / 2));  // sd_peak: ops of all iterations
    }
    const double ymm = macs / *std::min_element(t_ymm.begin(), t_ymm.end()) / 1e9;
    const double zmm = macs / *std::min_element(t_zmm.begin(), t_zmm.end()) / 1e9;
    const double lane = macs / *std::min_element(t_lane.begin(), t_lane.end()) / 1e9;
    const double peak_y = 1e-9 / *std::min_element(p_ymm.begin(), p_ymm.end());
    const double peak_z = 1e-9 / *std::min_element(p_zmm.begin(), p_zmm.end());
    std::printf("| %lld x %lld x %lld | %.0f | %.0f%% (%.0f) | %.0f | %.0f%% (%.0f) | %.0f | %.2fx |\n", (long long)s.M,
                (long long)s.K, (long long)s.N, ymm, 100 * ymm / peak_y, peak_y, zmm, 100 * zmm / peak_z, peak_z, lane,
                ymm / lane);
  }
  std::printf("\n| M x K | row quantization us | ns per entry |\n|---|---|---|\n");
  for (const int64_t K : {int64_t{384}, int64_t{1536}}) {
    const int64_t M = 128, kp = (K + 15) / 16 * 16;
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> x(static_cast<size_t>(M * K)), sa(M);
    for (auto& v : x) v = normal(rng);
    std::vector<uint8_t> xq(static_cast<size_t>(M * kp));
    std::vector<int32_t> za(M);
    std::vector<double> t2;
    for (int round = 0; round < 9; ++round) {
      const auto time = [&](auto&& f) {
        std::vector<double> ts;
        for (int r = 0; r < 200; ++r) ts.push_back(Seconds(f));
        std::nth_element(ts.begin(), ts.begin() + ts.size() / 2, ts.end());
        return ts[ts.size() / 2];
      };
      t2.push_back(time([&] { rw::QuantizeRowsAvx2(x.data(), M, K, kp, 255, xq.data(), sa.data(), za.data()); }));
    }
    const double a2 = *std::min_element(t2.begin(), t2.end()) * 1e6;
    std::printf("| %lld x %lld | %.1f | %.3f |\n", (long long)M, (long long)K, a2, a2 * 1e3 / double(M * K));
  }
  return 0;
}
