"""Which int8 format for which CPU: a small decision table keyed by the CPU features softdeploy detects.

onnxruntime's int8 GEMMs (MLAS) multiply uint8 activations by int8 weights ("u8s8") with one of two
instruction sequences, chosen by the CPU (onnxruntime/core/mlas/lib/platform.cpp):

* with VNNI (AVX512-VNNI, or AVX-VNNI on AVX2 cores): ``vpdpbusd(s)`` sums four u8 x s8 products
  straight into int32 (``MultiplyAccumulateCellU8S8Avx512Vnni`` in
  onnxruntime/core/mlas/lib/amd64/SymQgemmU8KernelAvx512.asm): no intermediate rounding;
* without it (AVX2, and AVX-512 cores without VNNI such as Skylake-SP): ``vpmaddubsw`` then
  ``vpmaddwd`` (``MultiplyAccumulateRowU8S8Avx2`` in QgemmU8X8KernelAvx2.asm,
  ``MultiplyAccumulateCellU8S8Avx512Core``): ``vpmaddubsw`` adds each PAIR of u8 x s8 products (the
  even-aligned k = 2j, 2j + 1 of a weight column) into a SATURATED int16. Two products reach 2 x 255 x 127 =
  64770 > 32767, so full-range int8 weights can clip.

Two weight formats cannot clip, and compute on a vpmaddubsw core the same exact integer sums as on a VNNI one:

* ``7-bit`` (onnxruntime's ``reduce_range``): |w| <= 64, a pair at most 2 x 255 x 64 = 32640 -- at twice the
  8-bit step;
* ``pair-bounded`` (:mod:`softdeploy.quant.pair_bounded`): the 8-bit grid with every same-sign pair
  |w_2j| + |w_2j+1| <= 128 (255 x 128 = 32640), a per-channel step only ~1.3x the 8-bit one on MiniLM,
  because a column's largest weight rarely sits beside another large weight of its sign.

onnxruntime 1.32's own guidance (``onnxruntime.quantization.quantize_static``'s docstring, "Choosing
parameters for CPU inference") is x86-64 without VNNI -> QUInt8 activations, QInt8 weights,
``reduce_range=True``; with VNNI -> ``reduce_range=False``. Measured on all-MiniLM-L6-v2 (653 queries,
bench/results/minilm_int8_options.md): sentence cosine to fp32 0.9913 (8-bit), 0.9911 (pair-bounded),
0.9900 (7-bit) -- pair-bounded keeps 8-bit accuracy where 7-bit sits at the 0.99 line, so it is the
non-VNNI choice. It applies to MatMul weights (the reduction axis of a MatMul's B is known); a model with
int8 weights of other GEMM-like ops (Conv, Gemm, Attention, LSTM) falls back to 7-bit, and its report says so.

The table (:data:`TABLE`), one row per CPU class (:func:`int8_cpu_class`):

==================== ============ ============= =============================================================
CPU class            u8s8 kernel  weights       why
==================== ============ ============= =============================================================
vnni                 vpdpbusd     8-bit         exact int32 sums: fewer bits would only lose accuracy; dynamic
                                  (dynamic:     mode with AVX-512 VNNI: rowwise-8-bit, see below
                                  rowwise-8-bit)
avx512 (no VNNI)     vpmaddubsw   pair-bounded  int16 pair saturation at 8-bit weights; bounded pairs cannot;
                                  (dynamic:     dynamic mode: lane-bounded, see below
                                  lane-bounded)
avx2 (no VNNI)       vpmaddubsw   pair-bounded  the same (the issue's Zen 3 / client-CPU case); dynamic mode:
                                  (dynamic:     lane-bounded, see below
                                  lane-bounded)
x86-64 (no AVX2)     SSE          pair-bounded  onnxruntime's guidance (no VNNI: guard against saturation)
other                --           8-bit         no vpmaddubsw (ARM: onnxruntime's guidance is reduce_range off)
==================== ============ ============= =============================================================

Dynamic mode on a CPU without VNNI (AVX2, or AVX-512 without VNNI) takes softdeploy's own format, ``lane-bounded``
(:mod:`softdeploy.quant.rowwise`): the weight MatMuls become com.softdeploy ``RowwiseInt8MatMul`` nodes, whose kernel
sums four ``vpmaddubsw`` results in int16 before one ``vpmaddwd`` (2.25 vector ops per vector of products against
MLAS's 3; exact because the weights are bounded per int16 lane; on zmm for AVX-512) and quantizes activations per
row. Measured on all-MiniLM-L6-v2 (bench/results/minilm_int8_options.md) with an AVX2 CPU's instruction set:
1.96-2.04x fp32 against onnxruntime's 1.61-1.66x; with an AVX-512 CPU's without VNNI: 2.05x against 1.69x; sentence
cosine 0.995 against 0.991. It is not the choice with VNNI (onnxruntime's vpdpbusd is as fast; see rowwise-8-bit
below), nor in static mode (QDQ), nor without softdeploy's kernel library (quantize() then says so and takes the
row's onnxruntime format).

Dynamic mode on a CPU with AVX-512 VNNI takes ``rowwise-8-bit`` (:mod:`softdeploy.quant.rowwise`): the same
RowwiseInt8MatMul nodes with 8-bit activations per row and plain 8-bit weights, run by the kernel's vpdpbusd tile
(exact for every int8 weight). On all-MiniLM-L6-v2 it is as fast as onnxruntime's VNNI int8 and more accurate
(sentence cosine 0.9981 against 0.9913; bench/results/minilm_int8_options.md). Where VNNI comes as AVX-VNNI on an
AVX2 core (Alder Lake and later), the kernel's avx2 variant runs a VEX vpdpbusd ymm tile instead, and dynamic mode
takes rowwise-8-bit there too (the tile ran at 89-92% of the ymm vpdpbusd peak at MiniLM's shapes, measured through
its EVEX twin on Zen 4: bench/results/rowwise_int8_matmul.md; no AVX-VNNI core was at hand to time it against
onnxruntime's own AVX-VNNI int8).

The rest is the same on every class, and measured (bench/results/minilm_int8_options.md, on a VNNI
core): weights per output channel (per-tensor lost 0.018 MRR@10 on MiniLM); dynamic mode is
QOperator (DynamicQuantizeLinear + MatMulInteger, fused by onnxruntime to DynamicQuantizeMatMul: its
only dynamic form), static mode QDQ; the activation x activation MatMuls (attention scores,
attention x values) stay float (no faster in int8 at these sizes, 0.009 MRR@10 lost). A pair-bounded or
7-bit model computes the same integers on every kernel, so its accuracy measured on a VNNI core is its
accuracy on an AVX2 one; the speed of an AVX2 core, and the accuracy of unbounded 8-bit weights on
vpmaddubsw, cannot be measured on a VNNI one (MLAS has no switch to turn VNNI off).

The table picks the format for the CPU that quantizes; a model deployed on another class can run its format on a
slower path there (rowwise-8-bit weights on a CPU without VNNI take RowwiseInt8MatMul's widened vpmaddwd tile, 0.63-0.76x
the lane-bounded one on MiniLM). ``quantize(config=QuantConfig(target=...))`` (``softdeploy quantize --target``) names
the class the model is for instead (:data:`TARGETS`, :func:`target_weights`): ``auto`` (this CPU's row), a class of the
table (its row), or ``portable``: the format that is exact on every x86-64 class and takes each one's fast path,
chosen by measurement (bench/results/int8_matrix.md, MiniLM on every class this Zen 4 host can present): dynamic
lane-bounded (the fastest format on AVX2 and AVX-512 without VNNI in every run, 1.88-1.97x fp32 on AVX2; level with
the best with VNNI), static pair-bounded QDQ (the one static format whose integers cannot saturate vpmaddubsw). The
model records its target and format in metadata_props (:data:`TARGET_KEY`, :data:`FORMAT_KEY`);
``softdeploy.runtime.Session`` warns when its RowwiseInt8MatMul weights take the widened tile here
(:func:`mismatch_line`), and ``softdeploy doctor MODEL`` reports the path each int8 node takes
(:func:`model_int8_lines`). The format line (:meth:`Int8Format.line`, :func:`weights_line`) names the format used
first, then why.

The class follows softdeploy's CPU detection (the kernel library's, ops/common/cpu.cc), so
``SOFTDEPLOY_TEST_CPU=avx2`` makes this machine choose as an AVX2 CPU without VNNI would (onnxruntime
itself still runs its VNNI kernels here).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from softdeploy.cpu import ISAS, isa_from_flags
from softdeploy.runtime.int8_paths import FORMAT_KEY as FORMAT_KEY
from softdeploy.runtime.int8_paths import PATH_BODY as PATH_BODY
from softdeploy.runtime.int8_paths import PATH_LANE as PATH_LANE
from softdeploy.runtime.int8_paths import PATH_SCALAR as PATH_SCALAR
from softdeploy.runtime.int8_paths import PATH_VNNI_YMM as PATH_VNNI_YMM
from softdeploy.runtime.int8_paths import PATH_VNNI_ZMM as PATH_VNNI_ZMM
from softdeploy.runtime.int8_paths import PATH_WIDE as PATH_WIDE

# What a quantized model runs here is the runtime's to say (a session warns on loading); re-exported for the
# reports and callers that read formats from here.
from softdeploy.runtime.int8_paths import TARGET_KEY as TARGET_KEY
from softdeploy.runtime.int8_paths import mismatch_line as mismatch_line
from softdeploy.runtime.int8_paths import model_int8_metadata as model_int8_metadata
from softdeploy.runtime.int8_paths import rowwise_path as rowwise_path
from softdeploy.runtime.int8_paths import slow_rowwise_nodes as slow_rowwise_nodes

VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "avx512vnni", "avxvnni"})


@dataclasses.dataclass(frozen=True)
class Int8Format:
    """One row of the decision table: the CPU class, the weight format (:data:`WEIGHTS`), per-channel weights, the
    graph format per mode, which MatMuls stay float, and why (one line)."""

    cpu_class: str
    kernel: str  # MLAS's u8s8 multiply on this class
    weights: str  # one of WEIGHTS: static mode's (and dynamic mode's unless dynamic_weights says otherwise)
    why: str
    per_channel: bool = True
    dynamic_format: str = "QOperator (DynamicQuantizeLinear + MatMulInteger)"
    static_format: str = "QDQ"
    float_matmuls: str = "activation x activation MatMuls (attention)"
    types: str = "u8s8 (uint8 activations, int8 weights)"
    # dynamic mode's weights where they differ from ``weights`` ("lane-bounded": softdeploy.quant.rowwise), and why
    dynamic_weights: str | None = None
    dynamic_why: str = ""

    @property
    def reduce_range(self) -> bool:
        """Whether onnxruntime's quantizer runs with ``reduce_range`` (7-bit weights)."""
        return self.weights == "7-bit"

    def weights_for(self, mode: str) -> str:
        """The weight format (:data:`WEIGHTS`) this class gets in ``mode`` ("dynamic" or "static")."""
        return self.dynamic_weights if mode == "dynamic" and self.dynamic_weights else self.weights

    def why_for(self, mode: str) -> str:
        """Why this class gets :meth:`weights_for` ``mode`` (one line)."""
        return self.dynamic_why if mode == "dynamic" and self.dynamic_weights else self.why

    def line(self, mode: str = "dynamic") -> str:
        """One line for reports: the format chosen for ``mode`` first, then the class it was chosen for and why."""
        weights = self.weights_for(mode)
        if weights in ROWWISE_FORMAT:
            fmt = f"{WEIGHTS[weights]}, per-channel, {ROWWISE_FORMAT[weights].split('(', 1)[1][:-1]}"
        else:
            graph = self.dynamic_format if mode == "dynamic" else self.static_format
            fmt = f"{WEIGHTS[weights]}: {graph}, {self.types}, {'per-channel' if self.per_channel else 'per-tensor'}"
        return f"int8 format: {fmt}, {self.float_matmuls} in float -- chosen for a {self.cpu_class} CPU: {self.why_for(mode)}"


# The weight formats, each as reports name it. Every one is symmetric int8 (zero point 0).
WEIGHTS: dict[str, str] = {
    "8-bit": "8-bit weights",
    "7-bit": "7-bit weights (reduce_range)",
    "pair-bounded": "pair-bounded 8-bit weights (same-sign pairs |w_2j| + |w_2j+1| <= 128)",
    # softdeploy.quant.rowwise: not onnxruntime formats; dynamic, per-channel only
    "lane-bounded": "lane-bounded 8-bit weights in com.softdeploy RowwiseInt8MatMul (activations 7-bit per row)",
    "rowwise-8-bit": "8-bit weights in com.softdeploy RowwiseInt8MatMul (activations 8-bit per row)",
}

# How reports name softdeploy's graph formats (softdeploy.quant.rowwise), by weight format.
ROWWISE_FORMAT: dict[str, str] = {
    "lane-bounded": "com.softdeploy RowwiseInt8MatMul (activations quantized per row inside the op, u7s8)",
    "rowwise-8-bit": "com.softdeploy RowwiseInt8MatMul (activations quantized per row inside the op, u8s8)",
}

_ROWWISE_VNNI_WHY = (
    "with AVX-512 VNNI softdeploy's RowwiseInt8MatMul (vpdpbusd zmm, 72-81% of the core's vpdpbusd peak) encodes "
    "MiniLM as fast as onnxruntime's int8 (2.52x fp32 against 2.51x) and quantizes activations per row: sentence "
    "cosine 0.9981 against 0.9913, MRR@10 drop 0.0029 against 0.0046 (bench/results/minilm_int8_options.md); with "
    "AVX-VNNI its ymm tile (89-92% of the ymm vpdpbusd peak, timed through its EVEX twin); it needs softdeploy's "
    "kernel library to run fast (stock onnxruntime runs its exact function body, slower than fp32)"
)

_LANE_BOUNDED_WHY = (
    "without VNNI onnxruntime's u8s8 GEMM (vpmaddubsw + vpmaddwd + vpaddd per 32 products) holds MiniLM int8 at "
    "1.61-1.66x fp32; softdeploy's RowwiseInt8MatMul sums four vpmaddubsw results in int16 (exact for lane-bounded "
    "weights) and quantizes activations per row: 1.96-2.04x fp32, sentence cosine 0.995 against 0.991 "
    "(bench/results/minilm_int8_options.md); it needs softdeploy's kernel library to run fast (stock onnxruntime "
    "runs its exact function body, slower than fp32)"
)

_LANE_BOUNDED_AVX512_WHY = (
    "without VNNI onnxruntime's u8s8 GEMM (64-byte vpmaddubsw + vpmaddwd + vpaddd) holds MiniLM int8 at 1.69x fp32; "
    "softdeploy's RowwiseInt8MatMul sums four vpmaddubsw results in int16 on zmm (exact for lane-bounded weights) "
    "and quantizes activations per row: 2.05x fp32, sentence cosine 0.995 against 0.991 (measured with an AVX-512 "
    "CPU's instruction set without VNNI, bench/results/minilm_int8_options.md); it needs softdeploy's kernel "
    "library to run fast (stock onnxruntime runs its exact function body, slower than fp32)"
)

_NO_VNNI_WHY = (
    "without VNNI MLAS multiplies with vpmaddubsw, whose int16 pair sums saturate at 8-bit weights; pair-bounded "
    "weights cannot, and keep the 8-bit grid (7-bit weights cannot either, at twice the step)"
)

TABLE: dict[str, Int8Format] = {
    "vnni": Int8Format(
        "vnni",
        "vpdpbusd",
        "8-bit",
        "VNNI's vpdpbusd sums u8 x s8 products exactly in int32: 8-bit weights; fewer bits would only lose accuracy",
        dynamic_weights="rowwise-8-bit",
        dynamic_why=_ROWWISE_VNNI_WHY,
    ),
    "avx512": Int8Format(
        "avx512 (no VNNI)",
        "vpmaddubsw",
        "pair-bounded",
        _NO_VNNI_WHY,
        dynamic_weights="lane-bounded",
        dynamic_why=_LANE_BOUNDED_AVX512_WHY,
    ),
    "avx2": Int8Format(
        "avx2 (no VNNI)",
        "vpmaddubsw",
        "pair-bounded",
        _NO_VNNI_WHY,
        dynamic_weights="lane-bounded",
        dynamic_why=_LANE_BOUNDED_WHY,
    ),
    "x86-64": Int8Format(
        "x86-64 (no AVX2)",
        "SSE",
        "pair-bounded",
        "onnxruntime's guidance for an x86-64 CPU without VNNI guards against vpmaddubsw saturation; pair-bounded "
        "weights cannot saturate it and keep the 8-bit grid",
    ),
    "other": Int8Format(
        "other",
        "not x86 (no vpmaddubsw)",
        "8-bit",
        "not an x86 CPU: no vpmaddubsw saturation, full 8-bit weights",
    ),
}


def _flags() -> set[str]:
    from softdeploy.cpu import cpuinfo

    return cpuinfo()[1]


def _detected_isa(flags: set[str], limit: str | None) -> str:
    """softdeploy's ISA detection (portable | avx2 | avx512): the kernel library's answer where it loads (CPUID),
    else the same rule on ``flags``, capped by SOFTDEPLOY_TEST_CPU."""
    from softdeploy.runtime import library_status

    info = library_status().info
    if info is not None:
        return info.isa_detected
    isa = isa_from_flags(flags)
    if limit is not None and limit.lower() in ISAS and ISAS.index(limit.lower()) < ISAS.index(isa):
        isa = limit.lower()
    return isa


def _library_vnni(isa: str) -> bool | None:
    """Whether the kernel library reads from CPUID the VNNI that goes with ``isa``, its detected variant: AVX-512 VNNI
    for avx512, AVX-VNNI for avx2 (None where the library does not load, or for another variant)."""
    from softdeploy.runtime import library_status

    info = library_status().info
    if info is None:
        return None
    return {"avx512": info.avx512_vnni, "avx2": info.avx_vnni}.get(isa)


def int8_cpu_class(flags: set[str] | None = None, *, machine: str | None = None) -> str:
    """This CPU's row of :data:`TABLE`: ``vnni``, ``avx512``, ``avx2``, ``x86-64`` or ``other``.

    The ISA is softdeploy's detection (SOFTDEPLOY_TEST_CPU included). VNNI is the kernel library's CPUID answer for
    that ISA (AVX-512 VNNI with avx512, AVX-VNNI with avx2) where the library loads, else the CPU flags (``flags``,
    default /proc/cpuinfo) where they give the detected ISA; as the kernels' own VNNI check does, it counts only while
    no SOFTDEPLOY_TEST_CPU limit is set (the emulated CPU is one without it). A process whose CPUID hides AVX-512 and
    VNNI (bench/cpuid_avx2.c) runs every library's AVX2 kernels, onnxruntime's int8 GEMM included, whatever
    /proc/cpuinfo says."""
    import platform

    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "other"
    flags = _flags() if flags is None else flags
    limit = os.environ.get("SOFTDEPLOY_TEST_CPU") or None
    isa = _detected_isa(flags, limit)
    library_vnni = _library_vnni(isa)
    if library_vnni is not None:
        # the kernel library's CPUID answer, which every library in the process shares (onnxruntime's MLAS too): a
        # process whose CPUID hides AVX-512 and VNNI (bench/cpuid_avx2.c) is the AVX2 CPU without it whatever
        # /proc/cpuinfo says; one hiding the VNNI bits alone (SD_CPUID_MASK=vnni) the AVX-512 CPU without them
        vnni = library_vnni
    else:  # no library: the flags, believed only where they give the detected ISA
        vnni = bool(flags & VNNI_FLAGS) and isa == isa_from_flags(flags)
    if limit is None and vnni and isa != "portable":
        return "vnni"
    return {"avx512": "avx512", "avx2": "avx2"}.get(isa, "x86-64")


def code_bits() -> int:
    """The code width :func:`softdeploy.ops.max_sim.quantize_tokens` should give queries and documents on this CPU: 7 where MaxSim's int8
    kernel is the AVX2 one without VNNI (an x86-64 CPU with AVX2 but neither AVX512-VNNI nor AVX-VNNI, as softdeploy
    detects it, SOFTDEPLOY_TEST_CPU included), whose vpmaddubsw tiles take codes in [-64, 63] (bench/results/maxsim.md);
    8 everywhere else (VNNI multiplies 8-bit codes at full rate)."""
    return 7 if int8_cpu_class() in ("avx2", "avx512") else 8


def int8_format(cpu_class: str | None = None) -> Int8Format:
    """The table's row for ``cpu_class`` (default: this CPU's, :func:`int8_cpu_class`)."""
    return TABLE[cpu_class or int8_cpu_class()]


def table_weights(mode: str = "dynamic", per_channel: bool = True, chosen: Any = None) -> tuple[str, str]:
    """The weight format quantize() takes here when none is asked, and why it is not the table row's ("" when it
    is): softdeploy's formats (softdeploy.quant.rowwise) need per-channel weights and the kernel library, and
    rowwise-8-bit the kernel's VNNI tile; otherwise the row's onnxruntime format. ``chosen``: this CPU's row
    (softdeploy.quant.formats.Int8Format) where the caller has it already (default: looked up)."""
    from softdeploy.quant.rowwise import FORMS as ROWWISE_FORMS

    chosen = chosen or int8_format()
    weights = chosen.weights_for(mode)
    if weights not in ROWWISE_FORMS:
        return weights, ""
    why_not = (
        "" if per_channel else f"per-tensor weights were asked ({weights} weights have one scale per output channel)"
    )
    if not why_not and not _rowwise_kernel_loads():
        why_not = "softdeploy's kernel library (RowwiseInt8MatMul) does not load here (`softdeploy doctor` says why)"
    if not why_not and weights == "rowwise-8-bit" and not _rowwise_vnni_runs():
        why_not = (
            "RowwiseInt8MatMul's vpdpbusd tiles need VNNI under the kernels' vector variant: AVX-512 VNNI with the "
            "avx512 variant or AVX-VNNI with the avx2 one (SOFTDEPLOY_ISA or SOFTDEPLOY_TEST_CPU lowers the variant)"
        )
    return (chosen.weights, why_not) if why_not else (weights, "")


def _rowwise_kernel_loads() -> bool:
    """Whether softdeploy's kernel library loads here and runs RowwiseInt8MatMul (the speed of softdeploy's int8
    formats)."""
    from softdeploy.runtime import library_status

    info = library_status().info
    return info is not None and "RowwiseInt8MatMul" in info.ops


def _rowwise_vnni_runs() -> bool:
    """Whether RowwiseInt8MatMul runs a vpdpbusd tile here (rowwise-8-bit's speed): the kernels' avx512 variant
    selected on a CPU with AVX-512 VNNI (the zmm tile), or the avx2 variant on one with AVX-VNNI (the ymm tile), as the
    library reads CPUID (the kernel's own rule, ops/rowwise_int8_matmul.cc)."""
    from softdeploy.runtime import library_status

    info = library_status().info
    if info is None:
        return False
    return (info.isa_selected == "avx512" and info.avx512_vnni) or (info.isa_selected == "avx2" and info.avx_vnni)


def format_lines(mode: str = "dynamic") -> list[str]:
    """Two lines for ``softdeploy doctor`` and reports: the format chosen for this CPU, and the one an AVX2 CPU
    without VNNI would get (or that this one is such a CPU)."""
    here = int8_format()
    lines = [f"this CPU ({here.cpu_class}): {here.line(mode).split(': ', 1)[1]}"]
    weights, why_not = table_weights(mode, chosen=here)
    if why_not:  # softdeploy's format cannot run fast here: quantize() takes onnxruntime's, as it will say
        lines[0] += f"; here quantize() takes {WEIGHTS[weights]} in onnxruntime's format instead: {why_not}"
    if os.environ.get("SOFTDEPLOY_TEST_CPU"):
        lines[0] += " (SOFTDEPLOY_TEST_CPU emulates the class; onnxruntime still runs this machine's own int8 kernels)"
    if here.cpu_class != TABLE["avx2"].cpu_class:
        other = TABLE["avx2"]
        lines.append(f"an AVX2 CPU without VNNI would get: {WEIGHTS[other.weights_for(mode)]} -- {other.why_for(mode)}")
    return lines


# ---- the deployment target ------------------------------------------------------------------------------------------
#
# A model is quantized on one machine and deployed on others: ``target`` names the CPU class the model is for, and
# the format follows it instead of the quantizing CPU. ``auto`` is the quantizing CPU's row of TABLE; a class name is
# that class's row; ``portable`` is the format that is exact and fast on every x86-64 class. Measured on
# all-MiniLM-L6-v2 (bench/results/int8_matrix.md): in dynamic mode lane-bounded RowwiseInt8MatMul runs the vpdpbusd
# tile with VNNI and its four-vpmaddubsw tile without, never the widened one, while rowwise-8-bit weights on a CPU
# without VNNI take the widened vpmaddwd tile; in static mode pair-bounded QDQ weights cannot saturate vpmaddubsw and
# keep the 8-bit grid, so their integers are the same on every class.

TARGETS: tuple[str, ...] = ("auto", "portable", "vnni", "avx512", "avx2", "x86-64")

_PORTABLE_WHY = {
    "dynamic": (
        "lane-bounded RowwiseInt8MatMul is exact on every kernel path and takes the fast one on every x86-64 class "
        "(vpdpbusd with VNNI, four vpmaddubsw summed in int16 without); rowwise-8-bit weights would take the widened "
        "vpmaddwd tile without VNNI"
    ),
    "static": (
        "pair-bounded weights cannot saturate vpmaddubsw (CPUs without VNNI) and keep the 8-bit grid, so every class "
        "computes the same integers at its own int8 GEMM's speed"
    ),
}


def check_target(target: str) -> str:
    """``target`` if it is one of :data:`TARGETS`; else ValueError naming the rule."""
    if target not in TARGETS:
        raise ValueError(f"int8 target {target!r} is not one of {list(TARGETS)}")
    return target


def target_weights(target: str, mode: str = "dynamic") -> tuple[str | None, str]:
    """The weight format (:data:`WEIGHTS`) a model quantized for ``target`` in ``mode`` gets, and why (one line);
    ``(None, "")`` for ``auto`` (this CPU's row, :func:`int8_format`, as quantize() chooses it)."""
    check_target(target)
    if target == "auto":
        return None, ""
    if target == "portable":
        return ("lane-bounded" if mode == "dynamic" else "pair-bounded"), _PORTABLE_WHY.get(mode, "")
    row = TABLE[target]
    return row.weights_for(mode), row.why_for(mode)


def weights_why(weights: str, mode: str = "dynamic") -> str:
    """Why the table takes ``weights`` where it does (the first row of :data:`TABLE` that takes it in ``mode``, else
    in the other mode); "" for a format no row takes (7-bit: onnxruntime's reduce_range)."""
    for m in (mode, "static" if mode == "dynamic" else "dynamic"):
        for row in TABLE.values():
            if row.weights_for(m) == weights:
                return row.why_for(m)
    return ""


def weights_line(weights: str, mode: str, why: str, *, per_channel: bool = True) -> str:
    """The format line: the format used first, then why, e.g. "int8 format: lane-bounded 8-bit weights in
    com.softdeploy RowwiseInt8MatMul (...), per-channel -- why"."""
    if weights in ROWWISE_FORMAT:
        fmt = f"{WEIGHTS[weights]}, per-channel, {ROWWISE_FORMAT[weights].split('(', 1)[1][:-1]}"
    else:
        row = TABLE["vnni"]  # every onnxruntime row has the same graph formats and types
        graph = row.dynamic_format if mode == "dynamic" else row.static_format
        fmt = f"{WEIGHTS[weights]}: {graph}, {row.types}, {'per-channel' if per_channel else 'per-tensor'}"
    return f"int8 format: {fmt} -- {why}" if why else f"int8 format: {fmt}"


def set_int8_metadata(model: Any, target: str, weights: str) -> None:
    """Records (in place, replacing earlier values) the target a ModelProto was quantized for and its weight
    format."""
    keep = [p for p in model.metadata_props if p.key not in (TARGET_KEY, FORMAT_KEY)]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for key, value in ((TARGET_KEY, target), (FORMAT_KEY, weights)):
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value


def model_int8_lines(model: Any, info: Any = None) -> list[str]:
    """For ``softdeploy doctor MODEL``: the model's target and format, and the path its int8 nodes take here (a slower
    one than its target's: :func:`mismatch_line`)."""
    meta = model_int8_metadata(model)
    lines = [
        f"target: {meta.get(TARGET_KEY, 'not recorded')}; format: "
        f"{WEIGHTS.get(meta.get(FORMAT_KEY, ''), meta.get(FORMAT_KEY, 'not recorded'))}"
    ]
    rowwise = [n for n in model.graph.node if n.op_type == "RowwiseInt8MatMul"]
    if rowwise:
        from softdeploy.quant.rowwise import weight_groups

        paths: dict[str, int] = {}
        for g in weight_groups(model).values():
            path = rowwise_path(g, info)
            paths[path] = paths.get(path, 0) + 1
        lines += [f"{count} RowwiseInt8MatMul node(s): {path}" for path, count in paths.items()]
    ort_int8 = [
        n
        for n in model.graph.node
        if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul", "QLinearMatMul", "ConvInteger", "QLinearConv")
    ]
    qdq = sum(n.op_type == "DequantizeLinear" for n in model.graph.node)
    if ort_int8 or qdq:
        here = int8_format()
        kernel = f"MLAS's {here.kernel} u8s8 kernel ({here.cpu_class} CPU)"
        if os.environ.get("SOFTDEPLOY_TEST_CPU"):  # a setting of softdeploy's kernels only
            kernel = "MLAS's own kernel for this machine (SOFTDEPLOY_TEST_CPU does not reach onnxruntime)"
        lines.append(
            f"{len(ort_int8)} onnxruntime integer node(s), {qdq} DequantizeLinear (QDQ or int8 embedding tables): {kernel}"
        )
    if len(lines) == 1:
        lines.append("no int8 nodes (RowwiseInt8MatMul, onnxruntime integer ops, DequantizeLinear): a float model")
    return lines
