"""The one place that builds onnxruntime sessions.

``Session(model, kernels="native")`` registers softdeploy's kernel library, so com.softdeploy nodes
run the native kernels; ``kernels="portable"`` never registers it, so onnxruntime runs the standard-ONNX
function bodies attached to the model (what a user without softdeploy gets); ``kernels="auto"``
uses the library when it loads and the function bodies otherwise.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from softdeploy.errors import OpContractError, RuntimeFailure

Kernels = Literal["native", "portable", "auto"]


def _session_options(threads: int, spin: bool) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3  # errors reach the caller as exceptions; don't also print them
    # Idle ORT workers spinning on a core steal it from whatever runs next (measured on 2 cores).
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return so


class Session:
    """An onnxruntime InferenceSession with softdeploy's kernels (or their portable bodies)."""

    def __init__(
        self,
        model: Any,
        *,
        kernels: Kernels = "native",
        threads: int = 1,
        spin: bool = False,
        optimization: str = "all",
    ) -> None:
        import onnxruntime as ort

        from softdeploy.runtime.library import library_path, library_status

        if kernels not in ("native", "portable", "auto"):
            raise ValueError(f"kernels must be 'native', 'portable' or 'auto', not {kernels!r}")
        so = _session_options(threads, spin)
        so.graph_optimization_level = {
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        }[optimization]
        self.library: Path | None = None
        if kernels == "native":
            self.library = library_path()
        elif kernels == "auto":
            self.library = library_status().path
        if self.library is not None:
            so.register_custom_ops_library(str(self.library))
        self.kernels = "native" if self.library is not None else "portable"
        self.threads = threads
        if hasattr(model, "SerializeToString"):
            model = model.SerializeToString()
        elif isinstance(model, os.PathLike):
            model = os.fspath(model)
        try:
            self._sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types
            raise _translate(e) from e

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self._sess.get_inputs()]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self._sess.get_outputs()]

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        try:
            return self._sess.run(list(outputs) if outputs else None, {k: np.asarray(v) for k, v in feeds.items()})
        except Exception as e:
            raise _translate(e) from e

    @property
    def ort_session(self) -> Any:
        return self._sess


def _translate(e: Exception) -> Exception:
    """onnxruntime error -> typed softdeploy error carrying the kernel's own message.

    A kernel reports a contract violation as "<Op>: <what> (rule: ...)": at run time onnxruntime
    wraps it as INVALID_ARGUMENT, at session creation (attribute checks) as "Exception during
    initialization"; both become OpContractError with the kernel's message."""
    text = str(e)
    message = text
    for marker in ("Status Message: ", "Exception during initialization: "):
        if marker in message:
            message = message.split(marker, 1)[1]
    message = message.strip()
    no_kernel = re.search(r"no kernel def matches node inputs for Op: (\w+)", text)
    if no_kernel:
        return OpContractError(_type_rule(no_kernel.group(1)))
    if "INVALID_ARGUMENT" in text or type(e).__name__ in ("InvalidArgument", "InvalidGraph") or _names_our_op(message):
        return OpContractError(message)
    return RuntimeFailure(message)


def _type_rule(op: str) -> str:
    """Message for a node whose input element types match none of the op's kernels."""
    from softdeploy.ops import REGISTRY

    d = REGISTRY.get(op)
    if d is None:
        return f"{op}: the input element types match no registered kernel"
    typed = [p.name for p in d.inputs if p.dtype == "T"]
    return (
        f"{op}: the element types of inputs {typed} match no kernel "
        f"(rule: they share one type T in {list(d.float_types)})"
    )


def _names_our_op(message: str) -> bool:
    from softdeploy.ops import REGISTRY

    op = message.split(": ", 1)[0]
    return op in REGISTRY and "(rule:" in message
