// CPU feature detection and the run-time choice of kernel variant.
//
// Every kernel has a portable C++ variant and, where it pays, AVX2+FMA and AVX-512 variants written over
// the vector traits (ops/common/vec.h) and compiled in per-ISA translation units (ops/<stem>_avx2.cc,
// _avx512.cc; CMakeLists.txt gives them their flags). Which one runs is decided once per kernel
// instance (at session creation) from the CPU's features; the environment variable SOFTDEPLOY_ISA
// (portable | avx2 | avx512) may lower the choice, never raise it above what the CPU supports --
// the conformance tests use it to check every variant on one machine. What was asked and what runs
// is reported by the exported SoftdeployLibraryInfo() (ops/register.cc), never guessed elsewhere.
#pragma once

#include <stdexcept>
#include <string>

namespace sd {

enum class Isa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// The best variant this CPU can run (AVX-512 needs F, BW, VL and DQ; AVX2 needs FMA as well), before
// SOFTDEPLOY_TEST_CPU.
Isa DetectIsa() noexcept;

// What SOFTDEPLOY_ISA asks for and what runs. `requested` is the variable's value ("" when unset or
// empty); `valid` is false when it names no variant; `note` says why `selected` differs from the
// request ("" when it does not). `cpu_limit` is SOFTDEPLOY_TEST_CPU (portable | avx2; "" when unset):
// detection then reports at most that variant, so that a test on an AVX-512 machine sees what an
// AVX2-only or a plain x86-64 CPU selects and reports. It is a test setting; doctor warns about it.
struct IsaChoice {
  Isa detected = Isa::kPortable;
  Isa selected = Isa::kPortable;
  std::string requested;
  bool valid = true;
  std::string note;
  std::string cpu_limit;
};
IsaChoice ChooseIsa();

// The library's environment refuses (a setting of this process, not the model or its inputs). Guard
// (common/kernel.h) reports it as "softdeploy kernel library: ..." -- never "<Op>: ...", the form of
// an op-contract error -- so that callers tell the two apart by the message's form alone (onnxruntime
// keeps no status code of a kernel that fails at session creation).
class EnvironmentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The variant a kernel instance runs: ChooseIsa().selected. A value of SOFTDEPLOY_ISA or
// SOFTDEPLOY_TEST_CPU that names no variant throws EnvironmentError (kernel creation then fails
// naming the op): an ignored typo would silently test or benchmark another variant than the one
// asked for.
Isa SelectIsa();

const char* IsaName(Isa isa) noexcept;

// Features the kernels use beyond the variant's own, read from CPUID here rather than with
// __builtin_cpu_supports, whose names differ by compiler (clang 14 knows neither "f16c" nor
// "avxvnni"). Each needs the OS to save the AVX state (OSXSAVE and XCR0 bits 1-2), as libgcc's
// __builtin_cpu_supports requires for them: same answer under GCC and clang.
bool CpuHasF16c() noexcept;     // CPUID.1:ECX[29]
bool CpuHasAvxVnni() noexcept;  // CPUID.(7,1):EAX[4] (VEX vpdpbusd on ymm)
// CPUID.(7,0):ECX[11] (EVEX vpdpbusd). Only meaningful with the avx512 variant selected, whose detection has
// checked that the OS saves the zmm state. CPUID traps to the hypervisor on a VM: read it at kernel creation.
bool CpuHasAvx512Vnni() noexcept;

// Whether the kernels use AVX-VNNI (their avx2 variant's VEX vpdpbusd ymm tiles: MaxSim's int8, RowwiseInt8MatMul's):
// CPUID reports it and SOFTDEPLOY_TEST_CPU is unset. That test setting hides it: the CPUs it stands for (Zen 1-3,
// Intel before Alder Lake) have none, and the non-VNNI paths are then the ones tested and benchmarked. Read at kernel
// creation, like the ISA; the library info reports the same answer (ops/register.cc).
bool KernelsUseAvxVnni();

}  // namespace sd

// Per-function targets (the kernels use the per-ISA translation units instead).
#define SD_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define SD_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
// For lambdas in hot loops whose captures must stay in registers (a lambda left out of line makes
// every variable it captures by reference live in memory across the loop).
#define SD_INLINE __attribute__((always_inline))
