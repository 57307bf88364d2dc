"""The ONNX identity of softdeploy's ops: their domain and opset version, and the package version.

A leaf: everything that writes or reads ``com.softdeploy`` nodes imports these from here (the package root
re-exports them as ``softdeploy.DOMAIN``, ``softdeploy.OPSET_VERSION`` and ``softdeploy.__version__``).
"""

from __future__ import annotations

__version__ = "0.1.0"  # the same as pyproject.toml's [project] version
DOMAIN = "com.softdeploy"
OPSET_VERSION = 1

__all__ = ["DOMAIN", "OPSET_VERSION", "__version__"]
