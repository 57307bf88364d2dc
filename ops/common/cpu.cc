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

namespace {

bool ParseIsa(const char* s, Isa* out) {
  if (strcasecmp(s, "portable") == 0) *out = Isa::kPortable;
  else if (strcasecmp(s, "avx2") == 0) *out = Isa::kAvx2;
  else if (strcasecmp(s, "avx512") == 0) *out = Isa::kAvx512;
  else return false;
  return true;
}

}  // namespace

IsaChoice ChooseIsa() {
  IsaChoice c;
  // Both variables are read at every call (not cached at load): the tests change them between sessions.
  c.detected = DetectIsa();
  const char* limit = std::getenv("SOFTDEPLOY_TEST_CPU");
  if (limit != nullptr && *limit != '\0') {
    c.cpu_limit = limit;
    Isa cap;
    if (!ParseIsa(limit, &cap)) {
      c.valid = false;
      c.note = "SOFTDEPLOY_TEST_CPU='" + c.cpu_limit +
               "' names no kernel variant; set it to portable or avx2, or unset it";
      c.selected = c.detected;
      return c;
    }
    if (static_cast<int>(cap) < static_cast<int>(c.detected)) c.detected = cap;
  }
  c.selected = c.detected;
  const char* want = std::getenv("SOFTDEPLOY_ISA");
  if (want == nullptr || *want == '\0') return c;
  c.requested = want;
  Isa asked;
  if (!ParseIsa(want, &asked)) {
    c.valid = false;
    c.note = "SOFTDEPLOY_ISA='" + c.requested +
             "' names no kernel variant; set it to portable, avx2 or avx512, or unset it";
    return c;
  }
  if (static_cast<int>(asked) > static_cast<int>(c.detected)) {
    c.note = std::string("SOFTDEPLOY_ISA=") + IsaName(asked) + " asks for more than this CPU supports" +
             (c.cpu_limit.empty() ? "" : " (as limited by SOFTDEPLOY_TEST_CPU=" + c.cpu_limit + ")") + "; " +
             IsaName(c.detected) + " runs (" +
             (asked == Isa::kAvx512 ? "AVX-512 needs F, BW, VL and DQ" : "AVX2 needs AVX2 and FMA") + ")";
    return c;
  }
  c.selected = asked;
  return c;
}

Isa SelectIsa() {
  IsaChoice c = ChooseIsa();
  if (!c.valid) throw EnvironmentError(c.note);
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
