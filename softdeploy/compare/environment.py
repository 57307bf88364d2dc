"""The environment block of every comparison: package versions, CPU model and ISA flags, cores,
threads, and how busy the machine was with other processes (a shared machine skews latency)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
from typing import Any

from softdeploy.cpu import cpuinfo

# ISA features that decide which kernels run (ours, onnxruntime's MLAS, torch's).
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_int8",
    "amx_tile",
)
PACKAGES = ("softdeploy", "numpy", "torch", "onnx", "onnxruntime", "onnxscript", "transformers", "tokenizers")


def environment(threads: int) -> dict[str, Any]:
    """The machine and software a result was measured on (Python, platform, CPU model and flags, package versions, the
    kernel library and the variant it selects, threads), for reports: numbers mean little without it."""
    from softdeploy.runtime import library_status

    model, flags = cpuinfo()
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            versions[p] = None
    status = library_status()
    info = status.info  # the library itself says which variant runs (SOFTDEPLOY_ISA included)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "cpu": model,
        "cores": os.cpu_count(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "threads": threads,
        "softdeploy_library": str(status.path) if status.ok else None,
        "softdeploy_library_version": info.version if info else None,
        "softdeploy_ort_api_version": info.ort_api_version if info else None,
        "softdeploy_kernel_isa": info.isa_selected if info else None,
        "softdeploy_kernel_isa_requested": info.isa_requested if info else None,
        "softdeploy_kernels": info.isa_summary() if info else None,
        "background_load_cores": round(background_load(), 2),
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _proc_stat_busy() -> tuple[int, int]:
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals[:8]) - idle, sum(vals[:8])


def _self_ticks() -> int:
    ticks = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return ticks


class LoadMeter:
    """Average number of cores used by OTHER processes between start() and stop() (0 where /proc
    is unavailable)."""

    def start(self) -> LoadMeter:
        """Starts measuring (reads /proc/stat and this process's CPU ticks); returns self. Where /proc is unreadable,
        stop() returns 0."""
        try:
            self._b0, self._t0 = _proc_stat_busy()
            self._s0 = _self_ticks()
            self._ok = True
        except OSError:
            self._ok = False
        return self

    def stop(self) -> float:
        """Other processes' average CPU load since start(), in busy cores (this process's own time subtracted): a
        latency number measured under load ~1 on 2 cores is not the idle machine's."""
        if not self._ok:
            return 0.0
        b1, t1 = _proc_stat_busy()
        s1 = _self_ticks()
        if t1 == self._t0:
            return 0.0
        return max(0.0, (b1 - self._b0 - (s1 - self._s0)) / (t1 - self._t0) * (os.cpu_count() or 1))


def background_load(interval: float = 0.3) -> float:
    """Busy cores of other processes, averaged over ``interval`` seconds (see LoadMeter)."""
    meter = LoadMeter().start()
    time.sleep(interval)
    return meter.stop()


def wait_quiet(max_wait_s: float, threshold: float = 0.5) -> float:
    """Waits (up to ``max_wait_s``) until other processes use less than ``threshold`` cores; returns
    the last reading. On a shared machine this keeps a burst of someone else's work out of the
    timings; the load during the timing itself is recorded either way."""
    deadline = time.monotonic() + max_wait_s
    load = background_load()
    while load > threshold and time.monotonic() < deadline:
        time.sleep(1.0)
        load = background_load()
    return load
