// Register-only throughput loops: the physical limits bench/maxsim.py (and bench/micro/maxsim_tiles.cc)
// report the MaxSim kernels against, measured in the same run. The loops are inline assembly on fixed
// registers (no loads or stores, nothing the compiler can hoist or spill), with enough independent
// accumulators to cover the latency on every x86 core we know (4-5 cycles x 2 ports: 10-12).
//   sd_peak(kind, iters): runs `iters` iterations; returns the operations done (FLOP or integer OP,
//   2 per multiply-add) so that the caller divides by its own timing.
// kind: 0 AVX2 FMA fp32 (12 ymm), 1 AVX-512 FMA fp32 (16 zmm), 2 AVX2 vpmaddwd + vpaddd (int16 pairs
// -> int32: the non-VNNI int8 path; 10 accumulators), 3 AVX-VNNI vpdpbusd ymm (12), 4 AVX-512 VNNI
// vpdpbusd zmm (16), 5 AVX-512 VNNI + VL vpdpbusd ymm (12: the EVEX encoding of kind 3, the limit of the AVX-VNNI
// tiles' EVEX twins, tests/native/*_avxvnni_evex.cc). Built by bench/maxsim.py into a temporary shared object:
//   g++ -O2 -shared -fPIC bench/micro/fma_peak.cc -o fma_peak.so
// The caller runs a kind only where the CPU has its instructions (else SIGILL).
#include <cstdint>

#define SD_R12(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)
#define SD_R16(OP) SD_R12(OP) OP(12) OP(13) OP(14) OP(15)
#define SD_FMA_Y(i) "vfmadd231ps %%ymm15, %%ymm14, %%ymm" #i "\n\t"
#define SD_FMA_Z(i) "vfmadd231ps %%zmm31, %%zmm30, %%zmm" #i "\n\t"
#define SD_DP_Y(i) "%{vex%} vpdpbusd %%ymm15, %%ymm14, %%ymm" #i "\n\t"
#define SD_DP_Z(i) "vpdpbusd %%zmm31, %%zmm30, %%zmm" #i "\n\t"
#define SD_CLOB_Y "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
                  "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"
#define SD_CLOB_Z SD_CLOB_Y, "xmm30", "xmm31"

namespace {

// Kind 5: vpdpbusd ymm in its EVEX encoding (the assembler picks EVEX without {vex}: AVX-512 VNNI + VL).
__attribute__((target("avx512f,avx512vl,avx512vnni"))) double EvexYmm(int64_t n) {
#define SD_DP_YE(i) "vpdpbusd %%ymm15, %%ymm14, %%ymm" #i "\n\t"
  asm volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\tvpxor %%xmm15, %%xmm15, %%xmm15\n\t"
               "1:\n\t" SD_R12(SD_DP_YE) "dec %0\n\tjnz 1b\n\tvzeroupper"
               : "+r"(n) : : "cc", SD_CLOB_Y);
#undef SD_DP_YE
  return 2.0 * 32 * 12;
}

// zmm16-31 exist only under the avx512f target.
__attribute__((target("avx512f"))) double Avx512(bool vnni, int64_t n) {
  if (!vnni) {
    asm volatile("vpxord %%zmm30, %%zmm30, %%zmm30\n\tvpxord %%zmm31, %%zmm31, %%zmm31\n\t"
                 "1:\n\t" SD_R16(SD_FMA_Z) "dec %0\n\tjnz 1b\n\tvzeroupper"
                 : "+r"(n) : : "cc", SD_CLOB_Z);
    return 2.0 * 16 * 16;
  }
  asm volatile("vpxord %%zmm30, %%zmm30, %%zmm30\n\tvpxord %%zmm31, %%zmm31, %%zmm31\n\t"
               "1:\n\t" SD_R16(SD_DP_Z) "dec %0\n\tjnz 1b\n\tvzeroupper"
               : "+r"(n) : : "cc", SD_CLOB_Z);
  return 2.0 * 64 * 16;
}

double Run(int kind, int64_t n) {
  if (n <= 0) return 0.0;
  switch (kind) {
    case 0:
      asm volatile("vxorps %%xmm14, %%xmm14, %%xmm14\n\tvxorps %%xmm15, %%xmm15, %%xmm15\n\t"
                   "1:\n\t" SD_R12(SD_FMA_Y) "dec %0\n\tjnz 1b\n\tvzeroupper"
                   : "+r"(n) : : "cc", SD_CLOB_Y);
      return 2.0 * 8 * 12;
    case 1: return Avx512(false, n);
    case 2:
#define SD_MADD(i, t) "vpmaddwd %%ymm15, %%ymm14, %%ymm" #t "\n\tvpaddd %%ymm" #t ", %%ymm" #i ", %%ymm" #i "\n\t"
      asm volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\tvpxor %%xmm15, %%xmm15, %%xmm15\n\t"
                   "1:\n\t" SD_MADD(0, 10) SD_MADD(1, 11) SD_MADD(2, 12) SD_MADD(3, 13) SD_MADD(4, 10)
                       SD_MADD(5, 11) SD_MADD(6, 12) SD_MADD(7, 13) SD_MADD(8, 10) SD_MADD(9, 11)
                   "dec %0\n\tjnz 1b\n\tvzeroupper"
                   : "+r"(n) : : "cc", SD_CLOB_Y);
#undef SD_MADD
      return 2.0 * 16 * 10;
    case 3:
      asm volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\tvpxor %%xmm15, %%xmm15, %%xmm15\n\t"
                   "1:\n\t" SD_R12(SD_DP_Y) "dec %0\n\tjnz 1b\n\tvzeroupper"
                   : "+r"(n) : : "cc", SD_CLOB_Y);
      return 2.0 * 32 * 12;
    case 4: return Avx512(true, n);
    case 5: return EvexYmm(n);
    default: return -1.0;
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) double sd_peak(int kind, int64_t iters) {
  const double per_iter = Run(kind, iters);
  return per_iter < 0 ? -1.0 : per_iter * static_cast<double>(iters);
}
