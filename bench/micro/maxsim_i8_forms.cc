// Issue 13 probe: can an int8 MaxSim tile on AVX2 without VNNI reach 2x our float32 AVX2 tile? Measures,
// as this thread's CPU time (min over repetitions: robust on a shared machine), the register-only
// throughput of each candidate instruction mix and tile-shaped loops of each form (loads included)
// against the float32 FMA loop and the library's own AVX2 tiles (ops/max_sim_avx2.cc) in the same
// process. Results and the reasoning: bench/results/maxsim.md ("int8 without VNNI: can vpmaddubsw ...").
//   B=build-micro; mkdir -p $B; F="-O3 -std=c++17 -Iops -ffp-contract=off -fno-tree-pre"
//   g++ $F -mavx2 -mfma -c ops/max_sim_avx2.cc -o $B/a2.o
//   g++ $F -mavx2 -mfma bench/micro/maxsim_i8_forms.cc $B/a2.o -o $B/maxsim_i8_forms
//   $B/maxsim_i8_forms [reps (default 20)]
// Register-only mixes (multiply-adds counted as 2 OP; "per 32 MACs" = one ymm of u8 x s8 products):
//   fma        vfmadd231ps, 12 accumulators                          8 MACs / 1 uop (p01)
//   madd       vpmaddwd + vpaddd (the library's non-VNNI path)       16 MACs / 2 uops (p01 + p015)
//   mubs_madd  vpmaddubsw + vpmaddwd(ones) + vpaddd                  32 MACs / 3 uops (2 p01 + p015)
//   mubs_addw  vpmaddubsw + vpaddw (int16 accumulation)              32 MACs / 2 uops (p01 + p015)
//   sign_mubs  vpsignb + vpmaddubsw + vpmaddwd(ones) + vpaddd        32 MACs / 4 uops
// What each form needs to be exact for every int8 input (the op's contract, see ops/max_sim_core.h):
//   mubs_madd: a bound on the data, e.g. D in [-64, 63] as u8 D + 64 (pair <= 2 * 127 * 128 = 32512);
//     with D + 128 a pair reaches 2 * 255 * 128 = 65280 and saturates.
//   mubs_addw: every 2G products summed in one int16 lane within int16 (G groups between widenings).
//   A split of one operand into two halves (7-bit or nibbles) makes any input exact but doubles the
//   vpmaddubsw count, i.e. half the rate of the mix it uses.
//   sign_mubs / the 16-pattern table: |d| (u8) x q * sign(d) (s8) is exact iff Q holds no -128
//   (|pair| <= 2 * 128 * 127); the sign costs a vpsignb per product vector, or Q precomputed for the
//   16 sign patterns of a 4-byte group of D and loaded per token.
// Tile-shaped loops: one query (two tiles of 16 lanes, dim 128) against one hot document of 180
// tokens, R tokens x 2 vectors of accumulators like the library's tiles. The two exact forms are
// checked against a scalar reference (prints MISMATCH otherwise); the bounded forms saturate on these
// full-range inputs and only their instruction stream is timed. Per-document preparation (|d|, sign
// patterns, D + 128) is outside the timed loop except in the row that says it is included.
#include <immintrin.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "max_sim_tile.h"

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
    const double dt = Now() - t0;
    if (dt < best) best = dt;
  }
  return best;
}

#define SD_CLOB "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
                "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"

// Each returns the OP (2 per multiply-add) of n iterations.
double Fma(int64_t n) {
#define X(i) "vfmadd231ps %%ymm15, %%ymm14, %%ymm" #i "\n\t"
  asm volatile("vxorps %%xmm14, %%xmm14, %%xmm14\n\tvxorps %%xmm15, %%xmm15, %%xmm15\n\t"
               "1:\n\t" X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
               "dec %0\n\tjnz 1b\n\tvzeroupper"
               : "+r"(n) : : "cc", SD_CLOB);
#undef X
  return 0;
}
double Madd(int64_t n) {
#define X(i, t) "vpmaddwd %%ymm15, %%ymm14, %%ymm" #t "\n\tvpaddd %%ymm" #t ", %%ymm" #i ", %%ymm" #i "\n\t"
  asm volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\tvpxor %%xmm15, %%xmm15, %%xmm15\n\t"
               "1:\n\t" X(0, 10) X(1, 11) X(2, 12) X(3, 13) X(4, 10) X(5, 11) X(6, 12) X(7, 13) X(8, 10) X(9, 11)
               "dec %0\n\tjnz 1b\n\tvzeroupper"
               : "+r"(n) : : "cc", SD_CLOB);
#undef X
  return 0;
}
// ymm13 = ones (int16), ymm10-12 temporaries, ymm0-9 accumulators.
double MubsMadd(int64_t n) {
#define X(i, t)                                                                     \
  "vpmaddubsw %%ymm15, %%ymm14, %%ymm" #t "\n\tvpmaddwd %%ymm13, %%ymm" #t ", %%ymm" #t \
  "\n\tvpaddd %%ymm" #t ", %%ymm" #i ", %%ymm" #i "\n\t"
  asm volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\tvpxor %%xmm15, %%xmm15, %%xmm15\n\tvpxor %%xmm13, %%xmm13, %%xmm13\n\t"
               "1:\n\t" X(0, 10) X(1, 11) X(2, 12) X(3, 10) X(4, 11) X(5, 12) X(6, 10) X(7, 11) X(8, 12) X(9, 10)
               "dec %0\n\tjnz 1b\n\tvzeroupper"
               : "+r"(n) : : "cc", SD_CLOB);
#undef X
  return 0;
}
double MubsAddw(int64_t n) {
#define X(i, t) "vpmaddubsw %%ymm15, %%ymm14, %%ymm" #t "\n\tvpaddw %%ymm" #t ", %%ymm" #i ", %%ymm" #i "\n\t"
  asm volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\tvpxor %%xmm15, %%xmm15, %%xmm15\n\t"
               "1:\n\t" X(0, 10) X(1, 11) X(2, 12) X(3, 13) X(4, 10) X(5, 11) X(6, 12) X(7, 13) X(8, 10) X(9, 11)
               "dec %0\n\tjnz 1b\n\tvzeroupper"
               : "+r"(n) : : "cc", SD_CLOB);
#undef X
  return 0;
}
double SignMubs(int64_t n) {
#define X(i, t)                                                                                      \
  "vpsignb %%ymm15, %%ymm14, %%ymm" #t "\n\tvpmaddubsw %%ymm" #t ", %%ymm15, %%ymm" #t               \
  "\n\tvpmaddwd %%ymm13, %%ymm" #t ", %%ymm" #t "\n\tvpaddd %%ymm" #t ", %%ymm" #i ", %%ymm" #i "\n\t"
  asm volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\tvpxor %%xmm15, %%xmm15, %%xmm15\n\tvpxor %%xmm13, %%xmm13, %%xmm13\n\t"
               "1:\n\t" X(0, 10) X(1, 11) X(2, 12) X(3, 10) X(4, 11) X(5, 12) X(6, 10) X(7, 11) X(8, 12) X(9, 10)
               "dec %0\n\tjnz 1b\n\tvzeroupper"
               : "+r"(n) : : "cc", SD_CLOB);
#undef X
  return 0;
}

// Tile-shaped loops: qp [groups][16 lanes][4 bytes] (two ymm per group), d [Ld][groups * 4].
template <bool kSign, int kR = 6>
__attribute__((noinline)) int32_t TileMubs(const int8_t* qp, const uint8_t* d, const uint8_t* dabs, int64_t groups,
                                           int64_t Ld) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i best = _mm256_set1_epi32(INT32_MIN);
  for (int64_t j0 = 0; j0 + kR <= Ld; j0 += kR) {
    __m256i acc[kR][2];
    for (int r = 0; r < kR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    const uint8_t* drow = d + j0 * groups * 4;
    for (int64_t g = 0; g < groups; ++g) {
      const __m256i q0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(qp + g * 64));
      const __m256i q1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(qp + g * 64 + 32));
#pragma GCC unroll 8
      for (int r = 0; r < kR; ++r) {
        int32_t w;
        std::memcpy(&w, drow + r * groups * 4 + g * 4, 4);
        const __m256i b = _mm256_set1_epi32(w);
        if constexpr (kSign) {  // |d| x q * sign(d)
          int32_t wa;  // |d|, prepared once per document like the library's D + 128
          std::memcpy(&wa, dabs + j0 * groups * 4 + r * groups * 4 + g * 4, 4);
          const __m256i a = _mm256_set1_epi32(wa);
          acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(q0, b)), ones));
          acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(q1, b)), ones));
        } else {
          acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(b, q0), ones));
          acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(b, q1), ones));
        }
      }
    }
    for (int r = 0; r < kR; ++r) best = _mm256_max_epi32(best, _mm256_max_epi32(acc[r][0], acc[r][1]));
  }
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), best);
  return out[0] ^ out[7];
}

// The sign table form: |d| (u8) x (q with the signs of the group's 4 d's applied) (s8). The 16 sign
// patterns of a 4-byte group are applied to Q once per call: qv [groups][16][2 ymm]; per document a
// pattern byte per (token, group) and |d|. Exact iff Q holds no -128 (|pair| <= 2 * 128 * 127).
template <int kR = 6>
__attribute__((noinline)) int32_t TileTable(const int8_t* qv, const uint8_t* dabs, const uint8_t* pat, int64_t groups,
                                            int64_t Ld) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i best = _mm256_set1_epi32(INT32_MIN);
  for (int64_t j0 = 0; j0 + kR <= Ld; j0 += kR) {
    __m256i acc[kR][2];
    for (int r = 0; r < kR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t g = 0; g < groups; ++g) {
#pragma GCC unroll 8
      for (int r = 0; r < kR; ++r) {
        const int8_t* qg = qv + (g * 16 + pat[(j0 + r) * groups + g]) * 64;
        int32_t wa;
        std::memcpy(&wa, dabs + (j0 + r) * groups * 4 + g * 4, 4);
        const __m256i a = _mm256_set1_epi32(wa);
        const __m256i q0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(qg));
        const __m256i q1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(qg + 32));
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a, q0), ones));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a, q1), ones));
      }
    }
    for (int r = 0; r < kR; ++r) best = _mm256_max_epi32(best, _mm256_max_epi32(acc[r][0], acc[r][1]));
  }
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), best);
  return out[0] ^ out[7];
}

// int16 accumulation over kG groups between widenings (exact only under a data bound).
template <int kR = 6, int kG = 4>
__attribute__((noinline)) int32_t TileAddw(const int8_t* qp, const uint8_t* d, int64_t groups, int64_t Ld) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i best = _mm256_set1_epi32(INT32_MIN);
  for (int64_t j0 = 0; j0 + kR <= Ld; j0 += kR) {
    __m256i acc[kR][2];
    for (int r = 0; r < kR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    const uint8_t* drow = d + j0 * groups * 4;
    for (int64_t g0 = 0; g0 < groups; g0 += kG) {
      __m256i s[kR][2];
      for (int r = 0; r < kR; ++r) s[r][0] = s[r][1] = _mm256_setzero_si256();
      for (int64_t g = g0; g < g0 + kG; ++g) {
        const __m256i q0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(qp + g * 64));
        const __m256i q1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(qp + g * 64 + 32));
#pragma GCC unroll 8
        for (int r = 0; r < kR; ++r) {
          int32_t w;
          std::memcpy(&w, drow + r * groups * 4 + g * 4, 4);
          const __m256i b = _mm256_set1_epi32(w);
          s[r][0] = _mm256_add_epi16(s[r][0], _mm256_maddubs_epi16(b, q0));
          s[r][1] = _mm256_add_epi16(s[r][1], _mm256_maddubs_epi16(b, q1));
        }
      }
      for (int r = 0; r < kR; ++r) {
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(s[r][0], ones));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(s[r][1], ones));
      }
    }
    for (int r = 0; r < kR; ++r) best = _mm256_max_epi32(best, _mm256_max_epi32(acc[r][0], acc[r][1]));
  }
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), best);
  return out[0] ^ out[7];
}

// Per-document preparation of the sign table form: |d| and one 4-bit sign pattern byte per
// (token, group of 4), from vpmovmskb + pdep (BMI2; fast on Intel and Zen 3, microcoded on Zen 1/2).
__attribute__((target("bmi2"), noinline)) void TablePrep(const int8_t* d, int64_t Ld, int64_t dim, uint8_t* dabs,
                                                          uint8_t* pat) {
  for (int64_t j = 0; j < Ld; ++j) {
    for (int64_t k = 0; k + 32 <= dim; k += 32) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + j * dim + k));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dabs + j * dim + k), _mm256_abs_epi8(x));
      const uint64_t bytes = _pdep_u64(static_cast<uint32_t>(_mm256_movemask_epi8(x)), 0x0F0F0F0F0F0F0F0Full);
      std::memcpy(pat + j * (dim / 4) + k / 4, &bytes, 8);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int64_t iters = 2000000;
  struct Mix {
    const char* name;
    double (*f)(int64_t);
    double op_per_iter;
  } mixes[] = {{"fma (fp32, 12 ymm)", Fma, 2.0 * 8 * 12},
               {"madd: vpmaddwd+vpaddd", Madd, 2.0 * 16 * 10},
               {"mubs_madd: vpmaddubsw+vpmaddwd(1)+vpaddd", MubsMadd, 2.0 * 32 * 10},
               {"mubs_addw: vpmaddubsw+vpaddw", MubsAddw, 2.0 * 32 * 10},
               {"sign_mubs: vpsignb+vpmaddubsw+vpmaddwd(1)+vpaddd", SignMubs, 2.0 * 32 * 10}};
  double fma = 0;
  for (const Mix& m : mixes) {
    const double t = MinTime(reps, [&] { m.f(iters); });
    const double gops = m.op_per_iter * iters / t * 1e-9;
    if (fma == 0) fma = gops;
    std::printf("%-52s %7.1f GOP/s  %.2fx fma\n", m.name, gops, gops / fma);
  }

  // Tiles: Lq 32 (two 16-lane tiles for our kernels), Ld 180, dim 128, one hot document.
  const int64_t Lq = 32, Ld = 180, dim = 128, groups = dim / 4;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> u(-127, 127);
  std::vector<float> qf(Lq * dim), df(Ld * dim);
  std::vector<int8_t> q8(Lq * dim), d8(Ld * dim);
  for (int64_t i = 0; i < Lq * dim; ++i) q8[i] = static_cast<int8_t>(u(rng)), qf[i] = q8[i];
  for (int64_t i = 0; i < Ld * dim; ++i) d8[i] = static_cast<int8_t>(u(rng)), df[i] = d8[i];
  const double work = 2.0 * Lq * Ld * dim;  // OP per document
  std::vector<uint8_t> valid(Ld, 1);
  Doc doc;
  doc.valid = valid.data();
  doc.scale = nullptr;
  doc.first_valid = 0;
  doc.stride = Ld * dim;
  std::vector<TileResult> res(2);

  // Our float32 AVX2 tile: Q packed [tiles][dim][16].
  alignas(64) static float qpf[2 * 128 * 16];
  for (int64_t i = 0; i < Lq; ++i)
    for (int64_t k = 0; k < dim; ++k) qpf[(i / 16) * dim * 16 + k * 16 + i % 16] = qf[i * dim + k];
  TileArgs af;
  af.Ld = Ld, af.dim = dim, af.qp = qpf, af.count = Lq, af.tiles = 2, af.tile_stride = dim * 16 * 4;
  doc.data = df.data();
  const double tf = MinTime(reps, [&] {
    for (int it = 0; it < 100; ++it) TileF32Avx2(af, false, doc, res.data());
  }) / 100;
  const double f32 = work / tf * 1e-9;
  std::printf("%-52s %7.1f GOP/s  1.00x tile fp32\n", "tile fp32 avx2 (library)", f32);

  // Our vpmaddwd tile (D widened per document, included).
  alignas(64) static int16_t qpw[2 * 64 * 16 * 2];
  for (int64_t i = 0; i < Lq; ++i)
    for (int64_t k = 0; k < dim; ++k) qpw[(i / 16) * dim * 16 + (k / 2) * 32 + (i % 16) * 2 + k % 2] = q8[i * dim + k];
  std::vector<int16_t> dw(Ld * dim);
  const double tw = MinTime(reps, [&] {
    for (int it = 0; it < 100; ++it) {
      WidenI8Avx2(d8.data(), Ld, dim, dw.data());
      doc.data = dw.data();
      for (int t = 0; t < 2; ++t) {
        TileArgs a;
        a.Ld = Ld, a.dim = dim, a.qp = qpw + t * dim * 16, a.count = 16;
        TileI8Avx2I16(a, doc, &res[t]);
      }
    }
  }) / 100;
  std::printf("%-52s %7.1f GOP/s  %.2fx tile fp32\n", "tile int8 vpmaddwd (library)", work / tw * 1e-9,
              tf / tw);

  // Our vpmaddubsw tiles for 7-bit documents (read in place; DocSums7Avx2 per document included): Q + 128 (any Q)
  // and, for 7-bit Q, Q + 64 with two groups per int16 sum. The data halved into [-64, 63] for both.
  {
    std::vector<int8_t> d7(Ld * dim), q7(Lq * dim);
    for (int64_t i = 0; i < Ld * dim; ++i) d7[i] = static_cast<int8_t>(d8[i] >> 1);
    for (int64_t i = 0; i < Lq * dim; ++i) q7[i] = static_cast<int8_t>(q8[i] >> 1);
    alignas(64) static uint8_t qpu[2][2 * 32 * 64];  // [form][tiles][groups][16 lanes][4 bytes]
    for (int64_t i = 0; i < Lq; ++i)
      for (int64_t k = 0; k < dim; ++k) {
        const int64_t at = (i / 16) * dim * 16 + (k / 4) * 64 + (i % 16) * 4 + k % 4;
        qpu[0][at] = static_cast<uint8_t>(q8[i * dim + k] + 128);
        qpu[1][at] = static_cast<uint8_t>(q7[i * dim + k] + 64);
      }
    std::vector<int32_t> dsum(Ld);
    doc.data = d7.data();
    for (int form = 0; form < 2; ++form) {
      const double tu = MinTime(reps, [&] {
        for (int it = 0; it < 100; ++it) {
          if (!DocSums7Avx2(d7.data(), Ld, dim, dsum.data())) std::printf("DocSums7Avx2 refused\n");
          for (int t = 0; t < 2; ++t) {
            TileArgs a;
            a.Ld = Ld, a.dim = dim, a.qp = qpu[form] + t * dim * 16, a.count = 16, a.bias = dsum.data();
            if (form == 0) TileI8Avx2Ubs(a, doc, &res[t]);
            else TileI8Avx2Ubs2(a, doc, &res[t]);
          }
        }
      }) / 100;
      std::printf("%-52s %7.1f GOP/s  %.2fx tile fp32\n",
                  form == 0 ? "tile int8 vpmaddubsw, 7-bit D (library)" : "tile int8 vpmaddubsw pairs, 7-bit Q, D (library)",
                  work / tu * 1e-9, tf / tu);
    }
  }

  // vpmaddubsw tiles: speed only (the instruction stream timed; on these full-range inputs the plain
  // form saturates, the results are not checked). Ld = 180 is a multiple of every block size here.
  alignas(64) static int8_t qpb[2 * 32 * 64];  // [tiles][groups][16 lanes][4 bytes] s8 = Q
  for (int64_t i = 0; i < Lq; ++i)
    for (int64_t k = 0; k < dim; ++k) qpb[(i / 16) * dim * 16 + (k / 4) * 64 + (i % 16) * 4 + k % 4] = q8[i * dim + k];
  std::vector<uint8_t> du(Ld * dim), dabs(Ld * dim);
  for (int64_t i = 0; i < Ld * dim; ++i) {
    du[i] = static_cast<uint8_t>(d8[i] ^ 0x80);
    dabs[i] = static_cast<uint8_t>(d8[i] < 0 ? -d8[i] : d8[i]);
  }
  // Sign table per tile: [groups][16 patterns][16 lanes][4 bytes]; pattern bit m = d[4g + m] < 0.
  std::vector<int8_t> qv_mem(2 * groups * 16 * 64 + 64);
  int8_t* qv = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(qv_mem.data()) + 63) / 64 * 64);
  for (int t = 0; t < 2; ++t)
    for (int64_t g = 0; g < groups; ++g)
      for (int pt = 0; pt < 16; ++pt)
        for (int l = 0; l < 16; ++l)
          for (int m = 0; m < 4; ++m) {
            const int8_t v = q8[(t * 16 + l) * dim + g * 4 + m];
            qv[t * groups * 16 * 64 + (g * 16 + pt) * 64 + l * 4 + m] = static_cast<int8_t>((pt >> m) & 1 ? -v : v);
          }
  std::vector<uint8_t> pat(Ld * groups);
  for (int64_t j = 0; j < Ld; ++j)
    for (int64_t g = 0; g < groups; ++g) {
      int pt = 0;
      for (int m = 0; m < 4; ++m) pt |= (d8[j * dim + g * 4 + m] < 0) << m;
      pat[j * groups + g] = static_cast<uint8_t>(pt);
    }
  volatile int32_t sink = 0;
  auto tile = [&](const char* name, auto&& one_tile) {
    const double t = MinTime(reps, [&] {
      for (int it = 0; it < 100; ++it)
        for (int t2 = 0; t2 < 2; ++t2) sink = sink + one_tile(t2);
    }) / 100;
    std::printf("%-52s %7.1f GOP/s  %.2fx tile fp32\n", name, work / t * 1e-9, tf / t);
  };
  const uint8_t* ds = reinterpret_cast<const uint8_t*>(d8.data());
  auto qb = [&](int t) { return qpb + t * dim * 16; };
  // u8 D x s8 Q, one vpmaddubsw + vpmaddwd(ones) + vpaddd per 32 MACs: exact iff every pair sum fits
  // int16, e.g. D in [-64, 63] as u8 D + 64 (2 * 127 * 128 = 32512), bias 64 * sum_k Q per lane.
  tile("tile_mubs_madd R=6 (exact iff D in [-64, 63])", [&](int t) { return TileMubs<false, 6>(qb(t), du.data(), nullptr, groups, Ld); });
  tile("tile_mubs_madd R=5", [&](int t) { return TileMubs<false, 5>(qb(t), du.data(), nullptr, groups, Ld); });
  tile("tile_mubs_madd R=4", [&](int t) { return TileMubs<false, 4>(qb(t), du.data(), nullptr, groups, Ld); });
  // |d| x q * sign(d): exact for every D and every Q without -128.
  tile("tile_sign_mubs R=6 (vpsignb; exact w/o -128 in Q)", [&](int t) { return TileMubs<true, 6>(qb(t), ds, dabs.data(), groups, Ld); });
  tile("tile_sign_mubs R=4", [&](int t) { return TileMubs<true, 4>(qb(t), ds, dabs.data(), groups, Ld); });
  tile("tile_table R=6 (16-pattern Q; exact w/o -128 in Q)", [&](int t) { return TileTable<6>(qv + t * groups * 16 * 64, dabs.data(), pat.data(), groups, Ld); });
  tile("tile_table R=4", [&](int t) { return TileTable<4>(qv + t * groups * 16 * 64, dabs.data(), pat.data(), groups, Ld); });
  {  // check the vectorised preparation against the scalar one above, then time it with the tiles
    std::vector<uint8_t> dabs2(Ld * dim), pat2(Ld * groups);
    TablePrep(d8.data(), Ld, dim, dabs2.data(), pat2.data());
    if (dabs2 != dabs || pat2 != pat) std::printf("TablePrep MISMATCH\n");
  }
  {  // the exact forms are exact: their lane-0 ^ lane-7 maxima against a scalar reference
    for (int t = 0; t < 2; ++t) {
      int32_t best[8];
      for (int l = 0; l < 8; ++l) {
        best[l] = INT32_MIN;
        for (int h = 0; h < 2; ++h)
          for (int64_t j = 0; j < Ld; ++j) {
            int32_t acc = 0;
            for (int64_t k = 0; k < dim; ++k) acc += q8[(t * 16 + h * 8 + l) * dim + k] * d8[j * dim + k];
            if (acc > best[l]) best[l] = acc;
          }
      }
      const int32_t want = best[0] ^ best[7];
      if (TileTable<4>(qv + t * groups * 16 * 64, dabs.data(), pat.data(), groups, Ld) != want ||
          TileMubs<true, 4>(qb(t), ds, dabs.data(), groups, Ld) != want)
        std::printf("exact form MISMATCH (tile %d)\n", t);
    }
  }
  tile("tile_table R=4 + per-document preparation", [&](int t) {
    if (t == 0) TablePrep(d8.data(), Ld, dim, dabs.data(), pat.data());
    return TileTable<4>(qv + t * groups * 16 * 64, dabs.data(), pat.data(), groups, Ld);
  });
  // int16 accumulation over G groups (2G products per int16 lane): exact for any int8 only with one
  // operand split into nibbles (15 * 128 * 16 = 30720 for G = 8), i.e. two of these per 32 MACs.
  tile("tile_mubs_addw R=3 G=8 (needs |2G products| < 2^15)", [&](int t) { return TileAddw<3, 8>(qb(t), du.data(), groups, Ld); });
  tile("tile_mubs_addw R=4 G=8", [&](int t) { return TileAddw<4, 8>(qb(t), du.data(), groups, Ld); });
  tile("tile_mubs_addw R=4 G=4", [&](int t) { return TileAddw<4, 4>(qb(t), du.data(), groups, Ld); });
  // G = 2 (4 products per int16 lane): exact when D + 64 is in [0, 127] and Q in [-64, 63] (7-bit codes on both
  // sides: 4 * 127 * 64 = 32512).
  tile("tile_mubs_addw R=3 G=2 (exact iff D, Q in [-64, 63])", [&](int t) { return TileAddw<3, 2>(qb(t), du.data(), groups, Ld); });
  tile("tile_mubs_addw R=4 G=2", [&](int t) { return TileAddw<4, 2>(qb(t), du.data(), groups, Ld); });
  tile("tile_mubs_addw R=5 G=2", [&](int t) { return TileAddw<5, 2>(qb(t), du.data(), groups, Ld); });
  tile("tile_mubs_addw R=6 G=2", [&](int t) { return TileAddw<6, 2>(qb(t), du.data(), groups, Ld); });
  return 0;
}
