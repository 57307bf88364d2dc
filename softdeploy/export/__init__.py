"""Export: torch -> ONNX with com.softdeploy nodes, and their portable function bodies.

``softdeploy.export`` is both this package and a function: ``softdeploy.export(module, inputs)`` calls
:func:`softdeploy.export.api.export`. Importing the package stays light (no torch, no onnxruntime);
they are imported when an export runs.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def export(*args: Any, **kwargs: Any) -> Any:
    """``softdeploy.export(module, example_inputs, path=None, *, dynamic_shapes=None, validate=True,
    ...)`` -> ExportResult; see :func:`softdeploy.export.api.export`."""
    from softdeploy.export.api import export as _export

    return _export(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name in ("attach_function_bodies", "inline_function_bodies"):  # softdeploy.ops.functions (numpy, on use)
        from softdeploy.ops import functions

        return getattr(functions, name)
    if name in ("ExportResult",):
        from softdeploy.export import api

        return getattr(api, name)
    if name in ("ValidationReport", "Divergence", "validate_export", "localize_divergence"):
        from softdeploy.export import validate

        return getattr(validate, name)
    if name in ("optimize", "OptimizeReport"):
        from softdeploy.export import rewrites

        return getattr(rewrites, name)
    raise AttributeError(f"module 'softdeploy.export' has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """Lets ``softdeploy.export(...)`` call :func:`export` while ``softdeploy.export.<name>`` still
    reaches this package (Python sets the package as the parent's attribute on import, so a plain
    function of the same name on ``softdeploy`` would be shadowed)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["attach_function_bodies", "export", "inline_function_bodies"]
