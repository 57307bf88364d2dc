"""SoftmaxTopK (softdeploy) against the peers doing Softmax + TopK with stock ops, in the same run.

    python -m bench.softmax_topk [--B 1,64] [--V 1000,32000,128000,256000] [--k 1,5,50] [--threads 1,2] [--quick]

Started from shared/notes/perf/softmax_topk.py. All produce the k largest probabilities + int64 indices:
  softdeploy        com.softdeploy SoftmaxTopK kernel (best ISA of this CPU) in onnxruntime, 2 outputs
  softdeploy_avx2   the same kernel forced to its AVX2 variant (SOFTDEPLOY_ISA=avx2; the variant it
                    runs is printed in the header)
  ort_body          SoftmaxTopK's standard-ONNX function body in stock onnxruntime (library not
                    registered): what a user without the native kernel gets
  ort_sm_topk       ONNX Softmax(axis=-1) -> TopK
  ort_topk_lse      ONNX TopK(x) ; ReduceLogSumExp(x) ; Exp(vals - lse)
  ort_topk_gather   ONNX TopK(x) ; Softmax(x) ; GatherElements(P, idx)
  torch_sm_topk     torch.softmax -> torch.topk
  torch_topk_lse    torch.topk(x) ; exp(vals - torch.logsumexp(x))
  numpy             max, exp, sum + argpartition/argsort (argmax for k=1)
Floors in the same run: floor_amax = torch.amax (read the input once), floor_ort_rmax = ORT ReduceMax
(read once + the cost of an onnxruntime session.run call, which our kernel pays too).
GB/s = B*V*4 bytes / time; %DRAM against the in-run DRAM read bandwidth (torch.amax on 256 MB); the
same for softdeploy_avx2, with its ratio to the read-once floor and its speedup over ort_body (the issue 13
floors: >= 70% of DRAM read at 64 x 256000, <= 3x floor_amax at 64 x 32000, never slower than the body).
"""

from __future__ import annotations

import numpy as np

from bench.harness import (
    Avx2VsBody,
    avx2_variant,
    base_parser,
    fmt_num,
    header,
    int_list,
    md_table,
    quiet_bench,
    stream_yardsticks,
    sync_print,
    threads,
    wait_quiet,
)

OPSET = 18
PEERS = ["ort_body", "ort_sm_topk", "ort_topk_lse", "ort_topk_gather", "torch_sm_topk", "torch_topk_lse", "numpy"]
OURS = ["softdeploy", "softdeploy_avx2"]
FLOORS = ["floor_amax", "floor_ort_rmax"]


def build_models(k: int) -> dict[str, bytes]:
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", "V"])
    p = helper.make_tensor_value_info("P", TensorProto.FLOAT, ["B", k])
    i = helper.make_tensor_value_info("I", TensorProto.INT64, ["B", k])
    kk = numpy_helper.from_array(np.array([k], np.int64), "K")
    ax = numpy_helper.from_array(np.array([-1], np.int64), "AX")

    def mk(nodes, inits, outs=(p, i)) -> bytes:
        g = helper.make_graph(nodes, "g", [x], list(outs), initializer=inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)]).SerializeToString()

    node = helper.make_node
    r = helper.make_tensor_value_info("R", TensorProto.FLOAT, ["B", 1])
    return {
        "ort_sm_topk": mk(
            [
                node("Softmax", ["X"], ["S"], axis=-1),
                node("TopK", ["S", "K"], ["P", "I"], axis=-1, largest=1, sorted=1),
            ],
            [kk],
        ),
        "ort_topk_lse": mk(
            [
                node("TopK", ["X", "K"], ["Vv", "I"], axis=-1, largest=1, sorted=1),
                node("ReduceLogSumExp", ["X", "AX"], ["L"], keepdims=1),
                node("Sub", ["Vv", "L"], ["D"]),
                node("Exp", ["D"], ["P"]),
            ],
            [kk, ax],
        ),
        "ort_topk_gather": mk(
            [
                node("TopK", ["X", "K"], ["Vv", "I"], axis=-1, largest=1, sorted=1),
                node("Softmax", ["X"], ["S"], axis=-1),
                node("GatherElements", ["S", "I"], ["P"], axis=-1),
            ],
            [kk],
        ),
        "floor_ort_rmax": mk([node("ReduceMax", ["X", "AX"], ["R"], keepdims=1)], [ax], outs=(r,)),
    }


def numpy_softmax_topk(x: np.ndarray, k: int):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    if k == 1:
        idx = e.argmax(axis=-1)[:, None]
    else:
        part = np.argpartition(e, -k, axis=-1)[:, -k:]
        order = np.argsort(-np.take_along_axis(e, part, axis=-1), axis=-1, kind="stable")
        idx = np.take_along_axis(part, order, axis=-1)
    return np.take_along_axis(e, idx, axis=-1) / s, idx


def ours_model(x: np.ndarray, k: int):
    """The SoftmaxTopK model, function body attached (the native kernel replaces it where registered)."""
    from softdeploy.ops import REGISTRY, Sample

    return REGISTRY["SoftmaxTopK"].make_model(Sample("bench", (x,), {"k": k}), outputs=2)


def ours_session(x: np.ndarray, k: int, nt: int, isa: str | None):
    from softdeploy.conformance import forced_isa
    from softdeploy.runtime import Session

    with forced_isa(isa):
        return Session(ours_model(x, k), kernels="native", threads=nt)


def make_peers(x_np: np.ndarray, k: int, nt: int, models: dict):
    import torch

    xt = torch.from_numpy(x_np)
    from softdeploy.runtime import Session

    # every onnxruntime contender through the same call path as ours (softdeploy.runtime.Session.run)
    sess = {name: Session(mb, kernels="portable", threads=nt) for name, mb in models.items()}
    ours = ours_session(x_np, k, nt, None)
    ours_avx2 = ours_session(x_np, k, nt, "avx2")
    body = Session(ours_model(x_np, k), kernels="portable", threads=nt)
    feeds = {"X": x_np}

    def torch_topk_lse():
        v, i = torch.topk(xt, k, dim=-1)
        return torch.exp(v - torch.logsumexp(xt, dim=-1, keepdim=True)), i

    return {
        "softdeploy": lambda: ours.run(feeds),
        "softdeploy_avx2": lambda: ours_avx2.run(feeds),
        "ort_body": lambda: body.run(feeds),
        "ort_sm_topk": lambda: sess["ort_sm_topk"].run(feeds),
        "ort_topk_lse": lambda: sess["ort_topk_lse"].run(feeds),
        "ort_topk_gather": lambda: sess["ort_topk_gather"].run(feeds),
        "torch_sm_topk": lambda: torch.topk(torch.softmax(xt, dim=-1), k, dim=-1),
        "torch_topk_lse": torch_topk_lse,
        "numpy": lambda: numpy_softmax_topk(x_np, k),
        "floor_amax": lambda: torch.amax(xt, dim=-1),
        "floor_ort_rmax": lambda: sess["floor_ort_rmax"].run(feeds),
    }


def check(peers) -> list[str]:
    """Every peer and our kernel agree on the probabilities (and on the indices up to ties; masked
    entries, probability 0, may come in any order)."""
    ref_p, ref_i = (np.asarray(a) for a in peers["torch_sm_topk"]())
    bad = []
    for name in OURS + [p for p in PEERS if p != "torch_sm_topk"]:
        out = peers[name]()
        p, i = np.asarray(out[0]), np.asarray(out[1])
        if not np.allclose(p, ref_p, rtol=1e-4, atol=1e-7):
            bad.append(f"{name}: probs differ (max abs {np.abs(p - ref_p).max():.2e})")
        elif (differ := (i != ref_i)[ref_p > 0].mean()) > 0.01:  # (probability 0: -inf ties, any order)
            bad.append(f"{name}: {differ:.1%} indices differ")
    return bad


def main() -> None:
    p = base_parser(__doc__ or "")
    p.add_argument("--B", type=int_list, default=[1, 64])
    p.add_argument("--V", type=int_list, default=[1000, 32000, 128000, 256000])
    p.add_argument("--k", type=int_list, default=[1, 5, 50])
    p.add_argument(
        "--masked",
        type=float,
        default=0.0,
        help="fraction of each row set to -inf, the first 64 entries always among them (a constrained-decoding "
        "mask: such rows once left the kernel's fast path)",
    )
    args = p.parse_args()
    rounds = 5 if args.quick else args.rounds
    header("SoftmaxTopK vs Softmax + TopK peers")
    sync_print(f"- softdeploy_avx2 kernel variant: {avx2_variant()}")
    vs_body = Avx2VsBody("SoftmaxTopK")
    rng = np.random.default_rng(0)
    rows = []
    for nt in args.threads:
        bg = wait_quiet(args.quiet_wait)
        ys = stream_yardsticks(nt)
        sync_print(
            f"- {nt} thread(s): in-run DRAM bandwidth (torch, 256 MB): read {ys['read_GBs']:.1f} GB/s, "
            f"copy {ys['copy_GBs']:.1f} GB/s (bg load {ys['bg']:.1f}); other processes' load before block: {bg:.2f} cores"
        )
        for k in args.k:
            models = build_models(k)
            for b in args.B:
                for v in args.V:
                    if k > v:
                        continue
                    x = rng.standard_normal((b, v), dtype=np.float32) * 2.0  # logits-like, N(0, 2^2)
                    if args.masked > 0:
                        x[rng.random((b, v)) < args.masked] = -np.inf
                        x[:, :64] = -np.inf
                    with threads(nt):
                        peers = make_peers(x, k, nt, models)
                        bad = check(peers)
                        t, bgc = quiet_bench(peers, rounds=rounds, batch_ms=args.batch_ms, max_tries=args.tries)
                    best = min(PEERS, key=lambda n: t[n].median)
                    ours = t["softdeploy"].median
                    gbs = b * v * 4 / ours / 1e9
                    avx2 = t["softdeploy_avx2"].median
                    gbs2 = b * v * 4 / avx2 / 1e9
                    rows.append(
                        [nt, b, v, k]
                        + [fmt_num(t[n].median * 1e6) for n in OURS + PEERS + FLOORS]
                        + [
                            best,
                            f"**{t[best].median / ours:.1f}x**",
                            f"{ours / t['floor_amax'].median:.2f}",
                            f"{ours / t['floor_ort_rmax'].median:.2f}",
                            fmt_num(gbs),
                            f"{gbs / ys['read_GBs']:.0%}",
                            f"{gbs2 / ys['read_GBs']:.0%}",
                            f"{avx2 / t['floor_amax'].median:.2f}",
                            vs_body.add(f"{nt} thr {b}x{v} k={k}", t["ort_body"].median, avx2),
                            f"{max(t[n].spread for n in OURS + PEERS):.0%}",
                            f"{bgc:.1f}",
                            "; ".join(bad) if bad else "ok",
                        ]
                    )
                    sync_print(
                        f"  done nt={nt} k={k} B={b} V={v}: softdeploy {ours * 1e6:.1f} us, best peer {best} "
                        f"{t[best].median * 1e6:.1f} us, floor_amax {t['floor_amax'].median * 1e6:.1f} us"
                    )
    sync_print(
        "\nTimes in microseconds per call (median). speedup = best peer / softdeploy; x floor = softdeploy / floor. "
        "bg load = CPU cores used by other processes while the configuration was measured (shared machine).\n"
    )
    sync_print(
        md_table(
            [
                "thr",
                "B",
                "V",
                "k",
                *OURS,
                *PEERS,
                *FLOORS,
                "best peer",
                "speedup vs best",
                "x floor_amax",
                "x floor_ort_rmax",
                "GB/s",
                "%DRAM rd",
                "avx2 %DRAM rd",
                "avx2 x floor_amax",
                "avx2 vs body",
                "max spread",
                "bg load",
                "check",
            ],
            rows,
        )
    )
    vs_body.print_summary()


if __name__ == "__main__":
    main()
