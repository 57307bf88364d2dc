"""all-MiniLM-L6-v2 end to end with an int16-summing int8 GEMM prototype (issue 13: int8 on a CPU without VNNI).

bench/minilm_int8_paired_accuracy.py measured the accuracy of per-row activations with lane-bounded weights and
the retired bench/int8_gemm_paired.py the speed of the prototype GEMM on MiniLM's shapes. This script puts them together: each
of the 36 weight MatMuls of the case's fp32 graph (eager attention + onnxruntime's BERT fusions, as in the case)
becomes RowwiseInt8MatMul (bench/micro/int8_gemm_ort: a benchmark-only custom-op library around
bench/micro/int8_gemm_paired.h; AVX2, one thread, no function body), and the model runs in onnxruntime next to
its fp32 graph and onnxruntime's dynamic int8 of the same graph (softdeploy.quant with this CPU's format):

  ort fp32                  the case's fp32 graph
  ort int8 dynamic          onnxruntime's own dynamic int8 through softdeploy.quant.quantize: per-tensor u8
                            activations, per-channel weights (8-bit with VNNI, pair-bounded without, even where this
                            CPU's table row is one of softdeploy's formats)
  rowwise u8, paired        per-row u8 activations, lane-bounded weights (4-product lanes), 2 vpmaddubsw per sum
  rowwise u7, octet         per-row u7 activations, lane-bounded weights (8-product lanes), 4 vpmaddubsw per sum
  softdeploy lane-bounded   the shipped form of octet: softdeploy.quant.quantize(dynamic, weights="lane-bounded"),
                            com.softdeploy RowwiseInt8MatMul run by softdeploy's kernel library (its AVX2 variant)
  softdeploy rowwise-8-bit  (only where the kernel's VNNI tile runs: AVX-512 VNNI, not emulated) quantize(dynamic,
                            weights="rowwise-8-bit"): per-row u8 activations, plain 8-bit weights, vpdpbusd zmm

Accuracy on the case's data (653 queries, 871 documents; MaxSim scoring) against the fp32 graph; latency of batch
1 x 128 tokens, 1 thread, interleaved rounds. On a host with VNNI run it with --emulate-avx2 (bench/cpuid_avx2.c):
onnxruntime then runs its non-VNNI kernels, the comparison the issue's floor asks for.

    python -m bench.minilm_int8_rowwise [--emulate-avx2] [--quick] [--rounds 10] [--shipped-only]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from bench import harness
from bench.minilm_int8_paired_accuracy import lane_bounded_int8
from softdeploy.compare.environment import LoadMeter
from softdeploy.compare.latency import measure_interleaved
from softdeploy.compare.metrics import cosine_rows
from softdeploy.compare.progress import SilentProgress
from softdeploy.models import get_case
from softdeploy.quant import QuantConfig, quantize
from softdeploy.quant.formats import int8_format
from softdeploy.runtime import Session

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "bench" / "micro" / "int8_gemm_ort"
BUILD = ROOT / "build" / "int8_gemm_ort"
DOMAIN = "bench.int8"
NR = 16  # the prototype's panel width (i8gemm::kNR)

SHIPPED = "softdeploy lane-bounded (RowwiseInt8MatMul)"
SHIPPED_VNNI = "softdeploy rowwise-8-bit (RowwiseInt8MatMul, VNNI tile)"
# (label, activation levels, vpmaddubsw results per int16 sum)
FORMS = [("rowwise u8, paired", 255, 2), ("rowwise u7, octet", 127, 4)]


def pack_weights(q: np.ndarray) -> np.ndarray:
    """q int8 [K, N] in i8gemm::Weights' layout, flattened: per 16-column panel and block of 16 k, [group g][half h]
    [column j][byte b] = q[16 i + 4 g + b, 16 p + 8 h + j]; K and N padded to 16 with 0."""
    k, n = q.shape
    kp, np_ = -(-k // 16) * 16, -(-n // NR) * NR
    padded = np.zeros((kp, np_), np.int8)
    padded[:k, :n] = q
    # axes of padded.reshape: (i, g, b, p, h, j) -> (p, i, g, h, j, b)
    blocks = padded.reshape(kp // 16, 4, 4, np_ // NR, 2, 8).transpose(3, 0, 1, 4, 5, 2)
    return np.ascontiguousarray(blocks).reshape(-1)


def rowwise_graph(src: Path, out: Path, levels: int, groups: int) -> int:
    """Writes ``src`` with every MatMul by a 2-D float initializer replaced by RowwiseInt8MatMul; returns how many.
    A bias the MatMul's only consumer adds (an Add of a [N] initializer, or BiasGelu's bias, which then becomes
    com.microsoft Gelu) moves into the op's epilogue, as onnxruntime's int8 graph fuses it into
    MatMulIntegerToFloat."""
    model = onnx.load(str(src))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in graph.output}
    replace: dict[int, list[Any]] = {}  # id(node) -> its replacement nodes ([] removes it)
    for node in graph.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or len(w.dims) != 2:
            continue
        wf = numpy_helper.to_array(w).astype(np.float64)
        k, n = wf.shape
        np_ = -(-n // NR) * NR
        pad = np.zeros(np_ - n)
        bias, output = np.zeros(n), node.output[0]
        users = consumers.get(output, [])
        if len(users) == 1 and output not in graph_outputs:
            user = users[0]
            other = [i for i in user.input if i != output]
            b = inits.get(other[0]) if len(other) == 1 else None
            if b is not None and int(np.prod(b.dims)) == n and user.op_type in ("Add", "BiasGelu"):
                bias = numpy_helper.to_array(b).astype(np.float64).reshape(n)
                if user.op_type == "Add":
                    output = user.output[0]
                    replace[id(user)] = []
                else:
                    gelu = helper.make_node("Gelu", [output], list(user.output), name=user.name, domain="com.microsoft")
                    replace[id(user)] = [gelu]
        q, step = lane_bounded_int8(wf, levels, groups)
        base = f"{node.name or node.output[0]}_rowwise"
        graph.initializer.extend(
            [
                numpy_helper.from_array(pack_weights(q), f"{base}_W"),
                numpy_helper.from_array(np.concatenate([step, pad]).astype(np.float32), f"{base}_scale"),
                numpy_helper.from_array(
                    np.concatenate([q.astype(np.int64).sum(0), pad]).astype(np.int32), f"{base}_colsum"
                ),
                numpy_helper.from_array(np.concatenate([bias, pad]).astype(np.float32), f"{base}_bias"),
            ]
        )
        replace[id(node)] = [
            helper.make_node(
                "RowwiseInt8MatMul",
                [node.input[0], f"{base}_W", f"{base}_scale", f"{base}_colsum", f"{base}_bias"],
                [output],
                name=base,
                domain=DOMAIN,
                K=k,
                N=n,
                groups=groups,
                levels=levels,
            )
        ]
    nodes = [m for node in graph.node for m in replace.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for nd in graph.node for i in nd.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    onnx.save(model, str(out))
    return sum(nd.op_type == "RowwiseInt8MatMul" for nd in nodes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100 queries")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--profile", type=int, default=0, help="also: onnxruntime's profile by op type over this many calls")
    p.add_argument("--shipped-only", action="store_true", help="without the prototype's graphs")
    harness.add_emulate_avx2(p)
    args = p.parse_args()

    library = harness.build_cmake_library(SOURCE, BUILD, "int8_gemm_ort")
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
    if len(shipped.quantized_nodes) != 36:
        sys.exit(f"lane-bounded: {len(shipped.quantized_nodes)} MatMuls rewritten, expected MiniLM's 36")
    paths[SHIPPED] = shipped.path
    from softdeploy.quant.quantize import _rowwise_vnni_runs

    if _rowwise_vnni_runs():  # false under --emulate-avx2 (the kernels then select avx2)
        vnni = quantize(fp32, tmp / "rowwise_8_bit.onnx", QuantConfig("dynamic", weights="rowwise-8-bit"))
        paths[SHIPPED_VNNI] = vnni.path
    for label, levels, groups in FORMS:
        if args.shipped_only:
            break
        out = tmp / f"rowwise_{levels}_{groups}.onnx"
        count = rowwise_graph(fp32, out, levels, groups)
        if count != 36:
            sys.exit(f"{label}: {count} MatMuls replaced, expected MiniLM's 36")
        paths[label] = out

    rowwise = {label for label, _, _ in FORMS}  # the graphs that need the prototype's library

    def runner(label: str, threads: int) -> Any:
        if label in rowwise:
            sess = harness.ort_session(str(paths[label]), threads, library=library)
            return lambda feeds: sess.run(None, feeds)
        return Session(paths[label], threads=threads).run

    evals = {label: case.evaluate(runner(label, 2), "native", SilentProgress(), label) for label in paths}
    feeds = case.latency_feeds()
    runs = {label: runner(label, 1) for label in paths}
    meter = LoadMeter().start()
    stats, _ = measure_interleaved(
        {label: (lambda r=r: r(feeds)) for label, r in runs.items()}, rounds=args.rounds, round_seconds=0.3
    )
    load = meter.stop()

    harness.header("all-MiniLM-L6-v2 end to end with an int16-summing int8 GEMM prototype")
    from softdeploy.quant.formats import format_lines

    print(f"- this CPU's int8 format (softdeploy.quant.formats): {format_lines()[0]}")
    print(f"- `ort int8 dynamic`: {int8.int8_format}")
    d = case.data
    print(
        f"- data: {len(d.queries)} queries, {len(d.corpus)} documents; reference: ort fp32; latency: batch 1 x "
        f"{case.latency_seq} tokens, 1 thread; background load while timing: {load:.2f} cores\n"
    )
    if args.profile:
        from minilm_op_profile import profile

        prof = {label: profile(path, feeds, args.profile, library) for label, path in paths.items()}
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
