"""A model softdeploy never shipped, as a new user writes it: Softpick attention over token vectors,
a SoftmaxTopK head, trained for a few seconds on a synthetic task (tests/workflow/)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import softdeploy.nn as snn

CLASSES, TOKENS, DIM = 6, 12, 32


class TinyClassifier(nn.Module):
    """Embeddings -> Softpick self-attention -> mean pool -> logits, plus the top-3 classes fused."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.attention = snn.SoftpickAttention(DIM, 4)
        self.head = nn.Linear(DIM, CLASSES)
        self.top = snn.SoftmaxTopKHead(DIM, CLASSES, 3)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = torch.relu(self.inp(tokens))
        h = h + self.attention(h)
        pooled = h.mean(dim=1)
        values, indices = self.top(pooled)
        return self.head(pooled), values, indices


def task(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Token sets whose class is the prototype most of their tokens come from."""
    rng = np.random.default_rng(seed)
    protos = np.random.default_rng(0).standard_normal((CLASSES, DIM)).astype(np.float32)
    labels = rng.integers(0, CLASSES, n)
    x = protos[labels][:, None, :] + 0.9 * rng.standard_normal((n, TOKENS, DIM)).astype(np.float32)
    return x.astype(np.float32), labels.astype(np.int64)


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...], dict]:
    """The factory `softdeploy run` calls: a trained model, example inputs, a dynamic batch."""
    torch.manual_seed(0)
    model = TinyClassifier()
    x, y = task(256, seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):
        logits, _, _ = model(torch.from_numpy(x))
        loss = nn.functional.cross_entropy(logits, torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model, (torch.from_numpy(x[:8]),), {"tokens": {0: torch.export.Dim("batch")}}


def macro_recall(logits: np.ndarray, labels: np.ndarray) -> float:
    """A user's own metric: the mean over classes of the fraction of that class predicted right."""
    pred = logits.argmax(-1)
    return float(np.mean([(pred[labels == c] == c).mean() for c in np.unique(labels)]))
