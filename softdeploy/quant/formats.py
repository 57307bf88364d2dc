"""Which int8 format for which CPU: a small decision table keyed by the CPU features softdeploy detects.

onnxruntime's int8 GEMMs (MLAS) multiply uint8 activations by int8 weights ("u8s8") with one of two
instruction sequences, chosen by the CPU (onnxruntime/core/mlas/lib/platform.cpp):

* with VNNI (AVX512-VNNI, or AVX-VNNI on AVX2 cores): ``vpdpbusd(s)`` sums four u8 x s8 products
  straight into int32 (``MultiplyAccumulateCellU8S8Avx512Vnni`` in
  onnxruntime/core/mlas/lib/amd64/SymQgemmU8KernelAvx512.asm): no intermediate rounding;
* without it (AVX2, and AVX-512 cores without VNNI such as Skylake-SP): ``vpmaddubsw`` then
  ``vpmaddwd`` (``MultiplyAccumulateRowU8S8Avx2`` in QgemmU8X8KernelAvx2.asm,
  ``MultiplyAccumulateCellU8S8Avx512Core``): ``vpmaddubsw`` adds each PAIR of u8 x s8 products into a
  SATURATED int16. Two products reach 2 x 255 x 127 = 64770 > 32767, so full-range int8 weights can
  clip. With ``reduce_range`` (7-bit weights, |w| <= 64) a pair is at most 2 x 255 x 64 = 32640: it
  cannot saturate, and the result is the same exact integer sum as on a VNNI core.

onnxruntime 1.32's own guidance says the same (``onnxruntime.quantization.quantize_static``'s
docstring, "Choosing parameters for CPU inference"): x86-64 without VNNI -> QUInt8 activations, QInt8
weights, ``reduce_range=True``; with VNNI -> ``reduce_range=False``; QDQ preferred for static models.

The table (:data:`TABLE`), one row per CPU class (:func:`int8_cpu_class`):

==================== ============ ============= =============================================================
CPU class            u8s8 kernel  reduce_range  why
==================== ============ ============= =============================================================
vnni                 vpdpbusd     no            exact int32 sums: 7-bit weights would only lose accuracy
avx512 (no VNNI)     vpmaddubsw   yes           int16 pair saturation at 8-bit weights; 7 bits cannot clip
avx2 (no VNNI)       vpmaddubsw   yes           the same (the issue's Zen 3 / client-CPU case)
x86-64 (no AVX2)     SSE          yes           onnxruntime's guidance for every x86-64 CPU without VNNI
other                --           no            no vpmaddubsw (ARM: onnxruntime's guidance is reduce_range off)
==================== ============ ============= =============================================================

The rest is the same on every class, and measured (bench/results/minilm_int8_options.md, on a VNNI
core): weights per output channel (per-tensor lost 0.018 MRR@10 on MiniLM); dynamic mode is
QOperator (DynamicQuantizeLinear + MatMulInteger, fused by onnxruntime to DynamicQuantizeMatMul: its
only dynamic form), static mode QDQ; the activation x activation MatMuls (attention scores,
attention x values) stay float (no faster in int8 at these sizes, 0.009 MRR@10 lost). A reduce_range
model computes the same integers on every kernel, so its accuracy measured on a VNNI core is its
accuracy on an AVX2 one (measured on MiniLM: sentence cosine 0.9893 against 0.9910 at 8 bits, MRR@10
-0.0195 on 100 queries: bench/results/minilm_int8_options.md); the speed of an AVX2 core, and the accuracy
of 8-bit weights on vpmaddubsw, cannot be measured on a VNNI one (MLAS has no switch to turn VNNI off).

The class follows softdeploy's CPU detection (the kernel library's, ops/common/cpu.cc), so
``SOFTDEPLOY_TEST_CPU=avx2`` makes this machine choose as an AVX2 CPU without VNNI would (onnxruntime
itself still runs its VNNI kernels here).
"""

from __future__ import annotations

import dataclasses
import os

VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "avx512vnni", "avxvnni"})
_AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})


@dataclasses.dataclass(frozen=True)
class Int8Format:
    """One row of the decision table: the CPU class, whether weights are quantized to 7 bits (``reduce_range``),
    per-channel weights, the graph format per mode, which MatMuls stay float, and why (one line)."""

    cpu_class: str
    kernel: str  # MLAS's u8s8 multiply on this class
    reduce_range: bool
    why: str
    per_channel: bool = True
    dynamic_format: str = "QOperator (DynamicQuantizeLinear + MatMulInteger)"
    static_format: str = "QDQ"
    float_matmuls: str = "activation x activation MatMuls (attention)"
    types: str = "u8s8 (uint8 activations, int8 weights)"

    def line(self, mode: str = "dynamic") -> str:
        """One line for reports: the class, the format chosen for ``mode`` and why."""
        fmt = self.dynamic_format if mode == "dynamic" else self.static_format
        weights = "7-bit weights (reduce_range)" if self.reduce_range else "8-bit weights"
        return (
            f"int8 format for a {self.cpu_class} CPU: {fmt}, {self.types}, {weights}, "
            f"{'per-channel' if self.per_channel else 'per-tensor'}, {self.float_matmuls} in float -- {self.why}"
        )


TABLE: dict[str, Int8Format] = {
    "vnni": Int8Format(
        "vnni",
        "vpdpbusd",
        False,
        "VNNI's vpdpbusd sums u8 x s8 products exactly in int32: 7-bit weights would only lose accuracy",
    ),
    "avx512": Int8Format(
        "avx512 (no VNNI)",
        "vpmaddubsw",
        True,
        "without VNNI MLAS multiplies with vpmaddubsw, whose int16 pair sums saturate at 8-bit weights; "
        "7-bit weights cannot",
    ),
    "avx2": Int8Format(
        "avx2 (no VNNI)",
        "vpmaddubsw",
        True,
        "without VNNI MLAS multiplies with vpmaddubsw, whose int16 pair sums saturate at 8-bit weights; "
        "7-bit weights cannot",
    ),
    "x86-64": Int8Format(
        "x86-64 (no AVX2)",
        "SSE",
        True,
        "onnxruntime's guidance for an x86-64 CPU without VNNI: 7-bit weights against saturation",
    ),
    "other": Int8Format(
        "other",
        "not x86 (no vpmaddubsw)",
        False,
        "not an x86 CPU: no vpmaddubsw saturation, full 8-bit weights",
    ),
}


def _flags() -> set[str]:
    from softdeploy.compare.environment import cpuinfo

    return cpuinfo()[1]


def _detected_isa(flags: set[str], limit: str | None) -> str:
    """softdeploy's ISA detection (portable | avx2 | avx512): the kernel library's answer where it loads, else the
    same rule on ``flags`` (ops/common/cpu.cc: AVX-512 = F, BW, VL, DQ; AVX2 = AVX2 + FMA; capped by
    SOFTDEPLOY_TEST_CPU)."""
    from softdeploy.runtime import library_status

    info = library_status().info
    if info is not None:
        return info.isa_detected
    isa = "avx512" if _AVX512 <= flags else "avx2" if {"avx2", "fma"} <= flags else "portable"
    order = ("portable", "avx2", "avx512")
    if limit is not None and limit.lower() in order and order.index(limit.lower()) < order.index(isa):
        isa = limit.lower()
    return isa


def int8_cpu_class(flags: set[str] | None = None, *, machine: str | None = None) -> str:
    """This CPU's row of :data:`TABLE`: ``vnni``, ``avx512``, ``avx2``, ``x86-64`` or ``other``.

    The ISA is softdeploy's detection (SOFTDEPLOY_TEST_CPU included); VNNI is read from the CPU flags
    (``flags``, default /proc/cpuinfo) and, as the kernels' own VNNI check does, counts only while no
    SOFTDEPLOY_TEST_CPU limit is set (the emulated CPU is one without it)."""
    import platform

    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "other"
    flags = _flags() if flags is None else flags
    limit = os.environ.get("SOFTDEPLOY_TEST_CPU") or None
    isa = _detected_isa(flags, limit)
    if limit is None and flags & VNNI_FLAGS and isa != "portable":
        return "vnni"
    return {"avx512": "avx512", "avx2": "avx2"}.get(isa, "x86-64")


def int8_format(cpu_class: str | None = None) -> Int8Format:
    """The table's row for ``cpu_class`` (default: this CPU's, :func:`int8_cpu_class`)."""
    return TABLE[cpu_class or int8_cpu_class()]


def format_lines(mode: str = "dynamic") -> list[str]:
    """Two lines for ``softdeploy doctor`` and reports: the format chosen for this CPU, and the one an AVX2 CPU
    without VNNI would get (or that this one is such a CPU)."""
    here = int8_format()
    lines = [f"this CPU ({here.cpu_class}): {here.line(mode).split(': ', 1)[1]}"]
    if os.environ.get("SOFTDEPLOY_TEST_CPU"):
        lines[0] += " (SOFTDEPLOY_TEST_CPU emulates the class; onnxruntime still runs this machine's own int8 kernels)"
    if here.cpu_class != TABLE["avx2"].cpu_class:
        other = TABLE["avx2"]
        weights = "7-bit weights (reduce_range)" if other.reduce_range else "8-bit weights"
        lines.append(f"an AVX2 CPU without VNNI would get: {weights} -- {other.why}")
    return lines
