#include "common/cpu.h"

#include <strings.h>

#include <cstdlib>
#include <stdexcept>

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

IsaChoice ChooseIsa() {
  IsaChoice c;
  c.detected = c.selected = DetectIsa();
  // Read at every call (not cached at load): the conformance tests change it between sessions.
  const char* want = std::getenv("SOFTDEPLOY_ISA");
  if (want == nullptr || *want == '\0') return c;
  c.requested = want;
  Isa asked;
  if (strcasecmp(want, "portable") == 0) asked = Isa::kPortable;
  else if (strcasecmp(want, "avx2") == 0) asked = Isa::kAvx2;
  else if (strcasecmp(want, "avx512") == 0) asked = Isa::kAvx512;
  else {
    c.valid = false;
    c.note = "SOFTDEPLOY_ISA='" + c.requested +
             "' names no kernel variant; set it to portable, avx2 or avx512, or unset it";
    return c;
  }
  if (static_cast<int>(asked) > static_cast<int>(c.detected)) {
    c.note = std::string("SOFTDEPLOY_ISA=") + IsaName(asked) + " asks for more than this CPU supports; " +
             IsaName(c.detected) + " runs (" +
             (asked == Isa::kAvx512 ? "AVX-512 needs F, BW, VL and DQ" : "AVX2 needs AVX2 and FMA") + ")";
    return c;
  }
  c.selected = asked;
  return c;
}

Isa SelectIsa() {
  IsaChoice c = ChooseIsa();
  if (!c.valid) throw std::invalid_argument(c.note);
  return c.selected;
}

const char* IsaName(Isa isa) noexcept {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "portable";
  }
}

}  // namespace sd
