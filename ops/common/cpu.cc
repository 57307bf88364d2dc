#include "common/cpu.h"

#include <cstdlib>
#include <cstring>

namespace sd {

Isa DetectIsa() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kPortable;
}

Isa SelectIsa() noexcept {
  Isa best = DetectIsa();
  const char* want = std::getenv("SOFTDEPLOY_ISA");
  if (want == nullptr || *want == '\0') return best;
  Isa asked = best;
  if (std::strcmp(want, "portable") == 0) asked = Isa::kPortable;
  else if (std::strcmp(want, "avx2") == 0) asked = Isa::kAvx2;
  else if (std::strcmp(want, "avx512") == 0) asked = Isa::kAvx512;
  return static_cast<int>(asked) < static_cast<int>(best) ? asked : best;
}

const char* IsaName(Isa isa) noexcept {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "portable";
  }
}

}  // namespace sd
