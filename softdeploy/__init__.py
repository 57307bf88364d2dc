"""softdeploy: ship PyTorch models that use "soft" operators to onnxruntime (and TVM).

``import softdeploy`` is deliberately light: it imports neither torch, nor onnxruntime, nor TVM.
The op registry lives in :mod:`softdeploy.ops`, sessions in :mod:`softdeploy.runtime`.
"""

from __future__ import annotations

from softdeploy.domain import DOMAIN, OPSET_VERSION, __version__
from softdeploy.errors import (
    ArgumentError,
    CacheError,
    ExportError,
    InputError,
    LibraryNotFoundError,
    ModelLoadError,
    OpContractError,
    OutputError,
    OverwriteError,
    RuntimeFailure,
    SoftdeployError,
    SoftdeployWarning,
)


def __getattr__(name: str) -> object:
    # ``softdeploy.export(module, example_inputs)``: the export package is callable (see
    # softdeploy/export/__init__.py); imported on first use so that ``import softdeploy`` stays light.
    if name == "export":
        import importlib

        return importlib.import_module("softdeploy.export")
    raise AttributeError(f"module 'softdeploy' has no attribute {name!r}")


__all__ = [
    "DOMAIN",
    "OPSET_VERSION",
    "ArgumentError",
    "CacheError",
    "ExportError",
    "InputError",
    "LibraryNotFoundError",
    "ModelLoadError",
    "OpContractError",
    "OutputError",
    "OverwriteError",
    "RuntimeFailure",
    "SoftdeployError",
    "SoftdeployWarning",
    "__version__",
    "export",
]
