"""softdeploy's ops as TIR (TE) computes: one PrimFunc per op node, which MetaSchedule tunes as one
task and TVM runs as one kernel (the inlined function body would be several standard ops).

Every table here is derived from the op registry (``softdeploy.ops.REGISTRY``) and the op's own
module ``softdeploy/tvm/ops/<stem>.py``; adding an op edits none of them. Such a module defines
  * ``convert(bb, inputs, attrs) -> relax.Expr``: the op has a TIR compute (``TIR_OPS``; attrs
    resolved against the OpDef, inputs as relax expressions, ``None`` for an omitted optional input);
  * optionally ``schedule(sch) -> bool``: its hand schedule (a ``SCHEDULES`` rule named after the op),
    and ``KEEP_BLOCKS``: block names that stay stored when the neighbours are inlined;
  * or, without ``convert``, ``FUNCTION_BODY_ONLY`` (why TVM imports the function body instead) or
    ``NOT_IMPORTABLE`` (why TVM cannot import the op at all) -- a string each.
An op without such a module is imported from its function body. Importing this package imports TVM.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType
from typing import Any

from softdeploy.ops import REGISTRY
from softdeploy.tvm.ops import injective, matmul

Converter = Callable[[Any, list[Any], dict[str, Any]], Any]
Scheduler = Callable[[Any], bool]  # (tvm.s_tir.Schedule) -> applied? (False: not this op's kernel)


def _op_modules() -> dict[str, ModuleType]:
    """op name -> its module ``softdeploy.tvm.ops.<stem>``, for the ops of REGISTRY that have one."""
    found = {}
    for name, op in REGISTRY.items():
        module = f"{__name__}.{op.stem}"
        if importlib.util.find_spec(module) is not None:
            found[name] = importlib.import_module(module)
    return found


OP_MODULES: dict[str, ModuleType] = _op_modules()

TIR_OPS: dict[str, Converter] = {name: m.convert for name, m in OP_MODULES.items() if hasattr(m, "convert")}

# Hand schedules of the TIR computes (dlight style: a rule that does not recognise the kernel
# returns False), the ops' own in op order, then the two for standard ops. Used for kernels without a
# tuning record, and offered to MetaSchedule as one more candidate of its design space. An op with a
# TIR compute and no rule (MultiMax, SignedMaxSim) builds its kernel of another op's blocks, whose
# rule schedules it.
SCHEDULES: dict[str, Scheduler] = {
    **{name: m.schedule for name, m in OP_MODULES.items() if hasattr(m, "schedule")},
    # not one of our ops: Relax's legalised matmul (Linear / MatMul layers and their bias adds)
    "MatMul": matmul.schedule,
    # nor these: kernels without a reduction (layout changes, gathers, elementwise chains); last, after every rule
    "Injective": injective.schedule,
}

# Ops that TVM imports from their function bodies (several standard ops, each its own kernel) -> why
# they have no TIR compute yet. Held by tests/tvm_backend (each op's import path).
FUNCTION_BODY_ONLY: dict[str, str] = {
    **{name: m.FUNCTION_BODY_ONLY for name, m in OP_MODULES.items() if hasattr(m, "FUNCTION_BODY_ONLY")},
    **{
        name: f"no TIR compute (no softdeploy/tvm/ops/{op.stem}.py)"
        for name, op in REGISTRY.items()
        if name not in OP_MODULES
    },
}

# Ops that have no TIR compute and whose function body TVM's importer cannot take -> why. The
# importer pre-check (softdeploy.tvm.frontend) finds these by itself; this list documents them and
# the conformance test holds it to the truth.
NOT_IMPORTABLE: dict[str, str] = {
    name: m.NOT_IMPORTABLE for name, m in OP_MODULES.items() if hasattr(m, "NOT_IMPORTABLE")
}


def is_scheduled(func: Any) -> bool:
    """Set by MetaScheduleApplyDatabase and dlight ("tirx.is_scheduled" in 0.27, "tir." before)."""
    attrs = func.attrs or {}
    return any(k in attrs and bool(attrs[k]) for k in ("tirx.is_scheduled", "tir.is_scheduled"))


def try_schedules(func: Any) -> tuple[Any | None, str | None, dict[str, str]]:
    """(``func`` scheduled, the SCHEDULES entry that did it, errors) -- (None, None, errors) when no
    rule recognises the kernel. ``errors`` maps each rule that RAISED to its message: a rule that does
    not recognise a kernel returns False, so an exception is a broken schedule (the kernel then falls
    back to dlight's or TVM's loop nests, measured 30-77x slower), never "not applicable"."""
    from tvm.s_tir import Schedule

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


# Blocks of our computes that are kept on purpose (each op module's KEEP_BLOCKS): a layout change (an
# inlined transpose would make the kernel read strided again), per-call and per-row scalars (inlined, they
# would be recomputed per element) and row stages (values stored once per row so that later passes need
# not recompute an exp).
KEEP_BLOCKS = frozenset(b for m in OP_MODULES.values() for b in getattr(m, "KEEP_BLOCKS", ()))


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


__all__ = [
    "FUNCTION_BODY_ONLY",
    "KEEP_BLOCKS",
    "NOT_IMPORTABLE",
    "OP_MODULES",
    "SCHEDULES",
    "TIR_OPS",
    "Converter",
    "Scheduler",
    "apply_schedules",
    "error_line",
    "inline_neighbours",
    "is_scheduled",
    "try_schedules",
]
