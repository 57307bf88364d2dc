// LoRAMixer's vector pieces for AVX2: ops/lora_mixer_kernels.h instantiated with the Avx2 traits. Compiled
// with the AVX2 flags and -ffp-contract=off (CMakeLists.txt); called only after the run-time ISA check of
// ops/lora_mixer.cc.
#include "lora_mixer_kernels.h"

namespace sd {
namespace lora_mixer {

void DotTileAvx2(const float* x0, const float* x1, const float* const* rows, int64_t n, float* out0, float* out1) {
  DotTile<vec::Avx2>(x0, x1, rows, n, out0, out1);
}

void AxpyAvx2(const float* bt, int64_t r, int64_t out, const float* c0, const float* c1, float* d0, float* d1,
              bool fresh0, bool fresh1) {
  Axpy<vec::Avx2>(bt, r, out, c0, c1, d0, d1, fresh0, fresh1);
}

bool AllFiniteAvx2(const float* p, int64_t n) { return AllFinite<vec::Avx2>(p, n); }

}  // namespace lora_mixer
}  // namespace sd
