// The int8 GEMM prototype of int8_gemm_paired.h, exported (extern "C") for bench/int8_gemm_paired.py, which times it
// against onnxruntime in the same process, with the register-only loops of each form's instruction mix (the ceiling
// of its GEMM loop on the core that runs it):
//   g++ -O3 -std=c++17 -mavx2 -mfma -fno-tree-pre -shared -fPIC bench/micro/int8_gemm_paired.cc -o build/int8_gemm_paired.so
#include "int8_gemm_paired.h"

#include <time.h>

namespace {

using namespace i8gemm;

struct Packed {
  std::vector<int8_t> storage;
  std::vector<float> sb, bias;
  std::vector<int32_t> colsum;
  Weights view;
};

double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

}  // namespace

extern "C" {

// q: int8 [K, N] row-major (the MatMul's B), sb [N], bias [N]. Returns an opaque handle.
void* sd_gemm_pack(const int8_t* q, const float* sb, const float* bias, int64_t K, int64_t N) {
  auto* p = new Packed;
  Weights& v = p->view;
  v.K = K, v.N = N, v.kp = Round16(K), v.np = (N + kNR - 1) / kNR * kNR;
  p->storage.assign(static_cast<size_t>(v.kp * v.np + 32), 0);
  int8_t* panels = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(p->storage.data()) + 31) & ~uintptr_t{31});
  p->sb.assign(v.np, 0.f);
  p->bias.assign(v.np, 0.f);
  p->colsum.assign(v.np, 0);
  for (int64_t n = 0; n < N; ++n) {
    p->sb[n] = sb[n];
    p->bias[n] = bias[n];
    for (int64_t k = 0; k < K; ++k) p->colsum[n] += q[k * N + n];
  }
  // the layout of i8gemm::Weights
  for (int64_t n0 = 0; n0 < v.np; n0 += kNR)
    for (int64_t k16 = 0; k16 < v.kp; k16 += 16)
      for (int g = 0; g < 4; ++g)
        for (int h = 0; h < 2; ++h)
          for (int j = 0; j < 8; ++j)
            for (int b = 0; b < 4; ++b) {
              const int64_t k = k16 + 4 * g + b, n = n0 + 8 * h + j;
              panels[n0 * v.kp + k16 * kNR + (g * 2 + h) * 32 + j * 4 + b] =
                  (k < K && n < N) ? q[k * N + n] : int8_t{0};
            }
  v.panels = panels, v.sb = p->sb.data(), v.colsum = p->colsum.data(), v.bias = p->bias.data();
  return p;
}

void sd_gemm_free(void* handle) { delete static_cast<Packed*>(handle); }

// Runs the GEMM `reps` times with activations on 0..levels (255 or 127) and `groups` (1, 2 or 4) vpmaddubsw
// results per int16 sum and returns the least thread CPU time of one call.
double sd_gemm_run(void* handle, const float* x, int64_t M, int levels, float* y, int groups, int reps) {
  const Weights& p = static_cast<Packed*>(handle)->view;
  Scratch scratch;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = ThreadSeconds();
    GemmGroups(p, x, M, levels, y, groups, scratch);
    best = std::min(best, ThreadSeconds() - t0);
  }
  return best;
}

// Register-only throughput of each form's instruction mix (no loads, no stores: the loop's ceiling on this core),
// two independent rows per iteration. Returns the products (MACs) done by `iters` iterations.
//   groups 1: per row 2 x (vpmaddubsw, vpmaddwd, vpaddd)                        64 products
//   groups 2: per row 2 x (2 vpmaddubsw, vpaddw, vpmaddwd, vpaddd)             128 products
//   groups 4: per row 2 x (4 vpmaddubsw, 3 vpaddw, vpmaddwd, vpaddd)           256 products
// ymm0-3 accumulators, 4-7 int16 sums, 8-9 products, 12-13 weights, 14 the activations, 15 ones.
#define SD_MUBS(w, dst) "vpmaddubsw %%ymm" #w ", %%ymm14, %%ymm" #dst "\n\t"
#define SD_ADDW(src, dst) "vpaddw %%ymm" #src ", %%ymm" #dst ", %%ymm" #dst "\n\t"
#define SD_WIDEN(s, acc) "vpmaddwd %%ymm15, %%ymm" #s ", %%ymm" #s "\n\tvpaddd %%ymm" #s ", %%ymm" #acc ", %%ymm" #acc "\n\t"
#define SD_G1(a0, a1, s0, s1) SD_MUBS(12, s0) SD_MUBS(13, s1) SD_WIDEN(s0, a0) SD_WIDEN(s1, a1)
#define SD_GN(s0, s1, t0, t1) SD_MUBS(12, t0) SD_MUBS(13, t1) SD_ADDW(t0, s0) SD_ADDW(t1, s1)
#define SD_G2(a0, a1, s0, s1, t0, t1) \
  SD_MUBS(12, s0) SD_MUBS(13, s1) SD_GN(s0, s1, t0, t1) SD_WIDEN(s0, a0) SD_WIDEN(s1, a1)
#define SD_G4(a0, a1, s0, s1, t0, t1) \
  SD_MUBS(12, s0) SD_MUBS(13, s1) SD_GN(s0, s1, t0, t1) SD_GN(s0, s1, t0, t1) SD_GN(s0, s1, t0, t1) \
  SD_WIDEN(s0, a0) SD_WIDEN(s1, a1)
#define SD_CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm12", "xmm13", \
                   "xmm14", "xmm15"
double sd_mix_peak(int groups, int64_t iters) {
  if (iters <= 0) return 0.0;
  int64_t n = iters;
  if (groups == 1) {
    asm volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\t1:\n\t" SD_G1(0, 1, 4, 5) SD_G1(2, 3, 6, 7)
                 "dec %0\n\tjnz 1b\n\tvzeroupper" : "+r"(n) : : "cc", SD_CLOBBER);
    return 2.0 * 64 * static_cast<double>(iters);
  }
  if (groups == 2) {
    asm volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\t1:\n\t" SD_G2(0, 1, 4, 5, 8, 9) SD_G2(2, 3, 6, 7, 8, 9)
                 "dec %0\n\tjnz 1b\n\tvzeroupper" : "+r"(n) : : "cc", SD_CLOBBER);
    return 2.0 * 128 * static_cast<double>(iters);
  }
  asm volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\t1:\n\t" SD_G4(0, 1, 4, 5, 8, 9) SD_G4(2, 3, 6, 7, 8, 9)
               "dec %0\n\tjnz 1b\n\tvzeroupper" : "+r"(n) : : "cc", SD_CLOBBER);
  return 2.0 * 256 * static_cast<double>(iters);
}

}  // extern "C"
