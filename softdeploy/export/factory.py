"""``softdeploy export FACTORY``: what the module to export is, named as ``package.module:attr`` or
``path/to/file.py:attr``. The attribute is a callable returning ``(module, example_inputs)`` or
``(module, example_inputs, dynamic_shapes)``."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from pathlib import Path
from typing import Any

from softdeploy.errors import ExportError


@dataclasses.dataclass(frozen=True)
class ExportSpec:
    """What a factory returns, normalised: the module, its example inputs as a tuple and the dynamic shapes (None: all
    static)."""

    module: Any
    example_inputs: tuple[Any, ...]
    dynamic_shapes: Any = None


def load_callable(spec: str, what: str = "factory") -> Any:
    """The attribute named by ``package.module:attr`` or ``path/to/file.py:attr`` (a factory, data
    loader or metric); a module in the current folder imports, as with ``python -m``."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ExportError(f"{what} {spec!r} must be 'package.module:attr' or 'file.py:attr'")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ExportError(f"{what} file {path} does not exist")
        loader_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert loader_spec is not None and loader_spec.loader is not None
        mod = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(mod)
    else:
        # As `python -m` does: a module in the current folder imports (the CLI's sys.path[0] is the
        # folder of the `softdeploy` script, not the user's).
        import os
        import sys

        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            mod = importlib.import_module(target)
        except ImportError as e:
            raise ExportError(f"cannot import {target!r} for {what} {spec!r}: {e}") from e
    if not hasattr(mod, attr):
        raise ExportError(f"{target} has no attribute {attr!r}")
    return getattr(mod, attr)


def load_factory(spec: str) -> ExportSpec:
    """Calls the factory ``spec`` names; returns what it made as an ExportSpec."""
    made = load_callable(spec)()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise ExportError(
            f"factory {spec!r} returned {type(made).__name__}; expected (module, example_inputs[, dynamic_shapes])"
        )
    module, inputs = made[0], made[1]
    import torch

    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    return ExportSpec(module, tuple(inputs), made[2] if len(made) == 3 else None)
