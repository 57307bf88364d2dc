// The int8 GEMM prototype of int8_gemm_paired.h, exported (extern "C") for bench/int8_gemm_paired.py, which times it
// against onnxruntime in the same process:
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

}  // extern "C"
