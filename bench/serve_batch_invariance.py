"""Why a stacked MiniLM request differs from the same request alone: where in the graph the bits first move.

For all-MiniLM-L6-v2 (the fp32 export of softdeploy's MiniLM case) and B requests of 128 tokens each (equal
lengths, full mask: no padding), each request is run alone (batch 1) and inside the stack of all B; the table says,
per thread count and kernels, whether each output -- and the input of the mean pooling's ReduceSum (pinned as an
extra graph output) -- holds the same bits for the request alone and for its row of the stack. Then the ReduceSum
alone, on that pinned tensor, and the order it sums in at batch 1 (token after token, as numpy's add.reduce over
the token axis of the [T, D] slice).

Usage: python -m bench.serve_batch_invariance [--model minilm.onnx] [--batch 4]
Without --model the encoder is exported as bench/serve.py exports it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bench.harness import header, md_table, sync_print

SEQ = 128


def pinned(model: Path) -> tuple[bytes, str]:
    """The model with the input of its first ReduceSum over the tokens added as a graph output; that input's name."""
    import onnx

    proto = onnx.load(model)
    producer = {o: n for n in proto.graph.node for o in n.output}
    # the mean pooling sums the masked token embeddings (a Mul); the other ReduceSum counts the mask
    pool = next(
        n
        for n in proto.graph.node
        if n.op_type == "ReduceSum" and n.input[0] in producer and producer[n.input[0]].op_type == "Mul"
    )
    name = pool.input[0]
    proto.graph.output.append(onnx.ValueInfoProto(name=name))
    return proto.SerializeToString(), name


def reduce_sum_model() -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["X", "axis"], ["Y"], keepdims=0)],
        "pool",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", "tokens", "width"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "width"])],
        initializer=[numpy_helper.from_array(np.array([1], np.int64), "axis")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10).SerializeToString()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()
    from bench.serve import export_minilm, request_feeds
    from softdeploy.runtime import Session

    model = args.model or export_minilm(Path.home() / ".cache" / "softdeploy" / "serve_bench" / "minilm.onnx")
    header("Batch invariance of all-MiniLM-L6-v2 in onnxruntime: a request alone against its row of a stack")
    sync_print(f"Command: `cd bench && PYTHONPATH=.. python {' '.join(sys.argv)}`\n")
    data, pool_input = pinned(model)
    feeds = request_feeds(args.batch, seed=3)
    stacked = {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}
    rows = []
    kept: np.ndarray | None = None
    for threads in (1, 2):
        for kernels in ("native", "portable"):
            sess = Session(data, threads=threads, kernels=kernels)  # type: ignore[arg-type]
            names = sess.output_names
            together = dict(zip(names, sess.run(stacked), strict=True))
            alone = [dict(zip(names, sess.run(f), strict=True)) for f in feeds]
            for name in names:
                same = sum(together[name][i : i + 1].tobytes() == alone[i][name].tobytes() for i in range(len(feeds)))
                worst = max(
                    float(np.max(np.abs(together[name][i : i + 1] - alone[i][name]))) for i in range(len(feeds))
                )
                label = f"{name} (the pooling ReduceSum's input)" if name == pool_input else name
                rows.append([threads, kernels, label, f"{same}/{len(feeds)}", f"{worst:.1e}"])
            kept = together[pool_input]
    sync_print(
        md_table(["threads", "kernels", "output", "requests with the same bits alone and stacked", "max |diff|"], rows)
    )
    assert kept is not None
    pool = Session(reduce_sum_model(), threads=1)
    alone_sum = [pool.run({"X": kept[i : i + 1]})[0] for i in range(len(kept))]
    stack_sum = pool.run({"X": kept})[0]
    same = sum(stack_sum[i : i + 1].tobytes() == alone_sum[i].tobytes() for i in range(len(kept)))
    sequential = sum(
        alone_sum[i][0].tobytes() == np.add.reduce(kept[i], axis=0, dtype=np.float32).tobytes()
        for i in range(len(kept))
    )
    sync_print(
        f"\nReduceSum over the tokens alone, on the pinned tensor [{', '.join(map(str, kept.shape))}]: {same}/{len(kept)} "
        f"rows the same stacked and alone; at batch 1 it equals numpy's token-after-token sum for {sequential}/"
        f"{len(kept)} rows."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
