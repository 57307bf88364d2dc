"""Register tiles of the TVM MatMul rule (softdeploy/tvm/ops/matmul.py) against each other, on one target.

    python -m bench.tvm_matmul_tiles [--mcpu znver4] [--threads 1] [--rounds 7]

Each kernel is a one-GEMM model, y = x @ w + b (MiniLM's projections at batch 1, sequence 128), built without the
shipped records once per tile (MR x NR x vector width, forced through ``tile_for``), so that only the register tile
differs; the builds run alternately, a batch of calls each, and the median per call is printed with its GFLOP/s.
The rule's own choice for the target (``tile_for``) is marked. Results: bench/results/tvm_minilm.md.
"""

from __future__ import annotations

import os

import numpy as np

from bench import harness
from softdeploy.compare.latency import time_batches_interleaved

TILES = [(6, 16, 8), (8, 32, 16), (14, 16, 16), (6, 48, 16), (4, 64, 16), (12, 32, 16)]
SHAPES = [(128, 384, 1536), (128, 1536, 384), (128, 384, 384)]


def _projection(m: int, k: int, n: int):
    """(model, input, float64 reference) of y = x @ w + b, x [1, m, k]."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    inits = [helper.make_tensor(nm, TensorProto.FLOAT, list(a.shape), a.ravel()) for nm, a in (("w", w), ("b", b))]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return model, x, x.astype(np.float64) @ w.astype(np.float64) + b


def main() -> None:
    p = harness.base_parser(__doc__)
    p.add_argument("--mcpu", default=None, help="LLVM CPU name of the target (default: the host's)")
    p.set_defaults(threads=[1], rounds=7)
    args = p.parse_args()
    nt = args.threads[0]
    os.environ["TVM_NUM_THREADS"] = str(nt)  # read by TVM's pool when it first starts, below

    from tvm import relax

    import softdeploy.tvm.ops.matmul as matmul
    from softdeploy.tvm.build import build, make_target
    from softdeploy.tvm.frontend import import_model, prepare
    from softdeploy.tvm.target import host_target, import_tvm

    tvm = import_tvm()
    spec = host_target(args.mcpu, nt)
    harness.header("TVM MatMul rule: register tiles")
    harness.sync_print(f"- target: {spec}; {nt} thread(s); builds without the shipped records")
    rule_tile = matmul.tile_for
    rows = []
    for m, k, n in SHAPES:
        model, x, ref = _projection(m, k, n)
        with make_target(spec):
            chosen = rule_tile(n)
        calls = {}
        for tile in TILES:
            matmul.tile_for = lambda _n, tile=tile: tile  # the tile under test, for every kernel
            try:
                executable, report = build(
                    import_model(prepare(model, {"x": list(x.shape)}), spec), target=spec, shipped_records=False
                )
            finally:
                matmul.tile_for = rule_tile
            hand = [v for name, v in report.schedules.items() if "matmul" in name]
            vm = relax.VirtualMachine(executable, tvm.cpu())
            xt = tvm.runtime.tensor(x, tvm.cpu())
            err = float(np.abs(vm["main"](xt).numpy() - ref).max())
            if hand != ["hand (MatMul)"] or err > 1e-4:
                raise SystemExit(f"tile {tile}: {hand}, max |error| {err:.2e}")
            calls[tile] = (vm["main"], xt)
        timings = time_batches_interleaved(
            {str(tile): (lambda fn=fn, xt=xt: fn(xt)) for tile, (fn, xt) in calls.items()},
            rounds=1 if args.quick else args.rounds,
            batch_seconds=args.batch_ms / 1e3,
        )
        flops = 2 * m * k * n
        cells = []
        for tile in TILES:
            t = timings[str(tile)].median
            mark = " (rule)" if tile == chosen else ""
            cells.append(f"{t * 1e6:,.0f} us, {flops / t / 1e9:.0f} GF/s{mark}")
        rows.append([f"{m}x{k} @ {k}x{n} + b", *cells])
    harness.sync_print(harness.md_table(["kernel", *[" x ".join(map(str, t)) for t in TILES]], rows))


if __name__ == "__main__":
    main()
