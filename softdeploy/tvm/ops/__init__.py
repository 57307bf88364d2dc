"""softdeploy's ops as TIR (TE) computes: one PrimFunc per op node, which MetaSchedule tunes as one
task and TVM runs as one kernel (the inlined function body would be several standard ops).

``TIR_OPS`` maps an op type to its converter ``(bb, inputs, attrs) -> relax.Expr`` (attrs resolved
against the OpDef, inputs as relax expressions, ``None`` for an omitted optional input). An op
without an entry is imported from its function body. Importing this package imports TVM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from softdeploy.tvm.ops import two_pass_softmax

Converter = Callable[[Any, list[Any], dict[str, Any]], Any]

TIR_OPS: dict[str, Converter] = {
    "TwoPassSoftmax": two_pass_softmax.convert,
}

# Ops that have no TIR compute and whose function body TVM's importer cannot take -> why. The
# importer pre-check (softdeploy.tvm.frontend) finds these by itself; this list documents them and
# the conformance test holds it to the truth.
NOT_IMPORTABLE: dict[str, str] = {}

__all__ = ["NOT_IMPORTABLE", "TIR_OPS", "Converter"]
