// Micro-benchmark behind RowwiseInt8MatMul's path for weights outside the lane bound on CPUs without VNNI (the plain
// 8-bit grid of "rowwise-8-bit", which no vpmaddubsw int16 sum holds exactly). Two exact forms were candidates:
//   widened  B packed as int16, the quantized rows widened to int16, vpmaddwd straight into int32: per 16 products
//            one vpmaddwd + one vpaddd (the form the kernel runs: WideSums in ops/rowwise_int8_matmul_avx2.cc and
//            ops/rowwise_int8_matmul_avx512.cc);
//   split    B = 2 Bh + Bl with Bh = B >> 1 in -64..63 and Bl = B & 1: a vpmaddubsw pair of Bh stays within int16
//            (2 * 255 * 64 < 32768) but no two of them may be summed, so each takes vpmaddwd(2) + vpaddd, while the
//            Bl pairs (at most 510) are summed over 4 groups in int16 before one vpmaddwd(1) + vpaddd: per 128
//            products 8 vpmaddubsw + 5 vpmaddwd + 3 vpaddw + 5 vpaddd (13 multiplies against the widened form's 8).
// Both run here as tiles of the AVX2 driver (ops/rowwise_int8_matmul_ymm.h; the split one defined below for this
// comparison only) on full-range int8 B of MiniLM's shapes, next to the AVX-512 (no VNNI) widened tile, the groups-4
// lane tiles on lane-bounded B (|B| <= 16, what "lane-bounded" weights run) and the AVX-512 VNNI tile on the full-range
// B; every widened and split result is checked against the int64 reference integers first. Minimum over rounds of the
// median of each round's repetitions, the forms interleaved.
//   S="-O3 -std=c++17 -fno-math-errno -ffp-contract=off -fno-tree-pre -Iops"
//   V="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma"
//   mkdir -p /tmp/rww && g++ $S -c ops/rowwise_int8_matmul_common.cc -o /tmp/rww/c.o &&
//   g++ $S -c ops/common/weight_arena.cc -o /tmp/rww/w.o &&
//   g++ $S -mavx2 -mfma -c ops/rowwise_int8_matmul_avx2.cc -o /tmp/rww/a2.o &&
//   g++ $S $V -c ops/rowwise_int8_matmul_avx512.cc -o /tmp/rww/bw.o &&
//   g++ $S $V -mavx512vnni -c ops/rowwise_int8_matmul_avx512vnni.cc -o /tmp/rww/z.o &&
//   g++ $S -mavx2 -mfma -c bench/micro/rowwise_int8_wide_forms.cc -o /tmp/rww/m.o &&
//   g++ /tmp/rww/*.o -o /tmp/rww/b && /tmp/rww/b
// The AVX-512 tiles need AVX-512 BW (and VNNI for the VNNI tile); without them only the ymm forms run.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "rowwise_int8_matmul_common.h"
#include "rowwise_int8_matmul_ymm.h"

namespace rw = sd::rowwise_int8;

namespace {

template <class F>
double Seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The split form as a tile of the AVX2 driver (ops/rowwise_int8_matmul_ymm.h), for this comparison only. Packing:
// per panel and block of 16 k, Bh's 256 bytes then Bl's 256, each in the int8 layout (so a panel is kp * 16 * 2 bytes,
// and the driver's width 2 finds it); the driver then also steps the activations by 2 kp bytes a row, so they are
// passed with that row stride.
struct SplitSums {
  template <int MR>
  static inline void Run(const uint8_t* xq, int64_t kp, const int8_t* panel, __m256i out[MR][2]) {
    const __m256i ones = _mm256_set1_epi16(1), twos = _mm256_set1_epi16(2);
    __m256i acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t k = 0; k < kp; k += rw::kKB, panel += 2 * 8 * 32) {
      for (int r = 0; r < MR; ++r) {
        __m256i low[2];
        for (int g = 0; g < 4; ++g) {
          const __m256i x = rw::Broadcast4(xq + r * 2 * kp + k + 4 * g);
          for (int h = 0; h < 2; ++h) {
            const __m256i bh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + 64 * g + 32 * h));
            const __m256i bl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + 256 + 64 * g + 32 * h));
            acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(x, bh), twos));
            const __m256i p = _mm256_maddubs_epi16(x, bl);
            low[h] = g == 0 ? p : _mm256_add_epi16(low[h], p);
          }
        }
        for (int h = 0; h < 2; ++h) acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(low[h], ones));
      }
    }
    for (int r = 0; r < MR; ++r) out[r][0] = acc[r][0], out[r][1] = acc[r][1];
  }
};

// B [K, N] split into Bh = B >> 1 and Bl = B & 1, both packed in the int8 layout and interleaved per 16-k block.
std::vector<int8_t> PackSplit(const std::vector<int8_t>& b, int64_t K, int64_t N, const rw::Packed& like) {
  std::vector<int8_t> hi(b.size()), lo(b.size());
  for (size_t i = 0; i < b.size(); ++i) hi[i] = static_cast<int8_t>(b[i] >> 1), lo[i] = static_cast<int8_t>(b[i] & 1);
  const rw::Packed ph = rw::Pack(hi.data(), K, N, 255, rw::Path::kAvx512Vnni, /*kept=*/true);
  const rw::Packed pl = rw::Pack(lo.data(), K, N, 255, rw::Path::kAvx512Vnni, /*kept=*/true);
  std::vector<int8_t> out(static_cast<size_t>(like.kp * like.np * 2));
  for (int64_t n0 = 0; n0 < like.np; n0 += rw::kNR) {
    for (int64_t i = 0; i < like.kp / rw::kKB; ++i) {
      const int64_t src = n0 * like.kp + i * 256, dst = 2 * n0 * like.kp + i * 512;
      std::memcpy(&out[dst], ph.panels.get() + src, 256);
      std::memcpy(&out[dst + 256], pl.panels.get() + src, 256);
    }
  }
  return out;
}

bool HasAvx512Bw() { return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"); }
bool HasAvx512Vnni() { return HasAvx512Bw() && __builtin_cpu_supports("avx512vnni"); }

}  // namespace

int main() {
  struct Shape { int64_t M, K, N; };
  const Shape shapes[] = {{128, 384, 384}, {128, 384, 1536}, {128, 1536, 384}, {8, 384, 1536}};
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> w8(-127, 127), wl(-16, 16), a8(0, 255);
  const bool bw = HasAvx512Bw(), vnni = HasAvx512Vnni();
  std::printf("Tiles, 1 thread (GMAC/s; full-range B for the widened, split and VNNI tiles, |B| <= 16 for the lane "
              "tiles):\n\n| M x K x N | AVX2 widened | AVX2 split | AVX2 lane g4 | AVX-512 BW widened | AVX-512 BW "
              "lane g4 | AVX-512 VNNI | widened / split |\n|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    std::vector<int8_t> b(static_cast<size_t>(s.K * s.N)), bl(b.size());
    for (auto& v : b) v = static_cast<int8_t>(w8(rng));
    b[0] = -128;  // the grid's extreme, where it can occur
    for (auto& v : bl) v = static_cast<int8_t>(wl(rng));
    const rw::Packed pw = rw::Pack(b.data(), s.K, s.N, 255, rw::Path::kAvx2, /*kept=*/true);
    const rw::Packed pwz = rw::Pack(b.data(), s.K, s.N, 255, rw::Path::kAvx512Bw, /*kept=*/true);
    const rw::Packed pl = rw::Pack(bl.data(), s.K, s.N, 127, rw::Path::kAvx2, /*kept=*/true);
    const rw::Packed pv = rw::Pack(b.data(), s.K, s.N, 255, rw::Path::kAvx512Vnni, /*kept=*/true);
    if (pw.width != 2 || pl.groups != 4) {
      std::printf("unexpected packing: width %d, lane groups %d\n", pw.width, pl.groups);
      return 1;
    }
    std::vector<uint8_t> xq(static_cast<size_t>(s.M * pw.kp));
    for (auto& v : xq) v = static_cast<uint8_t>(a8(rng));
    std::vector<uint8_t> xq7(xq.size());
    for (size_t i = 0; i < xq.size(); ++i) xq7[i] = xq[i] / 2;
    std::vector<int16_t> xw(xq.begin(), xq.end());  // the widened tiles' int16 rows
    const uint8_t* xwp = reinterpret_cast<const uint8_t*>(xw.data());
    std::vector<uint8_t> x2(xq.size() * 2);  // the split tile's activations: row stride 2 kp bytes (see SplitSums)
    for (int64_t m = 0; m < s.M; ++m) std::memcpy(&x2[m * 2 * pw.kp], &xq[m * pw.kp], pw.kp);
    const std::vector<int8_t> split = PackSplit(b, s.K, s.N, pw);
    rw::PackedView sv = pw.View();
    sv.panels = split.data();
    std::vector<float> sa(s.M, 1.f), sb(s.N, 1.f), y(static_cast<size_t>(s.M * s.N));
    std::vector<int32_t> za(s.M, 0);
    // exactness first: with unit scales and zero points 0, y holds the integer sums (|sum| < 2^24 here)
    const auto check = [&](const char* what) {
      for (int64_t m = 0; m < s.M; ++m) {
        for (int64_t n = 0; n < s.N; ++n) {
          int64_t acc = 0;
          for (int64_t k = 0; k < s.K; ++k) acc += int64_t{xq[m * pw.kp + k]} * b[k * s.N + n];
          if (static_cast<float>(acc) != y[m * s.N + n]) {
            std::printf("%s: y[%lld, %lld] = %.1f, want %lld\n", what, (long long)m, (long long)n, y[m * s.N + n],
                        (long long)acc);
            std::exit(1);
          }
        }
      }
    };
    rw::GemmAvx2(pw.View(), xwp, sa.data(), za.data(), s.M, sb.data(), nullptr, y.data(), s.N, rw::Activation::kNone, nullptr);
    check("AVX2 widened");
    rw::GemmYmm<SplitSums>(sv, x2.data(), sa.data(), za.data(), s.M, sb.data(), nullptr, y.data(), s.N, rw::Activation::kNone, nullptr);
    check("AVX2 split");
    if (bw) {
      rw::GemmAvx512Bw(pwz.View(), xwp, sa.data(), za.data(), s.M, sb.data(), nullptr, y.data(), s.N, rw::Activation::kNone, nullptr);
      check("AVX-512 BW widened");
    }
    const double work = double(s.M) * s.K * s.N;
    const int reps = static_cast<int>(std::max<double>(3, 1e8 / work));
    std::vector<double> t[6];
    for (int round = 0; round < 7; ++round) {
      const auto time = [&](auto&& gemm) {
        std::vector<double> v;
        for (int r = 0; r < reps; ++r) v.push_back(Seconds(gemm));
        std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
        return v[v.size() / 2];
      };
      const float* no_bias = nullptr;
      const auto run = [&](auto gemm, const rw::PackedView& w, const uint8_t* x) {
        return time([&] { gemm(w, x, sa.data(), za.data(), s.M, sb.data(), no_bias, y.data(), s.N, rw::Activation::kNone, nullptr); });
      };
      t[0].push_back(run(rw::GemmAvx2, pw.View(), xwp));
      t[5].push_back(run(rw::GemmYmm<SplitSums>, sv, x2.data()));
      t[1].push_back(run(rw::GemmAvx2, pl.View(), xq7.data()));
      if (bw) {
        t[2].push_back(run(rw::GemmAvx512Bw, pwz.View(), xwp));
        t[3].push_back(run(rw::GemmAvx512Bw, pl.View(), xq7.data()));
      }
      if (vnni) t[4].push_back(run(rw::GemmAvx512Vnni, pv.View(), xq.data()));
    }
    char cells[6][32];
    for (int i = 0; i < 6; ++i) {
      if (t[i].empty()) std::snprintf(cells[i], sizeof cells[i], "-");
      else std::snprintf(cells[i], sizeof cells[i], "%.0f", work / *std::min_element(t[i].begin(), t[i].end()) / 1e9);
    }
    const double ratio = *std::min_element(t[5].begin(), t[5].end()) / *std::min_element(t[0].begin(), t[0].end());
    std::printf("| %lld x %lld x %lld | %s | %s | %s | %s | %s | %s | %.2fx |\n", (long long)s.M, (long long)s.K,
                (long long)s.N, cells[0], cells[5], cells[1], cells[2], cells[3], cells[4], ratio);
  }
  return 0;
}
