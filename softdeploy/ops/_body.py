"""Function bodies compiled on first use, so that ``import softdeploy.ops`` stays light.

An op's portable body is an onnxscript function. Compiling one with ``onnxscript.script`` at import
would import onnxscript (and through it onnx_ir and sympy, seconds of start-up) for every user of the
registry, including the ones that never look at a body (``softdeploy ops``, sessions, docs). So an op
module decorates its body with :func:`function_body` instead: the decorator keeps the plain Python
function and compiles it the first time anything asks for the body (:meth:`FunctionBody.onnx_function`,
:meth:`FunctionBody.to_function_proto`).

The names a body uses from onnxscript -- ``op`` (opset 18, the default opset of every body) and the
tensor types (``FLOAT``, ``BOOL``, ...) -- are bound in the op module's namespace when it is compiled:
onnxscript resolves a body's names in the namespace of the module that defines it, and the eager
evaluator runs the function there too. Op modules import them only under ``TYPE_CHECKING``, for the
reader and the type checker.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from softdeploy.domain import DOMAIN, OPSET_VERSION

# The onnxscript names a body may use without importing them; everything else it names must be bound in
# its module as usual.
_ONNXSCRIPT_TYPES = ("BFLOAT16", "BOOL", "DOUBLE", "FLOAT", "FLOAT16", "INT8", "INT16", "INT32", "INT64", "UINT8")

_COMPILE_LOCK = threading.Lock()  # one compilation per body, also when threads ask at once


class FunctionBody:
    """An op's standard-ONNX function body: a Python function in onnxscript's dialect, compiled into a
    domain-``com.softdeploy`` onnxscript function (opset 18 by default) the first time it is needed."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self._compiled: Any = None

    @property
    def name(self) -> str:
        """The body's name, which is the op's name (known without compiling)."""
        return self._fn.__name__

    @property
    def python_function(self) -> Callable[..., Any]:
        """The undecorated Python function the body is written as."""
        return self._fn

    @property
    def compiled(self) -> bool:
        """Whether the body has been compiled (in this interpreter)."""
        return self._compiled is not None

    def onnx_function(self) -> Any:
        """The compiled ``onnxscript.OnnxFunction`` (compiled once, then cached)."""
        if self._compiled is None:
            with _COMPILE_LOCK:
                if self._compiled is None:
                    self._compiled = _compile(self._fn)
        return self._compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the body eagerly on arrays (onnxscript's evaluator), as the compiled function would."""
        return self.onnx_function()(*args, **kwargs)

    def to_function_proto(self) -> Any:
        """The body as an ``onnx.FunctionProto`` (a fresh copy each call: callers retarget its opsets)."""
        return self.onnx_function().to_function_proto()

    def __repr__(self) -> str:
        state = "compiled" if self.compiled else "not compiled yet"
        return f"<FunctionBody {self.name} ({state})>"


def function_body(fn: Callable[..., Any]) -> FunctionBody:
    """Decorator for an op's body: ``@function_body def Softpick(X, axis: int = -1): ...`` is
    ``@onnxscript.script(Opset(DOMAIN, OPSET_VERSION), default_opset=opset18)``, compiled on first use."""
    return FunctionBody(fn)


def _compile(fn: Callable[..., Any]) -> Any:
    import onnxscript
    from onnxscript.values import Opset

    namespace = vars(sys.modules[fn.__module__])
    namespace.setdefault("op", onnxscript.opset18)
    for name in _ONNXSCRIPT_TYPES:
        namespace.setdefault(name, getattr(onnxscript, name))
    return onnxscript.script(Opset(DOMAIN, OPSET_VERSION), default_opset=onnxscript.opset18)(fn)
