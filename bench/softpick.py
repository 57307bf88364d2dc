"""Softpick (last axis, fp32) -- softdeploy's kernel against the same job done by its peers.

    python -m bench.softpick [--B 1,64] [--V 1000,32000,128000,256000] [--threads 1,2] [--quick]

Peers, all in the same interleaved rounds:
  softpick         com.softdeploy Softpick, our native kernel in onnxruntime
  avx2             the same kernel forced to its AVX2 variant (SOFTDEPLOY_ISA=avx2); `body/avx2` = ort_body
                   time / avx2 time (issue 13's floor: >= 1 at every shape)
  ort_decomposed   the authors' naive formula as standard ONNX ops in onnxruntime (what an export
                   without softdeploy gives): Where/IsNaN/IsInf masks, ReduceMax over the finite
                   entries, Exp(X - m) - Exp(-m), Abs, ReduceSum, Relu, Div
  ort_body         softdeploy's portable function body in stock onnxruntime (library not registered)
  ort_softmax      onnxruntime's Softmax on the same shape: the yardstick
  torch            the authors' formula in eager torch (allocating, as user code does)
  numpy            the same formula in numpy
  floor_copy       torch copy_ of the input into a preallocated output (read once + write once)
  floor_ort_identity  a one-node Identity model in onnxruntime (same session options): onnxruntime's own
                   per-run() cost (input binding, output allocation, a copy), which any one-node model pays;
                   ort_decomposed / floor_ort_identity is the largest ratio any Softpick kernel could reach
  *_bound          the same sessions through Session.bind: inputs and outputs bound once (onnxruntime's IO
                   binding), no per-call conversion or output allocation -- how a latency-bound caller runs
                   one shape many times
Every onnxruntime contender runs through softdeploy.runtime.Session, the same call path as ours.
Floors of the issue (1 thread, medians): softpick >= 3x faster than ort_decomposed, and softpick
<= 1.5x ort_softmax's time on the same shape.
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
    stream_yardsticks,
    sync_print,
    threads,
    wait_quiet,
)

# isort: split
import numpy as np

EPS = 1e-6
PEERS = ["softpick", "avx2", "ort_decomposed", "ort_body", "ort_softmax", "torch", "numpy"]
FLOORS = ["floor_copy", "floor_ort_identity"]
BOUND = ["softpick_bound", "ort_decomposed_bound", "ort_softmax_bound", "floor_ort_identity_bound"]
ATTENTION_SHAPE = (8, 12, 128, 128)


def onnx_models(rank: int) -> dict[str, bytes]:
    """One-node / decomposed models over an input of the given rank, reducing the last axis."""
    from onnx import TensorProto, helper

    from softdeploy.ops import REGISTRY, Sample

    dims = [f"d{i}" for i in range(rank)]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, dims)

    def const(name: str, value: float) -> object:
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.FLOAT, [], [value]))

    def model(nodes: list, opsets: list | None = None) -> bytes:
        graph = helper.make_graph(nodes, "g", [x], [y])
        opsets = opsets or [helper.make_opsetid("", 18)]
        return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()

    axes = helper.make_node("Constant", [], ["axes"], value=helper.make_tensor("axes", TensorProto.INT64, [1], [-1]))
    decomposed = [
        axes,
        const("zero", 0.0),
        const("neg_inf", float("-inf")),
        const("eps", EPS),
        helper.make_node("IsNaN", ["X"], ["is_nan"]),
        helper.make_node("IsInf", ["X"], ["is_inf"]),
        helper.make_node("Or", ["is_nan", "is_inf"], ["non_finite"]),
        helper.make_node("Where", ["non_finite", "neg_inf", "X"], ["x_masked"]),
        helper.make_node("ReduceMax", ["x_masked", "axes"], ["m"], keepdims=1),
        helper.make_node("Sub", ["X", "m"], ["x_minus_m"]),
        helper.make_node("Exp", ["x_minus_m"], ["exp_x"]),
        helper.make_node("Neg", ["m"], ["minus_m"]),
        helper.make_node("Exp", ["minus_m"], ["exp_minus_m"]),
        helper.make_node("Sub", ["exp_x", "exp_minus_m"], ["e"]),
        helper.make_node("Abs", ["e"], ["abs_e"]),
        helper.make_node("Where", ["non_finite", "zero", "abs_e"], ["abs_e_finite"]),
        helper.make_node("ReduceSum", ["abs_e_finite", "axes"], ["s"], keepdims=1),
        helper.make_node("Add", ["s", "eps"], ["d"]),
        helper.make_node("Relu", ["e"], ["num"]),
        helper.make_node("Div", ["num", "d"], ["Y"]),
    ]
    sp = REGISTRY["Softpick"]
    # symbolic dims: the sample only fixes the rank; eps is set like the peers'
    with_body = sp.make_model(Sample("bench", (np.zeros([1] * rank, np.float32),), {"eps": EPS}))
    return {
        "softpick": with_body.SerializeToString(),
        "ort_decomposed": model(decomposed),
        "ort_softmax": model([helper.make_node("Softmax", ["X"], ["Y"], axis=-1)]),
        "ort_identity": model([helper.make_node("Identity", ["X"], ["Y"])]),
    }


def numpy_softpick(x: np.ndarray) -> np.ndarray:
    finite = np.isfinite(x)
    m = np.max(np.where(finite, x, -np.inf), axis=-1, keepdims=True)
    e = np.exp(x - m) - np.exp(-m)
    return np.maximum(e, 0) / (np.sum(np.where(finite, np.abs(e), 0), axis=-1, keepdims=True) + EPS)


def torch_softpick(x):  # the authors' naive_softpick_attn.softpick, with our eps
    import torch

    m = torch.amax(torch.where(torch.isfinite(x), x, float("-inf")), dim=-1, keepdim=True)
    e = torch.exp(x - m) - torch.exp(-m)
    return torch.relu(e) / (torch.where(torch.isfinite(x), e.abs(), 0).sum(dim=-1, keepdim=True) + EPS)


def make_peers(x: np.ndarray, models: dict[str, bytes], nt: int) -> dict:
    """The callables timed for one input (sessions built under the caller's thread limits)."""
    import torch

    from softdeploy.runtime import Session

    xt = torch.from_numpy(x)
    yt = torch.empty_like(xt)
    feeds = {"X": x}
    # every onnxruntime contender through the same call path (softdeploy.runtime.Session); ours with
    # the kernel library, the others without it (ort_body: softdeploy's function body in stock ORT)
    ours = Session(models["softpick"], kernels="native", threads=nt)
    avx2 = avx2_session(models["softpick"], nt)
    body = Session(models["softpick"], kernels="portable", threads=nt)
    dec = Session(models["ort_decomposed"], kernels="portable", threads=nt)
    smx = Session(models["ort_softmax"], kernels="portable", threads=nt)
    idn = Session(models["ort_identity"], kernels="portable", threads=nt)
    return {
        "softpick": lambda: ours.run(feeds),
        "avx2": lambda: avx2.run(feeds),
        "ort_decomposed": lambda: dec.run(feeds),
        "ort_body": lambda: body.run(feeds),
        "ort_softmax": lambda: smx.run(feeds),
        "torch": lambda: torch_softpick(xt),
        "numpy": lambda: numpy_softpick(x),
        "floor_copy": lambda: yt.copy_(xt),
        "floor_ort_identity": lambda: idn.run(feeds),
        "softpick_bound": ours.bind(feeds),
        "ort_decomposed_bound": dec.bind(feeds),
        "ort_softmax_bound": smx.bind(feeds),
        "floor_ort_identity_bound": idn.bind(feeds),
    }


def main() -> None:
    p = base_parser(__doc__)
    p.add_argument("--B", type=int_list, default=[1, 64])
    p.add_argument("--V", type=int_list, default=[1000, 32000, 128000, 256000])
    p.add_argument("--no-attention", action="store_true", help="skip the attention-like shape")
    args = p.parse_args()
    rounds = 5 if args.quick else args.rounds
    header("Softpick")
    Avx2VsBody.print_variant()
    vs_body = Avx2VsBody("Softpick")
    shapes = [(b, v) for b in args.B for v in args.V]
    if not args.no_attention:
        shapes.append(ATTENTION_SHAPE)
    rng = np.random.default_rng(0)
    rows = []
    floor_checks = []
    for nt in args.threads:
        bg = wait_quiet(args.quiet_wait)
        ys = stream_yardsticks(nt)
        sync_print(
            f"- {nt} thread(s): in-run DRAM bandwidth (torch, 256 MB): read {ys['read_GBs']:.1f} GB/s, "
            f"copy {ys['copy_GBs']:.1f} GB/s (bg load {ys['bg']:.1f}); other processes' load before block: {bg:.2f} cores"
        )
        for shape in shapes:
            x = (rng.standard_normal(shape, dtype=np.float32) * 2.0).astype(np.float32)
            with threads(nt):
                peers = make_peers(x, onnx_models(len(shape)), nt)
                want = numpy_softpick(x.astype(np.float64))
                ok = all(
                    np.allclose(np.asarray(out), want, rtol=1e-4, atol=1e-7)
                    for out in (peers[n]()[0] for n in ("softpick", "avx2", "ort_decomposed", "ort_body"))
                )
                t, bgc = quiet_bench(peers, rounds=rounds, batch_ms=args.batch_ms, max_tries=args.tries)
            nbytes = x.size * 4
            sp = t["softpick"].median
            label = "x".join(map(str, shape))
            # per call path ("run": Session.run; "bound": Session.bind): dec/softpick, the ratio a kernel
            # taking no time at all would reach (onnxruntime's per-run cost stays: dec/identity), and
            # softpick/softmax
            ratios = {
                path: (
                    t[f"ort_decomposed{sfx}"].median / t[f"softpick{sfx}"].median,
                    t[f"ort_decomposed{sfx}"].median / t[f"floor_ort_identity{sfx}"].median,
                    t[f"softpick{sfx}"].median / t[f"ort_softmax{sfx}"].median,
                )
                for path, sfx in (("run", ""), ("bound", "_bound"))
            }
            # bytes moved at the DRAM copy bandwidth: read x once + write y once
            limit = 2 * nbytes / (ys["copy_GBs"] * 1e9)
            rows.append(
                [nt, label, f"{nbytes / 2**20:.2f}"]
                + [fmt_num(t[n].median * 1e6) for n in PEERS + FLOORS + BOUND]
                + [f"{dec:.1f}x / {reach:.1f}x / {smx:.2f}" for dec, reach, smx in ratios.values()]
                + [
                    vs_body.add(f"{nt} thr {label}", t["ort_body"].median, t["avx2"].median),
                    f"{sp / t['floor_copy'].median:.2f}",
                    f"{limit / sp:.0%}",
                    f"{max(t[n].spread for n in PEERS + BOUND):.0%}",
                    f"{bgc:.1f}",
                    "ok" if ok else "MISMATCH",
                ]
            )
            if nt == 1:
                floor_checks.append((label, ratios))
            sync_print(
                f"  done nt={nt} {label}: softpick {sp * 1e6:.1f} us; "
                + "; ".join(f"{p}: {d:.1f}x decomposed, {m:.2f}x softmax" for p, (d, _, m) in ratios.items())
            )
    sync_print(
        "\nTimes in microseconds per call (median). Ratio columns, per call path (`run`: Session.run; `bound`: "
        "Session.bind, inputs and outputs bound once): `dec/softpick` = ort_decomposed time / softpick time (floor "
        ">= 3x) / `dec/identity` = ort_decomposed time / floor_ort_identity time, the largest dec/softpick that any "
        "kernel could reach (onnxruntime's per-run cost of a one-node model stays) / `softpick/softmax` = softpick "
        "time / ort_softmax time (floor <= 1.5); `of DRAM limit` = (read x + write y at the in-run copy bandwidth) / "
        "softpick time -- meaningful only for tensors beyond the 32 MiB L3.\n"
    )
    sync_print(
        md_table(
            [
                "thr",
                "shape",
                "MiB",
                *PEERS,
                *FLOORS,
                *BOUND,
                "run: dec/softpick / dec/identity / softpick/softmax",
                "bound: dec/softpick / dec/identity / softpick/softmax",
                "body/avx2",
                "softpick/floor_copy",
                "of DRAM limit",
                "max spread",
                "bg load",
                "check",
            ],
            rows,
        )
    )
    vs_body.print_summary()
    if floor_checks:
        sync_print("\nFloors (1 thread):")
        for path in ("run", "bound"):
            slow = [
                f"{lbl} ({r[path][0]:.1f}x; a zero-time kernel would reach {r[path][1]:.1f}x)"
                for lbl, r in floor_checks
                if r[path][0] < 3.0
            ]
            over = [lbl for lbl, r in floor_checks if r[path][2] > 1.5]
            sync_print(
                f"- {path}: softpick >= 3x faster than ort_decomposed: "
                f"{'met on every shape' if not slow else 'NOT met on ' + ', '.join(slow)}; softpick <= 1.5x "
                f"ort_softmax: {'met on every shape' if not over else 'NOT met on ' + ', '.join(over)}"
            )


if __name__ == "__main__":
    main()
