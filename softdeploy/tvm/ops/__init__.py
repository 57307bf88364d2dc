"""softdeploy's ops as TIR (TE) computes: one PrimFunc per op node, which MetaSchedule tunes as one
task and TVM runs as one kernel (the inlined function body would be several standard ops).

``TIR_OPS`` maps an op type to its converter ``(bb, inputs, attrs) -> relax.Expr`` (attrs resolved
against the OpDef, inputs as relax expressions, ``None`` for an omitted optional input). An op
without an entry is imported from its function body. Importing this package imports TVM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from softdeploy.tvm.ops import (
    adaptive_temperature_softmax,
    injective,
    matmul,
    max_sim,
    multi_max,
    rowwise_int8_matmul,
    softmax_topk,
    softpick,
    two_pass_softmax,
)

Converter = Callable[[Any, list[Any], dict[str, Any]], Any]
Scheduler = Callable[[Any], bool]  # (tvm.s_tir.Schedule) -> applied? (False: not this op's kernel)

TIR_OPS: dict[str, Converter] = {
    "AdaptiveTemperatureSoftmax": adaptive_temperature_softmax.convert,
    "MaxSim": max_sim.convert_max_sim,
    "MultiMax": multi_max.convert,
    "RowwiseInt8MatMul": rowwise_int8_matmul.convert,
    "SignedMaxSim": max_sim.convert_signed_max_sim,
    "SoftmaxTopK": softmax_topk.convert,
    "Softpick": softpick.convert,
    "TwoPassSoftmax": two_pass_softmax.convert,
}

# Hand schedules of the TIR computes (dlight style: a rule that does not recognise the kernel
# returns False). Used for kernels without a tuning record, and offered to MetaSchedule as one more
# candidate of its design space.
# MultiMax's kernel has TwoPassSoftmax's blocks (two_pass_softmax.softmax_of): that rule schedules it.
SCHEDULES: dict[str, Scheduler] = {
    "AdaptiveTemperatureSoftmax": adaptive_temperature_softmax.schedule,
    "MaxSim": max_sim.schedule,  # and SignedMaxSim (same blocks)
    "RowwiseInt8MatMul": rowwise_int8_matmul.schedule,
    "Softpick": softpick.schedule,
    "SoftmaxTopK": softmax_topk.schedule,  # its statistics kernel
    "TwoPassSoftmax": two_pass_softmax.schedule,
    # not one of our ops: Relax's legalised matmul (Linear / MatMul layers and their bias adds)
    "MatMul": matmul.schedule,
    # nor these: kernels without a reduction (layout changes, gathers, elementwise chains); last, after every rule
    "Injective": injective.schedule,
}


def try_schedules(func: Any) -> tuple[Any | None, str | None, dict[str, str]]:
    """(``func`` scheduled, the SCHEDULES entry that did it, errors) -- (None, None, errors) when no
    rule recognises the kernel. ``errors`` maps each rule that RAISED to its message: a rule that does
    not recognise a kernel returns False, so an exception is a broken schedule (the kernel then falls
    back to dlight's or TVM's loop nests, measured 30-77x slower), never "not applicable"."""
    from tvm.s_tir import Schedule

    from softdeploy.tvm.build import is_scheduled

    errors: dict[str, str] = {}
    if is_scheduled(func):  # written scheduled already (SoftmaxTopK's block maxima and selection)
        return None, None, errors
    try:
        Schedule(func).get_sblock("root")
    except Exception:  # no "root" block: a PrimFunc not built of blocks (TOPI's TopK, ScatterElements), not ours
        return None, None, errors
    for name, rule in SCHEDULES.items():
        sch = Schedule(func)
        inline_neighbours(sch)
        try:
            if rule(sch):
                return sch.mod["main"], name, errors
        except Exception as e:  # reported: see the docstring
            errors[name] = error_line(e)
    return None, None, errors


def apply_schedules(func: Any, kernel: str | None = None) -> Any | None:
    """``func`` scheduled by the first of SCHEDULES that recognises it (after inlining the elementwise
    neighbours the fusion pass put into the same kernel), or None when none does. Raises
    :class:`~softdeploy.tvm.errors.ScheduleError` naming ``kernel`` (default: the function's symbol)
    when a rule raised (see :func:`try_schedules`)."""
    from softdeploy.tvm.errors import ScheduleError

    scheduled, _, errors = try_schedules(func)
    if errors:
        attrs = func.attrs or {}
        raise ScheduleError(kernel or str(attrs.get("global_symbol", "a kernel")), errors)
    return scheduled


def error_line(e: BaseException, limit: int = 400) -> str:
    """``Type: message`` of an exception on one line, at most ``limit`` characters. A TVM ScheduleError
    prints the whole module between its first line and its reason ("Error message: ..."): those two
    are kept."""
    text = str(e)
    head = text.strip().splitlines()[0] if text.strip() else ""
    if "Error message:" in text:
        head += " " + text.rsplit("Error message:", 1)[1]
    line = " ".join(f"{type(e).__name__}: {head}".split()) if head else type(e).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


# Blocks of our computes that are kept on purpose: a layout change (an inlined transpose would make the
# kernel read strided again), per-call and per-row scalars (inlined, they would be recomputed per
# element) and row stages (values stored once per row so that later passes need not recompute an exp).
KEEP_BLOCKS = frozenset(
    {
        "q_packed",
        "multimax_params",
        "beta",
        "row_exp",
        "scaled_exp",
        "term",
        "row_shift",
        "row_unit",
        "row_scale",
        "row_sums",
        # TwoPassSoftmax's output, which the standard Softmax imports as (softdeploy/tvm/frontend.py): the
        # elementwise ops after it (attention's where(isnan(p), 0, p)) are inlined into it, not it into them
        "softmax",
        # RowwiseInt8MatMul's per-row scalars
        *rowwise_int8_matmul.ROW_BLOCKS,
    }
)


def inline_neighbours(sch: Any) -> None:
    """Inlines the elementwise blocks that the fusion pass put next to our kernels, except KEEP_BLOCKS (layout changes,
    per-row scalars and row stages that must stay stored), so that the hand schedules see the kernel they were written
    for."""
    root = sch.get_sblock("root")
    for block in sch.get_child_blocks(root):
        if sch.get(block).name_hint in KEEP_BLOCKS:
            continue
        for inline in (sch.compute_inline, sch.reverse_compute_inline):
            try:
                inline(block)
                break
            except Exception:  # reductions and our own blocks stay
                continue


# Ops that TVM imports from their function bodies (several standard ops, each its own kernel) -> why
# they have no TIR compute yet. Held by tests/tvm_backend (each op's import path).
FUNCTION_BODY_ONLY: dict[str, str] = {
    "LoRAMixer": "its routed form (group tokens by selected expert, then per-expert GEMMs of data-dependent "
    "sizes) has no static TE compute; the dense function body (two GEMMs over all experts) imports as is",
    "SoftpickAttention": "no TIR flash-style compute yet: TVM runs the float64 function body, which "
    "materialises the [B, H, Tq, Tk] scores",
    "SoftTokenEmbedding": "no TIR compute yet: TVM runs the float64 function body (a TopK over the vocabulary "
    "for the candidates over tie-free keys, since TVM's TopK does not keep lower ids first; the probability "
    "row in float64)",
}

# Ops that have no TIR compute and whose function body TVM's importer cannot take -> why. The
# importer pre-check (softdeploy.tvm.frontend) finds these by itself; this list documents them and
# the conformance test holds it to the truth.
NOT_IMPORTABLE: dict[str, str] = {
    # The Newton-Schulz steps are an ONNX Loop in the body (their count is an attribute); no TIR compute yet.
    "NystromGaussianAttention": "its function body uses Loop for the Newton-Schulz steps (not in TVM's Relax "
    "ONNX frontend, apache/tvm#17767) and it has no TIR compute yet",
    # The body's selection loop is an ONNX Loop, which the Relax importer lacks; a TIR compute is not
    # possible either: the number of selected boxes (the output's first dimension) depends on the data.
    "SoftNMS": "its function body uses Loop (not in TVM's Relax ONNX frontend, apache/tvm#17767) and its "
    "output size depends on the data, so it has no TIR compute",
}

__all__ = [
    "FUNCTION_BODY_ONLY",
    "NOT_IMPORTABLE",
    "SCHEDULES",
    "TIR_OPS",
    "Converter",
    "Scheduler",
    "apply_schedules",
    "error_line",
    "inline_neighbours",
    "try_schedules",
]
