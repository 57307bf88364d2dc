"""The shape every softdeploy rewrite rule has: pattern -> check -> rewrite (onnxscript rewriter).

A rule's ``check`` returns ``self.reject(reason)`` for every way a structurally matching candidate
can be unsafe to rewrite; the pipeline records those reasons (and the matcher's own reasons for
candidates that start like the pattern but do not match it) so each run says why a rule did not fire.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from onnxscript import ir
from onnxscript.rewriter import MatchResult, RewriteRule, RewriteRuleClassBase

from softdeploy.domain import DOMAIN


class SoftRule(RewriteRuleClassBase):
    """Base of softdeploy's rules. ``anchor_op`` is the standard op a candidate is built around (the
    pattern's last node): a node of that type that is not rewritten is reported with the reason."""

    anchor_op: ClassVar[str]
    target_op: ClassVar[str]  # the com.softdeploy op the rule writes
    summary: ClassVar[str]
    # The reason reported when an intermediate value of the pattern is used outside it (the matcher
    # then refuses the candidate before check runs: the matched nodes could not be removed).
    shared_intermediate: ClassVar[str] = "an intermediate value of the pattern is also used elsewhere"

    def __init__(self) -> None:
        super().__init__(name=self.rule_name())

    @classmethod
    def rule_name(cls) -> str:
        return cls.__dict__.get("name_", cls.__name__)

    def is_candidate(self, node: ir.Node) -> bool:
        """Whether a node the pattern did not match is reported as a candidate not rewritten: by default every
        standard node of the anchor type (a rule whose anchor is a common op narrows this)."""
        return node.op_type == self.anchor_op and node.domain in ("", "ai.onnx")

    def own_rule(self) -> RewriteRule:
        """The RewriteRule of this instance. (onnxscript's ``rule()`` is a classmethod that builds a fresh default
        instance, which would drop the settings of this one, e.g. TwoPassSoftmaxRule's row length or a variant.)"""
        return RewriteRule(
            self.pattern,
            self.rewrite,
            self.check,
            name=self.name,
            remove_nodes=self.remove_nodes,
            graph_pre_visitor=self.setup,
            graph_post_visitor=self.cleanup,
            as_function=self.as_function,
        )

    def variants(self) -> list[SoftRule]:
        """The rules run under this rule's name, one pattern each (most rules: itself); their counts and
        rejections are reported together."""
        return [self]

    @staticmethod
    def reject(reason: str) -> MatchResult:
        return MatchResult().fail(reason)

    @staticmethod
    def domain() -> str:
        return DOMAIN


# ---- helpers the rules share ---------------------------------------------------------------------


def const_ints(value: ir.Value | None) -> list[int] | None:
    """The integer contents of a constant (initializer or Constant node) value, else None."""
    if value is None:
        return None
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
            attr = producer.attributes.get("value")
            tensor = attr.value if attr is not None else None
            if tensor is None:
                ints = producer.attributes.get("value_ints") or producer.attributes.get("value_int")
                if ints is not None:
                    v = ints.value
                    return [int(i) for i in (v if isinstance(v, list | tuple) else [v])]
    if tensor is None:
        return None
    array = np.asarray(tensor.numpy())
    if not np.issubdtype(array.dtype, np.integer):
        return None
    return [int(i) for i in array.reshape(-1)]


def const_floats(value: ir.Value | None) -> list[float] | None:
    if value is None:
        return None
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
            attr = producer.attributes.get("value")
            tensor = attr.value if attr is not None else None
    if tensor is None:
        return None
    return [float(f) for f in np.asarray(tensor.numpy()).reshape(-1)]


def rank(value: ir.Value) -> int | None:
    return None if value.shape is None else len(value.shape)


def node_opset(context: Any) -> int:
    """The default-domain opset of the model being matched."""
    return int(context.model.opset_imports.get("", context.model.opset_imports.get("ai.onnx", 0)))


def int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.as_int())


def dtype_name(value: ir.Value) -> str | None:
    return None if value.dtype is None else str(np.dtype(value.dtype.numpy()))


def describe(node: ir.Node) -> str:
    return f"{node.op_type} {node.name!r}" if node.name else node.op_type
