"""Late interaction ``ReduceSum(ReduceMax(MatMul(A, B)))`` => ``com.softdeploy.MaxSim``.

``MatMul(A, B)`` gives token-by-token similarities ``S[..., i, j] = <A[..., i, :], B[..., :, j]>``.
Max over one token axis then sum over the other is MaxSim: the max-reduced side is the document, the
summed side the query. Checks (each failure is reported):
- both reductions reduce exactly one constant axis with ``keepdims=0``, the max over a token axis
  of S and the sum over the remaining token axis (otherwise it is not MaxSim);
- layouts MaxSim covers: one side a single sequence ``[L, dim]`` against a batch ``[N, L, dim]``
  (the peer layout of shared/notes/perf/maxsim.py), both single, or queries ``[B, 1, Lq, dim]``
  against documents ``[N, Ld, dim]`` (all pairs, ``[B, N]``). Two rank-3 batches pair query b with
  document b (the diagonal), which MaxSim does not compute;
- float32/float16 (MaxSim returns float32; a Cast restores float16).
``B`` is the transposed side; a ``Transpose`` swapping its last two axes is folded away, otherwise
one is inserted. Difference: a document with zero tokens gives 0 in MaxSim, ``-inf`` in ReduceMax.
"""

from __future__ import annotations

from typing import Any

from onnxscript import ir

from softdeploy.export.rewrites._base import SoftRule, const_ints, dtype_name, int_attr, rank


def _reduce_axes(node: ir.Node) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return const_ints(node.inputs[1])
    attr = node.attributes.get("axes")
    return None if attr is None else [int(a) for a in attr.as_ints()]


def _is_last_two_swap(node: ir.Node | None, r: int) -> bool:
    if node is None or node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return False
    perm = node.attributes.get("perm")
    return perm is not None and list(perm.as_ints()) == [*range(r - 2), r - 1, r - 2]


class MaxSimRule(SoftRule):
    """MatMul -> ReduceMax -> ReduceSum => MaxSim: late-interaction scoring written with standard ops becomes one MaxSim
    node, which never materialises the similarity matrix. Rewritten only when the layout is MaxSim's (max over document
    tokens, sum over query tokens) and the intermediates are used nowhere else."""

    name_ = "maxsim"
    target_op = "MaxSim"
    anchor_op = "ReduceSum"
    summary = "MatMul -> ReduceMax -> ReduceSum => MaxSim"
    shared_intermediate = "the similarity matrix or its row maxima are also used elsewhere (they would still be needed)"

    def pattern(self, op: Any, a: ir.Value, b: ir.Value) -> Any:
        """MatMul(a, b) -> ReduceMax -> ReduceSum, the shape of late-interaction scoring."""
        sim = op.MatMul(a, b, _outputs=["sim"])
        best = op.ReduceMax(sim, _allow_other_inputs=True, _outputs=["best"])
        return op.ReduceSum(best, _allow_other_inputs=True, _outputs=["scores"])

    def _layout(self, a: ir.Value, b: ir.Value, best: ir.Value, scores: ir.Value) -> tuple[str, str] | str:
        """(document side 'a'|'b', layout name) or the reason it is not MaxSim."""
        ra, rb = rank(a), rank(b)
        if ra is None or rb is None:
            return "the MatMul operands have unknown rank (run shape inference or give input shapes)"
        if ra < 2 or rb < 2:
            return f"MatMul operand ranks {ra}, {rb} (a vector operand is not token-by-token similarity)"
        rs = max(ra, rb)
        max_node, sum_node = best.producer(), scores.producer()
        assert max_node is not None and sum_node is not None
        for node in (max_node, sum_node):
            if int_attr(node, "keepdims", 1) != 0:
                return f"{node.op_type} keepdims=1 (the MaxSim layout reduces without keeping axes)"
        max_axes, sum_axes = _reduce_axes(max_node), _reduce_axes(sum_node)
        if max_axes is None or len(max_axes) != 1:
            return f"ReduceMax axes {max_axes} (needs one constant axis)"
        if sum_axes is None or len(sum_axes) != 1:
            return f"ReduceSum axes {sum_axes} (needs one constant axis)"
        max_axis, sum_axis = max_axes[0] % rs, sum_axes[0] % (rs - 1)
        if max_axis not in (rs - 2, rs - 1):
            return f"ReduceMax over axis {max_axes[0]}, not a token axis of the similarity matrix"
        if sum_axis != rs - 2:
            return f"ReduceSum over axis {sum_axes[0]}, not the remaining token axis"
        doc = "b" if max_axis == rs - 1 else "a"
        q_rank, d_rank = (ra, rb) if doc == "b" else (rb, ra)
        if (q_rank, d_rank) in ((2, 3), (3, 2), (2, 2)):
            return doc, f"q{q_rank}d{d_rank}"
        q_val = a if doc == "b" else b
        if (q_rank, d_rank) == (4, 3) and q_val.shape is not None and q_val.shape[1] == 1:
            return doc, "q4d3"
        if (q_rank, d_rank) == (3, 3):
            return "two rank-3 batches: MatMul pairs query b with document b (diagonal scores); MaxSim scores all pairs"
        return f"query rank {q_rank} with document rank {d_rank} is not a MaxSim layout MaxSimRule covers"

    def check(self, context: Any, a: ir.Value, b: ir.Value, best: ir.Value, scores: ir.Value, **_: Any) -> Any:
        """Accepts float32/float16 operands whose reduction axes are MaxSim's layout; otherwise records why not (the
        optimize report lists it)."""
        dtype = dtype_name(a)
        if dtype not in ("float32", "float16") or dtype_name(b) != dtype:
            return self.reject(f"MatMul dtypes {dtype}, {dtype_name(b)} (the rule handles float32/float16)")
        layout = self._layout(a, b, best, scores)
        if isinstance(layout, str):
            return self.reject(layout)
        return True

    def rewrite(self, op: Any, a: ir.Value, b: ir.Value, best: ir.Value, scores: ir.Value, **_: Any) -> Any:
        """One MaxSim node on (query tokens, document tokens), transposing the operand that holds the documents when
        needed (or reusing the tensor an existing last-two-axes Transpose came from)."""
        layout = self._layout(a, b, best, scores)
        assert not isinstance(layout, str)
        doc, kind = layout
        rb = rank(b)
        assert rb is not None
        producer = b.producer()
        if _is_last_two_swap(producer, rb):
            assert producer is not None
            b_tokens = producer.inputs[0]
        else:
            b_tokens = op.Transpose(b, perm=[*range(rb - 2), rb - 1, rb - 2])
        q, d = (a, b_tokens) if doc == "b" else (b_tokens, a)

        def axes(*values: int) -> Any:
            return op.Constant(value=ir.tensor(list(values), dtype=ir.DataType.INT64))

        if kind == "q2d3":  # one query against N documents -> [N]
            out = op.Squeeze(op.MaxSim(op.Unsqueeze(q, axes(0)), d, _domain=self.domain()), axes(0))
        elif kind == "q3d2":  # B queries against one document -> [B]
            out = op.Squeeze(op.MaxSim(q, op.Unsqueeze(d, axes(0)), _domain=self.domain()), axes(1))
        elif kind == "q2d2":  # one against one -> scalar
            out = op.Squeeze(
                op.MaxSim(op.Unsqueeze(q, axes(0)), op.Unsqueeze(d, axes(0)), _domain=self.domain()), axes(0, 1)
            )
        else:  # q4d3: [B, 1, Lq, dim] x [N, Ld, dim] -> [B, N]
            out = op.MaxSim(op.Squeeze(q, axes(1)), d, _domain=self.domain())
        if dtype_name(a) == "float16":
            out = op.Cast(out, to=ir.DataType.FLOAT16)
        return out
