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
