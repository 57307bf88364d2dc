"""all-MiniLM-L6-v2 end to end with softdeploy's RowwiseInt8MatMul (int8 on a CPU without VNNI).

The case's fp32 graph (eager attention + onnxruntime's BERT fusions, as in the case) runs in onnxruntime next to
onnxruntime's dynamic int8 of the same graph and softdeploy's RowwiseInt8MatMul formats:

  ort fp32                  the case's fp32 graph
  ort int8 dynamic          onnxruntime's own dynamic int8 through softdeploy.quant.quantize: per-tensor u8
                            activations, per-channel weights (8-bit with VNNI, pair-bounded without, even where this
                            CPU's table row is one of softdeploy's formats)
  softdeploy lane-bounded   quantize(dynamic, weights="lane-bounded"): per-row activations, lane-bounded weights,
                            com.softdeploy RowwiseInt8MatMul run by softdeploy's kernel library (its AVX2 variant)
  softdeploy rowwise-8-bit  (only where the kernel's VNNI tile runs: AVX-512 VNNI, not emulated) quantize(dynamic,
                            weights="rowwise-8-bit"): per-row u8 activations, plain 8-bit weights, vpdpbusd zmm

Accuracy on the case's data (653 queries, 871 documents; MaxSim scoring) against the fp32 graph; latency of batch
1 x 128 tokens, 1 thread, interleaved rounds. On a host with VNNI run it with --emulate-avx2 (bench/cpuid_avx2.c):
onnxruntime then runs its non-VNNI kernels, the comparison the int8 floor asks for. The benchmark-only prototype
this script first timed beside the shipped path (an int16-summing GEMM as its own custom-op library) is retired;
its numbers stay in bench/results/minilm_int8_options.md.

    python -m bench.minilm_int8_rowwise [--emulate-avx2] [--quick] [--rounds 10] [--profile 30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import onnx

from bench import harness
from softdeploy.compare.environment import LoadMeter
from softdeploy.compare.latency import measure_interleaved
from softdeploy.compare.metrics import cosine_rows
from softdeploy.models import get_case
from softdeploy.progress import SilentProgress
from softdeploy.quant import QuantConfig, quantize
from softdeploy.quant.formats import int8_format
from softdeploy.runtime import Session

SHIPPED = "softdeploy lane-bounded (RowwiseInt8MatMul)"
SHIPPED_VNNI = "softdeploy rowwise-8-bit (RowwiseInt8MatMul, VNNI tile)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100 queries")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--profile", type=int, default=0, help="also: onnxruntime's profile by op type over this many calls")
    p.add_argument(
        "--shipped-only",
        action="store_true",
        help="accepted for the recorded commands: the shipped path is all it runs",
    )
    harness.add_emulate_avx2(p)
    args = p.parse_args()

    case = get_case("minilm_retrieval", quick=args.quick)
    case.prepare(SilentProgress())
    tmp = Path(tempfile.mkdtemp(prefix="minilm-int8-rowwise-"))
    fp32 = tmp / "fp32.onnx"
    case.export_fp32(fp32, fuse=True)
    # onnxruntime's own format (the table row's static-mode weights: 8-bit with VNNI, pair-bounded without), where
    # dynamic mode's default may be one of softdeploy's RowwiseInt8MatMul formats
    int8 = quantize(fp32, tmp / "int8.onnx", QuantConfig("dynamic", weights=int8_format().weights))
    paths: dict[str, Path] = {"ort fp32": fp32, f"ort int8 dynamic ({int8.weights} weights)": int8.path}
    # The shipped path: softdeploy.quant's lane-bounded format (com.softdeploy RowwiseInt8MatMul, the library's kernel)
    shipped = quantize(fp32, tmp / "lane_bounded.onnx", QuantConfig("dynamic", weights="lane-bounded"))
    # quantized_nodes also counts the embedding tables' Gathers: count the rewritten MatMuls in the graph
    rowwise = sum(n.op_type == "RowwiseInt8MatMul" for n in onnx.load(str(shipped.path)).graph.node)
    if rowwise != 36:
        sys.exit(f"lane-bounded: {rowwise} MatMuls rewritten as RowwiseInt8MatMul, expected MiniLM's 36")
    paths[SHIPPED] = shipped.path
    from softdeploy.quant.quantize import _rowwise_vnni_runs

    if _rowwise_vnni_runs():  # false under --emulate-avx2 (the kernels then select avx2)
        vnni = quantize(fp32, tmp / "rowwise_8_bit.onnx", QuantConfig("dynamic", weights="rowwise-8-bit"))
        paths[SHIPPED_VNNI] = vnni.path

    def runner(label: str, threads: int) -> Any:
        return Session(paths[label], threads=threads).run

    evals = {label: case.evaluate(runner(label, 2), "native", SilentProgress(), label) for label in paths}
    feeds = case.latency_feeds()
    runs = {label: runner(label, 1) for label in paths}
    meter = LoadMeter().start()
    stats, _ = measure_interleaved(
        {label: (lambda r=r: r(feeds)) for label, r in runs.items()}, rounds=args.rounds, round_seconds=0.3
    )
    load = meter.stop()

    harness.header("all-MiniLM-L6-v2 end to end: softdeploy's RowwiseInt8MatMul against onnxruntime's int8")
    from softdeploy.quant.formats import format_lines

    print(f"- this CPU's int8 format (softdeploy.quant.formats): {format_lines()[0]}")
    print(f"- `ort int8 dynamic`: {int8.int8_format}")
    d = case.data
    print(
        f"- data: {len(d.queries)} queries, {len(d.corpus)} documents; reference: ort fp32; latency: batch 1 x "
        f"{case.latency_seq} tokens, 1 thread; background load while timing: {load:.2f} cores\n"
    )
    if args.profile:
        from bench.minilm_op_profile import profile

        prof = {label: profile(path, feeds, args.profile) for label, path in paths.items()}
        ops = sorted(
            {o for pr in prof.values() for o in pr}, key=lambda o: -max(pr.get(o, 0.0) for pr in prof.values())
        )
        print("Kernel time by op type, ms per call (onnxruntime's profiler, 1 thread):\n")
        table = [[o] + [f"{prof[label].get(o, 0.0):.3f}" for label in paths] for o in ops[:14]]
        table.append(["total"] + [f"{sum(prof[label].values()):.3f}" for label in paths])
        print(harness.md_table(["op type", *paths], table) + "\n")
    ref, rs = evals["ort fp32"], stats["ort fp32"]
    rows = []
    for label in paths:
        ev, st = evals[label], stats[label]
        rows.append(
            [
                label,
                f"{ev.metrics['MRR@10']:.4f}",
                f"{ref.metrics['MRR@10'] - ev.metrics['MRR@10']:+.4f}",
                f"{cosine_rows(ref.rows['sentence cosine'], ev.rows['sentence cosine']).mean():.5f}",
                f"{cosine_rows(ref.rows['token cosine'], ev.rows['token cosine']).mean():.5f}",
                f"{st.p50_ms:.2f}",
                f"{st.cpu_p50_ms:.2f}",
                f"{rs.p50_ms / st.p50_ms:.2f}",
                f"{rs.cpu_p50_ms / st.cpu_p50_ms:.2f}",
            ]
        )
    print(
        harness.md_table(
            [
                "variant",
                "MRR@10",
                "MRR drop",
                "sentence cos",
                "token cos",
                "wall p50 ms",
                "CPU ms",
                "speed-up wall",
                "speed-up CPU",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
