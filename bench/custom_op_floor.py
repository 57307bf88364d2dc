"""What onnxruntime charges per call for a custom op, next to the built-in ops and TwoPassSoftmax.

    python -m bench.custom_op_floor [--V 16,1000] [--rounds 21]

Builds bench/micro/custom_op_floor (a benchmark-only library with one custom op, CopyOp: read the
input's shape, ask onnxruntime for the output, copy -- through the C API directly) with CMake into
build/custom_op_floor, then times one-node models on a 1 x V float input, each in onnxruntime with one
thread (harness.ort_session's options), through the plain call (`run`: onnxruntime's Python run()) and through bound buffers
(`bound`: softdeploy.runtime.BoundRun, onnxruntime's IO binding):
  ort_identity     ai.onnx Identity (a copy; the built-in floor)
  ort_softmax      ai.onnx Softmax(axis=-1) (MLAS)
  floor_custom_op  CopyOp: a copy through the custom-op interface (the custom-op floor)
  softdeploy       com.softdeploy TwoPassSoftmax (our kernel library)
`floor_custom_op - ort_identity` is onnxruntime's own extra cost per call of any custom op;
`softdeploy - floor_custom_op` is what our binding and the row cost on top of it.
"""

from __future__ import annotations

from pathlib import Path

from bench.harness import (
    base_parser,
    build_cmake_library,
    header,
    int_list,
    md_table,
    ort_session,
    quiet_bench,
    sync_print,
    threads,
)

# isort: split
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "bench" / "micro" / "custom_op_floor"
BUILD = ROOT / "build" / "custom_op_floor"
PEERS = ["ort_identity", "ort_softmax", "floor_custom_op", "softdeploy"]


def one_node_model(op: str, domain: str = "") -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", "V"])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["B", "V"])
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    node = helper.make_node(op, ["X"], ["Y"], domain=domain)
    graph = helper.make_graph([node], "g", [x], [y])
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def main() -> None:
    from softdeploy.ops import REGISTRY, Sample
    from softdeploy.runtime import BoundRun
    from softdeploy.runtime.library import library_path

    p = base_parser(__doc__)
    p.add_argument("--V", type=int_list, default=[16, 1000])
    p.set_defaults(rounds=21)
    args = p.parse_args()
    header("The per-call cost of a custom op in onnxruntime")
    floor_library = build_cmake_library(SOURCE, BUILD, "custom_op_floor")
    ours = REGISTRY["TwoPassSoftmax"].make_model(Sample("bench", (np.zeros((1, 2), np.float32),)), with_function=False)
    models = {
        "ort_identity": (one_node_model("Identity"), None),
        "ort_softmax": (one_node_model("Softmax"), None),
        "floor_custom_op": (one_node_model("CopyOp", "bench.floor"), floor_library),
        "softdeploy": (ours.SerializeToString(), library_path()),
    }
    rows = []
    with threads(1):
        for v in args.V:
            x = np.random.default_rng(0).standard_normal((1, v)).astype(np.float32)
            fns = {}
            for name, (model, library) in models.items():
                s = ort_session(model, 1, library=library)
                fns[f"{name} run"] = lambda s=s, x=x: s.run(None, {"X": x})
                fns[f"{name} bound"] = BoundRun(s, {"X": x})
            t, bg = quiet_bench(fns, rounds=args.rounds, batch_ms=args.batch_ms, max_tries=args.tries)
            for path in ("run", "bound"):
                us = {n: t[f"{n} {path}"].median * 1e6 for n in PEERS}
                rows.append(
                    [f"1x{v}", path]
                    + [f"{us[n]:.3f}" for n in PEERS]
                    + [
                        f"{us['floor_custom_op'] - us['ort_identity']:+.3f}",
                        f"{us['softdeploy'] - us['floor_custom_op']:+.3f}",
                        f"{us['ort_softmax'] / us['softdeploy']:.2f}",
                        f"{max(t[f'{n} {path}'].spread for n in PEERS):.0%}",
                        f"{bg:.1f}",
                    ]
                )
            sync_print(f"  done 1x{v}")
    sync_print("\nMicroseconds per call (median of interleaved rounds), 1 thread.\n")
    sync_print(
        md_table(
            [
                "shape",
                "call",
                *PEERS,
                "custom-op floor - Identity",
                "softdeploy - custom-op floor",
                "ort_softmax / softdeploy",
                "max spread",
                "bg load",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
