"""Where does the ``Softmax => TwoPassSoftmax`` rewrite pay? (softdeploy optimize, rule two-pass-softmax)

Same-run, interleaved medians of onnxruntime's ai.onnx.Softmax (MLAS) and softdeploy's TwoPassSoftmax
kernel on one-node models, last axis, rows B x n, plus the copy floor (torch copy_ of the same bytes).
The rule's threshold (softdeploy/export/rewrites/two_pass_softmax.py MIN_ROW_LENGTH) is the smallest
row length from which the kernel is faster at every longer row measured.

    python -m bench.softmax_rewrite [--threads 1,2] [--quick]
"""

from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto, helper

from bench import harness
from softdeploy import DOMAIN, OPSET_VERSION
from softdeploy.export import attach_function_bodies
from softdeploy.runtime import Session


def one_node(op: str, domain: str) -> bytes:
    node = helper.make_node(op, ["X"], ["Y"], axis=-1, domain=domain)
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", "N"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["B", "N"])],
    )
    imports = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(DOMAIN, OPSET_VERSION)] if domain else [])
    model = helper.make_model(graph, opset_imports=imports, ir_version=10)
    return attach_function_bodies(model).SerializeToString()


def main() -> None:
    p = harness.base_parser(__doc__ or "")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--lengths", type=harness.int_list, default=None, help="row lengths n")
    args = p.parse_args()
    lengths = args.lengths or (
        [128, 4096, 131072, 1048576]
        if args.quick
        else [16, 128, 1024, 4096, 32000, 131072, 262144, 524288, 1048576, 2097152, 4194304]
    )
    rounds = 5 if args.quick else args.rounds
    harness.header("Softmax vs TwoPassSoftmax (the two-pass-softmax rewrite rule)")
    ort_model, ours_model = one_node("Softmax", ""), one_node("TwoPassSoftmax", DOMAIN)
    rng = np.random.default_rng(0)
    for n_threads in args.threads:
        ort = Session(ort_model, kernels="portable", threads=n_threads)
        ours = Session(ours_model, kernels="native", threads=n_threads)
        rows = []
        for n in lengths:
            x = (rng.standard_normal((args.rows, n)) * 3).astype(np.float32)
            tx, ty = torch.from_numpy(x), torch.empty(args.rows, n)
            feeds = {"X": x}
            np.testing.assert_allclose(
                ours.run(feeds)[0], ort.run(feeds)[0], rtol=2e-3, atol=1e-9
            )  # MLAS sums long rows in float32 (4e-4 off at 4M)
            with harness.threads(n_threads):
                t, bg = harness.quiet_bench(
                    {
                        "ort_softmax": lambda feeds=feeds, ort=ort: ort.run(feeds),
                        "two_pass": lambda feeds=feeds, ours=ours: ours.run(feeds),
                        "floor_copy": lambda tx=tx, ty=ty: ty.copy_(tx),
                    },
                    rounds=rounds,
                    batch_ms=args.batch_ms,
                    max_tries=args.tries,
                    wait_s=args.quiet_wait,
                )
            a, b, c = t["ort_softmax"].median, t["two_pass"].median, t["floor_copy"].median
            rows.append(
                [
                    n_threads,
                    f"{args.rows}x{n}",
                    harness.fmt_time(a),
                    harness.fmt_time(b),
                    f"{a / b:.2f}",
                    "yes" if b < a else "no",
                    harness.fmt_time(c),
                    f"{b / c:.2f}",
                    f"{max(t['ort_softmax'].spread, t['two_pass'].spread):.2f}",
                    f"{bg:.2f}",
                ]
            )
        harness.sync_print(
            harness.md_table(
                [
                    "thr",
                    "B x n",
                    "ORT Softmax",
                    "TwoPassSoftmax",
                    "speedup",
                    "faster",
                    "floor_copy",
                    "ours / copy",
                    "spread",
                    "bg load",
                ],
                rows,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
