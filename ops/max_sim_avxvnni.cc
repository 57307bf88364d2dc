// MaxSim int8 tile for AVX-VNNI (VEX vpdpbusd on ymm: Alder Lake and later, Zen 5). Compiled with
// -mavx2 -mfma -mavxvnni -ffp-contract=off (CMakeLists.txt), called only after the avxvnni CPU check
// in ops/max_sim_core.h. The size sweep also compiles this file with vpdpbusd's EVEX encoding
// (ops/common/avxvnni.h), so CPUs with AVX-512 VNNI sweep this tile too. Its own translation unit because the intrinsic needs the avxvnni target on
// every function it is inlined into (the generic BlockInt template cannot carry a per-ISA target
// attribute), and inline asm on an accumulator array made GCC 12 keep all 12 accumulators in memory.
//
// vpdpbusd sums four u8 x s8 products into int32 exactly. The u8 side is the document (D + 128, one
// xor per byte and document: BiasI8Avx2) and Q stays s8, so the bias 128 * sum_k Q[i, k] is per
// query lane and computed once per call, not per document token as with Q + 128.
#include "common/avxvnni.h"
#include "max_sim_kernels.h"

namespace sd {
namespace maxsim {
namespace {

using V = vec::Avx2;

struct StepAvxVnni {  // four u8 (b: the document) x s8 (q) products per 32-bit lane
  static constexpr int kBlock = 6;  // 12 accumulators + 2 Q + broadcast: vpdpbusd accumulates in place
  static SD_VEC_INLINE __m256i dot(__m256i acc, __m256i q, __m256i b) { return SD_DPBUSD_YMM(acc, b, q); }
};

}  // namespace

void SD_AVXVNNI_NAME(TileI8AvxVnni)(const TileArgs& a, const Doc& doc, TileResult* out) {
  // bias[l] = 128 * sum_k Q[l, k]: sum_k (D + 128) Q - bias = sum_k D Q. Padding lanes have bias 0.
  const __m256i init[2] = {V::subi(V::zeroi(), V::loadui(a.bias)), V::subi(V::zeroi(), V::loadui(a.bias + 8))};
  TileInt<V, StepAvxVnni>(a, (a.dim + 3) / 4, init, doc, out);
}

}  // namespace maxsim
}  // namespace sd
