"""``distill``: train a student sentence encoder against a teacher, one-shot or in stages.

Objectives (``DistillConfig.objective``; the main loss):

* ``mse`` -- sentence-transformers' recipe: mean squared error between the student's and the teacher's
  embeddings, of the L2-normalised token embeddings over valid tokens (``level="token"``, what MaxSim
  scores) or of the sentence embeddings (``level="sentence"``);
* ``kd`` -- knowledge distillation on output distributions (:func:`kd_loss`): for an embedding model the
  distribution of each sentence over the other sentences of its batch, ``softmax(scale * cos)``
  (``scale`` 20, as MultipleNegativesRankingLoss), the teacher's optionally top-k truncated
  (``renorm``/``tail``) and both softened by a registry operator at ``temperature``.

Layer-to-layer hidden-state MSE (``hidden_weight`` > 0; TinyBERT's / MiniLM's intermediate-layer
distillation, added to the main loss): student layer ``k`` of ``m`` (its output, not normalised) is matched to
the output of teacher layer ``(k + 1) * n / m - 1`` (6 -> 3: teacher layers 1, 3, 5), over valid tokens. It gives
every student layer its own target, which converges in far fewer steps than the last layer's alone (measured:
cases/results/experiments/distill_recipes.md).

Frozen embeddings (``freeze_embeddings``): the student's embedding module (word, position and token-type tables
and their LayerNorm) keeps the teacher's weights. With a few thousand texts, training the word table moves only
the rows of the tokens those texts contain, away from the rows of every token they do not -- which held-out
queries do contain; frozen, the student's layers learn against the embeddings they will meet. It also saves the
AdamW update of the 11.7 M-entry word table each step. ``dropout=False`` trains the student in eval mode
(no dropout): a regression onto a deterministic teacher gains nothing from the noise at these budgets. Both
measured in cases/results/experiments/distill_recipes.md.

Learning rate: ``lr`` after a linear warmup over the first ``warmup`` fraction of the steps, then constant
(``schedule="constant"``) or linearly down to 0 at the last step (``"linear"``); set per step from the step
index, so a resumed run follows the same schedule.

Auxiliary objective (``aux="int8"``): the same MSE with the student's Linear weights fake-quantised to
symmetric per-channel int8 (straight-through), so that the student keeps its accuracy after int8
quantization. ``combine`` chooses how it joins the main loss: ``bloop`` (:class:`Bloop`, the auxiliary
gradient projected orthogonally to the EMA of the main one) or ``sum`` (``main + lam * aux``).

Batches (``group_by_length``, default on): each epoch's seeded permutation is cut into chunks of
``GROUP_CHUNK`` batches, each chunk sorted by token length and split into batches, and the batches shuffled --
a batch pads to its longest text, so mixing a 120-token answer with 15 short questions pays for 16 x 120
tokens. On the chatterbot texts at max length 128 this halves the cost of a step
(cases/results/experiments/distill_recipes.md).
Teacher outputs (``cache_teacher``, default on): when the run sees every text more than once and the outputs
fit in ``teacher_cache_mib``, the teacher encodes every text once up front (in length-sorted chunks, so a
resumed run gets the same targets) and each step reads its targets from memory; the teacher's forward pass
was about a third of a step. Not with ``hidden_weight`` > 0 (its hidden states are not kept).

Broad texts beside the task's (``distill(..., extra_texts=...)``): each batch takes ``extra_fraction`` of its
texts from ``extra_texts`` and the rest from ``texts``, each stream its own length-grouped epochs (so a few
thousand task texts are revisited every epoch while tens of thousands of broad ones are seen about once). On
minilm_distilled the 954 chatbot answers fit the corpus side, WordNet's definitions put in question form teach the
query side the words, names and shape of the held-out questions (cases/results/experiments/distill_recipes.md).

Runs are deterministic for a seed (data order per epoch from the seed; dropout reseeded per step), and
resumable: every ``checkpoint_every`` steps and at the end, one safetensors file holds the student, the
AdamW state, Bloop's EMA and the step; its metadata carries a key of the settings, data and student
shape, and resuming from a checkpoint of another run raises DistillError. A resumed run ends with the
weights of an uninterrupted one.

Multi-stage (:func:`distill_stages`): ``6 -> 5 -> 4 -> 3`` layers, each stage a layer reduction of the
previous student distilled from it (or from the original teacher), the total step budget split evenly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from softdeploy.distill.bloop import Bloop
from softdeploy.distill.softening import get_softening, truncate_topk
from softdeploy.distill.students import SentenceEncoder, check_compatible, evenly_spaced_layers, layer_reduce
from softdeploy.errors import ArgumentError, DistillError

CHECKPOINT_FORMAT = "softdeploy-distill-1"


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    """Settings of one distillation run (all part of the checkpoint key)."""

    objective: Literal["mse", "kd"] = "mse"
    level: Literal["token", "sentence"] = "token"
    softening: str = "power"
    temperature: float = 2.0
    top_k: int | None = None
    completion: Literal["renorm", "tail"] = "renorm"
    scale: float = 20.0
    aux: Literal["int8"] | None = None
    combine: Literal["bloop", "sum"] = "bloop"
    lam: float = 0.1
    ema: float = 0.1
    steps: int = 200
    batch_size: int = 32
    lr: float = 1e-4
    warmup: float = 0.0
    schedule: Literal["constant", "linear"] = "constant"
    hidden_weight: float = 0.0
    freeze_embeddings: bool = True
    dropout: bool = False
    weight_decay: float = 0.01
    max_length: int = 64
    extra_fraction: float = 0.5  # of each batch, from distill's extra_texts when given
    group_by_length: bool = True
    cache_teacher: bool = True
    teacher_cache_mib: int = 1024
    seed: int = 0
    checkpoint_every: int = 50

    def check(self) -> None:
        """ArgumentError naming the first setting out of range."""
        if self.objective not in ("mse", "kd"):
            raise ArgumentError(f"distill: objective {self.objective!r} is not one of ['mse', 'kd']")
        if self.level not in ("token", "sentence"):
            raise ArgumentError(f"distill: level {self.level!r} is not one of ['token', 'sentence']")
        if self.aux not in (None, "int8"):
            raise ArgumentError(f"distill: aux {self.aux!r} is not one of [None, 'int8']")
        if self.combine not in ("bloop", "sum"):
            raise ArgumentError(f"distill: combine {self.combine!r} is not one of ['bloop', 'sum']")
        if self.schedule not in ("constant", "linear"):
            raise ArgumentError(f"distill: schedule {self.schedule!r} is not one of ['constant', 'linear']")
        if not 0.0 <= self.warmup < 1.0:
            raise ArgumentError(
                f"distill: warmup {self.warmup} is out of range (rule: 0 <= warmup < 1, a fraction of steps)"
            )
        for name in ("lr", "temperature", "scale", "lam", "ema", "weight_decay", "hidden_weight"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ArgumentError(f"distill: {name} {value!r} is not a finite number")
        if self.lr < 0.0:  # 0 is allowed: steps that leave the weights as they are
            raise ArgumentError(f"distill: lr {self.lr} is out of range (rule: a learning rate >= 0)")
        if self.weight_decay < 0.0:
            raise ArgumentError(f"distill: weight_decay {self.weight_decay} is out of range (rule: >= 0)")
        if not 0.0 < self.ema <= 1.0:
            raise ArgumentError(f"distill: ema {self.ema} is out of range (rule: 0 < ema <= 1)")
        if self.lam < 0.0:
            raise ArgumentError(f"distill: lam {self.lam} is out of range (rule: >= 0)")
        if self.hidden_weight < 0.0:
            raise ArgumentError(f"distill: hidden_weight {self.hidden_weight} is out of range (rule: >= 0)")
        if not 0.0 < self.extra_fraction < 1.0:
            raise ArgumentError(f"distill: extra_fraction {self.extra_fraction} is out of range (rule: 0 < f < 1)")
        if self.teacher_cache_mib < 0:
            raise ArgumentError(f"distill: teacher_cache_mib {self.teacher_cache_mib} is out of range (rule: >= 0)")
        for name in ("steps", "batch_size", "max_length", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ArgumentError(f"distill: {name} {getattr(self, name)} is out of range (rule: >= 1)")
        if self.objective == "kd":
            get_softening(self.softening).check_temperature(self.temperature)
            if self.batch_size < 3:
                raise ArgumentError("distill: objective 'kd' needs batch_size >= 3 (in-batch distributions)")
            if self.top_k is not None and not 1 <= self.top_k <= self.batch_size - 1:
                raise ArgumentError(f"distill: top_k {self.top_k} is out of range (rule: 1 <= top_k <= batch_size - 1)")


@dataclasses.dataclass
class DistillResult:
    """What a run returns: the trained student and its per-step losses."""

    student: SentenceEncoder
    main_losses: list[float]
    aux_losses: list[float]
    steps: int
    resumed_from: int
    checkpoint: Path | None


def kd_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    *,
    softening: str = "power",
    temperature: float = 2.0,
    top_k: int | None = None,
    completion: Literal["renorm", "tail"] = "renorm",
) -> Tensor:
    """``T^2 * KL(S_T(teacher) || S_T(student))`` over the last axis, averaged over rows; the teacher's
    distribution ``softmax(teacher_logits)``, top-k truncated first when ``top_k`` (then softened: the order
    of softdeploy.distill.softening), the student's ``S_T(softmax(student_logits))``. ``0 log 0 = 0``: classes
    a truncated teacher gives no mass cost nothing."""
    op = get_softening(softening)
    with torch.no_grad():
        p = torch.softmax(teacher_logits, -1) if top_k is None else truncate_topk(teacher_logits, top_k, completion)
        p = op.soften(p, temperature)
    q = op.soften_logits(student_logits, temperature)
    kl = torch.special.xlogy(p, p) - p * torch.log(q.clamp_min(torch.finfo(q.dtype).tiny))
    return kl.sum(-1).mean() * temperature**2


def fake_quant_int8(w: Tensor) -> Tensor:
    """Symmetric per-output-channel int8 fake quantisation with a straight-through gradient."""
    scale = w.detach().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
    q = torch.clamp(torch.round(w / scale), -127, 127) * scale
    return w + (q - w).detach()


def lr_factor(cfg: DistillConfig, step: int) -> float:
    """The multiplier of ``cfg.lr`` at optimizer step ``step`` (0-based): linear warmup over
    ``ceil(warmup * steps)`` steps, then 1 (constant) or linear decay to 0 at ``steps`` (linear)."""
    w = math.ceil(cfg.warmup * cfg.steps)
    if step < w:
        return (step + 1) / (w + 1)
    if cfg.schedule == "linear":
        return max(0.0, (cfg.steps - step) / max(1, cfg.steps - w))
    return 1.0


def hidden_layer_map(teacher_layers: int, student_layers: int) -> list[int]:
    """The teacher layer whose output each student layer is matched to by the hidden-state MSE:
    ``(k + 1) * n // m - 1`` (6 -> 3: 1, 3, 5; the last student layer always to the last teacher layer)."""
    return [(k + 1) * teacher_layers // student_layers - 1 for k in range(student_layers)]


def _masked_mse(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    m = mask.unsqueeze(-1).to(a.dtype)
    return (((a - b) ** 2) * m).sum() / (m.sum() * a.shape[-1])


class _Objective:
    def __init__(self, cfg: DistillConfig) -> None:
        self.cfg = cfg

    def main(self, s_tok: Tensor, s_sent: Tensor, t_tok: Tensor, t_sent: Tensor, mask: Tensor) -> Tensor:
        c = self.cfg
        if c.objective == "mse":
            if c.level == "token":
                return _masked_mse(s_tok, t_tok, mask)
            return ((s_sent - t_sent) ** 2).mean()
        b = s_sent.shape[0]
        off = ~torch.eye(b, dtype=torch.bool)
        s_logits = (c.scale * s_sent @ s_sent.T)[off].view(b, b - 1)
        t_logits = (c.scale * t_sent @ t_sent.T)[off].view(b, b - 1)
        return kd_loss(
            s_logits, t_logits, softening=c.softening, temperature=c.temperature, top_k=c.top_k, completion=c.completion
        )

    def aux(self, student: SentenceEncoder, ids: Tensor, mask: Tensor, t_tok: Tensor, t_sent: Tensor) -> Tensor:
        from torch.func import functional_call

        params = {
            name: (fake_quant_int8(p) if p.dim() == 2 and name.endswith(".weight") and "embeddings" not in name else p)
            for name, p in student.named_parameters()
        }
        q_tok, q_sent = functional_call(student, params, (ids, mask))
        if self.cfg.level == "token":
            return _masked_mse(q_tok, t_tok, mask)
        return ((q_sent - t_sent) ** 2).mean()


def run_key(cfg: DistillConfig, texts: Sequence[str], student: SentenceEncoder, extra: str = "") -> str:
    """The key a checkpoint must carry to be resumed: settings, data, student shape and initial weights."""
    h = hashlib.sha256()
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "checkpoint_every"}
    h.update(json.dumps(fields, sort_keys=True).encode())
    for t in texts:
        h.update(t.encode() + b"\0")
    h.update(f"{student.num_layers}:{student.hidden_size}:{extra}".encode())
    with torch.no_grad():
        for name, p in student.state_dict().items():
            h.update(name.encode())
            h.update(f"{float(p.double().sum()):.9e}".encode())
    return h.hexdigest()[:32]


def _save(
    path: Path, key: str, step: int, student: SentenceEncoder, opt: torch.optim.Optimizer, bloop: Bloop | None
) -> None:
    from safetensors.torch import save_file

    from softdeploy.files import make_folder, write_with

    tensors = {f"student.{k}": v.detach().contiguous().clone() for k, v in student.state_dict().items()}
    state = opt.state_dict()
    for i, s in state["state"].items():
        for name, v in s.items():
            tensors[f"optimizer.{i}.{name}"] = v.detach().reshape(v.shape).contiguous().clone()
    if bloop is not None and bloop.grad_main_ema is not None:
        for i, e in enumerate(bloop.grad_main_ema):
            tensors[f"bloop.{i}"] = e.contiguous().clone()
    meta = {
        "format": CHECKPOINT_FORMAT,
        "key": key,
        "step": str(step),
        "param_groups": json.dumps(state["param_groups"]),
    }
    make_folder(path.parent, "checkpoint folder")
    # written beside the checkpoint and renamed over it once complete: a crash, Ctrl-C or full disk mid-write leaves
    # the previous checkpoint intact and no partial file behind; its digest (softdeploy.cache) follows, so an edited
    # or replaced checkpoint is told from the one this run wrote
    from softdeploy.cache import digest_path, seal

    digest_path(path).unlink(missing_ok=True)
    write_with(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta), what="checkpoint")
    seal(path, "checkpoint")


_OPT_STATE = {"step": "a scalar", "exp_avg": "the parameter's shape", "exp_avg_sq": "the parameter's shape"}


def _load(
    path: Path,
    key: str,
    steps: int,
    student: SentenceEncoder,
    opt: torch.optim.Optimizer,
    bloop: Bloop | None,
) -> int:
    """Restores ``student``, ``opt`` and ``bloop`` from the checkpoint ``path`` of the run ``key`` of ``steps``
    steps; returns its step. Everything is checked against the run before anything is restored -- the header, the
    format, the key, the step (0 <= step <= steps: the key covers ``steps``, so a later step means an edited or
    damaged file, whose resume would return an untrained student as if trained), the optimizer's groups, every
    tensor's name and shape, finite values -- each failure a DistillError naming the file and what is wrong."""
    from softdeploy.cache import digest_path, verify
    from softdeploy.errors import CacheError
    from softdeploy.safetensors_check import load_tensors, read_header

    if digest_path(path).exists():  # checkpoints written before digests existed are checked structurally only
        try:
            verify(path)
        except CacheError as e:
            raise DistillError(f"checkpoint {path}: {str(e).split(': ', 1)[-1]}") from e
    header = read_header(path, DistillError)
    meta = header.metadata
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise DistillError(f"{path}: not a softdeploy distill checkpoint (format {meta.get('format')!r})")
    if meta.get("key") != key:
        raise DistillError(
            f"{path}: checkpoint of another run (key {meta.get('key')} != {key}: settings, data or student "
            "differ); delete it or choose another checkpoint path"
        )
    raw_step = meta.get("step", "")
    if not (raw_step.isascii() and raw_step.isdigit()):
        raise DistillError(f"{path}: step {raw_step!r} (rule: the checkpoint records its step as an integer >= 0)")
    step = int(raw_step)
    if step > steps:
        raise DistillError(
            f"{path}: step {step} is past the run's {steps} steps (rule: a checkpoint of this run records "
            "0 <= step <= steps; the file was edited or damaged -- delete it to start over)"
        )
    try:
        groups = json.loads(meta.get("param_groups", ""))
    except ValueError as e:
        raise DistillError(f"{path}: param_groups is not JSON ({e}) (rule: AdamW's param_groups)") from None
    mine = opt.state_dict()["param_groups"]
    if (
        not isinstance(groups, list)
        or len(groups) != len(mine)
        or not all(isinstance(g, dict) and g.get("params") == m["params"] for g, m in zip(groups, mine, strict=False))
    ):
        raise DistillError(
            f"{path}: the optimizer's parameter groups do not match the student's "
            f"({sum(len(m['params']) for m in mine)} parameters in {len(mine)} group(s)) (rule: one run, one student)"
        )
    problems = _checkpoint_problems(header.shapes(), student, opt, bloop)
    if bloop is not None:
        held = sum(f"bloop.{i}" in header.tensors for i in range(len(bloop.params)))
        if held not in (0, len(bloop.params)):
            problems.append(f"Bloop's EMA of {held} of the {len(bloop.params)} parameters (rule: all or none)")
    if problems:
        raise DistillError(f"{path}: does not fit this run's student: {'; '.join(problems[:4])}")
    tensors = load_tensors(header, DistillError)
    student.load_state_dict({k[len("student.") :]: v for k, v in tensors.items() if k.startswith("student.")})
    opt_state: dict[int, dict[str, Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith("optimizer."):
            _, i, name = k.split(".", 2)
            opt_state.setdefault(int(i), {})[name] = v
    try:
        opt.load_state_dict({"state": opt_state, "param_groups": groups})
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise DistillError(f"{path}: the optimizer state cannot be restored ({type(e).__name__}: {e})") from None
    if bloop is not None:
        ema = [tensors[f"bloop.{i}"] for i in range(len(bloop.params)) if f"bloop.{i}" in tensors]
        bloop.grad_main_ema = ema if ema else None
    return step


def _checkpoint_problems(
    have: dict[str, tuple[int, ...]], student: SentenceEncoder, opt: torch.optim.Optimizer, bloop: Bloop | None
) -> list[str]:
    """What in a checkpoint's tensor names and shapes does not fit the run: missing or unexpected student weights,
    wrong shapes, optimizer and Bloop state of parameters the run does not have."""
    problems: list[str] = []
    want = {f"student.{k}": tuple(v.shape) for k, v in student.state_dict().items()}
    params = [p for g in opt.param_groups for p in g["params"]]
    ema_params = list(bloop.params) if bloop is not None else []
    missing = sorted(set(want) - set(have))
    if missing:
        problems.append(f"missing {missing[:3]}")
    for name, shape in have.items():
        if name.startswith("student."):
            if name not in want:
                problems.append(f"unexpected tensor {name!r}")
            elif shape != want[name]:
                problems.append(f"{name} has shape {list(shape)}, the student's is {list(want[name])}")
            continue
        head, _, rest = name.partition(".")
        index, _, field = rest.partition(".")
        if head == "optimizer" and index.isdigit() and int(index) < len(params) and field in _OPT_STATE:
            expect = () if field == "step" else tuple(params[int(index)].shape)
            if shape != expect:
                problems.append(f"{name} has shape {list(shape)} (rule: {_OPT_STATE[field]}, {list(expect)})")
        elif head == "bloop" and index.isdigit() and not field and int(index) < len(ema_params):
            if shape != tuple(ema_params[int(index)].shape):
                problems.append(
                    f"{name} has shape {list(shape)}, its parameter's is {list(ema_params[int(index)].shape)}"
                )
        else:
            problems.append(
                f"unexpected tensor {name!r} (rule: student.*, optimizer.<i>.step/exp_avg/exp_avg_sq, bloop.<i>)"
            )
    return problems


GROUP_CHUNK = 50  # batches per length-sorted chunk: long enough to group lengths, short enough to stay random


def extra_per_batch(cfg: DistillConfig) -> int:
    """How many texts of each batch come from ``extra_texts``: ``extra_fraction`` of the batch, at least one and
    at most all but one."""
    return min(cfg.batch_size - 1, max(1, round(cfg.extra_fraction * cfg.batch_size)))


class _Batches:
    """The text indices of every optimizer step: epochs of a seeded permutation, the last partial batch of an
    epoch dropped (every step sees ``batch_size`` texts, so budgets compare like with like); with ``lengths``,
    grouped by length (chunks of ``GROUP_CHUNK`` batches sorted by token length, then the batches shuffled).
    A function of (seed, step) only, so a resumed run continues the same sequence."""

    def __init__(self, n: int, batch_size: int, seed: int, lengths: Sequence[int] | None = None) -> None:
        self.n, self.batch_size, self.seed, self.lengths = n, batch_size, seed, lengths
        self.per_epoch = max(1, n // batch_size)
        self._epoch = -1
        self._batches: list[list[int]] = []

    def __call__(self, step: int) -> list[int]:
        epoch, i = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._batches = epoch, self._epoch_batches(epoch)
        return self._batches[i]

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        b = self.batch_size
        perm = torch.randperm(self.n, generator=g).tolist()[: self.per_epoch * b]
        if self.lengths is None:
            return [perm[i * b : (i + 1) * b] for i in range(self.per_epoch)]
        batches: list[list[int]] = []
        lengths = self.lengths
        for c in range(0, len(perm), GROUP_CHUNK * b):
            chunk = sorted(perm[c : c + GROUP_CHUNK * b], key=lambda j: lengths[j])
            batches += [chunk[k : k + b] for k in range(0, len(chunk), b)]
        return [batches[j] for j in torch.randperm(len(batches), generator=g).tolist()]


class _MixedBatches:
    """Batches of ``batch_size - k`` texts of the first ``n_main`` (the task's) and ``k`` of the following
    ``n_extra``, as two :class:`_Batches` streams (seeds ``seed`` and ``seed + 1``); indices into
    ``texts + extra_texts``. A function of (seed, step) only."""

    def __init__(
        self, n_main: int, n_extra: int, batch_size: int, k: int, seed: int, lengths: Sequence[int] | None
    ) -> None:
        self.n_main = n_main
        main_len = None if lengths is None else lengths[:n_main]
        extra_len = None if lengths is None else lengths[n_main:]
        self.main = _Batches(n_main, batch_size - k, seed, main_len)
        self.extra = _Batches(n_extra, k, seed + 1, extra_len)

    def __call__(self, step: int) -> list[int]:
        return self.main(step) + [self.n_main + j for j in self.extra(step)]


class _TeacherCache:
    """The teacher's token and sentence outputs of every text, computed once in length-sorted chunks (the same
    chunks whatever step a run starts from, so a resumed run reads the same targets)."""

    CHUNK = 64

    def __init__(
        self,
        teacher: SentenceEncoder,
        tokenizer: Any,
        texts: Sequence[str],
        lengths: Sequence[int],
        cfg: DistillConfig,
        progress: Any,
    ) -> None:
        self.tok: list[Tensor] = [torch.empty(0)] * len(texts)
        self.sent: list[Tensor] = [torch.empty(0)] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: lengths[i])
        with progress.step(f"teacher outputs of {len(texts)} texts (cached)", total=len(texts)) as advance:
            for c in range(0, len(order), self.CHUNK):
                chunk = order[c : c + self.CHUNK]
                enc = tokenizer(
                    [texts[i] for i in chunk],
                    padding=True,
                    truncation=True,
                    max_length=cfg.max_length,
                    return_tensors="pt",
                )
                with torch.no_grad():
                    t_tok, t_sent = teacher(enc["input_ids"], enc["attention_mask"])
                for j, i in enumerate(chunk):
                    self.tok[i] = t_tok[j, : lengths[i]].clone()
                    self.sent[i] = t_sent[j].clone()
                advance(len(chunk))

    @staticmethod
    def fits(teacher: SentenceEncoder, lengths: Sequence[int], cfg: DistillConfig) -> bool:
        """Caching pays (the run sees a text more than once), is possible (no hidden states needed) and fits."""
        size = (sum(lengths) + len(lengths)) * teacher.hidden_size * 4
        return (
            cfg.cache_teacher
            and cfg.hidden_weight == 0
            and cfg.steps * cfg.batch_size > len(lengths)
            and size <= cfg.teacher_cache_mib * 2**20
        )

    def targets(self, idx: Sequence[int], seq_len: int) -> tuple[Tensor, Tensor]:
        """Token targets ``[b, seq_len, d]`` (zeros past each text's length) and sentence targets ``[b, d]``."""
        t_tok = torch.zeros(len(idx), seq_len, self.tok[idx[0]].shape[-1])
        for j, i in enumerate(idx):
            t_tok[j, : self.tok[i].shape[0]] = self.tok[i]
        return t_tok, torch.stack([self.sent[i] for i in idx])


def distill(
    teacher: SentenceEncoder,
    student: SentenceEncoder,
    texts: Sequence[str],
    *,
    tokenizer: Any,
    config: DistillConfig | None = None,
    student_tokenizer: Any = None,
    checkpoint: str | Path | None = None,
    progress: Any = None,
    description: str = "distill",
    extra_texts: Sequence[str] = (),
) -> DistillResult:
    """Trains ``student`` (in place; returned in eval mode) to mimic ``teacher`` on ``texts`` for
    ``config.steps`` AdamW steps; resumes from ``checkpoint`` when that file exists and belongs to this run.
    ``extra_texts``: broad texts making up ``config.extra_fraction`` of every batch (module docstring).
    ``progress``: a softdeploy.compare Progress (RichProgress on a terminal), silent when None."""
    from softdeploy.progress import SilentProgress

    cfg = config or DistillConfig()
    cfg.check()
    check_compatible(teacher, student, tokenizer, student_tokenizer)
    texts, extra = list(texts), list(extra_texts)
    k = extra_per_batch(cfg) if extra else 0
    if len(texts) < cfg.batch_size - k:
        raise ArgumentError(
            f"distill: {len(texts)} texts for batch_size {cfg.batch_size} (rule: texts >= batch_size - {k} extra)"
        )
    if extra and len(extra) < k:
        raise ArgumentError(f"distill: {len(extra)} extra_texts for {k} per batch (rule: extra_texts >= {k})")
    progress = progress or SilentProgress()
    n_main, texts = len(texts), texts + extra  # batches index texts, then extra_texts
    key = run_key(cfg, texts, student, f"extra {len(extra)}" if extra else "")
    for name, p in student.named_parameters():  # a layer reduction of a frozen teacher starts frozen too
        p.requires_grad_(not (cfg.freeze_embeddings and name.startswith("bert.embeddings.")))
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    bloop = Bloop(opt, lam=cfg.lam, ema=cfg.ema, combine=cfg.combine, params=params) if cfg.aux else None
    ckpt = Path(checkpoint) if checkpoint is not None else None
    start = 0
    if ckpt is not None and ckpt.is_file():
        start = _load(ckpt, key, cfg.steps, student, opt, bloop)
    objective = _Objective(cfg)
    layer_map = hidden_layer_map(teacher.num_layers, student.num_layers)
    teacher.eval()
    lengths: list[int] | None = None
    if cfg.group_by_length or cfg.cache_teacher:
        enc_all = tokenizer(texts, truncation=True, max_length=cfg.max_length)
        lengths = [len(x) for x in enc_all["input_ids"]]
    grouping = lengths if cfg.group_by_length else None
    batches: _Batches | _MixedBatches = (
        _MixedBatches(n_main, len(extra), cfg.batch_size, k, cfg.seed, grouping)
        if extra
        else _Batches(len(texts), cfg.batch_size, cfg.seed, grouping)
    )
    cache = None
    if lengths is not None and _TeacherCache.fits(teacher, lengths, cfg):
        cache = _TeacherCache(teacher, tokenizer, texts, lengths, cfg, progress)
    student.train(cfg.dropout)
    mains: list[float] = []
    auxs: list[float] = []
    with progress.step(description, total=cfg.steps) as advance:
        advance(start)
        for step in range(start, cfg.steps):
            idx = batches(step)
            enc = tokenizer(
                [texts[i] for i in idx], padding=True, truncation=True, max_length=cfg.max_length, return_tensors="pt"
            )
            ids, mask = enc["input_ids"], enc["attention_mask"]
            for g in opt.param_groups:
                g["lr"] = cfg.lr * lr_factor(cfg, step)
            if cache is not None:
                (t_tok, t_sent), t_hidden = cache.targets(idx, ids.shape[1]), ()
            else:
                with torch.no_grad():
                    t_tok, t_sent, t_hidden = teacher.states(ids, mask, hidden=cfg.hidden_weight > 0)
            torch.manual_seed(cfg.seed * 1_000_003 + step)  # dropout: the same masks after a resume
            s_tok, s_sent, s_hidden = student.states(ids, mask, hidden=cfg.hidden_weight > 0)
            main = objective.main(s_tok, s_sent, t_tok, t_sent, mask)
            if cfg.hidden_weight > 0:
                # hidden_states[0] is the embedding output; layer i's output is hidden_states[i + 1]
                pairs = zip(s_hidden[1:], (t_hidden[j + 1] for j in layer_map), strict=True)
                main = main + cfg.hidden_weight * sum(_masked_mse(a, b, mask) for a, b in pairs) / len(layer_map)
            opt.zero_grad(set_to_none=True)
            if bloop is not None:
                aux = objective.aux(student, ids, mask, t_tok, t_sent)
                bloop.step(main, aux)
                auxs.append(float(aux.detach()))
            else:
                main.backward()
                opt.step()
            value = float(main.detach())
            if not math.isfinite(value):
                raise DistillError(f"distill: main loss became {value} at step {step} (lower lr?)")
            mains.append(value)
            advance(1)
            done = step + 1
            if ckpt is not None and (done % cfg.checkpoint_every == 0 or done == cfg.steps):
                _save(ckpt, key, done, student, opt, bloop)
    student.eval()
    return DistillResult(student, mains, auxs, cfg.steps, start, ckpt)


def distill_stages(
    teacher: SentenceEncoder,
    texts: Sequence[str],
    *,
    tokenizer: Any,
    layers: Sequence[int],
    final_layers: Sequence[int] | None = None,
    config: DistillConfig | None = None,
    stage_teacher: Literal["previous", "original"] = "previous",
    checkpoint_dir: str | Path | None = None,
    progress: Any = None,
    extra_texts: Sequence[str] = (),
) -> list[DistillResult]:
    """Multi-stage layer reduction: for each layer count in ``layers`` (decreasing, e.g. 5, 4, 3), the
    previous model (the teacher first) loses layers and is distilled from the previous model
    (``stage_teacher="previous"``) or from ``teacher``, each stage ``config.steps // len(layers)`` steps
    (the same total budget as one-shot ``distill`` with ``config.steps``). The last stage keeps the
    teacher's ``final_layers`` (default: :func:`evenly_spaced_layers`, 0, 3, 5 for 6 -> 3, as one-shot), so both end on
    the same layers: each stage drops the not-kept teacher layers from the last one down (6 -> 5 -> 4 -> 3:
    drops layer 4, then 2, then 1). ``extra_texts``: as :func:`distill`'s, in every stage."""
    cfg = config or DistillConfig()
    counts = list(layers)
    if not counts or any(b >= a for a, b in zip([teacher.num_layers, *counts], counts, strict=False)):
        raise ArgumentError(
            f"distill stages: layer counts {counts} must decrease from the teacher's {teacher.num_layers}"
        )
    final = list(final_layers) if final_layers is not None else evenly_spaced_layers(teacher.num_layers, counts[-1])
    if len(final) != counts[-1] or sorted(set(final)) != final or final[0] < 0 or final[-1] >= teacher.num_layers:
        raise ArgumentError(
            f"distill stages: final layers {final} are not {counts[-1]} distinct increasing teacher layer indices"
        )
    drop_order = [i for i in reversed(range(teacher.num_layers)) if i not in final]
    per_stage = dataclasses.replace(cfg, steps=max(1, cfg.steps // len(counts)))
    results: list[DistillResult] = []
    current = teacher
    origin = list(range(teacher.num_layers))  # the teacher layer each layer of `current` started as
    for i, m in enumerate(counts):
        dropped = set(drop_order[: teacher.num_layers - m])
        keep = [j for j, o in enumerate(origin) if o not in dropped]
        origin = [origin[j] for j in keep]
        student = layer_reduce(current, keep)
        ckpt = None if checkpoint_dir is None else Path(checkpoint_dir) / f"stage{i + 1}-{m}layers.safetensors"
        source = current if stage_teacher == "previous" else teacher
        r = distill(
            source,
            student,
            texts,
            tokenizer=tokenizer,
            config=per_stage,
            checkpoint=ckpt,
            progress=progress,
            description=f"distill stage {i + 1}/{len(counts)}: {current.num_layers} -> {m} layers",
            extra_texts=extra_texts,
        )
        results.append(r)
        current = r.student
    return results


def freeze(model: nn.Module) -> nn.Module:
    """``model`` in eval mode without gradients (a teacher)."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()
