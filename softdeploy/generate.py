"""Batched generation with soft thinking on onnxruntime, and the same loop on torch eager as its reference.

Soft thinking (Soft Thinking; SofT-GRPO): while a row *thinks*, its next input is not one sampled token but the
probability-weighted mixture of the top ``max_topk`` token embeddings (optionally perturbed by Gumbel noise), computed
by the SoftTokenEmbedding op from the step's logits. A row stops thinking when slot 0's id (the most probable token
after noise) is the ``</think>`` id, or by *cold stop*: after ``early_stopping_length`` consecutive steps whose entropy
is below ``early_stopping_entropy`` the ``</think>`` token is forced. From then on it *answers*: discrete decoding,
greedy (slot 0) or sampled from the op's after-thinking ``Weights``, until an end-of-sequence id or
``max_new_tokens``. Rows are independent: each has its own mode, low-entropy run and end.

Per step and row the loop records one id: slot 0's id while thinking (the readable trace of what the row "thinks"),
the chosen token while answering, ``</think>`` when thinking ends, -1 once the row has ended.

Noise is uniform in [0, 1) from a ``numpy.random.Generator`` seeded with ``seed``, drawn as one ``[B, V]`` array per
step (and ``[B]`` uniforms for sampling), in the same order whatever the backend: the ORT and torch loops consume the
same stream, so with the same seed they see the same noise and, where their logits agree, produce the same ids.

Backends, behind one interface (:class:`Backend`): :class:`OrtBackend` runs the prefill / step graphs of a
:func:`softdeploy.export.decoder.export_decoder` folder and a one-node SoftTokenEmbedding graph on
:class:`softdeploy.runtime.Session` (softdeploy's kernels); :class:`TorchBackend` runs the transformers model with a
``DynamicCache`` and :class:`softdeploy.nn.SoftTokenEmbedding`. :func:`generate` is the loop; the per-step work
outside the backends (bookkeeping, embedding gathers, the mask, noise) runs on buffers allocated once, and
:class:`GenerationResult` says how long the backends took and how long the loop itself took.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from softdeploy.errors import ArgumentError

NOISES = ("none", "gumbel")


@dataclasses.dataclass(frozen=True)
class SoftThinking:
    """Soft-thinking settings: the SoftTokenEmbedding op's attributes (docs/ops/SoftTokenEmbedding.md) and the loop's
    thinking rules. ``think_end_id``: the ``</think>`` token id (slot 0 choosing it ends thinking);
    ``early_stopping_entropy`` / ``early_stopping_length``: cold stop after that many consecutive steps with entropy
    (nats) below the threshold (length 0: off). Defaults: Soft Thinking's (max_topk 10, min_p 0.001, entropy 0.01,
    length 256)."""

    think_end_id: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.001
    max_topk: int = 10
    noise: str = "none"
    tau: float = 1.0
    noise_factor: float = 1.0
    clamp_min: float = -1.5
    clamp_max: float = 3.0
    after_thinking_temperature: float = 1.0
    after_thinking_top_k: int = 0
    after_thinking_top_p: float = 1.0
    after_thinking_min_p: float = 0.0
    early_stopping_entropy: float = 0.01
    early_stopping_length: int = 256

    def op_attrs(self) -> dict[str, Any]:
        """The SoftTokenEmbedding attributes."""
        d = dataclasses.asdict(self)
        for k in ("think_end_id", "early_stopping_entropy", "early_stopping_length"):
            d.pop(k)
        return d

    def check(self, vocab_size: int) -> None:
        """ArgumentError for a setting the loop cannot use (the op checks its own attributes when it is built)."""
        if not 0 <= self.think_end_id < vocab_size:
            raise ArgumentError(
                f"generate: think_end_id {self.think_end_id} is not a token id (rule: 0 <= id < {vocab_size})"
            )
        if self.noise not in NOISES:
            raise ArgumentError(f"generate: noise {self.noise!r} (rule: one of {list(NOISES)})")
        if self.early_stopping_length < 0:
            raise ArgumentError(f"generate: early_stopping_length {self.early_stopping_length} (rule: >= 0, 0 = off)")
        if not 1 <= self.max_topk <= vocab_size:
            raise ArgumentError(f"generate: max_topk {self.max_topk} (rule: 1 <= max_topk <= vocab {vocab_size})")


@dataclasses.dataclass(frozen=True)
class Decoding:
    """Discrete decoding (after thinking, or throughout without soft thinking): greedy, or ``sample`` from the top
    ``max_topk`` tokens after ``temperature`` / ``top_k`` / ``top_p`` / ``min_p`` (the op's after-thinking filters).
    ``eos_token_ids`` end a row; ``max_new_tokens`` bounds every row."""

    max_new_tokens: int = 64
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_topk: int = 10
    eos_token_ids: tuple[int, ...] = ()

    def check(self) -> None:
        """ArgumentError for a value the loop cannot use."""
        if self.max_new_tokens < 1:
            raise ArgumentError(f"generate: max_new_tokens {self.max_new_tokens} (rule: >= 1)")


@dataclasses.dataclass
class GenerationResult:
    """What :func:`generate` produced. ``tokens[b]``: row b's ids, one per step until it ended (slot 0 while
    thinking, ``</think>`` where thinking ended, the chosen tokens after); ``thinking_steps[b]``: steps spent
    thinking; ``think_end[b]``: "token" (slot 0 chose ``</think>``), "cold" (cold stop), "none" (still thinking at
    the end) or "off" (no soft thinking); ``stop[b]``: "eos" or "length". ``steps``: loop iterations;
    ``prefill_seconds``, ``graph_seconds`` (backend calls of the decode steps), ``loop_seconds`` (the decode
    steps' own work outside the backends), ``noise_seconds`` (of which drawing noise)."""

    tokens: list[list[int]]
    thinking_steps: list[int]
    think_end: list[str]
    stop: list[str]
    steps: int
    prefill_seconds: float
    graph_seconds: float
    loop_seconds: float
    noise_seconds: float

    @property
    def new_tokens(self) -> int:
        """Ids produced over all rows."""
        return sum(len(t) for t in self.tokens)

    @property
    def decode_seconds(self) -> float:
        """Wall time of the decode steps (graphs + loop)."""
        return self.graph_seconds + self.loop_seconds

    @property
    def overhead(self) -> float:
        """The loop's own share of a decode step: loop / (graphs + loop)."""
        total = self.decode_seconds
        return self.loop_seconds / total if total > 0 else 0.0


class Backend(Protocol):
    """What the loop drives: a decoder with a KV cache it keeps between calls, and the SoftTokenEmbedding op.

    ``prefill`` starts a batch from the prompts (``embeds`` [B, S, E] or ``ids`` [B, S], whichever the backend
    takes); ``step`` feeds one position per row. Both return the last position's logits [B, V] float32 (an array the
    backend may reuse: read it before the next call). ``soft`` runs the op on ``logits`` with ``noise`` [B, V] (or
    None) and ``mode`` [B] int64 and returns (mixed [B, E], weights [B, K], ids [B, K] int64, entropy [B]).
    """

    embedding: np.ndarray  # [V, E] float32, the token table the loop gathers discrete inputs from
    takes_embeds: bool

    def prefill(self, ids: np.ndarray, embeds: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Logits [B, V] of the last prompt position; the cache holds the prompt."""

    def step(self, ids: np.ndarray, embeds: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Logits [B, V] of the new position; the cache grows by one."""

    def configure(self, attrs: dict[str, Any], batch: int, with_noise: bool) -> None:
        """Builds the op for ``attrs`` (SoftTokenEmbedding attributes) at batch size ``batch``."""

    def soft(
        self, logits: np.ndarray, noise: np.ndarray | None, mode: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The op's (mixed, weights, ids, entropy) for ``logits``."""


def _op_attrs(soft: SoftThinking | None, decoding: Decoding) -> dict[str, Any]:
    """SoftTokenEmbedding attributes: the soft-thinking ones with the after-thinking trio from ``decoding``; without
    soft thinking every row is in after-thinking mode, so only the after-thinking filters matter."""
    attrs = soft.op_attrs() if soft is not None else {"max_topk": decoding.max_topk, "noise": "none"}
    attrs.update(
        after_thinking_temperature=decoding.temperature,
        after_thinking_top_k=decoding.top_k,
        after_thinking_top_p=decoding.top_p,
        after_thinking_min_p=decoding.min_p,
    )
    if soft is not None:
        attrs["max_topk"] = soft.max_topk
    return attrs


def _left_pad(prompts: Sequence[Sequence[int]], vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids [B, S], mask [B, S]) with the prompts right-aligned (left padding, id 0, mask 0)."""
    if not prompts:
        raise ArgumentError("generate: no prompts (rule: at least one prompt of at least one token)")
    longest = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), longest), np.int64)
    mask = np.zeros((len(prompts), longest), np.int64)
    for b, p in enumerate(prompts):
        if not len(p):
            raise ArgumentError(f"generate: prompt {b} is empty (rule: at least one token)")
        row = np.asarray(p, np.int64)
        if row.min() < 0 or row.max() >= vocab:
            raise ArgumentError(f"generate: prompt {b} holds id {int(row.max())} (rule: 0 <= id < vocab {vocab})")
        ids[b, longest - len(p) :] = row
        mask[b, longest - len(p) :] = 1
    return ids, mask


def generate(
    backend: Backend,
    prompts: Sequence[Sequence[int]],
    *,
    soft_thinking: SoftThinking | None = None,
    decoding: Decoding | None = None,
    seed: int = 0,
    progress: Any = None,
) -> GenerationResult:
    """Generates from the token-id ``prompts`` (one list per row, batched with left padding) on ``backend``.

    With ``soft_thinking`` every row starts thinking (soft inputs; see the module docstring) and answers after
    ``</think>``; without it every row decodes discretely from the first step. ``decoding`` sets the discrete part,
    ``seed`` the noise and sampling stream. ``progress`` is an ``advance(n)`` callable called once per step.
    """
    decoding = decoding or Decoding()
    decoding.check()
    table = backend.embedding
    vocab, hidden = table.shape
    if soft_thinking is not None:
        soft_thinking.check(vocab)
        if not backend.takes_embeds:
            raise ArgumentError(
                "generate: soft thinking feeds embeddings; this decoder takes input_ids "
                "(rule: export it with inputs_embeds=True)"
            )
    ids0, mask0 = _left_pad(prompts, vocab)
    batch, plen = ids0.shape
    steps_max = decoding.max_new_tokens
    gumbel = soft_thinking is not None and soft_thinking.noise == "gumbel"
    backend.configure(_op_attrs(soft_thinking, decoding), batch, gumbel)
    rng = np.random.default_rng(seed)
    eos = np.asarray(decoding.eos_token_ids or (-2,), np.int64)
    think_end = soft_thinking.think_end_id if soft_thinking is not None else -2
    cold_entropy = soft_thinking.early_stopping_entropy if soft_thinking is not None else 0.0
    cold_length = soft_thinking.early_stopping_length if soft_thinking is not None else 0

    # buffers, allocated once
    mask = np.zeros((batch, plen + steps_max), np.int64)
    mask[:, :plen] = mask0
    positions = np.empty((batch, 1), np.int64)
    positions[:, 0] = mask0.sum(axis=1) - 1
    next_ids = np.zeros((batch, 1), np.int64)
    next_embeds = np.empty((batch, 1, hidden), np.float32)
    gathered = np.empty((batch, hidden), np.float32)
    noise = np.empty((batch, vocab), np.float32) if gumbel else None
    uniforms = np.empty(batch, np.float64)
    mode = np.full(batch, 0 if soft_thinking is not None else 1, np.int64)
    thinking = mode == 0
    low_run = np.zeros(batch, np.int64)
    done = np.zeros(batch, bool)
    trace = np.full((steps_max, batch), -1, np.int64)
    thinking_steps = np.zeros(batch, np.int64)
    think_how = np.array(["none" if soft_thinking is not None else "off"] * batch, dtype=object)
    stop = np.array(["length"] * batch, dtype=object)
    rows = np.arange(batch)

    t0 = time.perf_counter()
    prompt_embeds = table[ids0] if backend.takes_embeds else next_embeds[:, :0]
    from softdeploy.export.decoder import positions as prompt_positions

    logits = backend.prefill(ids0, prompt_embeds, mask0, prompt_positions(mask0))
    prefill_seconds = time.perf_counter() - t0

    graph = 0.0
    noise_time = 0.0
    start = time.perf_counter()
    steps = 0
    for t in range(steps_max):
        steps = t + 1
        if noise is not None:
            n0 = time.perf_counter()
            rng.random(out=noise, dtype=np.float32)
            noise_time += time.perf_counter() - n0
        if decoding.sample:
            rng.random(out=uniforms)
        g0 = time.perf_counter()
        mixed, weights, top_ids, entropy = backend.soft(logits, noise, mode)
        graph += time.perf_counter() - g0
        token = top_ids[:, 0].copy()
        answering = ~thinking
        if decoding.sample and answering.any():
            # inverse-CDF draw from the after-thinking weights (their sum is 1 up to rounding: scale u by it)
            cdf = np.cumsum(weights, axis=1)
            pick = (cdf < (uniforms * cdf[:, -1])[:, None]).sum(axis=1)
            np.minimum(pick, weights.shape[1] - 1, out=pick)
            token = np.where(answering, top_ids[rows, pick], token)
        if soft_thinking is not None and thinking.any():
            thinking_steps += thinking & ~done
            by_token = thinking & (token == think_end)
            if cold_length > 0:
                low_run = np.where(thinking & (entropy < cold_entropy), low_run + 1, 0)
                cold = thinking & ~by_token & (low_run >= cold_length)
            else:
                cold = np.zeros(batch, bool)
            ending = (by_token | cold) & ~done
            think_how[by_token & ~done] = "token"
            think_how[cold & ~done] = "cold"
            token[cold] = think_end
        else:
            ending = np.zeros(batch, bool)
        active = ~done
        trace[t, active] = token[active]
        finished = active & np.isin(token, eos)
        stop[finished] = "eos"
        done |= finished
        if done.all() or t == steps_max - 1:
            break
        # next inputs: thinking rows (not ending) feed the mixture, the others their token's embedding
        feed_mix = thinking & ~ending
        np.take(table, token, axis=0, out=gathered)
        if feed_mix.any():
            gathered[feed_mix] = mixed[feed_mix]
        next_embeds[:, 0, :] = gathered
        next_ids[:, 0] = token
        thinking &= ~ending
        mode[ending] = 1
        mask[:, plen + t] = 1
        positions += 1
        g0 = time.perf_counter()
        logits = backend.step(next_ids, next_embeds, mask[:, : plen + t + 1], positions)
        graph += time.perf_counter() - g0
        if progress is not None:
            progress(1)
    loop_seconds = time.perf_counter() - start - graph
    tokens = [[int(v) for v in trace[:steps, b] if v >= 0] for b in range(batch)]
    return GenerationResult(
        tokens=tokens,
        thinking_steps=[int(v) for v in thinking_steps],
        think_end=list(think_how),
        stop=list(stop),
        steps=steps,
        prefill_seconds=prefill_seconds,
        graph_seconds=graph,
        loop_seconds=loop_seconds,
        noise_seconds=noise_time,
    )


# ---- onnxruntime -------------------------------------------------------------------------------------------------


class OrtBackend:
    """The decoder export's prefill and step graphs and a one-node SoftTokenEmbedding graph on onnxruntime
    (:class:`softdeploy.runtime.Session`, ``kernels`` as there). ``step`` may name another step graph (e.g. an int8
    one from ``softdeploy quantize``) with the same inputs and outputs; ``prefill`` likewise."""

    def __init__(
        self,
        export: Any,
        *,
        kernels: str = "native",
        threads: int = 1,
        step: str | os.PathLike[str] | None = None,
        prefill: str | os.PathLike[str] | None = None,
    ) -> None:
        from softdeploy.export.decoder import DecoderExport
        from softdeploy.runtime import Session

        self.export = export if isinstance(export, DecoderExport) else DecoderExport.load(export)
        self.embedding = self.export.load_embedding()
        self.takes_embeds = self.export.input_kind == "inputs_embeds"
        self.kernels = kernels
        self.threads = threads
        self._prefill = Session(prefill or self.export.prefill, kernels=kernels, threads=threads)  # type: ignore[arg-type]
        self._step = Session(step or self.export.step, kernels=kernels, threads=threads)  # type: ignore[arg-type]
        self._past = self.export.past_names
        self._first = self.export.input_kind
        self._cache: list[np.ndarray] = []
        self._bound: Any = None

    def _run(self, sess: Any, first: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: bool) -> np.ndarray:
        feeds = {self._first: first, "attention_mask": np.ascontiguousarray(mask), "position_ids": positions}
        if past:
            feeds.update(zip(self._past, self._cache, strict=True))
        out = sess.run(feeds)
        self._cache = out[1:]
        return out[0][:, -1, :]

    def prefill(self, ids: np.ndarray, embeds: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """See :class:`Backend`."""
        first = np.ascontiguousarray(embeds if self.takes_embeds else ids)
        return self._run(self._prefill, first, mask, positions, past=False)

    def step(self, ids: np.ndarray, embeds: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """See :class:`Backend`."""
        return self._run(self._step, embeds if self.takes_embeds else ids, mask, positions, past=True)

    def configure(self, attrs: dict[str, Any], batch: int, with_noise: bool) -> None:
        """Builds the SoftTokenEmbedding graph (Embedding a graph input, bound once) for ``batch`` rows."""
        from softdeploy.runtime import Session

        vocab = self.embedding.shape[0]
        logits = np.zeros((batch, vocab), np.float32)
        noise = np.full((batch, vocab), 0.5, np.float32) if with_noise else None
        mode = np.zeros(batch, np.int64)
        model = soft_token_model(attrs, logits, self.embedding, noise, mode)
        sess = Session(model, kernels=self.kernels, threads=self.threads)  # type: ignore[arg-type]
        feeds = {"Logits": logits, "Embedding": self.embedding, "Mode": mode}
        if noise is not None:
            feeds["Noise"] = noise
        self._bound = sess.bind(feeds)
        self._in = self._bound.inputs

    def soft(
        self, logits: np.ndarray, noise: np.ndarray | None, mode: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """See :class:`Backend`."""
        self._in["Logits"][...] = logits
        if noise is not None:
            self._in["Noise"][...] = noise
        self._in["Mode"][...] = mode
        mixed, weights, ids, entropy = self._bound()
        return mixed, weights, ids, entropy


def soft_token_model(
    attrs: dict[str, Any], logits: np.ndarray, embedding: np.ndarray, noise: np.ndarray | None, mode: np.ndarray
) -> Any:
    """A one-node ONNX model running SoftTokenEmbedding with ``attrs`` (inputs Logits, Embedding, Noise when given,
    Mode; the function body attached, so it also runs without softdeploy's library)."""
    from softdeploy.ops._schema import Sample
    from softdeploy.ops.soft_token_embedding import DEF

    return DEF.make_model(Sample("generate", (logits, embedding, noise, mode), attrs))


# ---- torch eager -------------------------------------------------------------------------------------------------


class TorchBackend:
    """The transformers model itself (a ``DynamicCache`` kept between steps) and
    :class:`softdeploy.nn.SoftTokenEmbedding`: the eager reference of :class:`OrtBackend`."""

    def __init__(self, model: Any, *, inputs_embeds: bool = True, threads: int | None = None) -> None:
        import inspect

        import torch

        from softdeploy.export.decoder import load_causal_lm

        self.model = load_causal_lm(model)
        self.embedding = self.model.get_input_embeddings().weight.detach().float().numpy().copy()
        self.takes_embeds = inputs_embeds
        if threads is not None:
            torch.set_num_threads(threads)
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._cache: Any = None
        self._op: Any = None

    def _forward(self, ids: np.ndarray, embeds: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        import torch

        first = (
            {"inputs_embeds": torch.from_numpy(np.ascontiguousarray(embeds))}
            if self.takes_embeds
            else {"input_ids": torch.from_numpy(np.ascontiguousarray(ids))}
        )
        with torch.no_grad():
            out = self.model(
                **first,
                attention_mask=torch.from_numpy(np.ascontiguousarray(mask)),
                position_ids=torch.from_numpy(np.ascontiguousarray(positions)),
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_arg: self._cache},
            )
        return out.logits[:, -1, :].float().numpy()

    def prefill(self, ids: np.ndarray, embeds: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """See :class:`Backend`."""
        from transformers import DynamicCache

        self._cache = DynamicCache(config=self.model.config)
        return self._forward(ids, embeds, mask, positions)

    def step(self, ids: np.ndarray, embeds: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """See :class:`Backend`."""
        return self._forward(ids, embeds, mask, positions)

    def configure(self, attrs: dict[str, Any], batch: int, with_noise: bool) -> None:
        """Builds :class:`softdeploy.nn.SoftTokenEmbedding` over the model's embedding table."""
        import torch

        from softdeploy.nn import SoftTokenEmbedding

        self._op = SoftTokenEmbedding(torch.from_numpy(self.embedding), **attrs)

    def soft(
        self, logits: np.ndarray, noise: np.ndarray | None, mode: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """See :class:`Backend`."""
        import torch

        with torch.no_grad():
            out = self._op(
                torch.from_numpy(logits),
                None if noise is None else torch.from_numpy(noise),
                torch.from_numpy(mode),
            )
        return tuple(t.numpy() for t in out)  # type: ignore[return-value]
