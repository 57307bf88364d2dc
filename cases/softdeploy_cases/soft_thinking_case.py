"""The ``soft_thinking`` compare case: the QA decoder of :mod:`softdeploy_cases.soft_thinking` generating with soft
thinking, its step graph in every variant of ``softdeploy compare``.

The compared model is the decoder's *step graph* (past key/values in, logits and presents out; the prefill graph
stays fp32 onnxruntime). ``evaluate`` runs the whole generation loop (:func:`softdeploy.generate.generate`) with the
variant's step graph and its way of running SoftTokenEmbedding (``kernels``: native kernel, function body, or the
torch op -- the torch variant runs the transformers model and :class:`softdeploy.nn.SoftTokenEmbedding` end to end):
64 training questions, soft thinking with Gumbel noise (tau 0.5, seeded), greedy answers, at most 48 steps.

Metrics: *topic accuracy* (the first thinking token is the question's ``#topic`` tag), *answer exact* (the ids after
``</think>`` up to ``<eos>`` equal the corpus answer), *trace agreement* (share of rows whose whole id trace equals
onnxruntime fp32's with the native kernel). The floor: torch eager produces the same traces as onnxruntime fp32.

What it cannot show: SofT-GRPO's accuracy claims need a reasoning model; this one memorised a Q/A corpus.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.compare.case import Evaluation, Floor, Progress, Runner, Timed

BATCH = 8
MAX_NEW = 48


class _StepRunner:
    """A Session stand-in whose ``run(feeds)`` is the variant's runner."""

    def __init__(self, runner: Runner) -> None:
        self.run = runner


class SoftThinkingCase:
    """See the module docstring. ``questions``: how many training questions (every 32nd of the corpus); ``steps``:
    the most new tokens per row; ``train``: the model's size and training
    (:class:`softdeploy_cases.soft_thinking.TrainConfig`, default its defaults)."""

    name = "soft_thinking"
    title = "Soft thinking: a 3-layer QA decoder (chatterbot-corpus) generating with SoftTokenEmbedding"
    primary_metric = "answer exact"
    metric_names = ("topic accuracy", "answer exact", "trace agreement")
    agreement_k = 1
    cosine_name = "step logits cosine"
    timed_phases = ("decode step", "soft-token op")

    def __init__(self, questions: int = 64, steps: int = MAX_NEW, train: Any = None) -> None:
        self.questions = questions
        self.steps = steps
        self.train = train
        self._model: Any = None
        self._reference: list[list[int]] | None = None

    # ---- setup -----------------------------------------------------------------------------------------------

    def prepare(self, progress: Progress) -> None:
        """Train (or load) the model, export its decoder into the cache, pick the questions, run the reference."""
        if self._model is not None:
            return
        from softdeploy.cache import cache_root
        from softdeploy.compare.cache import fingerprint
        from softdeploy.export.decoder import DecoderExport, export_decoder
        from softdeploy_cases.soft_thinking import EOS, THINK_END, trained_model, words

        model, data, _ = trained_model(self.train, progress=progress)
        folder = cache_root() / "soft_thinking" / f"case-export-{fingerprint(model)[:16]}"
        if (folder / "decoder.json").is_file():
            export = DecoderExport.load(folder)
        else:
            export = export_decoder(model, folder, overwrite=True, progress=progress)
        self._model, self._data, self._export = model, data, export
        picked = data.triples[::32][: self.questions]
        ids = data.ids
        self._prompts = [data.prompt(q) for _, q, _ in picked]
        self._answers = [[ids[w] for w in words(a)] + [EOS] for _, _, a in picked]
        self._topics = [ids["#" + t] for t, _, _ in picked]
        held = data.triples[16::32][:16]  # calibration: other questions than the evaluated ones
        self._calibration_prompts = [data.prompt(q) for _, q, _ in held]
        self._think_end = THINK_END
        self._eos = EOS
        with progress.step("reference traces (onnxruntime fp32, native kernel)"):
            self._reference = self._generate(None, "native")
        self._step_feeds = self._record_step_feeds(self._prompts[:1], every=1)[5]

    def _soft(self) -> Any:
        from softdeploy.generate import SoftThinking

        return SoftThinking(think_end_id=self._think_end, noise="gumbel", tau=0.5, early_stopping_length=0)

    def _backend(self, runner: Runner | None, kernels: str) -> Any:
        from softdeploy.generate import OrtBackend, TorchBackend

        if kernels == "torch":
            return TorchBackend(self._model, threads=1)
        backend = OrtBackend(self._export, kernels="native" if kernels == "native" else "portable")
        if runner is not None:
            backend._step = _StepRunner(runner)
        return backend

    def _generate(self, runner: Runner | None, kernels: str) -> list[list[int]]:
        from softdeploy.generate import Decoding, generate

        backend = self._backend(runner, kernels)
        dec = Decoding(max_new_tokens=self.steps, eos_token_ids=(self._eos,))
        tokens: list[list[int]] = []
        for i in range(0, len(self._prompts), BATCH):
            r = generate(backend, self._prompts[i : i + BATCH], soft_thinking=self._soft(), decoding=dec, seed=i)
            tokens += r.tokens
        return tokens

    def _record_step_feeds(self, prompts: list[list[int]], every: int) -> list[dict[str, np.ndarray]]:
        """The step graph's feeds of a real fp32 generation over ``prompts`` (every ``every``-th step)."""
        from softdeploy.generate import Decoding, generate

        backend = self._backend(None, "native")
        real = backend._step
        seen: list[dict[str, np.ndarray]] = []

        def run(feeds: Any) -> list[np.ndarray]:
            seen.append({k: np.array(v, copy=True) for k, v in feeds.items()})
            return real.run(feeds)

        backend._step = _StepRunner(run)
        generate(backend, prompts, soft_thinking=self._soft(), decoding=Decoding(max_new_tokens=24), seed=0)
        return seen[::every]

    def describe(self) -> dict[str, Any]:
        """Data, model and settings, for the report."""
        return {
            "model": f"LlamaForCausalLM, {self._model.config.num_hidden_layers} layers, width "
            f"{self._model.config.hidden_size}, trained on chatterbot-corpus (softdeploy_cases.soft_thinking)",
            "compared graph": "the decoder's step graph (prefill stays fp32 onnxruntime)",
            "questions": self.questions,
            "generation": f"soft thinking, Gumbel tau 0.5 (seeded), greedy answers, <= {self.steps} steps, batch {BATCH}",
            "cannot show": "SofT-GRPO's accuracy claims (they need a reasoning model)",
        }

    def fingerprint(self) -> str:
        """Weights and settings: the key of the cached fp32 export."""
        from softdeploy.compare.cache import fingerprint

        return fingerprint(self._model, self.describe())

    def torch_size_bytes(self) -> int:
        """The model's parameter bytes."""
        return sum(p.numel() * p.element_size() for p in self._model.parameters())

    # ---- the compared model ----------------------------------------------------------------------------------

    def export_fp32(self, path: Path) -> None:
        """Writes the decoder's fp32 step graph to ``path``."""
        from softdeploy.files import load_model, save_model

        save_model(load_model(self._export.step), path, "step graph")

    def torch_runner(self, threads: int) -> Runner:
        """The step graph's computation in torch eager, over the same feeds."""
        import torch

        from softdeploy.export.decoder import decoder_graph

        torch.set_num_threads(threads)
        module = decoder_graph(self._model, self._export.num_layers, input_kind=self._export.input_kind, with_past=True)
        names = [self._export.input_kind, "attention_mask", "position_ids", *self._export.past_names]

        def run(feeds: Any) -> list[np.ndarray]:
            with torch.no_grad():
                return [t.numpy() for t in module(*(torch.from_numpy(np.asarray(feeds[n])) for n in names))]

        return run

    def calibration_feeds(self) -> list[dict[str, np.ndarray]]:
        """Step feeds of 16 other questions' generation (every 4th step)."""
        return self._record_step_feeds(self._calibration_prompts, every=4)

    def probe_feeds(self) -> list[dict[str, np.ndarray]]:
        """A few step feeds, for the sensitivity probe."""
        return self.calibration_feeds()[:4]

    # ---- evaluation ------------------------------------------------------------------------------------------

    def evaluate(self, runner: Runner, kernels: str, progress: Progress, label: str) -> Evaluation:
        """The generation loop with this variant's step graph and op backend: topic accuracy, exact answers, trace
        agreement with onnxruntime fp32; the step logits of one recorded step for cosine / top-1 agreement."""
        assert self._reference is not None
        with progress.step(f"{label}: generate {len(self._prompts)} answers with soft thinking"):
            tokens = self._generate(runner, kernels)
        topic = exact = same = 0
        for toks, ref, answer, tag in zip(tokens, self._reference, self._answers, self._topics, strict=True):
            topic += bool(toks) and toks[0] == tag
            if self._think_end in toks:
                exact += toks[toks.index(self._think_end) + 1 :] == answer
            same += toks == ref
        n = len(tokens)
        logits = runner(self._step_feeds)[0][:, -1, :]
        op = {"torch": "SoftTokenEmbedding torch op", "native": "SoftTokenEmbedding native kernel"}.get(
            kernels, "SoftTokenEmbedding function body"
        )
        return Evaluation(
            metrics={"topic accuracy": topic / n, "answer exact": exact / n, "trace agreement": same / n},
            rows={"step logits cosine": logits},
            scores=logits,
            notes={"soft-token op": op},
        )

    def timed(self, runner: Runner, kernels: str, threads: int) -> dict[str, Timed]:
        """One decode step of the step graph (batch 1, a recorded mid-answer step) and one SoftTokenEmbedding call
        at batch 8 over the model's vocabulary."""
        import torch

        from softdeploy.generate import Decoding, _op_attrs

        feeds = self._step_feeds
        table = self._export.load_embedding()
        rng = np.random.default_rng(0)
        logits = rng.standard_normal((BATCH, table.shape[0])).astype(np.float32)
        noise = rng.random((BATCH, table.shape[0]), dtype=np.float32)
        mode = np.zeros(BATCH, np.int64)
        attrs = _op_attrs(self._soft(), Decoding())
        if kernels == "torch":
            from softdeploy.nn import SoftTokenEmbedding

            op = SoftTokenEmbedding(torch.from_numpy(table), **attrs)
            lt, nt, mt = map(torch.from_numpy, (logits, noise, mode))

            def soft() -> object:
                with torch.no_grad():
                    return op(lt, nt, mt)
        else:
            from softdeploy.generate import soft_token_model
            from softdeploy.runtime import Session

            sess = Session(
                soft_token_model(attrs, logits, table, noise, mode),
                kernels="native" if kernels == "native" else "portable",
                threads=threads,
            )
            bound = sess.bind({"Logits": logits, "Embedding": table, "Noise": noise, "Mode": mode})
            soft = bound
        return {"decode step": Timed(lambda: runner(feeds), 1), "soft-token op": Timed(soft, BATCH)}

    def floors(self, rows: list[dict[str, Any]]) -> list[Floor]:
        """torch eager and onnxruntime (stock bodies too) produce onnxruntime fp32's traces."""
        out = []
        for r in rows:
            if r["variant"] in ("torch-fp32", "ort-fp32-stock"):
                v = float(r["trace agreement"])
                out.append(Floor(f"{r['variant']}: identical traces to ort-fp32", v, "1.0", v == 1.0))
        return out
