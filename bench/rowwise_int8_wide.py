"""RowwiseInt8MatMul on weights outside the lane bound (the rowwise-8-bit format a VNNI CPU writes) against
onnxruntime's float32 MatMul, on the CPU class this process sees, two kernel libraries in the same rounds.

    python -m bench.rowwise_int8_wide --before OLD.so --after NEW.so [--emulate-no-vnni | --emulate-avx2]
        [--threads 1] [--rounds 15] [--quick]

Peers, one-node models of Y = X W + bias at all-MiniLM-L6-v2's GEMM shapes (hidden 384, FFN 1536), W a float32
initializer, all timed in the same interleaved rounds through raw onnxruntime sessions with softdeploy's options:
  fp32             ai.onnx MatMul + Add (onnxruntime's MLAS sgemm, whatever this CPU class gives it)
  u8 <variant> <lib>  com.softdeploy RowwiseInt8MatMul in the rowwise-8-bit form (8-bit rows, plain 8-bit weights:
                   outside the vpmaddubsw lane bound) with the kernel library `lib` (before / after), its kernels
                   created under each variant this CPU runs among avx512 and avx2 (SOFTDEPLOY_ISA)
  lane avx2 after  the lane-bounded form (7-bit rows, groups 4) under the avx2 variant: what that form runs
Which tile each variant runs on this CPU: avx512 with AVX-512 VNNI the vpdpbusd zmm tile; avx512 without it the zmm
vpmaddubsw/vpmaddwd tiles; avx2 without AVX-VNNI the ymm ones. Before the widened vpmaddwd tile, weights outside the
lane bound took the scalar loops on the last two. Both libraries' outputs are checked equal (bit for bit) first.

The classes this host can present: the host's CPUID, --emulate-no-vnni (AVX-512 without VNNI) and --emulate-avx2
(an AVX2-only CPU: MLAS's fp32 then runs its AVX2 sgemm too); bench/cpuid_avx2.c. An emulated class has that class's
instruction set on this host's microarchitecture.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from bench.harness import base_parser, header, md_table, ort_session, quiet_bench, sync_print, wait_quiet

SHAPES = [(128, 384, 384), (128, 384, 1536), (128, 1536, 384), (8, 384, 1536)]


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


def variants() -> list[tuple[str, str, str]]:
    """(SOFTDEPLOY_ISA, the variant the library then selects, which tile it runs) for avx512 and avx2, without
    repeats (an AVX2-only CPU lowers avx512 to avx2)."""
    from softdeploy.conformance import forced_isa
    from softdeploy.runtime import library_status

    out: dict[str, tuple[str, str, str]] = {}
    for isa in ("avx512", "avx2"):
        with forced_isa(isa):
            info = library_status().info
        if info is not None and info.isa_selected not in out:
            vnni = (info.isa_selected == "avx512" and info.avx512_vnni) or (
                info.isa_selected == "avx2" and info.avx_vnni
            )
            out[info.isa_selected] = (isa, info.isa_selected, "VNNI tile" if vnni else "no VNNI")
    return list(out.values())


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True, help="the kernel library before the change")
    p.add_argument("--after", type=Path, required=True, help="the kernel library after it")
    p.set_defaults(threads=[1])
    args = p.parse_args()
    import onnx

    from softdeploy.conformance import forced_isa
    from softdeploy.quant.rowwise import rewrite_matmuls

    os.environ["SOFTDEPLOY_LIBRARY"] = str(args.after.resolve())  # what the header and variants() report
    header("RowwiseInt8MatMul on weights outside the lane bound vs onnxruntime float32 MatMul")
    libs = {"before": args.before.resolve(), "after": args.after.resolve()}
    sync_print(f"- libraries: before {libs['before']}, after {libs['after']}")
    runs = variants()
    sync_print(f"- variants: {'; '.join(f'SOFTDEPLOY_ISA={isa}: {sel} ({what})' for isa, sel, what in runs)}\n")
    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="rowwise-wide-bench-"))
    shapes = SHAPES[:2] if args.quick else SHAPES
    models = {}
    for _, k, n in shapes:
        if (k, n) in models:
            continue
        fp32 = fp32_model(k, n, rng)
        onnx.save(fp32, tmp / f"fp32_{k}_{n}.onnx")
        forms = {}
        for form, (levels, groups) in {"u8": (255, 0), "lane": (127, 4)}.items():
            m = onnx.load(tmp / f"fp32_{k}_{n}.onnx")
            rewrite_matmuls(m, levels=levels, groups=groups)
            forms[form] = tmp / f"{form}_{k}_{n}.onnx"
            onnx.save(m, forms[form])
        models[(k, n)] = (tmp / f"fp32_{k}_{n}.onnx", forms)
    for nt in args.threads:
        rows = []
        for m, k, n in shapes:
            fp32, forms = models[(k, n)]
            x = {"X": rng.standard_normal((m, k)).astype(np.float32)}
            sessions = {"fp32": ort_session(str(fp32), nt)}
            for isa, sel, _ in runs:
                for lib, path in libs.items():
                    with forced_isa(isa):
                        sessions[f"u8 {sel} {lib}"] = ort_session(str(forms["u8"]), nt, library=path)
            with forced_isa("avx2"):
                sessions["lane avx2 after"] = ort_session(str(forms["lane"]), nt, library=libs["after"])
            outs = {name: s.run(None, x)[0] for name, s in sessions.items() if name.startswith("u8")}
            first = next(iter(outs.values()))
            for name, y in outs.items():  # every variant and both libraries: the same bits
                np.testing.assert_array_equal(y, first, err_msg=name)
            wait_quiet(args.quiet_wait)
            fns = {name: (lambda s=s: s.run(None, x)) for name, s in sessions.items()}
            t, bg = quiet_bench(
                fns, rounds=args.rounds, batch_ms=args.batch_ms, max_tries=args.tries, wait_s=args.quiet_wait
            )
            us = {name: t[name].median * 1e6 for name in sessions}
            cells = [f"{m} x {k} x {n}", f"{us['fp32']:.0f}"]
            for _, sel, _ in runs:
                before, after = us[f"u8 {sel} before"], us[f"u8 {sel} after"]
                cells += [
                    f"{before:.0f}",
                    f"{after:.0f}",
                    f"{us['fp32'] / before:.2f}x",
                    f"**{us['fp32'] / after:.2f}x**",
                    f"{m * k * n / after / 1e3:.0f}",
                ]
            cells += [f"{us['lane avx2 after']:.0f}", f"{us['fp32'] / us['lane avx2 after']:.2f}x"]
            cells += [f"{max(t[name].spread for name in sessions):.0%}", f"{bg:.1f}"]
            rows.append(cells)
            sync_print(f"  done nt={nt} {m}x{k}x{n}")
        heads = ["M x K x N", "fp32 us"]
        for _, sel, _ in runs:
            heads += [
                f"u8 {sel} before us",
                f"u8 {sel} after us",
                f"fp32 / u8 {sel} before",
                f"fp32 / u8 {sel} after",
                f"u8 {sel} after GMAC/s",
            ]
        heads += ["lane avx2 us", "fp32 / lane avx2", "max spread", "bg load"]
        sync_print(f"\nMicroseconds per call (median of interleaved rounds), {nt} thread(s):\n")
        sync_print(md_table(heads, rows))


if __name__ == "__main__":
    main()
