"""``softdeploy demo``: the softmax-family ops end to end on a model trained in seconds.

The model reads a sequence of 16 tokens and names its class (100 classes, each defined by a set of
signature tokens hidden among noise tokens). It attends with Softpick weights (which may give a
token exactly zero weight), classifies, and reports its class probabilities with TwoPassSoftmax
and its five best classes with SoftmaxTopK. It is trained with the softdeploy torch ops themselves,
exported with their com.softdeploy nodes and function bodies, and run three ways on held-out data:
torch eager, stock onnxruntime (the function bodies), onnxruntime with softdeploy's kernels.
"""

from __future__ import annotations

import logging
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

VOCAB, SEQ, CLASSES, DIM, SIGNATURE = 512, 16, 100, 64, 4


def make_data(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each class owns SIGNATURE tokens; a sequence shows 3 of its class's tokens among noise."""
    signatures = np.random.default_rng(1234).integers(0, VOCAB, size=(CLASSES, SIGNATURE))
    labels = rng.integers(0, CLASSES, size=n)
    tokens = rng.integers(0, VOCAB, size=(n, SEQ))
    for i, c in enumerate(labels):
        pos = rng.choice(SEQ, size=3, replace=False)
        tokens[i, pos] = rng.choice(signatures[c], size=3, replace=False)
    return tokens.astype(np.int64), labels.astype(np.int64)


def build_model() -> Any:
    """The demo's classifier: token embeddings, one head of Softpick attention, TwoPassSoftmax probabilities and a fused
    SoftmaxTopK, all through softdeploy's torch ops."""
    import torch

    from softdeploy.ops._torch import register_torch_ops

    register_torch_ops()

    class SoftpickClassifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, DIM)
            self.q = torch.nn.Linear(DIM, DIM)
            self.k = torch.nn.Linear(DIM, DIM)
            self.v = torch.nn.Linear(DIM, DIM)
            self.head = torch.nn.Linear(DIM, CLASSES)

        def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            h = self.embed(tokens)
            scores = self.q(h) @ self.k(h).transpose(1, 2) * DIM**-0.5
            weights = torch.ops.softdeploy.softpick(scores, axis=-1, eps=1e-6)
            pooled = (weights @ self.v(h)).mean(dim=1) + h.mean(dim=1)
            logits = self.head(pooled)
            probs = torch.ops.softdeploy.two_pass_softmax(logits, axis=-1)
            top_p, top_i, _ = torch.ops.softdeploy.softmax_topk(logits, k=5, axis=-1, temperature=1.0)
            return probs, top_p, top_i

    return SoftpickClassifier()


def train(model: Any, tokens: np.ndarray, labels: np.ndarray, steps: int = 400) -> float:
    """Trains ``model`` with Adam for ``steps`` minibatches of 128 (seeded) and returns the last loss."""
    import torch

    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = torch.from_numpy(tokens), torch.from_numpy(labels)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (128,), generator=g)
        probs, _, _ = model(x[idx])
        loss = torch.nn.functional.nll_loss(torch.log(probs + 1e-12), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())  # float() of a tensor needing grad warns


def _latency_ms(fn: Any, repeats: int = 50) -> float:
    from softdeploy.compare.latency import time_batches_interleaved

    return time_batches_interleaved({"call": fn}, rounds=repeats, batch_seconds=0.0)["call"].median * 1e3


MODEL_FILE = "softpick_classifier.onnx"  # the exported model's name in the demo's folder


def run_demo(threads: int = 1, out: str | None = None, overwrite: bool = False) -> dict[str, Any]:
    """``softdeploy demo``: trains the demo model, exports it, runs it with torch, stock onnxruntime (function bodies)
    and softdeploy's kernels, and prints agreement and latency; returns the numbers; the model goes to ``out`` (default:
    a temporary folder)."""
    import torch
    from rich.console import Console
    from rich.table import Table

    from softdeploy.export.torch_export import export_module
    from softdeploy.runtime import Session

    console = Console()
    if out:  # before the training: an existing model needs ``overwrite``; a folder or a dangling link is refused
        from softdeploy.errors import OutputError
        from softdeploy.files import check_outputs, make_folder

        if Path(out).exists() and not Path(out).is_dir():
            raise OutputError(f"--out {out}: is a file; give a folder (the demo writes {MODEL_FILE} into it)")
        check_outputs([Path(out) / MODEL_FILE], overwrite=overwrite)
        make_folder(out, "demo folder")  # a folder that cannot be made is said before the training too
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    train_x, train_y = make_data(20000, rng)
    test_x, test_y = make_data(2000, rng)

    model = build_model()
    t0 = time.perf_counter()
    loss = train(model, train_x, train_y)
    console.print(f"trained in {time.perf_counter() - t0:.1f} s (final loss {loss:.3f})")
    model.eval()

    folder = Path(out) if out else Path(tempfile.mkdtemp(prefix="softdeploy-demo-"))
    path = folder / MODEL_FILE
    batch = torch.export.Dim("batch", min=1, max=4096)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # exporter chatter (e.g. torchvision absent)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_module(
            model,
            (torch.from_numpy(test_x[:8]),),
            path,
            dynamic_shapes=({0: batch},),
            input_names=["tokens"],
            output_names=["probs", "top5_probs", "top5_classes"],
            overwrite=overwrite,
        )
    console.print(f"exported to {path} (com.softdeploy nodes with function bodies)")

    with torch.no_grad():
        eager = [t.numpy() for t in model(torch.from_numpy(test_x))]
    sessions = {
        "ORT, stock ops": Session(path, kernels="portable", threads=threads),
        "ORT + softdeploy": Session(path, kernels="native", threads=threads),
    }
    table = Table(
        title=f"softdeploy demo: {len(test_x)} held-out sequences, {threads} thread(s)",
        caption="ORT, stock ops = onnxruntime running the function bodies (no softdeploy library)",
    )
    for col in ("variant", "top-1", "top-5", "max |Δp| vs torch", "top-5 = torch", "ms/64 seq", "ms/1 seq"):
        table.add_column(col, justify="right" if col != "variant" else "left")

    def row(name: str, outs: list[np.ndarray], fn64: Any, fn1: Any) -> dict[str, Any]:
        probs, _, top_i = outs
        result = {
            "top1": float((probs.argmax(-1) == test_y).mean()),
            "top5": float((top_i == test_y[:, None]).any(-1).mean()),
            "max_abs_diff": float(np.abs(probs - eager[0]).max()),
            "top5_agreement": float((top_i == eager[2]).all(-1).mean()),
            "ms_batch64": _latency_ms(fn64),
            "ms_single": _latency_ms(fn1),
        }
        table.add_row(
            name,
            f"{result['top1']:.3f}",
            f"{result['top5']:.3f}",
            f"{result['max_abs_diff']:.1e}",
            f"{result['top5_agreement']:.1%}",
            f"{result['ms_batch64']:.3f}",
            f"{result['ms_single']:.3f}",
        )
        return result

    x64, x1 = torch.from_numpy(test_x[:64]), torch.from_numpy(test_x[:1])
    results = {}
    with torch.no_grad():
        results["torch eager"] = row("torch eager", eager, lambda: model(x64), lambda: model(x1))
    for name, sess in sessions.items():
        outs = sess.run({"tokens": test_x})
        results[name] = row(
            name,
            outs,
            lambda s=sess: s.run({"tokens": test_x[:64]}),
            lambda s=sess: s.run({"tokens": test_x[:1]}),
        )
    console.print(table)
    return results
