"""Issue 13 probe: int8 GEMMs that sum vpmaddubsw results in int16, against onnxruntime's on MiniLM's shapes (AVX2).

MiniLM int8 on a CPU without VNNI runs at 1.59x fp32; 1.8x needs its integer GEMMs 1.19x faster than MLAS's u8s8
AVX2 kernel (bench/results/minilm_int8_options.md). bench/micro/int8_gemm_paired.h is a benchmark-only prototype of
a GEMM with per-row activations quantized inside the call and lane-bounded int8 weights packed once (the formats
bench/minilm_int8_paired_accuracy.py measures), in three forms over the same packing, tiles and epilogue:

  single   vpmaddubsw + vpmaddwd + vpaddd per 32 products (MLAS's form; u8 activations)
  paired   two vpmaddubsw summed with vpaddw before one vpmaddwd + vpaddd: 64 products in 5 ops (u8 activations)
  octet    four vpmaddubsw summed: 128 products in 9 ops (u7 activations)

timed per MiniLM GEMM shape (128 tokens; Q/K/V/attention-output 384 x 384, FFN up 384 x 1536, FFN down 1536 x
384), 1 thread, interleaved, next to

  ort fp32   MatMul + Add in onnxruntime (MLAS sgemm)
  ort int8   the same model through onnxruntime's quantize_dynamic (per-channel u8s8: DynamicQuantizeMatMul, as in
             the MiniLM int8 graph)

and weighed by MiniLM's per-layer mix (4 + 1 + 1) into one "per encoder layer" row; then each form's best shape
against the register-only loop of its instruction mix (no loads or stores: the ceiling of that form's loop on this
core). The prototype's results are checked against a float64 evaluation of the same integer formula. Run it with --emulate-avx2 on a VNNI host: MLAS
then takes its non-VNNI kernels (bench/cpuid_avx2.c).

    PYTHONPATH=. python bench/int8_gemm_paired.py [--emulate-avx2] [--rounds 15]
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "bench" / "micro" / "int8_gemm_paired.cc"
LIBRARY = ROOT / "build" / "int8_gemm_paired.so"
M = 128
SHAPES = [(384, 384, 4, "Q, K, V, attention out"), (384, 1536, 1, "FFN up"), (1536, 384, 1, "FFN down")]


def build() -> ctypes.CDLL:
    LIBRARY.parent.mkdir(exist_ok=True)
    cmd = [
        "g++",
        "-O3",
        "-std=c++17",
        "-mavx2",
        "-mfma",
        "-fno-tree-pre",
        "-shared",
        "-fPIC",
        str(SOURCE),
        "-o",
        str(LIBRARY),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    lib = ctypes.CDLL(str(LIBRARY))
    lib.sd_gemm_pack.restype = ctypes.c_void_p
    lib.sd_gemm_pack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.sd_gemm_free.argtypes = [ctypes.c_void_p]
    lib.sd_gemm_run.restype = ctypes.c_double
    lib.sd_gemm_run.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.sd_mix_peak.restype = ctypes.c_double
    lib.sd_mix_peak.argtypes = [ctypes.c_int, ctypes.c_int64]
    return lib


def mix_peak(lib: ctypes.CDLL, groups: int, iters: int = 20_000_000, tries: int = 5) -> float:
    """GMAC/s of the register-only loop of a form's instruction mix (sd_mix_peak; best of ``tries``, this thread's
    CPU time): the ceiling of that form's GEMM loop on this core."""
    best = 0.0
    for _ in range(tries):
        t0 = time.thread_time()
        macs = lib.sd_mix_peak(groups, iters)
        best = max(best, macs / (time.thread_time() - t0) / 1e9)
    return best


def float_model(w: np.ndarray, b: np.ndarray) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    k, n = w.shape
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [M, k])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [M, n])
    nodes = [helper.make_node("MatMul", ["X", "W"], ["T"]), helper.make_node("Add", ["T", "B"], ["Y"])]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    graph = helper.make_graph(nodes, "gemm", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10).SerializeToString()


def reference(x: np.ndarray, q: np.ndarray, sb: np.ndarray, b: np.ndarray, levels: int) -> np.ndarray:
    """The prototype's formula in float64: per-row activations on 0..levels (DynamicQuantizeLinear's rule per row)."""
    lo, hi = np.minimum(x.min(1, keepdims=True), 0), np.maximum(x.max(1, keepdims=True), 0)
    sa = ((hi - lo) / levels).astype(np.float32).astype(np.float64)
    sa = np.where(sa > 0, sa, 1.0)
    za = np.rint(np.clip(-lo / sa, 0, levels))
    xq = np.clip(np.rint(x / sa) + za, 0, levels)
    return sa * ((xq - za) @ q.astype(np.float64)) * sb + b


# (label, vpmaddubsw results per int16 sum, activation levels)
FORMS = [("single", 1, 255), ("paired", 2, 255), ("octet", 4, 127)]
PEERS = ["ort fp32", "ort int8"]


def main() -> None:
    p = harness.base_parser(__doc__.splitlines()[0])
    args = p.parse_args()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from softdeploy.runtime import BoundRun

    lib = build()
    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="int8-gemm-paired-"))
    names = PEERS + [f[0] for f in FORMS]
    rows, totals = [], dict.fromkeys(names, 0.0)
    best = dict.fromkeys(names, 0.0)  # the best GMAC/s of each over the shapes
    for k, n, count, what in SHAPES:
        x = rng.standard_normal((M, k)).astype(np.float32)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32) * 0.1
        # weights every form sums exactly: |q| <= 32 bounds a paired lane by 4 x 255 x 32 = 32640 and an octet lane
        # by 8 x 127 x 32 = 32512 (the timing does not depend on the values)
        sb = (np.abs(w).max(0) / 32).astype(np.float32)
        q = np.clip(np.rint(w / sb), -32, 32).astype(np.int8)
        handle = lib.sd_gemm_pack(q.ctypes.data, sb.ctypes.data, b.ctypes.data, k, n)
        y = np.empty((M, n), np.float32)
        for label, groups, levels in FORMS:
            ref = reference(x.astype(np.float64), q, sb.astype(np.float64), b.astype(np.float64), levels)
            y[:] = np.nan
            lib.sd_gemm_run(handle, x.ctypes.data, M, levels, y.ctypes.data, groups, 1)
            err = np.abs(y - ref).max() / np.abs(ref).max()
            if not err < 1e-5:
                sys.exit(f"{label} {k}x{n}: max error {err:.2e} of the largest |y|")

        fp32 = tmp / f"fp32_{k}_{n}.onnx"
        fp32.write_bytes(float_model(w, b))
        int8 = tmp / f"int8_{k}_{n}.onnx"
        quantize_dynamic(fp32, int8, per_channel=True, weight_type=QuantType.QInt8)
        feeds = {"X": x}
        fns = {
            "ort fp32": BoundRun(harness.ort_session(str(fp32), 1), feeds),
            "ort int8": BoundRun(harness.ort_session(str(int8), 1), feeds),
        }
        xp, yp = x.ctypes.data, y.ctypes.data
        for label, groups, levels in FORMS:
            fns[label] = lambda g=groups, lv=levels: lib.sd_gemm_run(handle, xp, M, lv, yp, g, 1)
        t = harness.bench_interleaved(fns, rounds=args.rounds)
        lib.sd_gemm_free(handle)
        macs = M * k * n
        for name in names:
            totals[name] += count * t[name].median
            best[name] = max(best[name], macs / t[name].median / 1e9)
        rows.append(
            [f"{M} x {k} x {n} ({what})"]
            + [f"{t[name].median * 1e6:.1f}" for name in names]
            + [f"{macs / t[name].median / 1e9:.0f}" for name in ("ort int8", "paired", "octet")]
            + [f"{t['ort int8'].median / t[name].median:.2f}" for name in ("paired", "octet")]
            + [f"{max(t[name].spread for name in names):.0%}"]
        )
    rows.append(
        ["per encoder layer (4 + 1 + 1)"]
        + [f"{totals[name] * 1e6:.1f}" for name in names]
        + ["", "", ""]
        + [f"{totals['ort int8'] / totals[name]:.2f}" for name in ("paired", "octet")]
        + [""]
    )
    harness.header("int8 GEMMs summing vpmaddubsw in int16, against onnxruntime on MiniLM's shapes")
    print("Microseconds per call (median of interleaved rounds), 1 thread, X float32 [128, K] in, Y float32 out.\n")
    print(
        harness.md_table(
            [
                "shape M x K x N",
                *names,
                "ort int8 GMAC/s",
                "paired GMAC/s",
                "octet GMAC/s",
                "ort int8 / paired",
                "ort int8 / octet",
                "max spread",
            ],
            rows,
        )
    )
    peaks = {label: mix_peak(lib, groups) for label, groups, _ in FORMS}
    print(
        "\nEach form against the register-only loop of its instruction mix (bench/micro/int8_gemm_paired.cc, "
        "sd_mix_peak: no loads or stores; measured after the shapes, in this process):\n"
    )
    print(
        harness.md_table(
            ["form", "register-only mix GMAC/s", "best shape GMAC/s", "% of the mix"],
            [
                [label, f"{peaks[label]:.0f}", f"{best[label]:.0f}", f"{best[label] / peaks[label]:.0%}"]
                for label, _, _ in FORMS
            ],
        )
    )
    print(
        "\nPer layer: ort fp32 / ort int8 "
        + f"{totals['ort fp32'] / totals['ort int8']:.2f}x, / single {totals['ort fp32'] / totals['single']:.2f}x, "
        + f"/ paired {totals['ort fp32'] / totals['paired']:.2f}x, / octet {totals['ort fp32'] / totals['octet']:.2f}x"
    )


if __name__ == "__main__":
    main()
