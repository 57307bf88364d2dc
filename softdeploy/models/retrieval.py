"""Late-interaction retrieval: token embeddings scored with MaxSim.

    score(q, d) = Σ_{valid query tokens i} max_{valid document tokens j} ⟨q_i, d_j⟩

Scoring runs the com.softdeploy ``MaxSim`` ONNX op through :class:`softdeploy.runtime.Session`
(native kernel, or its standard-ONNX function body for "stock onnxruntime"), or the op's eager torch
implementation; :attr:`MaxSimScorer.backend` says which (reports print it).

int8 scoring: :meth:`TokenBank.to_int8` encodes every token with its own symmetric scale
(:func:`softdeploy.ops.max_sim.quantize_tokens`), and the scorer feeds codes and scales to MaxSim's
int8 path (``<q, d> = QScale * DScale * sum q_k d_k``, the integer sum exact).

Texts have very different lengths, so token embeddings are kept ragged and padded only within
length buckets: documents of similar length are scored together (one MaxSim call per bucket and
query chunk), which keeps the padded work -- and the memory of an unfused body -- small.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

Backend = Literal["native", "portable", "torch"]
BUCKET_LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# Keep one scoring call's [queries, query tokens, docs, doc tokens] volume under this many floats, so
# that an implementation which materialises the similarity matrix stays within memory.
MAX_SIMILARITY_FLOATS = 32 * 2**20


@dataclasses.dataclass
class TokenBank:
    """Ragged token embeddings of many texts, padded per length bucket (float32, or int8 codes with
    one scale per token in ``scales``, bucket by bucket)."""

    buckets: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (emb [n, L, d], mask [n, L] bool, ids [n])
    count: int
    dim: int
    scales: list[np.ndarray] | None = None  # int8: float32 [n, L] per bucket
    bits: int = 8  # int8: the codes' width (7: within [-63, 63], see quantize_tokens)

    @property
    def int8(self) -> bool:
        """Whether the bank holds int8 codes with per-token scales."""
        return self.scales is not None

    def to_int8(self, bits: int = 8) -> TokenBank:
        """The same bank as per-token symmetric codes of ``bits`` bits (8 or 7: :func:`quantize_tokens`) + scales,
        padding tokens encoding as 0. A bank that is int8 already is returned as it is."""
        from softdeploy.ops.max_sim import quantize_tokens

        if self.int8:
            return self
        buckets, scales = [], []
        for emb, mask, ids in self.buckets:
            codes, scale = quantize_tokens(emb, bits=bits)
            buckets.append((codes, mask, ids))
            scales.append(scale)
        return TokenBank(buckets, self.count, self.dim, scales, bits=bits)

    @classmethod
    def from_ragged(cls, vectors: Sequence[np.ndarray]) -> TokenBank:
        """A bank from one [L_i, dim] array per text, grouped into length buckets so that padding stays small."""
        if not vectors:
            raise ValueError("TokenBank needs at least one text")
        dim = int(vectors[0].shape[1])
        lengths = np.array([len(v) for v in vectors])
        edges = [b for b in BUCKET_LENGTHS if b < lengths.max()] + [int(lengths.max())]
        buckets = []
        lo = 0
        for hi in edges:
            ids = np.nonzero((lengths > lo) & (lengths <= hi))[0]
            lo = hi
            if len(ids) == 0:
                continue
            width = int(lengths[ids].max())
            emb = np.zeros((len(ids), width, dim), np.float32)
            mask = np.zeros((len(ids), width), bool)
            for row, i in enumerate(ids):
                emb[row, : lengths[i]] = vectors[i]
                mask[row, : lengths[i]] = True
            buckets.append((emb, mask, ids))
        return cls(buckets, len(vectors), dim)

    def nbytes(self) -> int:
        """Memory of the embeddings (and scales), in bytes."""
        return sum(e.nbytes for e, _, _ in self.buckets) + sum(s.nbytes for s in self.scales or [])


def _maxsim_model(int8: bool) -> Any:
    """One-node model: Scores = MaxSim(Q, D, QMask, DMask[, QScale, DScale]), with its function body
    attached; int8: Q and D are int8 codes with per-token float32 scales."""
    from onnx import TensorProto, helper

    from softdeploy.domain import DOMAIN, OPSET_VERSION
    from softdeploy.ops.functions import attach_function_bodies

    inputs = ["Q", "D", "QMask", "DMask"] + (["QScale", "DScale"] if int8 else [])
    elem = TensorProto.INT8 if int8 else TensorProto.FLOAT
    node = helper.make_node("MaxSim", inputs, ["Scores"], domain=DOMAIN, name="maxsim")
    scales = [
        helper.make_tensor_value_info("QScale", TensorProto.FLOAT, ["B", "Lq"]),
        helper.make_tensor_value_info("DScale", TensorProto.FLOAT, ["N", "Ld"]),
    ]
    graph = helper.make_graph(
        [node],
        "maxsim_scorer",
        [
            helper.make_tensor_value_info("Q", elem, ["B", "Lq", "dim"]),
            helper.make_tensor_value_info("D", elem, ["N", "Ld", "dim"]),
            helper.make_tensor_value_info("QMask", TensorProto.BOOL, ["B", "Lq"]),
            helper.make_tensor_value_info("DMask", TensorProto.BOOL, ["N", "Ld"]),
            *(scales if int8 else []),
        ],
        [helper.make_tensor_value_info("Scores", TensorProto.FLOAT, ["B", "N"])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)], ir_version=10
    )
    return attach_function_bodies(model)


class MaxSimScorer:
    """Scores query token embeddings against a TokenBank with MaxSim.

    ``backend``: "native" (the MaxSim op on softdeploy's kernel), "portable" (the op's function body
    in stock onnxruntime) or "torch" (the op's eager torch implementation). ``int8``: score int8
    TokenBanks (:meth:`TokenBank.to_int8`) through the op's int8 path; float banks are encoded on the
    way in."""

    def __init__(self, backend: Backend, threads: int = 1, *, int8: bool = False) -> None:
        self.threads = threads
        self.int8 = int8
        self._fn: Callable[..., np.ndarray]
        kind = "int8" if int8 else "fp32"
        if backend == "torch":
            from softdeploy.ops import REGISTRY

            impl = REGISTRY["MaxSim"].torch_impl

            def run_torch(
                q: np.ndarray, qm: np.ndarray, d: np.ndarray, dm: np.ndarray, *scales: np.ndarray
            ) -> np.ndarray:
                import torch

                with torch.inference_mode():
                    args = [torch.from_numpy(a) for a in (q, d, qm, dm, *scales)]
                    out = impl(*args)
                return out.numpy()

            self.backend = f"MaxSim op {kind} (torch eager)"
            self._fn = run_torch
        else:
            from softdeploy.runtime import Session

            session = Session(_maxsim_model(int8), kernels=backend, threads=threads)
            names = ["Q", "QMask", "D", "DMask"] + (["QScale", "DScale"] if int8 else [])

            def run_onnx(*arrays: np.ndarray) -> np.ndarray:
                return session.run(dict(zip(names, arrays, strict=True)))[0]

            self.backend = f"MaxSim op {kind} ({'native kernel' if session.kernels == 'native' else 'function body'})"
            self._fn = run_onnx

    def _bank(self, bank: TokenBank) -> TokenBank:
        if bank.int8 != self.int8:
            if not self.int8:
                raise ValueError("an fp32 MaxSimScorer cannot score an int8 TokenBank")
            return bank.to_int8()
        return bank

    def score(self, queries: TokenBank, corpus: TokenBank) -> np.ndarray:
        """[queries.count, corpus.count] scores."""
        queries, corpus = self._bank(queries), self._bank(corpus)
        out = np.zeros((queries.count, corpus.count), np.float32)
        for qi, (q, qm, qids) in enumerate(queries.buckets):
            for di, (d, dm, dids) in enumerate(corpus.buckets):
                per_query = q.shape[1] * d.shape[0] * d.shape[1]
                chunk = max(1, MAX_SIMILARITY_FLOATS // max(per_query, 1))
                for s in range(0, len(qids), chunk):
                    rows = slice(s, s + chunk)
                    args = [np.ascontiguousarray(q[rows]), np.ascontiguousarray(qm[rows]), d, dm]
                    if queries.scales is not None and corpus.scales is not None:
                        args += [np.ascontiguousarray(queries.scales[qi][rows]), corpus.scales[di]]
                    out[np.ix_(qids[rows], dids)] = self._fn(*args)
        return out

    def score_one(self, q: np.ndarray, corpus: TokenBank) -> np.ndarray:
        """One query ([Lq, dim] float32, all tokens valid) against the whole corpus: the latency
        measurement (int8: the query is encoded inside, as a deployment would, at the corpus's code width)."""
        corpus = self._bank(corpus)
        qb = np.ascontiguousarray(q[None])
        qm = np.ones(qb.shape[:2], bool)
        extra: list[np.ndarray] = []
        if self.int8:
            from softdeploy.ops.max_sim import quantize_tokens

            qb, q_scale = quantize_tokens(qb, bits=corpus.bits)
            extra = [q_scale]
        out = np.empty(corpus.count, np.float32)
        for di, (d, dm, dids) in enumerate(corpus.buckets):
            scales = [*extra, corpus.scales[di]] if corpus.scales is not None else []
            out[dids] = self._fn(qb, qm, d, dm, *scales)[0]
        return out


def _rows(bank: TokenBank, ids: np.ndarray) -> TokenBank:
    """The texts ``ids`` of ``bank`` (in that order: text i of the result is ``ids[i]``) as a bank of their own, each
    kept in its length bucket."""
    position = np.full(bank.count, -1, np.int64)
    position[ids] = np.arange(len(ids))
    buckets, scales = [], []
    for b, (emb, mask, bank_ids) in enumerate(bank.buckets):
        rows = np.nonzero(position[bank_ids] >= 0)[0]
        if len(rows) == 0:
            continue
        buckets.append((emb[rows], mask[rows], position[bank_ids[rows]]))
        if bank.scales is not None:
            scales.append(bank.scales[b][rows])
    return TokenBank(buckets, len(ids), bank.dim, scales if bank.scales is not None else None, bits=bank.bits)


class RerankedMaxSim:
    """Top-k MaxSim retrieval in two stages, the way late-interaction engines serve (ColBERTv2's PLAID scores
    compressed candidates, then re-ranks them): every document scored on int8 codes, the ``candidates`` best of
    those re-scored in float32, and the ``k`` best of the re-scored returned with their float32 scores.

    The first stage is the fast one: ``bits`` 7 (the default) runs MaxSim's paired vpmaddubsw tile, the fastest
    int8 form on a CPU without VNNI, but ranks less exactly than 8-bit codes; the second makes the result the float
    one. What must hold for the result to equal float32 MaxSim's top k: each of those k documents is among the first
    stage's ``candidates`` best. Nothing bounds that a priori (an int8 score can move past more than ``candidates``
    others where scores crowd), so the margin is measured, not guaranteed (bench/results/maxsim_int8_avx2.md).
    ``candidates`` must be at least ``k``.

    Memory: the corpus is held twice, as int8 codes (the first stage) and as float32 (re-ranking reads only the
    candidates' rows)."""

    def __init__(
        self,
        corpus: TokenBank,
        *,
        bits: int = 7,
        candidates: int = 100,
        backend: Backend = "native",
        threads: int = 1,
    ) -> None:
        from softdeploy.errors import ArgumentError

        if corpus.int8:
            raise ArgumentError("RerankedMaxSim: corpus must be the float32 TokenBank (it is kept for re-ranking)")
        if bits not in (7, 8):
            raise ArgumentError(f"RerankedMaxSim: bits must be 7 or 8, got {bits}")
        if candidates < 1:
            raise ArgumentError(f"RerankedMaxSim: candidates must be >= 1, got {candidates}")
        self.corpus = corpus
        self.codes = corpus.to_int8(bits=bits)
        self.candidates = candidates
        self._int8 = MaxSimScorer(backend, threads, int8=True)
        self._fp32 = MaxSimScorer(backend, threads)

    def search(self, q: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best documents for one query ([Lq, dim] float32, every token valid): their ids and float32
        MaxSim scores, best first (ties in id order)."""
        if not 1 <= k <= self.candidates:
            from softdeploy.errors import ArgumentError

            raise ArgumentError(f"RerankedMaxSim.search: k must be within 1..candidates = {self.candidates}, got {k}")
        coarse = self._int8.score_one(q, self.codes)
        count = min(self.candidates, self.corpus.count)
        ids = np.sort(np.argpartition(-coarse, count - 1)[:count]) if count < len(coarse) else np.arange(count)
        exact = self._fp32.score_one(q, _rows(self.corpus, ids))
        order = np.lexsort((ids, -exact))[: min(k, count)]
        return ids[order], exact[order]
