"""Each int8 format of all-MiniLM-L6-v2 on each CPU class this host can present: encode speed vs fp32 and cosine.

    python -m bench.int8_matrix [--work DIR] [--rounds 6] [--sentences 64] [--classes a,b]

Formats (each quantized once, on this host, into --work; a second run with the same --work reuses them):
  rowwise-8-bit    `quantize --target vnni` (dynamic): RowwiseInt8MatMul, 8-bit rows, plain 8-bit weights
  lane-bounded     `quantize --target portable` (dynamic) = `--target avx2`: RowwiseInt8MatMul, 7-bit rows,
                   weights bounded per int16 lane
  pair-bounded QDQ `quantize --mode static --target portable`: QDQ, the case's static settings (percentile
                   calibration, FFN down-projections in float), pair-bounded weights
  ort default      onnxruntime's quantize_dynamic, 8-bit per-channel weights (`--weights 8-bit`)
  ort reduce_range onnxruntime's quantize_dynamic, 7-bit weights (`--weights 7-bit`)
all from the same fp32 graph (the case's export, BERT fusions), which every class also runs as the reference.

CPU classes (each timed in a fresh subprocess; the formats' rounds interleaved within it):
  native           this host's CPUID
  shim avx2        bench/cpuid_avx2.c: every library (onnxruntime's MLAS, softdeploy's kernels) sees an AVX2-only
                   CPU without VNNI (Zen 3's instruction set on this host's core)
  test-cpu avx2    SOFTDEPLOY_TEST_CPU=avx2: softdeploy's kernels run their AVX2 variant without VNNI; onnxruntime
                   still runs this host's own kernels
  shim no-vnni     bench/cpuid_avx2.c with SD_CPUID_MASK=vnni: an AVX-512 CPU without VNNI (Skylake-SP's instruction
                   set)
Speed: batch 1 x 128 tokens, 1 thread, through softdeploy.runtime.Session, median of interleaved rounds, as x fp32
of the same class and run. Accuracy: mean token and sentence cosine to the class's fp32 over --sentences queries.
Prints markdown (bench/results/int8_matrix.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

FORMATS: dict[str, str] = {
    "rowwise-8-bit": "dynamic --target vnni",
    "lane-bounded": "dynamic --target portable",
    "pair-bounded QDQ": "static --target portable",
    "ort default": "dynamic --weights 8-bit",
    "ort reduce_range": "dynamic --weights 7-bit",
}

CLASSES: dict[str, str] = {
    "native": "this host's CPUID",
    "shim avx2": "CPUID shim: AVX2-only, no VNNI (every library)",
    "test-cpu avx2": "SOFTDEPLOY_TEST_CPU=avx2 (softdeploy's kernels only)",
    "shim no-vnni": "CPUID shim: AVX-512 without VNNI (every library)",
}


@dataclasses.dataclass
class Cell:
    """One format on one class."""

    speedup: float  # fp32 median / this median, same class and rounds
    ms: float
    token_cos: float
    sentence_cos: float
    path: str  # what its int8 nodes run here
    warned: str  # Session's SoftdeployWarning, if any


def prepare(work: Path, sentences: int) -> dict[str, Path]:
    """Exports the fp32 graph and quantizes each format into ``work`` (reusing what is there); writes the feeds."""
    from softdeploy.models import get_case
    from softdeploy.progress import SilentProgress
    from softdeploy.quant import QuantConfig, quantize

    work.mkdir(parents=True, exist_ok=True)
    paths = {"fp32": work / "fp32.onnx"} | {f: work / (f.replace(" ", "_") + ".onnx") for f in FORMATS}
    feeds_file = work / "feeds.npz"
    if all(p.is_file() for p in paths.values()) and feeds_file.is_file():
        return paths
    case = get_case("minilm_retrieval", quick=True)
    case.prepare(SilentProgress())
    if not paths["fp32"].is_file():
        case.export_fp32(paths["fp32"], fuse=True)
    static = dataclasses.replace(case.static_config(paths["fp32"]), target="portable")
    configs = {
        "rowwise-8-bit": QuantConfig("dynamic", target="vnni"),
        "lane-bounded": QuantConfig("dynamic", target="portable"),
        "pair-bounded QDQ": static,
        "ort default": QuantConfig("dynamic", weights="8-bit"),
        "ort reduce_range": QuantConfig("dynamic", weights="7-bit"),
    }
    for name, config in configs.items():
        if paths[name].is_file():
            continue
        kw: dict[str, Any] = {"calibration": case.calibration_feeds()} if config.mode == "static" else {}
        q = quantize(paths["fp32"], paths[name], config, **kw)
        print(f"quantized {name}: {q.weights}, {q.seconds:.0f} s", file=sys.stderr)
    texts = case.data.queries[:sentences]
    batches = case._batches(texts)
    arrays: dict[str, np.ndarray] = {f"{k}_latency": v for k, v in case.latency_feeds().items()}
    for i, (_, feeds) in enumerate(batches):
        arrays |= {f"{k}_{i}": v for k, v in feeds.items()}
    np.savez(feeds_file, **arrays)
    return paths


def worker(work: Path, rounds: int, out: Path) -> None:
    """Runs in the class's subprocess: cosine and interleaved timings of fp32 and every format; JSON to ``out``."""
    import warnings

    import onnx

    from softdeploy.compare.latency import measure_interleaved
    from softdeploy.quant.formats import int8_cpu_class, model_int8_lines
    from softdeploy.runtime import Session, library_status

    if os.environ.get("SD_BENCH_SHIM"):
        import ctypes

        try:
            active = ctypes.CDLL(None).cpuid_avx2_active()
        except AttributeError:
            active = 0
        if active != 1:
            raise SystemExit("the CPUID shim is not active in the worker")
    data = np.load(work / "feeds.npz")
    latency = {k: data[f"{k}_latency"] for k in ("input_ids", "attention_mask")}
    n = sum(1 for k in data.files if k.startswith("input_ids_") and k != "input_ids_latency")
    batches = [{k: data[f"{k}_{i}"] for k in ("input_ids", "attention_mask")} for i in range(n)]
    names = ["fp32", *FORMATS]
    sessions: dict[str, Session] = {}
    warned: dict[str, str] = {}
    for name in names:
        path = work / ("fp32.onnx" if name == "fp32" else name.replace(" ", "_") + ".onnx")
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            sessions[name] = Session(path, threads=1)
        warned[name] = "; ".join(str(r.message) for r in rec if "lane bound" in str(r.message))
    paths = {
        name: "; ".join(model_int8_lines(onnx.load(work / (name.replace(" ", "_") + ".onnx")))[1:]) for name in FORMATS
    }
    ref = [sessions["fp32"].run(f)[:2] for f in batches]
    cos: dict[str, tuple[float, float]] = {}
    for name in FORMATS:
        tok, sen = [], []
        for f, (rt, rs) in zip(batches, ref, strict=True):
            t, s = sessions[name].run(f)[:2]
            mask = f["attention_mask"].astype(bool)
            a, b = t[mask], rt[mask]
            tok += list((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))
            sen += list((s * rs).sum(1) / (np.linalg.norm(s, axis=1) * np.linalg.norm(rs, axis=1)))
        cos[name] = (float(np.mean(tok)), float(np.mean(sen)))
    stats, load = measure_interleaved(
        {name: (lambda s=sessions[name]: s.run(latency)) for name in names}, rounds=rounds, round_seconds=0.3
    )
    info = library_status().info
    ms = {name: stats[name].p50_ms for name in names}
    result = {
        "class": int8_cpu_class(),
        "variant": info.isa_summary() if info else "no library",
        "load": load,
        "fp32_ms": ms["fp32"],
        "cells": {
            name: dataclasses.asdict(
                Cell(ms["fp32"] / ms[name], ms[name], cos[name][0], cos[name][1], paths[name], warned[name])
            )
            for name in FORMATS
        },
    }
    out.write_text(json.dumps(result))


def class_env(name: str, shim: Path) -> dict[str, str]:
    """The environment of the class's subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in ("SOFTDEPLOY_TEST_CPU", "SOFTDEPLOY_ISA", "SD_CPUID_MASK")}
    if name.startswith("shim"):
        env["LD_PRELOAD"] = " ".join(x for x in (env.get("LD_PRELOAD", ""), str(shim)) if x)
        env["SD_BENCH_SHIM"] = "1"
        if name == "shim no-vnni":
            env["SD_CPUID_MASK"] = "vnni"
    if name == "test-cpu avx2":
        env["SOFTDEPLOY_TEST_CPU"] = "avx2"
    return env


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, help="folder for the models and feeds (reused; default: a new temp folder)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--sentences", type=int, default=64, help="queries for the cosines")
    p.add_argument("--classes", default=",".join(CLASSES), help="comma-separated, from: " + ", ".join(CLASSES))
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--report-only", action="store_true", help="print the markdown of the classes timed in --work")
    args = p.parse_args()
    if args.worker:
        worker(args.work, args.rounds, args.worker)
        return
    if args.report_only:
        names = [n for n in args.classes.split(",") if (args.work / f"class_{n.replace(' ', '_')}.json").is_file()]
        report({n: json.loads((args.work / f"class_{n.replace(' ', '_')}.json").read_text()) for n in names}, args, 0)
        return
    t0 = time.time()
    work = args.work or Path(tempfile.mkdtemp(prefix="int8-matrix-"))
    with contextlib.redirect_stdout(sys.stderr):  # onnxruntime's calibrator prints its progress
        prepare(work, args.sentences)
    shim = work / "cpuid_avx2.so"
    src = Path(__file__).resolve().parent / "cpuid_avx2.c"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src), "-o", str(shim), "-ldl"], check=True)
    results: dict[str, Any] = {}
    for name in args.classes.split(","):
        out = work / f"class_{name.replace(' ', '_')}.json"
        cmd = [sys.executable, __file__, "--work", str(work), "--rounds", str(args.rounds), "--worker", str(out)]
        done = subprocess.run(cmd, env=class_env(name, shim), capture_output=True, text=True)
        if done.returncode != 0:
            results[name] = {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
            continue
        results[name] = json.loads(out.read_text())
    report(results, args, time.time() - t0)


def report(results: dict[str, Any], args: argparse.Namespace, seconds: float) -> None:
    """The markdown."""
    from bench.harness import md_table
    from softdeploy.cpu import cpuinfo

    print("# int8 format x CPU class: all-MiniLM-L6-v2 (bench/int8_matrix.py)\n")
    name, flags = cpuinfo()
    isa = [f for f in ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx_vnni") if f in flags]
    print(
        f"- host: {name} ({os.cpu_count()} cores as this process sees them; flags: {' '.join(isa)}); 1 thread, batch "
        "1 x 128 tokens, through softdeploy.runtime.Session"
    )
    print(
        f"- command: `python -m bench.int8_matrix --rounds {args.rounds} --sentences {args.sentences}`"
        + (f" ({seconds:.0f} s, the quantization included)" if seconds else "")
    )
    print("- formats: " + "; ".join(f"{k} (`quantize --mode {v}`)" for k, v in FORMATS.items()))
    print("- speed: fp32 median / format median, same class, same interleaved rounds; cosine: token / sentence to fp32")
    for name, r in results.items():
        print(f"\n## {name}: {CLASSES[name]}\n")
        if "error" in r:
            print(f"not run: {r['error']}")
            continue
        print(
            f"class {r['class']}; kernel variant {r['variant']}; fp32 {r['fp32_ms']:.1f} ms; "
            f"background load {r['load']:.2f} cores\n"
        )
        best = max(c["speedup"] for c in r["cells"].values())
        rows = [
            [
                fmt,
                f"{c['speedup']:.2f}x",
                f"{c['speedup'] / best:.0%}",
                f"{c['ms']:.1f}",
                f"{c['token_cos']:.4f}",
                f"{c['sentence_cos']:.4f}",
                c["path"] or "onnxruntime",
                "yes" if c["warned"] else "",
            ]
            for fmt, c in r["cells"].items()
        ]
        print(
            md_table(
                ["format", "vs fp32", "of best", "ms", "token cos", "sentence cos", "int8 path here", "Session warns"],
                rows,
            )
        )
    print("\n## floors\n")
    for line in floors(results):
        print(f"- {line}")


def floors(results: dict[str, Any]) -> list[str]:
    """The issue's floors against the measured cells."""
    out = []

    def cell(cls: str, fmt: str) -> dict[str, Any] | None:
        r = results.get(cls, {})
        return r.get("cells", {}).get(fmt)

    for cls in ("shim avx2", "test-cpu avx2"):
        c, lane = cell(cls, "rowwise-8-bit"), cell(cls, "lane-bounded")
        if c is None or lane is None:
            continue
        out.append(
            f"{cls}: --target vnni (rowwise-8-bit) >= 1.5x fp32: {'MET' if c['speedup'] >= 1.5 else 'NOT MET'} "
            f"({c['speedup']:.2f}x; sentence cosine {c['sentence_cos']:.4f})"
        )
        out.append(
            f"{cls}: --target portable (lane-bounded) >= 1.8x fp32: {'MET' if lane['speedup'] >= 1.8 else 'NOT MET'} "
            f"({lane['speedup']:.2f}x); lane-bounded >= 1.9x: {'MET' if lane['speedup'] >= 1.9 else 'NOT MET'}"
        )
    for cls, r in results.items():
        if "cells" not in r:
            continue
        best_name, best = max(((f, c["speedup"]) for f, c in r["cells"].items()), key=lambda x: x[1])
        lane = r["cells"]["lane-bounded"]["speedup"]
        out.append(
            f"{cls}: portable within 10% of the best format: {'MET' if lane >= 0.9 * best else 'NOT MET'} "
            f"(lane-bounded {lane:.2f}x, best {best_name} {best:.2f}x)"
        )
    return out


if __name__ == "__main__":
    main()
