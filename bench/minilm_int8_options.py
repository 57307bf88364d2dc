"""Which int8 settings for all-MiniLM-L6-v2 (the default `softdeploy compare` case)? Measured, not guessed.

Graphs (fp32 and its int8 always from the SAME graph, so a speed-up compares like with like):
  sdpa           torch's default SDPA attention, exported with torch.onnx (dynamo): a NaN guard
                 (IsNaN + Where) per layer
  eager          the eager attention (matmul, softmax, matmul)
  eager+fusions  eager, then onnxruntime's BERT fusions (BiasGelu, LayerNormalization; opt_level 0)
Every session runs at ORT_ENABLE_ALL (onnxruntime's own fusions: SkipLayerNormalization, MatMul+scale, and
for int8 DynamicQuantizeMatMul / MatMulIntegerToFloat).

int8 options on eager+fusions: dynamic per-channel (the default), with pair-bounded weights (the choice of
softdeploy.quant.formats for a CPU without VNNI), with reduce_range (7-bit weights: onnxruntime's guidance there),
per-tensor, attention MatMuls
(activation x activation) quantized too; static QDQ per-channel with minmax / percentile / entropy
calibration, with all MatMuls int8 or some FFN down-projections kept in float.

Accuracy on the case's data (653 queries, 871 documents): MRR@10 drop and mean sentence / token cosine to
the fp32 of the same graph. Latency: batch 1 x 128 tokens, 1 thread, interleaved rounds; wall p50 and CPU
time p50 (this process), speed-up vs the fp32 of the same graph. Prints markdown.

    python -m bench.minilm_int8_options [--quick] [--emulate-avx2]

--emulate-avx2 measures them as on an AVX2 CPU without VNNI (bench/cpuid_avx2.c hides AVX-512 and VNNI from
every library in the process: onnxruntime's int8 GEMM runs its vpmaddubsw kernel, its float GEMM the AVX2 one).
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench import harness
from softdeploy.compare.environment import LoadMeter, environment
from softdeploy.compare.latency import measure_interleaved
from softdeploy.compare.metrics import cosine_rows
from softdeploy.models import get_case
from softdeploy.progress import SilentProgress
from softdeploy.quant import QuantConfig, quantize
from softdeploy.quant.quantize import candidate_nodes, load_named, node_scope
from softdeploy.runtime import Session
from softdeploy_cases.minilm_retrieval import STATIC_FLOAT_SCOPE


def export(case: Any, attention: str, path: Path, fuse: bool) -> Path:
    bert = case._model.m
    bert.set_attn_implementation(attention)
    try:
        case.export_fp32(path, fuse=fuse)
    finally:
        bert.set_attn_implementation("eager")  # what the case loads
    return path


ATTENTION_TOO = "eager+fusions int8 dynamic + attention MatMuls"
# 7-bit weights: what softdeploy.quant.formats chooses on x86-64 without VNNI. Its integer sums cannot saturate on
# either MLAS kernel (2 x 255 x 64 < 32767), so the accuracy measured here is its accuracy on an AVX2 CPU too.
REDUCED = "eager+fusions int8 dynamic per-channel, reduce_range (7-bit)"
# uint8 weights: MLAS's U8U8 kernels widen to int16 (vpmaddwd) on AVX2, so they cannot saturate either; its
# integer sums are exact on every kernel, so its accuracy here is its accuracy on an AVX2 CPU.
U8U8 = "eager+fusions int8 dynamic per-channel, u8u8 (uint8 weights)"
# pair-bounded 8-bit weights (softdeploy.quant.pair_bounded): what softdeploy.quant.formats chooses without VNNI. No
# same-sign pair of products can saturate vpmaddubsw, so its accuracy here is its accuracy on an AVX2 CPU too.
PAIRED = "eager+fusions int8 dynamic per-channel, pair-bounded 8-bit"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100 queries, fewer variants and rounds")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument(
        "--only", type=harness.str_list, default=[], help="variant-label substrings to run (plus their fp32 graphs)"
    )
    harness.add_emulate_avx2(p)
    args = p.parse_args()

    case = get_case("minilm_retrieval", quick=args.quick)
    case.prepare(SilentProgress())
    tmp = Path(tempfile.mkdtemp(prefix="minilm-int8-options-"))
    graphs = {
        "sdpa": export(case, "sdpa", tmp / "sdpa.onnx", fuse=False),
        "eager": export(case, "eager", tmp / "eager.onnx", fuse=False),
        "eager+fusions": export(case, "eager", tmp / "fused.onnx", fuse=True),
    }
    fused = graphs["eager+fusions"]
    proto = load_named(fused)
    ffn_down = [
        n for n, _ in candidate_nodes(proto, QuantConfig("static")) if STATIC_FLOAT_SCOPE.search(node_scope(proto, n))
    ]
    cal = case.calibration_feeds()
    caches = {m: tmp / f"ranges_{m}.json" for m in ("minmax", "percentile", "entropy")}

    # (label, graph, config or None for fp32)
    variants: list[tuple[str, str, QuantConfig | None]] = []
    for g in graphs:
        variants += [
            (f"{g} fp32", g, None),
            (f"{g} int8 dynamic per-channel", g, QuantConfig("dynamic", weights="8-bit")),
        ]
    variants += [
        (PAIRED, "eager+fusions", QuantConfig("dynamic", weights="pair-bounded")),
        (REDUCED, "eager+fusions", QuantConfig("dynamic", weights="7-bit")),
        (U8U8, "eager+fusions", QuantConfig("dynamic")),
        ("eager+fusions int8 dynamic per-tensor", "eager+fusions", QuantConfig("dynamic", per_channel=False)),
        (ATTENTION_TOO, "eager+fusions", QuantConfig("dynamic")),
        ("static minmax, all int8", "eager+fusions", QuantConfig("static")),
        ("static entropy, all int8", "eager+fusions", QuantConfig("static", calibrate_method="entropy")),
        ("static percentile, all int8", "eager+fusions", QuantConfig("static", calibrate_method="percentile")),
        (
            "static percentile, layer-0 FFN down in float",
            "eager+fusions",
            QuantConfig("static", calibrate_method="percentile", exclude=tuple(ffn_down[:1])),
        ),
        (
            "static percentile, layers 0, 4, 5 FFN down in float",
            "eager+fusions",
            QuantConfig("static", calibrate_method="percentile", exclude=(ffn_down[0], ffn_down[4], ffn_down[5])),
        ),
        (
            "static minmax, all 6 FFN down in float",
            "eager+fusions",
            QuantConfig("static", exclude=tuple(ffn_down)),
        ),
        (
            "static percentile, all 6 FFN down in float (default)",
            "eager+fusions",
            QuantConfig("static", calibrate_method="percentile", exclude=tuple(ffn_down)),
        ),
    ]
    if args.quick:
        variants = [v for v in variants if "percentile" not in v[0] or "default" in v[0]]
    if args.only:
        variants = [
            v for v in variants if v[0] == "sdpa fp32" or v[0] == f"{v[1]} fp32" or any(s in v[0] for s in args.only)
        ]
        wanted = {v[1] for v in variants if v[2] is not None} | {"sdpa"}
        variants = [v for v in variants if v[1] in wanted]

    paths: dict[str, Path] = {}
    for label, g, config in variants:
        if config is None:
            paths[label] = graphs[g]
            continue
        out = tmp / (re.sub(r"[^a-z0-9]+", "_", label) + ".onnx")
        if label == ATTENTION_TOO:
            paths[label] = quantize_attention_too(graphs[g], out)
            continue
        if label == U8U8:
            paths[label] = quantize_u8u8(graphs[g], out)
            continue
        kw: dict[str, Any] = {}
        if config.mode == "static":
            kw = {"calibration": cal, "calibration_cache": caches[config.calibrate_method]}
        result = quantize(graphs[g], out, config, **kw)
        if config.weights is not None and result.weights != config.weights:  # a fallback would mislabel the row
            raise SystemExit(f"{label}: quantized with {result.weights} weights ({result.int8_format})")
        paths[label] = result.path

    evals = {
        label: case.evaluate(Session(path, threads=2).run, "native", SilentProgress(), label)
        for label, path in paths.items()
    }

    feeds = case.latency_feeds()
    sessions = {label: Session(path, threads=1) for label, path in paths.items()}
    meter = LoadMeter().start()
    stats, _ = measure_interleaved(
        {label: (lambda s=s: s.run(feeds)) for label, s in sessions.items()}, rounds=args.rounds, round_seconds=0.3
    )
    load = meter.stop()

    env = environment(1)
    from softdeploy.quant.formats import format_lines

    print("# all-MiniLM-L6-v2: int8 options (bench/minilm_int8_options.py)\n")
    print(f"- {harness.cpuid_note()}")
    for line in format_lines():
        print(f"- int8 format, {line}")
    print(
        f"- CPU: {env['cpu']} ({env['cores']} cores), 1 thread, batch 1 x {case.latency_seq} tokens; "
        f"background load while timing: {load:.2f} cores"
    )
    print(
        f"- data: {len(case.data.queries)} queries, {len(case.data.corpus)} documents; reference for each row: "
        "the fp32 of its graph\n"
    )
    rows = []
    for label, g, _ in variants:
        ref_label = f"{g} fp32"
        ref, ev = evals[ref_label], evals[label]
        st, rs = stats[label], stats[ref_label]
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
                f"{stats['sdpa fp32'].cpu_p50_ms / st.cpu_p50_ms:.2f}",
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
                "CPU speed-up vs sdpa fp32",
            ],
            rows,
        )
    )


def quantize_u8u8(src: Path, out: Path) -> Path:
    """Dynamic int8 per channel with uint8 weights (onnxruntime's U8U8 kernels), attention MatMuls in float."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    named = out.with_suffix(".named.onnx")
    onnx.save(load_named(src), named)
    quantize_dynamic(named, out, weight_type=QuantType.QUInt8, per_channel=True, reduce_range=False)
    return out


def quantize_attention_too(src: Path, out: Path) -> Path:
    """Dynamic int8 with the activation x activation MatMuls (attention scores, attention x values)
    quantized as well (onnxruntime's MatMulConstBOnly=False)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    named = out.with_suffix(".named.onnx")
    onnx.save(load_named(src), named)
    quantize_dynamic(
        named,
        out,
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=False,
        op_types_to_quantize=["MatMul"],
        extra_options={"MatMulConstBOnly": False},
    )
    return out


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
