"""Where all-MiniLM-L6-v2's encode time goes, fp32 against int8, by onnxruntime op type: what bounds the int8
speed-up (issue 13: >= 1.8x fp32 on a CPU without VNNI).

The case's fused fp32 graph (eager attention, onnxruntime's BERT fusions, as `softdeploy compare` runs it) and its
dynamic int8 quantization with this CPU's int8 format (softdeploy.quant.formats), batch 1 x 128 tokens, 1 thread,
ORT_ENABLE_ALL; onnxruntime's own profiler over --runs calls after warm-up, each node's kernel time summed by op
type and divided by the calls. The bound: the int8 graph with its integer GEMMs (MatMulInteger,
DynamicQuantizeMatMul, MatMulIntegerToFloat and the activations' DynamicQuantizeLinear) taking no time at all is
still the rest of its ops, so fp32 / rest is the most any int8 GEMM could give.

    python -m bench.minilm_op_profile [--emulate-avx2] [--runs 50]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

from bench import harness

INT8_GEMM = ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLinear")


def profile(path: Path, feeds: dict, runs: int, extra_library: Path | None = None) -> dict[str, float]:
    """ms per call by op type (onnxruntime's profiler, node kernel time); ``extra_library``: another custom-op
    library the graph needs (a benchmark-only custom op)."""
    import onnxruntime as ort

    from softdeploy.runtime import library_path

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.register_custom_ops_library(str(library_path()))
    if extra_library is not None:
        so.register_custom_ops_library(str(extra_library))
    so.enable_profiling = True
    so.profile_file_prefix = str(path.with_suffix(""))
    from softdeploy.runtime.session import DISABLED_OPTIMIZERS  # profile the graph softdeploy's Session runs

    sess = ort.InferenceSession(
        str(path), so, providers=["CPUExecutionProvider"], disabled_optimizers=list(DISABLED_OPTIMIZERS)
    )
    for _ in range(5):  # the first calls after creation allocate
        sess.run(None, feeds)
    for _ in range(runs):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    us: dict[str, float] = defaultdict(float)
    calls = 0
    for e in events:
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            calls += 1
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            us[e["args"]["op_name"]] += e["dur"]
    return {op: t / calls / 1000.0 for op, t in us.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50)
    harness.add_emulate_avx2(p)
    args = p.parse_args()

    from softdeploy.compare.environment import environment
    from softdeploy.models import get_case
    from softdeploy.progress import SilentProgress
    from softdeploy.quant import QuantConfig, quantize
    from softdeploy.quant.formats import format_lines, int8_format

    case = get_case("minilm_retrieval", quick=True)
    case.prepare(SilentProgress())
    tmp = Path(tempfile.mkdtemp(prefix="minilm-op-profile-"))
    fp32 = tmp / "fp32.onnx"
    case.export_fp32(fp32, fuse=True)
    fmt = int8_format()
    int8 = quantize(fp32, tmp / "int8.onnx", QuantConfig("dynamic", weights=fmt.weights)).path
    feeds = case.latency_feeds()
    prof = {"fp32": profile(fp32, feeds, args.runs), "int8": profile(int8, feeds, args.runs)}

    env = environment(1)
    print("# all-MiniLM-L6-v2: encode time by op type, fp32 and int8 (bench/minilm_op_profile.py)\n")
    print(f"- {harness.cpuid_note()}")
    for line in format_lines():
        print(f"- int8 format, {line}")
    print(
        f"- CPU: {env['cpu']} ({env['cores']} cores), 1 thread, batch 1 x {case.latency_seq} tokens, "
        f"onnxruntime's profiler over {args.runs} calls (node kernel time; the session's own overhead not included)\n"
    )
    ops = sorted(
        set(prof["fp32"]) | set(prof["int8"]), key=lambda o: -(prof["fp32"].get(o, 0) + prof["int8"].get(o, 0))
    )
    rows = [[op, f"{prof['fp32'].get(op, 0.0):.3f}", f"{prof['int8'].get(op, 0.0):.3f}"] for op in ops]
    total = {k: sum(v.values()) for k, v in prof.items()}
    rows.append(["**total**", f"**{total['fp32']:.3f}**", f"**{total['int8']:.3f}**"])
    print(harness.md_table(["op type", "fp32 ms per call", "int8 ms per call"], rows))
    gemm = sum(t for op, t in prof["int8"].items() if op in INT8_GEMM)
    f32_matmul = sum(t for op, t in prof["fp32"].items() if op in ("MatMul", "FusedMatMul", "Gemm"))
    rest = total["int8"] - gemm
    print(
        f"\n- fp32: MatMul / FusedMatMul / Gemm {f32_matmul:.3f} ms of {total['fp32']:.3f} "
        f"({100 * f32_matmul / total['fp32']:.0f}%)"
    )
    print(
        f"- int8: integer GEMMs and activation quantization {gemm:.3f} ms of {total['int8']:.3f}; the rest "
        f"{rest:.3f} ms"
    )
    print(f"- speed-up int8 / fp32 (kernel time): {total['fp32'] / total['int8']:.2f}x")
    print(f"- bound with the int8 GEMMs free: fp32 / rest = {total['fp32'] / rest:.2f}x")
    need = total["fp32"] / 1.8 - rest  # what the int8 GEMMs may take for 1.8x
    if need <= 0:
        print("- 1.8x is out of reach: the rest alone exceeds fp32 / 1.8")
    elif gemm > need:
        print(
            f"- for 1.8x the int8 GEMMs and activation quantization would have to take {need:.3f} ms ({gemm / need:.2f}x faster)"
        )
    else:
        print(f"- 1.8x holds: the int8 GEMMs and activation quantization may take up to {need:.3f} ms")


if __name__ == "__main__":
    main()
