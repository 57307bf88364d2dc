"""RowwiseInt8MatMul on TVM against the C++ kernel and float32, per GEMM of all-MiniLM-L6-v2 (batch 1, seq 128).

    python -m bench.tvm_rowwise_int8 [--threads 1,2] [--target-cpu znver3] [--lane-bounded] [--quick]

Each shape is a one-node model whose B, BScale and Bias are initializers (as in a quantized model: B is packed once,
at import for TVM and at session creation for the C++ kernel). Peers in the same interleaved run: TVM int8 (the TIR
computes of softdeploy/tvm/ops/rowwise_int8_matmul.py, built for ``--target-cpu``, default this host), the C++
kernel in onnxruntime (this host's best variant, and its AVX2 variant: SOFTDEPLOY_ISA=avx2), and float32 MatMul + Add of the same shape in TVM (the MatMul hand
rule) and in onnxruntime (MLAS). TVM's and the kernel's outputs are checked equal bit for bit before timing.
``--lane-bounded``: weights from ``lane_bounded_weights`` (4 sets at 8-bit activations), the format that CPUs without
VNNI run through vpmaddubsw.
"""

from __future__ import annotations

import numpy as np

from bench import harness

SHAPES = [(128, 384, 1536), (128, 1536, 384), (128, 384, 384)]  # (M, K, N): FFN up, FFN down, projections


def _models(m: int, k: int, n: int, rng: np.random.Generator, lane_bounded: bool) -> tuple:
    """(int8 model, float32 model) of Y = A @ B + Bias, A [m, k]."""
    from onnx import TensorProto, helper, numpy_helper

    from softdeploy import DOMAIN, OPSET_VERSION
    from softdeploy.ops.functions import attach_function_bodies

    if lane_bounded:
        from softdeploy.ops.rowwise_int8_matmul import lane_bounded_weights

        b, scale = lane_bounded_weights(rng.standard_normal((k, n)) / np.sqrt(k), 255, 4)
    else:
        b = rng.integers(-127, 128, (k, n)).astype(np.int8)
        scale = (rng.random(n) * 0.01 + 1e-3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    a_in = [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])]
    y_out = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])]
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
    node = helper.make_node("RowwiseInt8MatMul", ["A", "B", "BScale", "Bias"], ["Y"], domain=DOMAIN)
    inits = [numpy_helper.from_array(v, name) for v, name in ((b, "B"), (scale, "BScale"), (bias, "Bias"))]
    int8 = attach_function_bodies(
        helper.make_model(helper.make_graph([node], "int8", a_in, y_out, inits), opset_imports=opsets)
    )
    w = (b.astype(np.float32) * scale).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["A", "W"], ["H"]), helper.make_node("Add", ["H", "Bias"], ["Y"])]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "Bias")]
    fp32 = helper.make_model(helper.make_graph(nodes, "fp32", a_in, y_out, inits), opset_imports=opsets[:1])
    return int8, fp32


def main() -> None:
    p = harness.base_parser(__doc__ or "")
    p.add_argument("--target-cpu", default=None, help="LLVM -mcpu to build TVM for (default: this host's)")
    p.add_argument("--lane-bounded", action="store_true", help="lane-bounded weights (vpmaddubsw without VNNI)")
    args = p.parse_args()

    from softdeploy.conformance import forced_isa
    from softdeploy.runtime import Session
    from softdeploy.tvm.ops import rowwise_int8_matmul as tir
    from softdeploy.tvm.session import TVMSession, set_threads
    from softdeploy.tvm.target import host_target, make_target

    target = host_target(args.target_cpu)
    with make_target(target):
        layout = tir.target_layout()
    harness.header("RowwiseInt8MatMul on TVM vs the C++ kernel and float32 (MiniLM's GEMMs)")
    if args.lane_bounded and layout in tir.LANE_LAYOUTS:
        layout = tir.LANE_LAYOUTS[layout][4]
    print(f"- TVM target -mcpu={target['mcpu']}: weight layout {layout.intrin or 'int32 vector lanes'}")
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in SHAPES:
        int8, fp32 = _models(m, k, n, rng, args.lane_bounded)
        shapes = {"A": [m, k]}
        tvm_int8, tvm_fp32 = (
            TVMSession(int8, shapes=shapes, target=target),
            TVMSession(fp32, shapes=shapes, target=target),
        )
        a = {"A": (rng.standard_normal((m, k)) * 2).astype(np.float32)}
        for threads in args.threads:
            set_threads(threads)
            kernel, ort_fp32 = Session(int8, kernels="native", threads=threads), Session(fp32, threads=threads)
            with forced_isa("avx2"):  # the kernel an AVX2 CPU runs (its lane tile on lane-bounded weights)
                kernel_avx2 = Session(int8, kernels="native", threads=threads)
            np.testing.assert_array_equal(tvm_int8.run(a)[0], kernel.run(a)[0])
            fns = {
                "TVM int8": lambda: tvm_int8.run(a),
                "C++ kernel int8": lambda s=kernel: s.run(a),
                "C++ kernel int8 (avx2)": lambda s=kernel_avx2: s.run(a),
                "TVM fp32": lambda: tvm_fp32.run(a),
                "onnxruntime fp32": lambda s=ort_fp32: s.run(a),
            }
            timings, bg = harness.quiet_bench(
                fns, rounds=5 if args.quick else args.rounds, batch_ms=args.batch_ms, max_tries=args.tries
            )
            ops = 2.0 * m * k * n
            for name, t in timings.items():
                rows.append(
                    (
                        f"{m}x{k} @ {k}x{n}",
                        threads,
                        name,
                        harness.fmt_time(t.median),
                        f"{t.spread:.0%}",
                        f"{ops / t.median / 1e9:.0f}",
                        f"{timings['C++ kernel int8'].median / t.median:.2f}x",
                        f"{timings['TVM fp32'].median / t.median:.2f}x",
                        f"{bg:.2f}",
                    )
                )
    print()
    print(
        harness.md_table(
            ("GEMM", "threads", "peer", "median", "spread", "G(FL)OP/s", "vs C++ kernel", "vs TVM fp32", "bg load"),
            rows,
        )
    )


if __name__ == "__main__":
    main()
