// An AVX2-only CPU without VNNI, as every library in a process sees it: an LD_PRELOAD shim that turns on
// Linux's CPUID faulting (arch_prctl(ARCH_SET_CPUID, 0): CPUID then raises SIGSEGV in this process and the
// threads it starts) and answers each CPUID from its SIGSEGV handler with the real result, less the
// AVX-512 and VNNI feature bits (leaf 7: AVX512F/DQ/IFMA/PF/ER/CD/BW/VL, AVX512_VBMI/VBMI2/VNNI/BITALG/
// VPOPCNTDQ, 4VNNIW/4FMAPS/VP2INTERSECT/FP16, AMX; leaf 7.1: AVX-VNNI, AVX512_BF16, AVX-IFMA,
// AVX-VNNI-INT8). onnxruntime's MLAS, numpy and torch then choose their AVX2 kernels -- MLAS's int8
// GEMM its vpmaddubsw (u8s8) path -- on the real core: the instruction set of an AVX2-only CPU, the
// microarchitecture of the host. Issue 13 uses it to measure "int8 on a CPU without VNNI" on a host
// that has VNNI (bench/minilm_int8_options.py --emulate-avx2, bench/maxsim.py --emulate-avx2).
//
//   gcc -O2 -shared -fPIC bench/cpuid_avx2.c -o /tmp/cpuid_avx2.so -ldl   (dlsym: libdl before glibc 2.34)
//   LD_PRELOAD=/tmp/cpuid_avx2.so python -c "import numpy; numpy.show_runtime()"   # no AVX512* listed
//   SD_CPUID_MASK=vnni LD_PRELOAD=/tmp/cpuid_avx2.so ...   # AVX-512 kept, only VNNI hidden (see vnni_only)
//   SD_CPUID_MASK=avxvnni LD_PRELOAD=/tmp/cpuid_avx2.so ... # the AVX2 CPU above *with* AVX-VNNI (see avx_vnni)
//
// What must stay true: only CPUID faults are handled (any other SIGSEGV gets the default action and
// recurs); the handler re-enables CPUID only around its own CPUID instruction. Where the kernel or the
// hypervisor has no CPUID faulting (arch_prctl fails), the shim says so on stderr and exits with status
// 3 rather than let a benchmark run on the unmasked CPU. Glibc's own ifunc choices are made before any
// shim runs and stay the host's (memcpy and friends; no effect on the kernels measured). A program that
// installs its own SIGSEGV handler (GCC's cc1plus does, Python's faulthandler does) keeps the shim's: its
// sigaction() and signal() for SIGSEGV are recorded here instead, and the shim's handler passes every
// fault that is not a CPUID on to the recorded handler (or to the default action). A handler installed by a
// direct syscall would bypass that; none of the programs run under the shim here does so.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

// Leaf 7, subleaf 0.
#define EBX7_MASK                                                                                                \
  ((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31))
#define ECX7_MASK ((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14))
#define EDX7_MASK ((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25))
// Leaf 7, subleaf 1 (EAX): AVX-VNNI, AVX512_BF16, AVX-IFMA; (EDX) AVX-VNNI-INT8.
#define EAX71_MASK ((1u << 4) | (1u << 5) | (1u << 23))
#define EDX71_MASK (1u << 4)

// SD_CPUID_MASK=vnni (read once, at load): hide only the VNNI bits (AVX512_VNNI; AVX-VNNI, AVX-VNNI-INT8) and keep
// AVX-512 -- an AVX-512 CPU without VNNI (Skylake-SP / Skylake-X), whose MLAS int8 kernel is the 64-byte
// vpmaddubsw one. Unset: the AVX2-only CPU above.
static int vnni_only;
// SD_CPUID_MASK=avxvnni: the AVX2-only CPU above, plus the AVX-VNNI bit (leaf 7.1 EAX[4]) -- an Alder Lake-class CPU,
// for code that only reads CPUID and chooses (softdeploy's int8 format choice: tests/quant/test_formats.py). The
// host has no AVX-VNNI if it has AVX-512 (Zen 4), so nothing may execute a VEX vpdpbusd under it: a library that
// trusts the bit and runs one faults (SIGILL). Never for benchmarks.
static int avx_vnni;

static void masked_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
  __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
  if (vnni_only) {
    if (leaf == 7 && sub == 0) r[2] &= ~(1u << 11);
    if (leaf == 7 && sub == 1) r[0] &= ~(1u << 4), r[3] &= ~(1u << 4);
    return;
  }
  if (leaf == 7 && sub == 0) {
    r[1] &= ~EBX7_MASK;
    r[2] &= ~ECX7_MASK;
    r[3] &= ~EDX7_MASK;
  } else if (leaf == 7 && sub == 1) {
    r[0] &= ~EAX71_MASK;
    r[3] &= ~EDX71_MASK;
    if (avx_vnni) r[0] |= 1u << 4;
  }
  if (avx_vnni && leaf == 7 && sub == 0 && r[0] < 1) r[0] = 1;  // subleaf 1 exists
}

// The process's own SIGSEGV disposition (what it asked sigaction() or signal() for), and the real sigaction.
static struct sigaction user_segv;  // zero: SIG_DFL
typedef int (*sigaction_fn)(int, const struct sigaction*, struct sigaction*);
static sigaction_fn real_sigaction_fn;

static int real_sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  if (real_sigaction_fn == NULL) real_sigaction_fn = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  return real_sigaction_fn(sig, act, old);
}

static void on_segv(int sig, siginfo_t* info, void* context) {
  ucontext_t* uc = (ucontext_t*)context;
  greg_t* g = uc->uc_mcontext.gregs;
  const unsigned char* ip = (const unsigned char*)g[REG_RIP];
  if (info->si_code == SI_KERNEL && ip[0] == 0x0F && ip[1] == 0xA2) {  // CPUID (a #GP: SI_KERNEL)
    uint32_t r[4];
    masked_cpuid((uint32_t)g[REG_RAX], (uint32_t)g[REG_RCX], r);
    g[REG_RAX] = r[0];  // a 32-bit result zero-extends, as CPUID's does
    g[REG_RBX] = r[1];
    g[REG_RCX] = r[2];
    g[REG_RDX] = r[3];
    g[REG_RIP] += 2;
    return;
  }
  // Not ours: the process's own handler, else the default action (the fault then recurs and ends the process).
  if (user_segv.sa_flags & SA_SIGINFO) {
    user_segv.sa_sigaction(sig, info, context);
  } else if (user_segv.sa_handler != SIG_DFL && user_segv.sa_handler != SIG_IGN) {
    user_segv.sa_handler(sig);
  } else {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    real_sigaction(sig, &dfl, NULL);
  }
}

// SIGSEGV dispositions are recorded, not installed: the shim's handler stays.
int sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  if (sig != SIGSEGV) return real_sigaction(sig, act, old);
  if (old != NULL) *old = user_segv;
  if (act != NULL) user_segv = *act;
  return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction act, old;
  memset(&act, 0, sizeof act);
  act.sa_handler = handler;
  act.sa_flags = SA_RESTART;
  sigemptyset(&act.sa_mask);
  if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
  return old.sa_handler;
}

// For the process to check that the shim is loaded (bench/harness.py: ctypes.CDLL(None).cpuid_avx2_active()).
int cpuid_avx2_active(void) { return 1; }

__attribute__((constructor)) static void cpuid_avx2_init(void) {
  const char* mask = getenv("SD_CPUID_MASK");
  vnni_only = mask != NULL && strcmp(mask, "vnni") == 0;
  avx_vnni = mask != NULL && strcmp(mask, "avxvnni") == 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  real_sigaction(SIGSEGV, &sa, NULL);
  if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
    static const char msg[] = "cpuid_avx2: this kernel or hypervisor has no CPUID faulting; cannot emulate an AVX2-only CPU\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(3);
  }
}
