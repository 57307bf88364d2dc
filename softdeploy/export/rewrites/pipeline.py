"""The rewrite pipeline: :func:`optimize` and its report (see the package docstring)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxscript.optimizer
from onnxscript import ir
from onnxscript.rewriter import MatchingTracer, MatchStatus, RewriteRuleSet

from softdeploy.domain import DOMAIN
from softdeploy.errors import ExportError
from softdeploy.export.rewrites._base import SoftRule, describe
from softdeploy.export.rewrites.maxsim import MaxSimRule
from softdeploy.export.rewrites.soft_nms import NmsToSoftNmsRule
from softdeploy.export.rewrites.softmax_topk import SoftmaxTopKRule
from softdeploy.export.rewrites.softpick import SoftpickRule
from softdeploy.export.rewrites.softpick_attention import SoftpickAttentionRule
from softdeploy.export.rewrites.two_pass_softmax import MIN_ROW_LENGTH, TwoPassSoftmaxRule
from softdeploy.export.validate import OutputCheck, compare_output
from softdeploy.ops.functions import attach_function_bodies, default_opset

# In the order they run: fusions that consume a Softmax before the rule that replaces a lone one;
# softpick (the authors' expression => Softpick) before softpick-attention, which fuses around it.
RULES: dict[str, type[SoftRule]] = {
    r.name_: r  # type: ignore[attr-defined]
    for r in (SoftmaxTopKRule, MaxSimRule, SoftpickRule, SoftpickAttentionRule, TwoPassSoftmaxRule, NmsToSoftNmsRule)
}
# nms-to-softnms only on request: it changes an op the user chose (same results, see its module).
DEFAULT_RULES = ("softmax-topk", "maxsim", "softpick", "softpick-attention", "two-pass-softmax")
TARGET_OPSET = 18  # models below it are converted first (the function bodies need >= 18)
VERIFY_TOLERANCE = {"float32": (1e-4, 1e-6), "float16": (1e-2, 1e-3)}


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A candidate a rule matched but did not rewrite, and why (shown by ``softdeploy optimize``)."""

    node: str  # the candidate node, e.g. "TopK 'topk_3'"
    reason: str


@dataclasses.dataclass(frozen=True)
class RuleReport:
    """One rule's outcome: how often it fired and the candidates it rejected, with reasons."""

    name: str
    summary: str
    applied: int
    rejected: tuple[Rejection, ...]


@dataclasses.dataclass(frozen=True)
class VerifyCheck:
    """The rewritten model, run in one onnxruntime configuration, compared output by output with the original."""

    backend: str  # the rewritten model's onnxruntime configuration, compared with the original
    outputs: tuple[OutputCheck, ...]

    @property
    def ok(self) -> bool:
        """Whether every output agrees within its tolerance."""
        return all(o.ok for o in self.outputs)


@dataclasses.dataclass(frozen=True)
class OptimizeResult:
    """What ``optimize`` produced: the rewritten model (function bodies attached), a report per rule, the verification
    against the original (empty when ``verify=False``) and notes (e.g. that random inputs were not valid for the model).
    """

    model: Any  # the rewritten onnx.ModelProto (function bodies attached, checker clean)
    rules: tuple[RuleReport, ...]
    verification: tuple[VerifyCheck, ...]  # empty when verify=False
    notes: tuple[str, ...] = ()

    @property
    def counts(self) -> dict[str, int]:
        """How often each rule fired, by rule name."""
        return {r.name: r.applied for r in self.rules}

    @property
    def ok(self) -> bool:
        """Whether every verification agrees (True when nothing was verified)."""
        return all(v.ok for v in self.verification)

    def to_text(self) -> str:
        """The report ``softdeploy optimize`` prints: per rule how often it fired and why each other candidate was not
        rewritten, then the notes and the verification."""
        lines = ["rule                 fired  candidates not rewritten"]
        for r in self.rules:
            lines.append(f"{r.name:<20} {r.applied:>5}  {len(r.rejected)}    ({r.summary})")
            for rej in r.rejected:
                lines.append(f"    - {rej.node}: {rej.reason}")
        lines += [f"note: {n}" for n in self.notes]
        for v in self.verification:
            worst = max((o.max_abs_err for o in v.outputs), default=0.0)
            status = "agrees" if v.ok else "DISAGREES"
            lines.append(f"verify ({v.backend}): {status} with the original, max |err| {worst:.3g}")
            lines += [f"    - {o.name}: {o.mismatched} mismatched {o.note}" for o in v.outputs if not o.ok]
        return "\n".join(lines)


# onnxscript's matcher refuses a match whose intermediate values have uses outside the pattern
# (removing the matched nodes would break them) before the rule's check runs, in these words.
_MATCHER_SHARED_VALUE = "Matched nodes have other uses preventing replacement."


class _RejectionTracer(MatchingTracer):
    """Records every candidate a rule looked at and did not rewrite, with the reason."""

    def __init__(self, rule: SoftRule) -> None:
        super().__init__()
        self.rule = rule
        self.anchor_op = rule.anchor_op
        self.rejected: list[Rejection] = []

    def log(self, rule: Any, container: Any, node: ir.Node, match_result: Any, status: MatchStatus) -> None:
        if status == MatchStatus.SUCCESS:
            return
        if status == MatchStatus.NO_MATCH and not self.rule.is_candidate(node):
            return  # not a candidate: does not even end like the pattern
        reason = match_result.reason if match_result is not None and match_result.reason else "does not match"
        if reason == _MATCHER_SHARED_VALUE:  # the matcher's words; the rule's say which value and why
            reason = self.rule.shared_intermediate
        self.rejected.append(Rejection(describe(node), reason))


def _drop_phantom_uses(model: ir.Model) -> None:
    """Forgets the uses of values by nodes that are in no graph. The tracer pass runs each rule's rewrite
    to build the replacement it then does not insert; those nodes stay registered as users of their
    inputs, which would keep dead producers alive (remove_unused_nodes) and look like other uses to a
    later rule (softpick's replacement Softpick on the scores, seen by softpick-attention).
    (onnxscript 0.7 has no public call for this: Value._remove_usage.)"""
    for graph in (model.graph, *(f.graph for f in model.functions.values())):
        for node in ir.traversal.RecursiveGraphIterator(graph):
            for value in node.inputs:
                if value is None:
                    continue
                for user, index in list(value.uses()):
                    if user.graph is None:
                        value._remove_usage(user, index)


def _make_rule(name: str, two_pass_min_row: int) -> SoftRule:
    cls = RULES[name]
    return TwoPassSoftmaxRule(two_pass_min_row) if cls is TwoPassSoftmaxRule else cls()


def optimize(
    model: Any,
    *,
    rules: Sequence[str] | None = None,
    nms_to_softnms: bool = False,
    two_pass_min_row: int = MIN_ROW_LENGTH,
    verify: bool = True,
    feeds: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
) -> OptimizeResult:
    """Rewrites ``model`` (ModelProto or path) with ``rules`` (default DEFAULT_RULES, plus
    ``nms-to-softnms`` when ``nms_to_softnms``). ``verify`` runs the original and the rewritten model
    on ``feeds`` (default: :func:`random_feeds`, symbolic dimensions from ``dims`` or 3) and compares
    every output; a disagreement raises ExportError with the report, as does an original model that
    fails on the random inputs (then ``feeds`` are needed). A ``dims`` name that is not a symbolic
    dimension of the model's inputs raises ArgumentError listing those that are."""
    if not isinstance(model, onnx.ModelProto):
        from softdeploy.files import load_model

        model = load_model(Path(model))
    check_dims(model, dims)
    original = model
    names = list(DEFAULT_RULES if rules is None else rules)
    if nms_to_softnms and "nms-to-softnms" not in names:
        names.append("nms-to-softnms")
    unknown = sorted(set(names) - set(RULES))
    if unknown:
        raise ExportError(f"unknown rewrite rule(s) {unknown}; rules are {list(RULES)}")
    names = [n for n in RULES if n in names]
    from softdeploy.ops import REGISTRY, register_onnx_schemas

    missing = {n: RULES[n].target_op for n in names if RULES[n].target_op not in REGISTRY}
    if missing:
        raise ExportError(f"rule(s) {missing} write ops this softdeploy build does not define; ops: {sorted(REGISTRY)}")
    notes = []
    work = onnx.ModelProto()
    work.CopyFrom(model)
    opset = default_opset(work)
    if opset < TARGET_OPSET:
        from onnx import version_converter

        work = version_converter.convert_version(work, TARGET_OPSET)
        notes.append(f"converted from opset {opset} to {TARGET_OPSET} (the function bodies need >= 18)")
    # softdeploy's own function bodies are not rewritten (they are re-attached afterwards).
    ours = [f for f in work.functions if f.domain == DOMAIN]
    for f in ours:
        work.functions.remove(f)
    register_onnx_schemas()
    work = onnx.shape_inference.infer_shapes(work)
    ir_model = ir.from_proto(work)
    reports = []
    for name in names:
        rule = _make_rule(name, two_pass_min_row)
        applied, rejected = 0, []
        for variant in rule.variants():
            rule_set = RewriteRuleSet([variant.own_rule()])
            tracer = _RejectionTracer(variant)
            rule_set.apply_to_model(ir_model, tracer=tracer)  # with a tracer nothing is rewritten
            _drop_phantom_uses(ir_model)
            applied += rule_set.apply_to_model(ir_model)
            rejected += tracer.rejected
        reports.append(RuleReport(name, rule.summary, applied, tuple(rejected)))
        # Nodes only the rewritten pattern used are dead now; a later rule must not see them as other
        # uses (softpick's IsInf/IsNaN of the scores would otherwise block softpick-attention).
        onnxscript.optimizer.remove_unused_nodes(ir_model)
    # Producers only a rewritten pattern used (e.g. a Transpose MaxSim folded away) are dead now.
    onnxscript.optimizer.remove_unused_nodes(ir_model)
    out = ir.to_proto(ir_model)
    attach_function_bodies(out)
    try:
        onnx.checker.check_model(out, full_check=True)
    except onnx.checker.ValidationError as e:
        # Only a failure the rewrite introduced is ours: a model nobody here wrote may fail already.
        try:
            onnx.checker.check_model(work, full_check=True)
        except onnx.checker.ValidationError as before:
            notes.append(f"the input model already fails onnx.checker (so does the result): {before}")
        else:
            raise ExportError(f"the rewritten model fails onnx.checker: {e}") from e
    result = OptimizeResult(out, tuple(reports), (), tuple(notes))
    if verify:
        result = dataclasses.replace(result, verification=_verify(original, out, feeds, dims, seed))
        if not result.ok:
            raise ExportError(f"the rewritten model disagrees with the original:\n{result.to_text()}")
    return result


def symbolic_dims(model: Any) -> list[str]:
    """The names of the symbolic dimensions of the model's inputs, in order of appearance."""
    initializers = {t.name for t in model.graph.initializer}
    names: list[str] = []
    for vi in model.graph.input:
        if vi.name not in initializers:
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param not in names:
                    names.append(d.dim_param)
    return names


def check_dims(model: Any, dims: Mapping[str, int] | None) -> None:
    """Refuses a ``dims`` name that is not a symbolic dimension of the model's inputs (a typo would
    otherwise silently leave that dimension at its default)."""
    known = symbolic_dims(model)
    unknown = sorted(set(dims or {}) - set(known))
    if unknown:
        from softdeploy.errors import ArgumentError

        raise ArgumentError(
            f"--dim {unknown}: not a symbolic dimension of the model's inputs; they are {known or 'none (all fixed)'}"
        )


# Inputs whose values have a meaning the op checks (onnxruntime refuses an iou_threshold outside
# [0, 1]; boxes must be boxes): (domain, op) -> the role of each input position.
_NMS_ROLES = ("boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold")
_KNOWN_INPUTS = {("", "NonMaxSuppression"): _NMS_ROLES, (DOMAIN, "SoftNMS"): _NMS_ROLES}


def _input_roles(model: Any) -> dict[str, tuple[str, int]]:
    """Graph input -> (role, center_point_box) for the inputs fed straight into an op of _KNOWN_INPUTS."""
    graph_inputs = {vi.name for vi in model.graph.input}
    roles: dict[str, tuple[str, int]] = {}
    for node in model.graph.node:
        known = _KNOWN_INPUTS.get(("" if node.domain == "ai.onnx" else node.domain, node.op_type))
        if known is None:
            continue
        center = next((a.i for a in node.attribute if a.name == "center_point_box"), 0)
        for role, name in zip(known, node.input, strict=False):
            if name in graph_inputs:
                roles.setdefault(name, (role, center))
    return roles


def _valid_value(role: str, center: int, shape: list[int], dtype: np.dtype, rng: Any) -> np.ndarray:
    if role == "boxes":  # [..., 4], each a box of positive size: corners, or centre + size
        lead = shape[:-1]
        origin = rng.uniform(0, 10, [*lead, 2])
        size = rng.uniform(1, 4, [*lead, 2])
        value = np.concatenate([origin, size] if center else [origin, origin + size], axis=-1)
        return value.astype(dtype)
    if role == "scores":
        return rng.uniform(0, 1, shape).astype(dtype)
    fixed = {"max_output_boxes_per_class": 2, "iou_threshold": 0.5, "score_threshold": 0.25}[role]
    return np.full(shape, fixed, dtype)


def random_feeds(model: Any, dims: Mapping[str, int] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for ``model``: floats standard normal, integers in [0, 4), bools; a symbolic
    dimension takes its size from ``dims`` (by name), else 3. Inputs fed straight into an op whose
    inputs have a meaning (NonMaxSuppression, SoftNMS) get valid values: boxes of positive size,
    scores in [0, 1), max_output_boxes_per_class 2, iou_threshold 0.5, score_threshold 0.25."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    roles = _input_roles(model)
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        t = vi.type.tensor_type
        shape = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            else:
                shape.append(int((dims or {}).get(d.dim_param, 3)))
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        if vi.name in roles and (roles[vi.name][0] != "boxes" or (shape and shape[-1] == 4)):
            feeds[vi.name] = _valid_value(*roles[vi.name], shape, dtype, rng)
        elif np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.random(shape) < 0.5
        else:
            feeds[vi.name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


def _verify(
    original: Any, rewritten: Any, feeds: Mapping[str, np.ndarray] | None, dims: Any, seed: int
) -> tuple[VerifyCheck, ...]:
    from softdeploy.errors import SoftdeployError
    from softdeploy.runtime import Session

    given = feeds is not None
    feeds = dict(feeds) if feeds is not None else random_feeds(original, dims, seed)
    try:
        want = Session(original, kernels="auto").run(feeds)
    except SoftdeployError as e:
        if given:
            raise
        # Random values are not valid inputs of every model (an index, a threshold): say what to do.
        raise ExportError(
            f"verification: the original model fails on random inputs ({e}); pass --feeds inputs.npz "
            "(feeds=...) with valid inputs, or --no-verify (verify=False)"
        ) from e
    names = [o.name for o in original.graph.output]
    checks = []
    for backend in ("native", "portable"):
        got = Session(rewritten, kernels=backend).run(feeds)  # type: ignore[arg-type]
        outs = tuple(compare_output(n, g, w, VERIFY_TOLERANCE) for n, g, w in zip(names, got, want, strict=True))
        checks.append(VerifyCheck(backend, outs))
    return tuple(checks)
