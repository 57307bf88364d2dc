"""RowwiseInt8MatMul (softdeploy kernel) vs onnxruntime's float32 MatMul and its own dynamic int8, at a transformer's
GEMM shapes (all-MiniLM-L6-v2's: hidden 384, FFN 1536).

    python -m bench.rowwise_int8_matmul [--threads 1,2] [--rounds 15] [--emulate-avx2] [--quick]

Peers, one-node models of Y = X W + bias with W a float32 initializer, measured in the same interleaved rounds:
  ort_fp32      ai.onnx MatMul + Add (MLAS sgemm)
  ort_int8      onnxruntime's dynamic int8 of that model (softdeploy.quant with weights="pair-bounded": per-tensor
                uint8 activations, per-channel pair-bounded weights; DynamicQuantizeMatMul after onnxruntime's fusion)
  softdeploy    com.softdeploy RowwiseInt8MatMul of the same weights (softdeploy.quant.rowwise: lane-bounded, 7-bit
                per-row activations, groups 4, bias folded), softdeploy's kernel library
  softdeploy_u8 the same op in the rowwise-8-bit form (8-bit rows, plain 8-bit weights: the AVX-512 VNNI default;
                on a CPU without the VNNI tile its weights take the widened vpmaddwd tile: bench/rowwise_int8_wide.py)
Issue 13's pair: avx2 (the kernel under SOFTDEPLOY_ISA=avx2) and ort_body (its function body in stock onnxruntime:
the row quantization and an exact float64 MatMul); `body/avx2` >= 1 at every shape is the floor.
`GMAC/s` counts M x K x N multiply-adds per call; where the VNNI tile runs, a register-only vpdpbusd zmm loop timed in
the same rounds gives its limit. On a host with VNNI, --emulate-avx2 shows an AVX2 CPU without it
(bench/cpuid_avx2.c): onnxruntime's MLAS then runs its non-VNNI int8 kernel too.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from bench.harness import (
    Avx2VsBody,
    avx2_session,
    base_parser,
    body_session,
    header,
    md_table,
    quiet_bench,
    sync_print,
    wait_quiet,
)

SHAPES = [(128, 384, 384), (128, 384, 1536), (128, 1536, 384), (1, 384, 384), (8, 384, 1536)]


def fp32_model(k: int, n: int, rng: np.random.Generator):
    """Y = X W + b, W [k, n] and b [n] float32 initializers, X [M, k] with a symbolic M."""
    from onnx import TensorProto, helper, numpy_helper

    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    b = (rng.standard_normal(n) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["h"], name="fc"), helper.make_node("Add", ["h", "b"], ["Y"])],
        "fc",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    args = p.parse_args()
    import onnx

    from softdeploy.quant import QuantConfig, quantize
    from softdeploy.quant.rowwise import rewrite_matmuls
    from softdeploy.runtime import Session

    header("RowwiseInt8MatMul vs onnxruntime's float32 MatMul and dynamic int8")
    Avx2VsBody.print_variant()
    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="rowwise-bench-"))
    shapes = SHAPES[:2] if args.quick else SHAPES
    models = {}
    for _, k, n in shapes:
        if (k, n) in models:
            continue
        src = tmp / f"fp32_{k}_{n}.onnx"
        onnx.save(fp32_model(k, n, rng), src)
        ort8 = quantize(src, tmp / f"ort_int8_{k}_{n}.onnx", QuantConfig("dynamic", weights="pair-bounded")).path
        ours = quantize(src, tmp / f"rowwise_{k}_{n}.onnx", QuantConfig("dynamic", weights="lane-bounded")).path
        u8 = onnx.load(src)
        rewrite_matmuls(u8, levels=255, groups=0)
        onnx.save(u8, tmp / f"rowwise_u8_{k}_{n}.onnx")
        models[(k, n)] = (src, ort8, ours, tmp / f"rowwise_u8_{k}_{n}.onnx")
    floor = Avx2VsBody("RowwiseInt8MatMul")
    from bench.maxsim import peak_library
    from softdeploy.quant.quantize import _rowwise_vnni_runs

    # The physical limit where the op runs its AVX-512 VNNI tile: a register-only vpdpbusd zmm loop
    # (bench/micro/fma_peak.cc, kind 4), timed in the same interleaved rounds as the sessions.
    peak_lib = peak_library() if _rowwise_vnni_runs() else None
    peak_iters = 100_000
    # the loop's operation count (2 per multiply-add) is fixed by peak_iters: read once, not per shape
    peak_macs = peak_lib.sd_peak(4, peak_iters) / 2 if peak_lib is not None else 0.0
    if peak_lib is not None:
        sync_print(
            "- softdeploy runs RowwiseInt8MatMul's AVX-512 VNNI tile here: `% vpdpbusd peak` is against a "
            "register-only vpdpbusd zmm loop timed in the same rounds, times the threads"
        )
    else:
        sync_print("- softdeploy runs RowwiseInt8MatMul's AVX2 (or portable) code here: no VNNI peak column applies")
    for nt in args.threads:
        rows = []
        for m, k, n in shapes:
            src, ort8, ours, ours_u8 = models[(k, n)]
            x = {"X": rng.standard_normal((m, k)).astype(np.float32)}
            sessions = {
                "ort_fp32": Session(src, threads=nt),
                "ort_int8": Session(ort8, threads=nt),
                "softdeploy": Session(ours, kernels="native", threads=nt),
                "softdeploy_u8": Session(ours_u8, kernels="native", threads=nt),
                "avx2": avx2_session(ours, nt),
                "ort_body": body_session(ours, nt),
            }
            want = sessions["ort_body"].run(x)[0]
            got = sessions["avx2"].run(x)[0]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # the same integers, float32 epilogues
            wait_quiet(args.quiet_wait)
            fns = {name: (lambda s=s: s.run(x)) for name, s in sessions.items()}
            if peak_lib is not None:
                fns["vnni_peak"] = lambda: peak_lib.sd_peak(4, peak_iters)
            t, bg = quiet_bench(
                fns,
                rounds=args.rounds,
                batch_ms=args.batch_ms,
                max_tries=args.tries,
                wait_s=args.quiet_wait,
            )
            us = {name: t[name].median * 1e6 for name in sessions}
            peak_gmacs = peak_macs / t["vnni_peak"].median / 1e9 * nt if peak_lib is not None else None
            label = f"{nt} thr {m}x{k}x{n}"
            rows.append(
                [
                    f"{m} x {k} x {n}",
                    *(f"{us[name]:.1f}" for name in sessions),
                    f"{us['ort_fp32'] / us['softdeploy']:.2f}",
                    f"{us['ort_int8'] / us['softdeploy']:.2f}",
                    f"{us['ort_int8'] / us['softdeploy_u8']:.2f}",
                    floor.add(label, us["ort_body"], us["avx2"]),
                    f"{m * k * n / us['softdeploy'] / 1e3:.0f}",
                    f"{m * k * n / us['ort_int8'] / 1e3:.0f}",
                    "" if peak_gmacs is None else f"{peak_gmacs:.0f}",
                    "" if peak_gmacs is None else f"{m * k * n / us['softdeploy_u8'] / 1e3 / peak_gmacs:.0%}",
                    f"{max(t[name].spread for name in sessions):.0%}",
                    f"{bg:.1f}",
                ]
            )
            sync_print(f"  done nt={nt} {label}")
        sync_print(f"\nMicroseconds per call (median of interleaved rounds), {nt} thread(s):\n")
        sync_print(
            md_table(
                [
                    "M x K x N",
                    "ort_fp32",
                    "ort_int8",
                    "softdeploy",
                    "softdeploy_u8",
                    "avx2",
                    "ort_body",
                    "fp32 / ours",
                    "ort int8 / ours",
                    "ort int8 / ours_u8",
                    "body/avx2",
                    "ours GMAC/s",
                    "ort int8 GMAC/s",
                    "vpdpbusd peak GMAC/s",
                    "ours_u8 % vpdpbusd peak",
                    "max spread",
                    "bg load",
                ],
                rows,
            )
        )
    floor.print_summary()


if __name__ == "__main__":
    main()
