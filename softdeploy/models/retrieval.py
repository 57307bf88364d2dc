"""Late-interaction retrieval: token embeddings scored with MaxSim.

    score(q, d) = Σ_{valid query tokens i} max_{valid document tokens j} ⟨q_i, d_j⟩

Scoring runs the com.softdeploy ``MaxSim`` ONNX op through :class:`softdeploy.runtime.Session`
(native kernel, or its standard-ONNX function body for "stock onnxruntime"). Where the op is not in
this build's registry, a NumPy implementation of the same equation stands in, and
:attr:`MaxSimScorer.backend` says so (reports print it).

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
    """Ragged token embeddings of many texts, padded per length bucket."""

    buckets: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (emb [n, L, d], mask [n, L] bool, ids [n])
    count: int
    dim: int

    @classmethod
    def from_ragged(cls, vectors: Sequence[np.ndarray]) -> TokenBank:
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
        return sum(e.nbytes for e, _, _ in self.buckets)


def maxsim_reference(q: np.ndarray, qmask: np.ndarray, d: np.ndarray, dmask: np.ndarray) -> np.ndarray:
    """The equation in NumPy (float32 accumulation): the stand-in where the op is missing."""
    sim = np.einsum("bid,njd->binj", q, d, optimize=True)
    sim = np.where(dmask[None, None, :, :], sim, -np.inf)
    best = sim.max(axis=3)
    best = np.where(np.isneginf(best), 0.0, best)  # a document with no valid token contributes 0
    return (best * qmask[:, :, None]).sum(axis=1).astype(np.float32)


def _maxsim_model() -> Any:
    """One-node model: Scores = MaxSim(Q, D, QMask, DMask), with its function body attached."""
    from onnx import TensorProto, helper

    from softdeploy import DOMAIN, OPSET_VERSION
    from softdeploy.export import attach_function_bodies

    node = helper.make_node("MaxSim", ["Q", "D", "QMask", "DMask"], ["Scores"], domain=DOMAIN, name="maxsim")
    graph = helper.make_graph(
        [node],
        "maxsim_scorer",
        [
            helper.make_tensor_value_info("Q", TensorProto.FLOAT, ["B", "Lq", "dim"]),
            helper.make_tensor_value_info("D", TensorProto.FLOAT, ["N", "Ld", "dim"]),
            helper.make_tensor_value_info("QMask", TensorProto.BOOL, ["B", "Lq"]),
            helper.make_tensor_value_info("DMask", TensorProto.BOOL, ["N", "Ld"]),
        ],
        [helper.make_tensor_value_info("Scores", TensorProto.FLOAT, ["B", "N"])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)], ir_version=10
    )
    return attach_function_bodies(model)


def maxsim_op_available() -> bool:
    from softdeploy.ops import REGISTRY

    return "MaxSim" in REGISTRY


class MaxSimScorer:
    """Scores query token embeddings against a TokenBank with MaxSim.

    ``backend``: "native" (the MaxSim op on softdeploy's kernel), "portable" (the op's function body
    in stock onnxruntime) or "torch" (the op's eager torch implementation)."""

    def __init__(self, backend: Backend, threads: int = 1) -> None:
        self.threads = threads
        self._fn: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
        if not maxsim_op_available():
            self.backend = "numpy (MaxSim op not in this build)"
            self._fn = maxsim_reference
        elif backend == "torch":
            from softdeploy.ops import REGISTRY

            impl = REGISTRY["MaxSim"].torch_impl

            def run_torch(q: np.ndarray, qm: np.ndarray, d: np.ndarray, dm: np.ndarray) -> np.ndarray:
                import torch

                with torch.inference_mode():
                    out = impl(torch.from_numpy(q), torch.from_numpy(d), torch.from_numpy(qm), torch.from_numpy(dm))
                return out.numpy()

            self.backend = "MaxSim op (torch eager)"
            self._fn = run_torch
        else:
            from softdeploy.runtime import Session

            session = Session(_maxsim_model(), kernels=backend, threads=threads)

            def run_onnx(q: np.ndarray, qm: np.ndarray, d: np.ndarray, dm: np.ndarray) -> np.ndarray:
                return session.run({"Q": q, "D": d, "QMask": qm, "DMask": dm})[0]

            self.backend = f"MaxSim op ({'native kernel' if session.kernels == 'native' else 'function body'})"
            self._fn = run_onnx

    def score(self, queries: TokenBank, corpus: TokenBank) -> np.ndarray:
        """[queries.count, corpus.count] scores."""
        out = np.zeros((queries.count, corpus.count), np.float32)
        for q, qm, qids in queries.buckets:
            for d, dm, dids in corpus.buckets:
                per_query = q.shape[1] * d.shape[0] * d.shape[1]
                chunk = max(1, MAX_SIMILARITY_FLOATS // max(per_query, 1))
                for s in range(0, len(qids), chunk):
                    block = self._fn(
                        np.ascontiguousarray(q[s : s + chunk]), np.ascontiguousarray(qm[s : s + chunk]), d, dm
                    )
                    out[np.ix_(qids[s : s + chunk], dids)] = block
        return out

    def score_one(self, q: np.ndarray, corpus: TokenBank) -> np.ndarray:
        """One query ([Lq, dim], all tokens valid) against the whole corpus: the latency measurement."""
        qb = np.ascontiguousarray(q[None])
        qm = np.ones(qb.shape[:2], bool)
        out = np.empty(corpus.count, np.float32)
        for d, dm, dids in corpus.buckets:
            out[dids] = self._fn(qb, qm, d, dm)[0]
        return out
