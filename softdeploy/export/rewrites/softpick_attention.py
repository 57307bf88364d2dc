"""``MatMul(Softpick(MatMul(Q, Kt) * scale + Mask), V)`` => ``com.softdeploy.SoftpickAttention``.

Softpick attention written out (the softpick authors' ``naive_softpick_attn``, or a model exported with
``softdeploy.nn.Softpick`` between standard MatMuls): scores ``MatMul(Q, Kt)``, then optionally a
``Mul`` by (or ``Div`` by) a constant scalar, then optionally an ``Add`` of an additive mask, then
``com.softdeploy.Softpick`` on the last axis, then ``MatMul`` with V. The fused op never forms the
``[Tq, Tk]`` scores (docs/ops/SoftpickAttention.md). Checks (each failure is reported):
- Softpick on the last axis (``axis = -1`` or rank - 1); its ``eps`` carries over;
- Q, Kt, V of one rank, 3 or 4 (rank 3 ``[N, T, D]`` runs as one batch of N heads), float32/float16;
- the batch dimensions of Q, Kt and V equal (or Kt/V with one head against H query heads: the op's
  grouped heads with Hk = 1); MatMul's other broadcasts are not the op's grouping;
- the scale a constant scalar, finite and non-zero (0 is the op's "1/sqrt(D)"), Div by c => 1/c;
- the mask's rank <= the scores' and each dimension 1 or the scores' (an Add that would broadcast the
  scores up changes the output shape);
- the scores, scaled scores, masked scores and weights used only inside the pattern (else they would
  still have to be computed).
``Kt`` is K transposed: a ``Transpose`` swapping its last two axes is folded away, otherwise one is
inserted. The written-out form rounds the scores, the scaled and the masked scores to the model's type
at each step; the fused op keeps them in float32 (float16 inputs: computed in float32), so float16
models agree within float16's rounding, not bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

from onnxscript import ir

from softdeploy.domain import DOMAIN
from softdeploy.export.rewrites._base import SoftRule, const_floats, dtype_name, rank


def _is_last_two_swap(node: ir.Node | None, r: int) -> bool:
    if node is None or node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return False
    perm = node.attributes.get("perm")
    return perm is not None and list(perm.as_ints()) == [*range(r - 2), r - 1, r - 2]


def _float_attr(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else float(attr.as_float())


def _dead(node: ir.Node) -> bool:
    """A node none of whose outputs is used (left behind by an earlier rewrite until the graph is cleaned)."""
    return all(not out.uses() and not out.is_graph_output() for out in node.outputs)


def _only_use(value: ir.Value, consumer: ir.Node) -> bool:
    """Whether ``consumer`` is the only live user of ``value`` (and ``value`` is no graph output)."""
    if value.is_graph_output():
        return False
    return all(user is consumer or _dead(user) for user, _ in value.uses())


def _same_dim(a: Any, b: Any) -> bool:
    """Equal dims: equal ints, or the same symbolic name (an unknown dim equals nothing)."""
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return a is not None and b is not None and a.value is not None and a.value == b.value


class _Match:
    """The parts of a candidate: Q, Kt, V, the mask (or None), the scale, Softpick's eps."""

    def __init__(
        self,
        q: ir.Value,
        kt: ir.Value,
        v: ir.Value,
        mask: ir.Value | None,
        scale: float,
        eps: float,
        fill: ir.Value | None = None,
    ):
        self.q, self.kt, self.v, self.mask, self.scale, self.eps = q, kt, v, mask, scale, eps
        self.fill = fill  # not None: mask is masked_fill's bool condition and fill its -inf


class SoftpickAttentionRule(SoftRule):
    """MatMul -> (Mul/Div scale) -> (Add mask) -> Softpick -> MatMul => SoftpickAttention: softpick attention written
    with standard ops and a Softpick node becomes one fused SoftpickAttention node, which never materialises the
    scores. Rewritten only when the layout is the op's (same-rank Q/K/V, last-axis Softpick, constant scalar scale,
    a mask that does not broadcast the scores up) and the intermediates are used nowhere else."""

    name_ = "softpick-attention"
    target_op = "SoftpickAttention"
    anchor_op = "MatMul"
    summary = "MatMul -> (Mul/Div) -> (Add | Where -inf) -> Softpick -> MatMul => SoftpickAttention"
    shared_intermediate = "the Softpick weights are also used elsewhere (they would still be needed)"

    def is_candidate(self, node: ir.Node) -> bool:
        """A MatMul whose first input is a Softpick's output: only those are reported when not rewritten (every
        other MatMul of a model is no attention)."""
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or not node.inputs:
            return False
        producer = node.inputs[0].producer() if node.inputs[0] is not None else None
        return producer is not None and producer.op_type == "Softpick" and producer.domain == DOMAIN

    def pattern(self, op: Any, s: ir.Value, v: ir.Value) -> Any:
        """Softpick(s) -> MatMul(weights, v); the scores s are traced back by check()."""
        w = op.Softpick(s, _domain=DOMAIN, _outputs=["w"])
        return op.MatMul(w, v, _outputs=["out"])

    def _parts(self, s: ir.Value, v: ir.Value, w: ir.Value) -> _Match | str:
        """The candidate's parts, or the reason it is not the op."""
        softpick = w.producer()
        assert softpick is not None
        r = rank(s)
        if r is None or rank(v) is None:
            return "the scores or V have unknown rank (run shape inference or give input shapes)"
        axis_attr = softpick.attributes.get("axis")
        axis = -1 if axis_attr is None else int(axis_attr.as_int())
        if axis % r != r - 1:
            return f"Softpick over axis {axis}, not the last (key) axis"
        eps = _float_attr(softpick, "eps", 1e-6)
        mask: ir.Value | None = None
        node = s.producer()
        consumer = softpick
        fill: ir.Value | None = None  # masked_fill's condition: Where(cond, -inf, scores)
        if node is not None and node.op_type == "Where" and node.domain in ("", "ai.onnx"):
            if not _only_use(s, consumer):
                return "the masked scores are also used elsewhere"
            cond, filler, kept = node.inputs
            value = const_floats(filler)
            if value is None or len(value) != 1 or value[0] != -math.inf or kept is None:
                return "Where before Softpick that does not fill -inf into the scores (masked_fill(mask, -inf))"
            mask, fill = cond, filler
            consumer, s, node = node, kept, kept.producer()
        elif node is not None and node.op_type == "Add" and node.domain in ("", "ai.onnx"):
            if not _only_use(s, consumer):
                return "the masked scores are also used elsewhere"
            a, b = node.inputs
            # the scores side is the one that comes from the scaling or the MatMul
            side = next(
                (
                    x
                    for x in (a, b)
                    if x is not None and x.producer() is not None and x.producer().op_type in ("Mul", "Div", "MatMul")
                ),
                None,
            )
            if side is None:
                return "Add before Softpick: neither input is the (scaled) scores of a MatMul"
            mask = b if side is a else a
            consumer, s, node = node, side, side.producer()
        scale = 1.0
        if node is not None and node.op_type in ("Mul", "Div") and node.domain in ("", "ai.onnx"):
            if not _only_use(s, consumer):
                return "the scaled scores are also used elsewhere"
            a, b = node.inputs
            if node.op_type == "Mul":
                ca, cb = const_floats(a), const_floats(b)
                scores, c = (b, ca) if ca is not None else (a, cb)
            else:
                scores, c = a, const_floats(b)
            if c is None or len(c) != 1:
                return f"{node.op_type} by a value that is not a constant scalar (the op's scale is an attribute)"
            if not math.isfinite(c[0]) or c[0] == 0.0:
                return f"{node.op_type} by {c[0]} (the scale must be finite and non-zero)"
            scale = c[0] if node.op_type == "Mul" else 1.0 / c[0]
            consumer, s, node = node, scores, scores.producer()
        if node is None or node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            return "the Softpick's input is not MatMul scores (optionally scaled by Mul/Div, then masked by Add)"
        if not _only_use(s, consumer):
            return "the scores are also used elsewhere"
        q, kt = node.inputs
        assert q is not None and kt is not None
        ranks = {rank(q), rank(kt), rank(v)}
        if len(ranks) != 1 or next(iter(ranks)) not in (3, 4):
            return f"Q, Kt, V ranks {rank(q)}, {rank(kt)}, {rank(v)} (the rule takes one rank, 3 or 4)"
        dtype = dtype_name(q)
        if dtype not in ("float32", "float16") or dtype_name(kt) != dtype or dtype_name(v) != dtype:
            return f"dtypes {dtype}, {dtype_name(kt)}, {dtype_name(v)} (the rule handles float32/float16)"
        why = self._batch_dims(q, kt, v)
        if why:
            return why
        if fill is not None:
            assert mask is not None
            if dtype_name(mask) != "bool":
                return f"Where condition of type {dtype_name(mask)} (expected bool)"
            why = self._mask_shape(mask, s)
            if why:
                return why
        elif mask is not None:
            if dtype_name(mask) != dtype:
                return f"mask dtype {dtype_name(mask)} differs from the scores' {dtype}"
            why = self._mask_shape(mask, s)
            if why:
                return why
        float_scale = float(ir.tensor([scale], dtype=ir.DataType.FLOAT).numpy()[0])
        if not math.isfinite(float_scale) or float_scale == 0.0:
            return f"scale {scale} is not a finite non-zero float32"
        return _Match(q, kt, v, mask, scale, eps, fill)

    @staticmethod
    def _batch_dims(q: ir.Value, kt: ir.Value, v: ir.Value) -> str | None:
        if q.shape is None or kt.shape is None or v.shape is None:
            return "Q, Kt or V has unknown shape"
        r = len(q.shape)
        for i in range(r - 2):
            if not _same_dim(kt.shape[i], v.shape[i]):
                return f"Kt and V differ in batch dimension {i} ({kt.shape[i]} vs {v.shape[i]})"
            head_axis = i == r - 3
            grouped = head_axis and isinstance(kt.shape[i], int) and kt.shape[i] == 1
            if not (_same_dim(q.shape[i], kt.shape[i]) or grouped):
                return (
                    f"Q and Kt batch dimension {i}: {q.shape[i]} vs {kt.shape[i]} (not provably equal; MatMul's "
                    "broadcast is the op's grouping only for one key head)"
                )
        if not _same_dim(kt.shape[r - 1], v.shape[r - 2]):
            return f"Kt has {kt.shape[r - 1]} keys but V {v.shape[r - 2]}"
        return None

    @staticmethod
    def _mask_shape(mask: ir.Value, scores: ir.Value) -> str | None:
        if mask.shape is None or scores.shape is None:
            return "the mask or the scores have unknown shape"
        mr, sr = len(mask.shape), len(scores.shape)
        if mr > sr:
            return f"mask rank {mr} above the scores' {sr} (the Add would broadcast the scores up)"
        for n in range(1, mr + 1):
            md, sd = mask.shape[mr - n], scores.shape[sr - n]
            if not (md == 1 or _same_dim(md, sd)):
                return f"mask dimension {mr - n} is {md}, neither 1 nor the scores' {sd}"
        return None

    def check(self, context: Any, s: ir.Value, v: ir.Value, w: ir.Value, out: ir.Value, **_: Any) -> Any:
        """Accepts the op's layout traced back from the Softpick (see the module docstring); otherwise records why
        not (the optimize report lists it)."""
        parts = self._parts(s, v, w)
        if isinstance(parts, str):
            return self.reject(parts)
        return True

    def rewrite(self, op: Any, s: ir.Value, v: ir.Value, w: ir.Value, out: ir.Value, **_: Any) -> Any:
        """One SoftpickAttention node on (Q, K, V[, mask]) with the scale and eps, K from the Transpose that made Kt
        (or a new one); rank-3 operands get a leading batch axis of 1 and lose it again."""
        parts = self._parts(s, v, w)
        assert isinstance(parts, _Match)
        r = rank(parts.q)
        assert r is not None
        producer = parts.kt.producer()
        if _is_last_two_swap(producer, r):
            assert producer is not None
            k = producer.inputs[0]
        else:
            k = op.Transpose(parts.kt, perm=[*range(r - 2), r - 1, r - 2])
        q, v4, mask = parts.q, parts.v, parts.mask
        if parts.fill is not None:  # masked_fill(cond, -inf) as the additive mask Where(cond, -inf, 0)
            mask = op.Where(mask, parts.fill, op.CastLike(op.Constant(value_float=0.0), parts.fill))
        if r == 3:
            zero = op.Constant(value=ir.tensor([0], dtype=ir.DataType.INT64))
            q, k, v4 = (op.Unsqueeze(x, zero) for x in (q, k, v4))
        # no mask: the input is left off (passing None makes the builder write a constant in its place)
        inputs = (q, k, v4) if mask is None else (q, k, v4, mask)
        att = op.SoftpickAttention(
            *inputs, scale=float(parts.scale), causal=0, eps=float(parts.eps), _domain=self.domain()
        )
        if r == 3:
            att = op.Squeeze(att, op.Constant(value=ir.tensor([0], dtype=ir.DataType.INT64)))
        return att
