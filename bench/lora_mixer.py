"""LoRAMixer (fp32) -- softdeploy's SGMV-style kernel against its own function body on stock onnxruntime.

    python -m bench.lora_mixer [--N 1,128,2048] [--top-k 1,2] [--threads 1,2] [--quick]

Shape of the issue: N tokens x in = out = 384 (MiniLM's hidden size), E = 8 experts of rank r = 8.
Peers, all in the same interleaved rounds (A B C A B C ..., rotated each round; medians):
  lora_mixer       com.softdeploy LoRAMixer, our native kernel in onnxruntime (route, group tokens by
                   expert, A_e x and Bm_e u for the selected experts only)
  ort_body         softdeploy's function body in stock onnxruntime (library not registered): the dense
                   form in two GEMMs over all E experts (X A_all^T, then (U * gates) Bm_all) plus the
                   router's MatMul, TopK, Softmax-like gates and ScatterElements -- what an export without
                   softdeploy's library runs
  torch_dense      the same dense form in eager torch (softdeploy::lora_mixer's eager implementation)
  base_matmul      onnxruntime's MatMul X [N, in] x W [in, out]: the base projection the delta is added
                   to, the yardstick of what the routed delta costs on top of a projection
  avx2             lora_mixer forced to its AVX2 variant (SOFTDEPLOY_ISA=avx2); `body/avx2` = ort_body time /
                   avx2 time (issue 13's floor: >= 1 at every shape)
  *_bound          lora_mixer and ort_body through Session.bind (inputs and outputs bound once)
Floor of the issue (1 thread, medians): lora_mixer >= 3x faster than ort_body at N = 128, top_k in {1, 2}.
"""

from __future__ import annotations

from bench.harness import (
    Avx2VsBody,
    avx2_session,
    base_parser,
    fmt_num,
    header,
    int_list,
    md_table,
    quiet_bench,
    sync_print,
    threads,
    wait_quiet,
)

# isort: split
import numpy as np

IN = OUT = 384
E, R = 8, 8
PEERS = ["lora_mixer", "avx2", "ort_body", "torch_dense", "base_matmul", "lora_mixer_bound", "ort_body_bound"]


def make_peers(n: int, top_k: int, nt: int, rng: np.random.Generator) -> tuple[dict, bool]:
    import torch
    from onnx import TensorProto, helper

    from softdeploy.ops import REGISTRY, Sample
    from softdeploy.ops._torch import torch_op
    from softdeploy.ops.lora_mixer import make_case
    from softdeploy.runtime import Session

    op = REGISTRY["LoRAMixer"]
    x, a, bm, router = make_case(rng, (n,), IN, OUT, E, R)
    # signed experts and a router spreading the tokens over the experts, as trained ones do
    a = (rng.standard_normal(a.shape) / np.sqrt(IN)).astype(np.float32)
    bm = (rng.standard_normal(bm.shape) / np.sqrt(R)).astype(np.float32)
    sample = Sample("bench", (x, a, bm, router), {"top_k": top_k})
    model = op.make_model(sample, outputs=1)  # Delta only: what a routed projection reads
    feeds = op.feeds(sample)
    ours = Session(model, kernels="native", threads=nt)
    body = Session(model, kernels="portable", threads=nt)
    avx2 = avx2_session(model, nt)
    w = helper.make_tensor_value_info("W", TensorProto.FLOAT, [IN, OUT])
    xi = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", IN])
    yo = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", OUT])
    mm = helper.make_model(
        helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "mm", [xi, w], [yo]),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=10,
    )
    base = Session(mm, kernels="portable", threads=nt)
    mm_feeds = {"X": x, "W": rng.standard_normal((IN, OUT)).astype(np.float32)}
    tt = [torch.from_numpy(v) for v in (x, a, bm, router)]
    mixer = torch_op(op)
    want = op.reference(x, a, bm, router, top_k=top_k)[0]
    scale = np.abs(want).max()
    ok = all(
        np.max(np.abs(out - want)) <= 1e-4 * scale
        for out in (ours.run(feeds)[0], avx2.run(feeds)[0], body.run(feeds)[0])
    )
    return {
        "lora_mixer": lambda: ours.run(feeds),
        "avx2": lambda: avx2.run(feeds),
        "ort_body": lambda: body.run(feeds),
        "torch_dense": lambda: mixer(*tt, top_k=top_k),
        "base_matmul": lambda: base.run(mm_feeds),
        "lora_mixer_bound": ours.bind(feeds),
        "ort_body_bound": body.bind(feeds),
    }, ok


def main() -> None:
    p = base_parser(__doc__)
    p.add_argument("--N", type=int_list, default=[1, 128, 2048], help="tokens per call")
    p.add_argument("--top-k", type=int_list, default=[1, 2])
    args = p.parse_args()
    rounds = 5 if args.quick else args.rounds
    header("LoRAMixer")
    Avx2VsBody.print_variant()
    vs_body = Avx2VsBody("LoRAMixer")
    rng = np.random.default_rng(0)
    rows, floors = [], []
    for nt in args.threads:
        bg = wait_quiet(args.quiet_wait)
        sync_print(f"- {nt} thread(s): other processes' load before block: {bg:.2f} cores")
        for n in args.N:
            for k in args.top_k:
                with threads(nt):
                    peers, ok = make_peers(n, k, nt, rng)
                    t, bgc = quiet_bench(peers, rounds=rounds, batch_ms=args.batch_ms, max_tries=args.tries)
                run_ratio = t["ort_body"].median / t["lora_mixer"].median
                bound_ratio = t["ort_body_bound"].median / t["lora_mixer_bound"].median
                vs_base = t["lora_mixer"].median / t["base_matmul"].median
                rows.append(
                    [str(nt), str(n), str(k)]
                    + [fmt_num(t[name].median * 1e6) for name in PEERS]
                    + [
                        f"{run_ratio:.1f}x",
                        f"{bound_ratio:.1f}x",
                        vs_body.add(f"{nt} thr N={n} top_k={k}", t["ort_body"].median, t["avx2"].median),
                        f"{vs_base:.2f}",
                        f"{max(t[name].spread for name in PEERS):.0%}",
                        f"{bgc:.1f}",
                        "ok" if ok else "MISMATCH",
                    ]
                )
                if nt == 1 and n == 128:
                    floors.append((k, run_ratio, bound_ratio))
                sync_print(f"  done nt={nt} N={n} top_k={k}: {run_ratio:.1f}x body (run), {bound_ratio:.1f}x (bound)")
    sync_print(
        "\nTimes in microseconds per call (median). `body/mixer` = ort_body time / lora_mixer time (floor >= 3x at "
        "N = 128, 1 thread); `mixer/base` = lora_mixer time / base_matmul time (the routed delta's cost relative "
        "to the projection it is added to).\n"
    )
    sync_print(
        md_table(
            [
                "thr",
                "N",
                "top_k",
                *PEERS,
                "run: body/mixer",
                "bound: body/mixer",
                "body/avx2",
                "mixer/base",
                "max spread",
                "bg load",
                "check",
            ],
            rows,
        )
    )
    vs_body.print_summary()
    if floors:
        sync_print("\nFloor (1 thread, N = 128): lora_mixer >= 3x faster than its function body on stock onnxruntime:")
        for k, run_ratio, bound_ratio in floors:
            verdict = "met" if min(run_ratio, bound_ratio) >= 3.0 else "NOT met"
            sync_print(f"- top_k = {k}: run {run_ratio:.1f}x, bound {bound_ratio:.1f}x -- {verdict}")


if __name__ == "__main__":
    main()
