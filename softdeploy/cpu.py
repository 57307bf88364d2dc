"""Platform facts: the CPU's model name and ISA flags, and the kernel library's rule from flags to kernel variant.

A leaf. The rule is ops/common/cpu.cc's (AVX-512 = F, BW, VL and DQ; AVX2 = AVX2 and FMA; else portable) and this is
its one Python copy: Python asks the loaded library first (``softdeploy.runtime.library_status().info``) and applies
this rule to /proc/cpuinfo only where no library loads.
"""

from __future__ import annotations

import os
import platform

from softdeploy.errors import SoftdeployWarning, WorkflowError

# Kernel variants, weakest first: a CPU that runs one runs every one before it.
ISAS = ("portable", "avx2", "avx512")
# The CPU flags (as /proc/cpuinfo names them) each variant needs, as ops/common/cpu.cc checks them.
ISA_FEATURES = {
    "avx2": frozenset({"avx2", "fma"}),
    "avx512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
}


def cpuinfo() -> tuple[str, set[str]]:
    """(CPU model name, ISA flags) from /proc/cpuinfo; the one place softdeploy reads it."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("unknown", "", "x86_64"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def isa_from_flags(flags: set[str] | frozenset[str]) -> str:
    """The kernel variant ops/common/cpu.cc selects on a CPU with ``flags``: avx512, avx2 or portable."""
    return "avx512" if ISA_FEATURES["avx512"] <= flags else "avx2" if ISA_FEATURES["avx2"] <= flags else "portable"


def isas_up_to(isa: str) -> list[str]:
    """The variants a CPU whose best variant is ``isa`` runs, weakest first."""
    return list(ISAS[: ISAS.index(isa) + 1])


def cpu_count() -> int:
    """The CPU cores this process may run on (its affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def bounded_threads(threads: int, where: str = "threads") -> int:
    """``threads``, lowered to :func:`cpu_count` with a one-line SoftdeployWarning when it is above it (more threads
    than cores only slows every variant down, and tens of thousands took minutes to start). WorkflowError below 1."""
    import warnings

    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise WorkflowError(f"{where}: {threads!r} (rule: a whole number of threads, at least 1)")
    cores = cpu_count()
    if threads > cores:
        warnings.warn(
            f"{where}: {threads} is more than the {cores} CPU cores of this machine; using {cores}",
            SoftdeployWarning,
            stacklevel=2,
        )
        return cores
    return threads


__all__ = ["ISAS", "ISA_FEATURES", "bounded_threads", "cpu_count", "cpuinfo", "isa_from_flags", "isas_up_to"]
