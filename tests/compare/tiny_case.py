"""A tiny case over the tiny MLP of tests/quant/tiny.py: fast enough for unit tests of the whole
compare pipeline (export, quantize, evaluate, time, report)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from quant.tiny import feeds, mlp_with_custom_op

from softdeploy.compare.case import Evaluation, Floor, Progress, Runner, Timed


class TinyCase:
    name = "tiny"
    title = "tiny MLP with a com.softdeploy op"
    primary_metric = "top-1 accuracy"
    metric_names = ("top-1 accuracy",)
    agreement_k = 3
    cosine_name = "output cosine"
    timed_phases = ("infer",)

    def __init__(self) -> None:
        self.model = mlp_with_custom_op(with_function=True)
        self.data = feeds(6, seed=21)
        self.prepared = False

    def prepare(self, progress: Progress) -> None:
        self.prepared = True

    def describe(self) -> dict[str, Any]:
        return {"model": "3-layer MLP", "data": f"{len(self.data)} random batches"}

    def fingerprint(self) -> str:
        from softdeploy.compare.cache import fingerprint

        return fingerprint(self.model, self.data)

    def export_fp32(self, path: Path) -> None:
        onnx.save(self.model, path)

    def torch_runner(self, threads: int) -> Runner:
        import torch

        w = {i.name: torch.from_numpy(onnx.numpy_helper.to_array(i).copy()) for i in self.model.graph.initializer}

        def run(f: Any) -> list[np.ndarray]:
            x = torch.from_numpy(f["X"])
            p = torch.softmax(x @ w["W1"], dim=-1) * w["scale"]
            return [((p @ w["W2"]) @ w["W3"]).numpy()]

        return run

    def calibration_feeds(self) -> list[dict[str, np.ndarray]]:
        return feeds(4, seed=5)

    def probe_feeds(self) -> list[dict[str, np.ndarray]]:
        return feeds(2, seed=6)

    def evaluate(self, runner: Runner, kernels: str, progress: Progress, label: str) -> Evaluation:
        with progress.step(f"{label}: evaluate", len(self.data)) as advance:
            outs = []
            for f in self.data:
                outs.append(runner(f)[0])
                advance(1)
        y = np.concatenate(outs)
        labels = np.arange(len(y)) % 8
        return Evaluation(
            metrics={"top-1 accuracy": float((y.argmax(1) == labels).mean())},
            rows={"output cosine": y},
            scores=y,
            notes={"post-processing": kernels},
        )

    def timed(self, runner: Runner, kernels: str, threads: int) -> dict[str, Timed]:
        f = self.data[0]
        return {"infer": Timed(lambda: runner(f), len(f["X"]))}

    def floors(self, rows: list[dict[str, Any]]) -> list[Floor]:
        worst = min(r["output cosine"] for r in rows)
        return [Floor("worst output cosine", worst, ">= 0.9", worst >= 0.9)]
