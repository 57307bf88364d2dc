"""SignedMaxSim as one TIR PrimFunc: the compute is MaxSim's with signs (``max_sim.signed_max_sim``,
equations in softdeploy/tvm/ops/max_sim.py), and MaxSim's hand schedule applies to it (same blocks)."""

from __future__ import annotations

from typing import Any

from softdeploy.ops import signed_max_sim as signed_op
from softdeploy.tvm.ops._te import shape_proxy
from softdeploy.tvm.ops.max_sim import signed_max_sim


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Relax converter for SignedMaxSim: checks the shape rules (no values at compile time) and emits one PrimFunc."""
    args = (list(inputs) + [None] * 6)[:6]
    signed_op.validate(*(shape_proxy(a) for a in args), values=False)
    return bb.emit_te(signed_max_sim, *args, primfunc_name_hint="signed_max_sim")
