#include "common/cpu.h"

#include <strings.h>

#include <cstdlib>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

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

#if defined(__x86_64__) || defined(__i386__)
namespace {

// The OS saves the xmm and ymm state: OSXSAVE (CPUID.1:ECX[27]), then XCR0 bits 1 (SSE) and 2 (AVX).
// (xgetbv as inline asm: the _xgetbv intrinsic would need the xsave target on this function.)
bool OsSavesAvxState() noexcept {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 6u) == 6u;
}

}  // namespace
#endif

bool CpuHasF16c() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) && OsSavesAvxState();
#else
  return false;
#endif
}

bool CpuHasAvxVnni() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;  // __get_cpuid_count fails where the CPU's highest leaf is below 7
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4)) && OsSavesAvxState();
#else
  return false;
#endif
}

bool KernelsUseAvxVnni() { return CpuHasAvxVnni() && ChooseIsa().cpu_limit.empty(); }

bool CpuHasAvx512Vnni() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11)) && OsSavesAvxState();
#else
  return false;
#endif
}

const char* IsaName(Isa isa) noexcept {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "portable";
  }
}

}  // namespace sd
