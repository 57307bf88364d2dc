"""Probability-domain softening operators ``S_T`` and top-k-truncated teachers (Flouro & Chadwick,
arXiv 2601.03195; research notes algorithms.md section 9).

An operator maps a distribution ``p`` (last axis) and a temperature ``T`` to another distribution and
satisfies the axioms the tests hold every family to (tests/distill/test_softening.py, hypothesis):

* ranking preservation -- ``p_i > p_j  =>  S_T(p)_i > S_T(p)_j`` (ties stay ties);
* continuity in ``p`` and in ``T``;
* entropy monotonicity -- ``H(S_T(p))`` is non-decreasing in ``T``;
* identity -- ``S_1 = id``;
* boundary -- ``T -> inf`` gives the uniform distribution (over the support, or over all classes,
  as the family says: :attr:`SofteningOperator.boundary_support`).

Families (the registry :data:`SOFTENING`; another family is one subclass with the
:func:`register_softening` decorator):

    power / escort   S_T(p) = p^(1/T) / sum_j p_j^(1/T) = softmax(log p / T);  T > 0
                     (S_T(softmax(z)) = softmax(z / T); zeros stay zero; T -> 0 is one-hot on the
                     argmax, uniform over ties)
    uniform mixing   S_T(p) = p / T + (1 - 1/T) / V;  T >= 1  (S_inf = uniform over all V classes)

Top-k truncation of a teacher that only exposes its k most probable classes (:func:`truncate_topk`),
with the probabilities taken through the SoftmaxTopK op's torch form: ``renorm`` zeroes the tail and
renormalises; ``tail`` spreads the missing mass ``1 - sum(top-k)`` uniformly over the other ``V - k``
classes. Order, decided here: the KD objective truncates first and softens second. For the power
operator under ``renorm`` the order does not matter (the normalisers cancel and rank preservation keeps
the top-k set; tested); with ``tail`` or uniform mixing it does, and truncating first is the only order
a black-box teacher that returns its top-k allows.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar, Literal

import torch
from torch import Tensor

from softdeploy.errors import ArgumentError

Completion = Literal["renorm", "tail"]
COMPLETIONS: tuple[str, ...] = ("renorm", "tail")


class SofteningOperator(ABC):
    """A probability-domain softening operator ``S_T`` on the last axis of a distribution tensor."""

    #: the registry name of the family
    name: ClassVar[str] = ""
    #: the smallest admissible temperature, and whether it is itself admissible
    min_temperature: ClassVar[float] = 0.0
    min_inclusive: ClassVar[bool] = False
    #: True: ``T -> inf`` is uniform over the support of ``p``; False: over all classes
    boundary_support: ClassVar[bool] = True

    def check_temperature(self, temperature: float) -> None:
        """ArgumentError when ``temperature`` is outside the family's domain (NaN included)."""
        t = float(temperature)
        ok = t >= self.min_temperature if self.min_inclusive else t > self.min_temperature
        if math.isnan(t) or not ok:
            rule = ">=" if self.min_inclusive else ">"
            raise ArgumentError(
                f"softening {self.name!r}: temperature {t:g} is out of range (rule: temperature {rule} "
                f"{self.min_temperature:g})"
            )

    @abstractmethod
    def soften(self, p: Tensor, temperature: float) -> Tensor:
        """``S_T(p)`` along the last axis; ``p`` non-negative and summing to one there."""

    def soften_logits(self, logits: Tensor, temperature: float) -> Tensor:
        """``S_T(softmax(logits))`` along the last axis; families with a log-domain form override it."""
        return self.soften(torch.softmax(logits, dim=-1), temperature)

    def __call__(self, p: Tensor, temperature: float) -> Tensor:
        """Same as :meth:`soften`."""
        return self.soften(p, temperature)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


SOFTENING: dict[str, type[SofteningOperator]] = {}


def register_softening(cls: type[SofteningOperator]) -> type[SofteningOperator]:
    """Class decorator: adds a family to :data:`SOFTENING` under its ``name`` (once)."""
    if not cls.name or cls.name in SOFTENING:
        raise ArgumentError(f"softening family {cls.__name__}: name {cls.name!r} is empty or taken")
    SOFTENING[cls.name] = cls
    return cls


def get_softening(name: str | SofteningOperator) -> SofteningOperator:
    """The operator of family ``name`` (an instance passes through); ArgumentError listing the families."""
    if isinstance(name, SofteningOperator):
        return name
    try:
        return SOFTENING[name]()
    except KeyError:
        raise ArgumentError(f"softening {name!r} is not one of {sorted(SOFTENING)}") from None


@register_softening
class PowerSoftening(SofteningOperator):
    """Power / escort: ``S_T(p) = p^(1/T) / sum p^(1/T)``, computed as ``softmax(log p / T)`` (no
    underflow of ``p^(1/T)`` for small T; ``log 0 = -inf`` keeps zeros at zero)."""

    name = "power"
    min_temperature = 0.0
    min_inclusive = False
    boundary_support = True

    def soften(self, p: Tensor, temperature: float) -> Tensor:
        """``softmax(log p / T)``."""
        self.check_temperature(temperature)
        return torch.softmax(torch.log(p) / temperature, dim=-1)

    def soften_logits(self, logits: Tensor, temperature: float) -> Tensor:
        """``softmax(z / T)`` -- the identity ``S_T(softmax(z)) = softmax(z / T)``."""
        self.check_temperature(temperature)
        return torch.softmax(logits / temperature, dim=-1)


@register_softening
class UniformMixing(SofteningOperator):
    """Uniform mixing: ``S_T(p) = p / T + (1 - 1/T) u``, ``u`` uniform over the V classes, ``T >= 1``
    (``T = inf`` allowed: exactly ``u``). Not equivalent to the power family: it gives mass to zeros."""

    name = "uniform_mixing"
    min_temperature = 1.0
    min_inclusive = True
    boundary_support = False

    def soften(self, p: Tensor, temperature: float) -> Tensor:
        """``p / T + (1 - 1/T) / V``."""
        self.check_temperature(temperature)
        w = 1.0 / float(temperature)
        return w * p + (1.0 - w) / p.shape[-1]


def truncate_topk(logits: Tensor, k: int, completion: Completion = "renorm") -> Tensor:
    """The teacher distribution ``softmax(logits)`` as a partial-access teacher that exposes only its
    k most probable classes (probabilities from the SoftmaxTopK op's torch form), completed to a full
    distribution over the last axis: ``renorm`` (tail zero, top-k renormalised) or ``tail`` (the missing
    mass spread uniformly over the other ``V - k`` classes; with ``k = V`` both are the full softmax)."""
    from softdeploy.ops import get as get_op
    from softdeploy.ops._torch import torch_op

    if completion not in COMPLETIONS:
        raise ArgumentError(f"top-k completion {completion!r} is not one of {list(COMPLETIONS)}")
    vocab = int(logits.shape[-1])
    if not 1 <= k <= vocab:
        raise ArgumentError(f"top-k: k {k} is out of range (rule: 1 <= k <= {vocab} classes)")
    values, indices, _ = torch_op(get_op("SoftmaxTopK"))(logits.detach(), k=k, axis=-1, temperature=1.0)
    values = values.to(logits.dtype)
    mass = values.sum(dim=-1, keepdim=True)
    if completion == "renorm":
        return torch.zeros_like(logits).scatter(-1, indices, values / mass)
    if k == vocab:
        return torch.zeros_like(logits).scatter(-1, indices, values)
    rest = (1.0 - mass).clamp_min(0.0) / (vocab - k)
    return rest.expand_as(logits).clone().scatter(-1, indices, values)


def entropy(p: Tensor) -> Tensor:
    """Shannon entropy (nats) along the last axis, ``0 log 0 = 0``."""
    return -torch.special.xlogy(p, p).sum(dim=-1)
