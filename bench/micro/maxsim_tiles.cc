// Micro-benchmark of the MaxSim tile functions (ops/max_sim_tile.h) without onnxruntime in the loop,
// next to the register-only peaks of bench/micro/fma_peak.cc, all timed as this thread's CPU time
// (min over repetitions: robust on a shared machine). One query (Lq x dim) against N documents
// (Ld x dim), the driver's per-document preparation included (int16 widening, D + 128, VNNI sums).
//   B=build-micro; mkdir -p $B; F="-O3 -std=c++17 -Iops -ffp-contract=off -fno-tree-pre"
//   g++ $F -mavx2 -mfma -c ops/max_sim_avx2.cc -o $B/a2.o
//   g++ $F -mavx2 -mfma -mavxvnni -c ops/max_sim_avxvnni.cc -o $B/vn.o
//   g++ $F -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -c ops/max_sim_avx512.cc -o $B/a5.o
//   g++ $F -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma \
//       -c tests/native/max_sim_avxvnni_evex.cc -o $B/vne.o    # the AVX-VNNI tile's EVEX twin (ops/common/avxvnni.h)
//   g++ -O2 -std=c++17 -Iops bench/micro/maxsim_tiles.cc bench/micro/fma_peak.cc $B/*.o -o $B/maxsim_tiles
//   $B/maxsim_tiles [N docs (default 1: one hot document)] [reps] [Lq] [Ld] [dim] [peak iterations]
// Instruction counts (load-independent; valgrind runs the AVX2 variants only, it has no AVX-512):
//   valgrind --tool=callgrind $B/maxsim_tiles 1 1 32 180 128 1000 && callgrind_annotate callgrind.out.*
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "../../tests/native/avxvnni_evex.h"  // TileI8AvxVnniEvex: the AVX-VNNI tile, EVEX
#include "max_sim_tile.h"

extern "C" double sd_peak(int kind, int64_t iters);

using namespace sd::maxsim;

namespace {

double Now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

template <class F>
double MinTime(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = Now();
    f();
    best = std::min(best, Now() - t0);
  }
  return best;
}

bool Has(const char* f) {
  __builtin_cpu_init();
  if (!std::strcmp(f, "avx512")) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  if (!std::strcmp(f, "avx512vnni")) return __builtin_cpu_supports("avx512vnni");
  if (!std::strcmp(f, "avxvnni")) return __builtin_cpu_supports("avxvnni");
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoll(argv[1]) : 1;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  const int64_t Lq = argc > 3 ? std::atoll(argv[3]) : 32, Ld = argc > 4 ? std::atoll(argv[4]) : 180,
                dim = argc > 5 ? std::atoll(argv[5]) : 128;
  const int64_t dim2 = (dim + 1) / 2, dim4 = (dim + 3) / 4;
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> uf(-1.f, 1.f);
  std::uniform_int_distribution<int> ui(-127, 127);
  std::vector<float> q(Lq * dim), d(N * Ld * dim);
  std::vector<int8_t> q8(Lq * dim), d8(N * Ld * dim);
  for (auto& v : q) v = uf(rng);
  for (auto& v : d) v = uf(rng);
  for (auto& v : q8) v = static_cast<int8_t>(ui(rng));
  for (auto& v : d8) v = static_cast<int8_t>(ui(rng));
  std::vector<uint8_t> valid(Ld, 1);
  const double ops = 2.0 * Lq * Ld * dim * N;
  const int64_t iters = argc > 6 ? std::atoll(argv[6]) : 20'000'000;  // peak loop iterations
  auto peak = [&](int kind) { double o = 0; const double t = MinTime(5, [&] { o = sd_peak(kind, iters); }); return o / t / 1e9; };

  // 64-byte aligned arenas for packed Q (kind 0 float32, 1 int16 pairs, 2 s8 quads, 3 u8 = Q + 128 quads).
  std::vector<std::vector<uint8_t>> arenas;
  const int64_t stride = dim4 * 4 * 32 * 4;  // bytes per packed tile, enough for every layout
  auto pack = [&](int kind, int lanes, int64_t tiles, std::vector<int32_t>* bias) {
    arenas.emplace_back(tiles * stride + 64, 0);
    uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(arenas.back().data()) + 63) / 64 * 64);
    for (int64_t t = 0; t < tiles; ++t) {
      uint8_t* p = base + t * stride;
      for (int l = 0; l < lanes; ++l) {
        const int64_t i = t * lanes + l;
        int32_t sum = 0;
        for (int64_t k = 0; k < dim && i < Lq; ++k) {
          if (kind == 0) reinterpret_cast<float*>(p)[k * lanes + l] = q[i * dim + k];
          if (kind == 1) reinterpret_cast<int16_t*>(p)[(k / 2) * lanes * 2 + l * 2 + k % 2] = q8[i * dim + k];
          if (kind == 2) p[(k / 4) * lanes * 4 + l * 4 + k % 4] = static_cast<uint8_t>(q8[i * dim + k]);
          if (kind == 3) p[(k / 4) * lanes * 4 + l * 4 + k % 4] = static_cast<uint8_t>(q8[i * dim + k] + 128);
          sum += q8[i * dim + k];
        }
        if (bias != nullptr) bias->push_back(128 * sum);
      }
    }
    return static_cast<const uint8_t*>(base);
  };
  std::vector<uint8_t> work_arena(Ld * dim4 * 4 * 4 + 64);
  uint8_t* work = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(work_arena.data()) + 63) / 64 * 64);
  std::vector<int32_t> dsum(Ld);
  float sink = 0;
  // variant: 0 fp32 avx2, 1 fp32 avx512, 2 int8 int16 (avx2), 3 int8 avx-vnni, 4 int8 avx512-vnni, 5 int8 avx-vnni's
  // EVEX twin
  auto time_variant = [&](int variant) {
    const int lanes = variant == 1 || variant == 4 ? 32 : 16;
    const int kind = variant <= 1 ? 0 : variant == 2 ? 1 : variant == 3 || variant == 5 ? 2 : 3;
    const int64_t tiles = (Lq + lanes - 1) / lanes;
    if (tiles > 8) std::abort();  // res[8]
    std::vector<int32_t> qb;
    const uint8_t* qp = pack(kind, lanes, tiles, &qb);
    TileResult res[8];
    return ops / MinTime(reps, [&] {
      for (int64_t n = 0; n < N; ++n) {
        Doc doc{nullptr, valid.data(), nullptr, 0, Ld * dim};
        const int8_t* dn = d8.data() + n * Ld * dim;
        if (variant <= 1) doc.data = d.data() + n * Ld * dim;
        if (variant == 2) WidenI8Avx2(dn, Ld, dim, reinterpret_cast<int16_t*>(work)), doc.data = work;
        if (variant == 3 || variant == 5) BiasI8Avx2(dn, Ld, dim, work), doc.data = work;
        if (variant == 4) DocSums128Avx512Vnni(dn, Ld, dim, dsum.data()), doc.data = dn;
        if (variant <= 1) {  // float32: all tiles in one pass, as ops/max_sim_core.h calls it
          TileArgs a;
          a.Ld = Ld, a.dim = dim, a.qp = qp, a.count = Lq, a.tiles = tiles, a.tile_stride = stride;
          if (variant == 0) TileF32Avx2(a, false, doc, res);
          else TileF32Avx512(a, false, doc, res);
          sink += res[0].best[0];
          continue;
        }
        for (int64_t t = 0; t < tiles; ++t) {
          TileArgs a;
          a.Ld = Ld, a.dim = dim, a.qp = qp + t * stride;
          a.count = std::min<int64_t>(lanes, Lq - t * lanes);
          a.bias = variant == 3 || variant == 5 ? qb.data() + t * lanes : dsum.data();
          if (variant == 2) TileI8Avx2I16(a, doc, res);
          if (variant == 3) TileI8AvxVnni(a, doc, res);
          if (variant == 4) TileI8Avx512Vnni(a, doc, res);
          if (variant == 5) TileI8AvxVnniEvex(a, doc, res);
          sink += res[0].best[0];
        }
      }
    }) / 1e9;
  };
  std::printf("MaxSim tiles: Lq %lld, Ld %lld, dim %lld, %lld document(s)%s; thread CPU time, min of %d\n",
              (long long)Lq, (long long)Ld, (long long)dim, (long long)N, N == 1 ? " (hot in cache)" : "", reps);
  std::printf("%-28s %10s %14s %8s\n", "variant", "GOP/s", "in-run peak", "% peak");
  const bool avx2 = Has("avx2"), avx512 = Has("avx512"), vnni = Has("avx512vnni"), avxvnni = Has("avxvnni");
  double f32_avx2 = 0;
  struct V { int variant; bool ok; int peak_kind; const char* name; const char* peak_name; };
  const V vs[] = {{0, avx2, 0, "fp32 avx2 (16x6 ymm)", "FMA ymm"},
                  {1, avx512, 1, "fp32 avx512 (32x8 zmm)", "FMA zmm"},
                  {2, avx2, 2, "int8 avx2 vpmaddwd (16x6)", "vpmaddwd+vpaddd"},
                  {3, avx2 && avxvnni, 3, "int8 avx-vnni (16x6)", "vpdpbusd ymm"},
                  {4, avx512 && vnni, 4, "int8 avx512-vnni (32x8)", "vpdpbusd zmm"},
                  {5, avx512 && vnni, 5, "int8 avx-vnni as EVEX (16x6)", "vpdpbusd ymm (EVEX)"}};
  for (const V& v : vs) {
    if (!v.ok) continue;
    const double pk = peak(v.peak_kind), g = time_variant(v.variant);
    if (v.variant == 0) f32_avx2 = g;
    std::printf("%-28s %10.1f %9.1f %-6s %6.0f%%", v.name, g, pk, v.peak_name, 100 * g / pk);
    if (v.variant >= 2 && f32_avx2 > 0) std::printf("   %.2fx fp32 avx2", g / f32_avx2);
    std::printf("\n");
  }
  std::printf("FMA ymm peak for reference: %.1f GFLOP/s\n", peak(0));
  return sink == 12345.f ? 1 : 0;
}
