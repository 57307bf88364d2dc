"""LoRA-Mixer projections: a frozen ``nn.Linear`` plus E routed low-rank experts (arXiv 2507.00029).

    y = x W^T + b + Delta,   Delta = LoRAMixer(x, A, Bm, Router; top_k, scaling)   (docs/ops/LoRAMixer.md)

Forward calls the registry's torch op ``softdeploy::lora_mixer``, so :func:`softdeploy.export` turns
each projection into ``MatMul + Add`` (the base Linear) plus one ``LoRAMixer`` node: the routed
export. :func:`softdeploy.lora.merge` turns it into a plain Linear for a fixed routing instead.

Training uses the hard-soft routing strategy: the forward value is the op's hard top-k routing (what
is deployed), the backward pass is that of the soft, dense mixture
``scaling * sum_e softmax(Router x)_e * Bm_e A_e x`` (straight-through:
``delta = soft + (hard - soft).detach()``), so every expert and the router get gradients. Routing
statistics of the last training forward are kept for :func:`routing_loss`.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from softdeploy.errors import ArgumentError
from softdeploy.ops import get as _get_op
from softdeploy.ops._torch import torch_op

# HF BERT / MiniLM attention projections (q, k, v, o); the o projection is attention.output.dense.
BERT_ATTENTION = ("*attention.self.query", "*attention.self.key", "*attention.self.value", "*attention.output.dense")


def _op() -> Any:
    return torch_op(_get_op("LoRAMixer"))


class LoRAMixerLinear(nn.Module):
    """``base(x) + LoRAMixer(x, A, Bm, Router)``: ``base`` frozen, ``num_experts`` experts of rank
    ``rank`` (A ``[E, r, in]``, Bm ``[E, out, r]``), a router ``[E, in]``, ``top_k`` experts per token,
    ``scaling`` (LoRA's alpha / r) on the delta.

    Initialisation as LoRA's: A Kaiming-uniform, Bm zero (the wrapped model starts equal to the base),
    the router small random (a zero router would tie every expert: tokens would all pick 0..k-1)."""

    def __init__(
        self,
        base: nn.Linear,
        num_experts: int,
        rank: int,
        *,
        top_k: int = 1,
        scaling: float = 1.0,
        train_experts: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ArgumentError(f"LoRAMixerLinear wraps an nn.Linear, got {type(base).__name__}")
        if not 1 <= top_k <= num_experts:
            raise ArgumentError(
                f"LoRAMixer: top_k {top_k} is out of range for E = {num_experts} experts (rule: 1 <= top_k <= E)"
            )
        if rank < 1:
            raise ArgumentError(f"LoRAMixer: rank {rank} is out of range (rule: rank >= 1)")
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        n_in, n_out = base.in_features, base.out_features
        dd = {"dtype": base.weight.dtype, "device": base.weight.device}
        self.A = nn.Parameter(torch.empty(num_experts, rank, n_in, **dd), requires_grad=train_experts)
        self.Bm = nn.Parameter(torch.zeros(num_experts, n_out, rank, **dd), requires_grad=train_experts)
        self.router = nn.Parameter(torch.randn(num_experts, n_in, **dd) * 0.02)
        for e in range(num_experts):
            nn.init.kaiming_uniform_(self.A.data[e], a=math.sqrt(5))
        self.top_k = top_k
        self.scaling = float(scaling)
        self.last_probs: Tensor | None = None  # softmax(Router x) of the last training forward [N, E]
        self.last_experts: Tensor | None = None  # the op's Experts output of the last training forward

    @property
    def num_experts(self) -> int:
        """E, the number of LoRA experts."""
        return int(self.A.shape[0])

    @property
    def rank(self) -> int:
        """r, the rank of each expert's factors."""
        return int(self.A.shape[1])

    def extra_repr(self) -> str:
        """The experts, rank, top_k and scaling, as printed inside the module's repr."""
        return f"experts={self.num_experts}, rank={self.rank}, top_k={self.top_k}, scaling={self.scaling:g}"

    def forward(self, x: Tensor) -> Tensor:
        """``base(x) + LoRAMixer(x)``. In training (with grad) the forward stays hard (the top-k experts only)
        and the backward is soft: the gradient is that of the dense mixture softmax(Router x) over all
        experts (straight-through); the routing probabilities and the chosen experts are kept for the loss."""
        delta, experts, _ = _op()(x, self.A, self.Bm, self.router, top_k=self.top_k, scaling=self.scaling)
        if self.training and torch.is_grad_enabled():
            self.last_experts = experts.detach()
            probs = torch.softmax(x @ self.router.t(), dim=-1)  # [..., E]
            u = torch.einsum("...i,eri->...er", x, self.A)
            soft = torch.einsum("...e,...er,eor->...o", probs, u, self.Bm) * self.scaling
            delta = soft + (delta - soft).detach()  # hard forward, soft (straight-through) backward
            self.last_probs = probs.reshape(-1, self.num_experts)
        return self.base(x) + delta


def wrap(
    model: nn.Module,
    patterns: Sequence[str] = BERT_ATTENTION,
    *,
    num_experts: int = 4,
    rank: int = 8,
    top_k: int = 1,
    alpha: float | None = None,
) -> list[str]:
    """Replaces (in place) every ``nn.Linear`` of ``model`` whose qualified name matches one of
    ``patterns`` (fnmatch, e.g. ``"*attention.self.query"``) by a :class:`LoRAMixerLinear`;
    ``scaling = alpha / rank`` (alpha defaults to rank: scaling 1; a finite number > 0). Returns the wrapped names;
    no match is an error naming the patterns. All or nothing: a failure leaves ``model`` as it was."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ArgumentError(f"LoRAMixer: rank {rank!r} is out of range (rule: an integer >= 1)")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ArgumentError(f"LoRAMixer: num_experts {num_experts!r} is out of range (rule: an integer >= 1)")
    if alpha is not None and (isinstance(alpha, bool) or not math.isfinite(alpha) or alpha <= 0):
        raise ArgumentError(f"LoRAMixer: alpha {alpha!r} is out of range (rule: a finite number > 0)")
    scaling = (rank if alpha is None else alpha) / rank
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and _matches(n, patterns)]
    if not names:
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)][:8]
        raise ArgumentError(
            f"no nn.Linear of the model matches {list(patterns)} (rule: fnmatch on qualified names; "
            f"the model's Linear layers include {linears})"
        )
    # all mixers are built before the first replaces its Linear: a failure leaves the model as it was
    with all_or_nothing(model):
        built: dict[str, nn.Module] = {
            name: LoRAMixerLinear(model.get_submodule(name), num_experts, rank, top_k=top_k, scaling=scaling)  # type: ignore[arg-type]
            for name in names
        }
        swap_in(model, built)
    return names


@contextlib.contextmanager
def all_or_nothing(model: nn.Module) -> Iterator[None]:
    """Restores the ``requires_grad`` flag of every parameter of ``model`` when the block raises: building a
    LoRAMixerLinear freezes its base Linear, which must not outlive a wrapping that failed."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        yield
    except BaseException:
        for p, flag in flags:
            p.requires_grad_(flag)
        raise


def swap_in(model: nn.Module, built: Mapping[str, nn.Module]) -> None:
    """Sets each module of ``built`` in place of the submodule of that qualified name, all of them or, when one
    fails, none (the replaced ones are put back)."""
    old: list[tuple[nn.Module, str, nn.Module]] = []
    try:
        for name, m in built.items():
            parent, attr = _parent(model, name)
            old.append((parent, attr, getattr(parent, attr)))
            setattr(parent, attr, m)
    except BaseException:
        for parent, attr, m in reversed(old):
            setattr(parent, attr, m)
        raise


def copy_without_routing_statistics(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose LoRA-Mixer projections hold no routing statistics: those of a training forward
    are graph tensors, which deepcopy refuses. ``model`` keeps its own."""
    found = mixers(model)
    kept = {n: (m.last_probs, m.last_experts) for n, m in found.items()}
    for m in found.values():
        m.last_probs = m.last_experts = None
    try:
        return copy.deepcopy(model)
    finally:
        for n, m in found.items():
            m.last_probs, m.last_experts = kept[n]


def mixers(model: nn.Module) -> dict[str, LoRAMixerLinear]:
    """The LoRA-Mixer projections of ``model`` by qualified name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRAMixerLinear)}


def routing_loss(model: nn.Module, *, balance_weight: float = 0.01, specialization_weight: float = 0.01) -> Tensor:
    """Auxiliary loss of the last training forward, summed over the model's LoRA-Mixer projections:

        balance        = E * sum_e f_e * P_e     f_e: fraction of token slots routed (hard top-k) to e,
                                                 P_e: mean router probability of e (Switch Transformer)
        specialisation = mean_t H(p_t) = -mean_t sum_e p_te log p_te   (entropy of each token's routing)
        loss = balance_weight * balance + specialization_weight * specialisation

    The balance term is minimised (= 1) by uniform expert load; the entropy term sharpens each
    token's routing towards few experts. LoRA-Mixer's paper (arXiv 2507.00029) describes a
    "specialisation balance loss" but its exact formula is not public: this is the closest documented
    reading (load balance over experts plus per-token routing entropy), with both weights arguments."""
    total: Tensor | None = None
    for m in mixers(model).values():
        if m.last_probs is None or m.last_experts is None:
            continue
        p = m.last_probs
        e = m.num_experts
        counts = torch.zeros(e, device=p.device).index_add_(
            0, m.last_experts.reshape(-1), torch.ones(m.last_experts.numel(), device=p.device)
        )
        f = counts / counts.sum().clamp_min(1)
        balance = e * (f * p.mean(dim=0)).sum()
        entropy = -(p * torch.log(p.clamp_min(1e-12))).sum(dim=-1).mean()
        term = balance_weight * balance + specialization_weight * entropy
        total = term if total is None else total + term
    if total is None:
        raise ArgumentError("routing_loss needs a training forward of a model with LoRA-Mixer projections first")
    return total


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    head, _, attr = name.rpartition(".")
    return (model.get_submodule(head) if head else model), attr
