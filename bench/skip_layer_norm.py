"""onnxruntime's SkipLayerNormFusion on CPU: the fused com.microsoft SkipLayerNormalization against the Add (+ bias
Add) + LayerNormalization it replaces, alone and in all-MiniLM-L6-v2 end to end (why softdeploy.runtime.Session turns
the fusion off: DISABLED_OPTIMIZERS).

Part 1, one node: x + skip + bias, then LayerNormalization over the last axis (hidden 384, epsilon 1e-12), as
SkipLayerNormalization and as Add + Add + LayerNormalization (session optimizers off, so it stays unfused), at
[1, S, 384] for S = 8, 128, 1024, 1 thread, interleaved rounds.

Part 2, the case's model: the fp32 graph of `softdeploy compare` (eager attention + onnxruntime's BERT fusions), its
dynamic int8 in onnxruntime's format (this CPU's weights) and in softdeploy's lane-bounded one (RowwiseInt8MatMul),
each in a session with onnxruntime's optimizers as they are and with SkipLayerNormFusion off; batch 1 x 128 tokens,
1 thread. On a host with VNNI, --emulate-avx2 shows an AVX2 CPU without it (bench/cpuid_avx2.c).

    python -m bench.skip_layer_norm [--emulate-avx2] [--rounds 15]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from bench import harness
from softdeploy.compare.environment import LoadMeter
from softdeploy.compare.latency import measure_interleaved

HIDDEN = 384


def one_node_models(seq: int) -> tuple[bytes, bytes, dict[str, np.ndarray]]:
    """(fused, unfused, feeds) at [1, seq, HIDDEN]."""
    rng = np.random.default_rng(0)
    shape = [1, seq, HIDDEN]
    inits = [
        numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), name) for name in ("g", "b", "bias")
    ]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "skip")]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]

    def model(nodes: list) -> bytes:
        graph = helper.make_graph(nodes, "sln", ins, outs, inits)
        opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
        return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()

    fused = model(
        [
            helper.make_node(
                "SkipLayerNormalization", ["x", "skip", "g", "b", "bias"], ["y"], domain="com.microsoft", epsilon=1e-12
            )
        ]
    )
    unfused = model(
        [
            helper.make_node("Add", ["x", "skip"], ["t"]),
            helper.make_node("Add", ["t", "bias"], ["t2"]),
            helper.make_node("LayerNormalization", ["t2", "g", "b"], ["y"], axis=-1, epsilon=1e-12),
        ]
    )
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("x", "skip")}
    return fused, unfused, feeds


def one_node(rounds: int) -> None:
    rows = []
    for seq in (8, 128, 1024):
        fused, unfused, feeds = one_node_models(seq)
        a = harness.ort_session(fused, 1, disabled_optimizers=[])
        b = harness.ort_session(unfused, 1, opt_level="none")
        diff = float(np.abs(a.run(None, feeds)[0] - b.run(None, feeds)[0]).max())
        stats, _ = measure_interleaved(
            {"fused": lambda: a.run(None, feeds), "unfused": lambda: b.run(None, feeds)},
            rounds=rounds,
            round_seconds=0.2,
        )
        f, u = stats["fused"].p50_ms * 1e3, stats["unfused"].p50_ms * 1e3
        rows.append([f"[1, {seq}, {HIDDEN}]", f"{f:.1f}", f"{u:.1f}", f"{f / u:.2f}", f"{diff:.1e}"])
    print("Part 1: one node, microseconds per call (1 thread):\n")
    print(
        harness.md_table(
            ["shape", "SkipLayerNormalization", "Add + Add + LayerNormalization", "fused / unfused", "max |diff|"], rows
        )
        + "\n"
    )


def minilm(rounds: int) -> None:
    from softdeploy.models import get_case
    from softdeploy.progress import SilentProgress
    from softdeploy.quant import QuantConfig, quantize
    from softdeploy.quant.formats import int8_format
    from softdeploy.runtime.library import library_path

    case = get_case("minilm_retrieval", quick=True)
    case.prepare(SilentProgress())
    tmp = Path(tempfile.mkdtemp(prefix="skip-layer-norm-"))
    fp32 = tmp / "fp32.onnx"
    case.export_fp32(fp32, fuse=True)
    # onnxruntime's own format for the second row: the table row's static-mode weights (8-bit, pair-bounded), never
    # softdeploy's RowwiseInt8MatMul formats, which dynamic mode takes on AVX2 without VNNI and on AVX-512 VNNI
    ort_int8 = quantize(fp32, tmp / "ort_int8.onnx", QuantConfig("dynamic", weights=int8_format().weights))
    lane = quantize(fp32, tmp / "lane.onnx", QuantConfig("dynamic", weights="lane-bounded"))
    models = {
        "fp32": fp32,
        f"onnxruntime int8 ({ort_int8.weights} weights)": ort_int8.path,
        "softdeploy lane-bounded int8": lane.path,
    }
    feeds = case.latency_feeds()

    runs = {}
    for name, path in models.items():
        runs[(name, "fused")] = harness.ort_session(str(path), 1, library=library_path(), disabled_optimizers=[])
        runs[(name, "off")] = harness.ort_session(str(path), 1, library=library_path())
    meter = LoadMeter().start()
    stats, _ = measure_interleaved(
        {k: (lambda s=s: s.run(None, feeds)) for k, s in runs.items()}, rounds=rounds, round_seconds=0.3
    )
    load = meter.stop()
    ms = {k: v.p50_ms for k, v in stats.items()}
    rows = []
    for name in models:
        f, o = ms[(name, "fused")], ms[(name, "off")]
        rows.append(
            [
                name,
                f"{f:.2f}",
                f"{o:.2f}",
                f"{f / o:.2f}",
                f"{ms[('fp32', 'fused')] / f:.2f}",
                f"{ms[('fp32', 'off')] / o:.2f}",
            ]
        )
    print(
        f"Part 2: all-MiniLM-L6-v2, batch 1 x {case.latency_seq} tokens, 1 thread, ms per call (p50); background load "
        f"while timing: {load:.2f} cores:\n"
    )
    print(
        harness.md_table(
            [
                "model",
                "fusion on (onnxruntime's default)",
                "SkipLayerNormFusion off",
                "speed-up",
                "vs fp32, fusion on",
                "vs fp32, fusion off",
            ],
            rows,
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    harness.add_emulate_avx2(p)
    args = p.parse_args()
    harness.header("onnxruntime's SkipLayerNormFusion on CPU")
    one_node(args.rounds)
    minilm(args.rounds)


if __name__ == "__main__":
    main()
