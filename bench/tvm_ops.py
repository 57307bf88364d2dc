"""Each softdeploy op on TVM: tuned vs untuned vs our C++ kernel vs onnxruntime's decomposed graph
(the function body in stock onnxruntime), all in the same interleaved run.

    python -m bench.tvm_ops [--threads 1,2] [--quick] [--records DIR]
    python -m bench.tvm_ops --tune-trials 32 --records softdeploy/tvm/records/avx512 --keep-best 1   # the shipped records (AVX-512 host)

"TVM tuned" = the op's TIR compute with the records shipped in softdeploy/tvm/records/<class> (plus
--records) applied, dlight defaults where no record matches. "TVM untuned" = the same TIR compute
with TVM's default (unscheduled) loop nests. Floor of the issue: every tuned op within 1.5x of our
C++ kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bench import harness

FLOOR_RATIO = 1.5

# Benchmark shapes per op: (label, one input maker per port (None = omitted), attrs). An input maker is
# a (shape, dtype) of normal * 3 values or a function of the generator. The shipped tuning records would
# cover exactly these.
InputSpec = tuple[tuple[int, ...], str] | Callable[[np.random.Generator], np.ndarray] | None
LOGITS_VOCAB = ((4, 32000), "float32")
LOGITS_ROWS = ((12 * 128, 128), "float32")


def _const(values: list[float]) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: np.array(values, np.float32)


def _signs(shape: tuple[int, ...]) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.choice(np.array([-1.0, 1.0], np.float32), size=shape)


def _all_valid(shape: tuple[int, ...]) -> Callable[[np.random.Generator], np.ndarray]:
    """Masks given explicitly: the function bodies of MaxSim/SignedMaxSim do not load in stock
    onnxruntime with the masks omitted (shape inference of the body's Unsqueeze on a missing input)."""
    return lambda rng: np.ones(shape, bool)


def _unit(shape: tuple[int, ...]) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


MULTIMAX = [_const([-1.0, 1.0, -2.0, 2.0]), _const([0.1, 0.2, 0.05, 0.03])]
SHAPES: dict[str, list[tuple[str, list[InputSpec], dict]]] = {
    "TwoPassSoftmax": [
        ("4x32000 (vocab)", [LOGITS_VOCAB], {}),
        ("1536x128 (attention rows)", [LOGITS_ROWS], {}),
    ],
    "Softpick": [("1536x128 (attention rows)", [LOGITS_ROWS], {})],
    "SoftmaxTopK": [
        ("4x32000 (vocab), k=5", [LOGITS_VOCAB], {"k": 5}),
        ("4x32000 (vocab), k=50", [LOGITS_VOCAB], {"k": 50}),
    ],
    "MultiMax": [
        ("4x32000 (vocab)", [LOGITS_VOCAB, *MULTIMAX], {}),
        ("1536x128 (attention rows)", [LOGITS_ROWS, *MULTIMAX], {}),
    ],
    "AdaptiveTemperatureSoftmax": [("4x32000 (vocab)", [LOGITS_VOCAB], {})],
    "MaxSim": [
        (
            "Q 1x32x128 vs D 256x32x128",
            [_unit((1, 32, 128)), _unit((256, 32, 128)), _all_valid((1, 32)), _all_valid((256, 32))],
            {},
        )
    ],
    "SignedMaxSim": [
        (
            "Q 1x32x128 vs D 256x32x128",
            [
                _unit((1, 32, 128)),
                _signs((1, 32)),
                _unit((256, 32, 128)),
                _signs((256, 32)),
                _all_valid((1, 32)),
                _all_valid((256, 32)),
            ],
            {},
        )
    ],
}


def _inputs(spec: list[InputSpec], rng: np.random.Generator) -> tuple:
    out = []
    for item in spec:
        if item is None:
            out.append(None)
        elif callable(item):
            out.append(item(rng))
        else:
            shape, dtype = item
            out.append((rng.standard_normal(shape) * 3).astype(dtype))
    return tuple(out)


def cases(ops: list[str]) -> list[tuple]:
    from softdeploy.ops import REGISTRY
    from softdeploy.ops._schema import Sample

    rng = np.random.default_rng(0)
    out = []
    for name in ops:
        op = REGISTRY[name]
        for label, spec, attrs in SHAPES[name]:
            out.append((op, label, Sample(label, _inputs(spec, rng), attrs)))
    return out


def _shapes(op, sample) -> dict[str, list[int]]:
    return {p.name: list(np.shape(v)) for p, v in zip(op.inputs, sample.inputs, strict=False) if v is not None}


def tune(ops: list[str], trials: int, records: str, keep: int) -> None:
    from softdeploy.tvm.frontend import import_model, prepare
    from softdeploy.tvm.tuning import keep_best
    from softdeploy.tvm.tuning import tune as ms_tune

    for op, label, sample in cases(ops):
        mod = import_model(prepare(op.make_model(sample), _shapes(op, sample)))
        report = ms_tune(mod, records, trials=trials)
        print(f"{op.name} {label}: {report.summary()}")
    if keep:
        before, after = keep_best(records, keep)
        print(f"{records}: kept the {keep} fastest record(s) per kernel, {before} -> {after} records")


def main() -> None:
    from softdeploy.tvm.ops import TIR_OPS

    p = harness.base_parser(__doc__ or "")
    p.add_argument("--ops", type=harness.str_list, default=sorted(set(SHAPES) & set(TIR_OPS)))
    p.add_argument("--records", default=None, help="extra tuning database folder")
    p.add_argument("--tune-trials", type=int, default=0, help="tune first, into --records")
    p.add_argument("--keep-best", type=int, default=0, help="after tuning, keep only the N fastest records per kernel")
    args = p.parse_args()
    if args.tune_trials:
        tune(args.ops, args.tune_trials, args.records or "tvm-records", args.keep_best)
        return

    from softdeploy.runtime import Session
    from softdeploy.tvm.session import TVMSession, set_threads

    harness.header("softdeploy ops on TVM: tuned vs untuned vs C++ kernel vs onnxruntime decomposed")
    rows = []
    for op, label, sample in cases(args.ops):
        model, feeds, shapes = op.make_model(sample), op.feeds(sample), _shapes(op, sample)
        tuned = TVMSession(model, shapes=shapes, databases=[args.records] if args.records else [])
        untuned = TVMSession(model, shapes=shapes, tuned=False)
        print(f"- {op.name} {label}: {tuned.report.summary()}")
        for n in args.threads:
            set_threads(n)
            kernel = Session(model, kernels="native", threads=n)
            decomposed = Session(model, kernels="portable", threads=n)
            want = kernel.run(feeds)
            for got in (tuned.run(feeds), untuned.run(feeds)):
                np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-7)
            fns = {
                "C++ kernel": lambda s=kernel: s.run(feeds),
                "ORT decomposed": lambda s=decomposed: s.run(feeds),
                "TVM tuned": lambda s=tuned: s.run(feeds),
                "TVM untuned": lambda s=untuned: s.run(feeds),
            }
            timings, bg = harness.quiet_bench(
                fns, rounds=5 if args.quick else args.rounds, batch_ms=args.batch_ms, max_tries=args.tries
            )
            base = timings["C++ kernel"].median
            for peer, t in timings.items():
                ratio = t.median / base
                verdict = ("MET" if ratio <= FLOOR_RATIO else "NOT MET") if peer == "TVM tuned" else ""
                rows.append(
                    (
                        op.name,
                        label,
                        n,
                        peer,
                        harness.fmt_time(t.median),
                        f"{t.spread:.0%}",
                        f"{ratio:.2f}x",
                        verdict,
                        f"{bg:.2f}",
                    )
                )
    print()
    print(
        harness.md_table(
            (
                "op",
                "shape",
                "threads",
                "peer",
                "median",
                "spread",
                "vs C++ kernel",
                f"floor <= {FLOOR_RATIO}x",
                "bg load",
            ),
            rows,
        )
    )


if __name__ == "__main__":
    main()
