"""Running models: the one place that opens onnxruntime sessions (:class:`Session`) and finds the
native kernel library."""

from __future__ import annotations

from softdeploy.runtime.library import library_path, library_status
from softdeploy.runtime.session import Session

__all__ = ["Session", "library_path", "library_status"]
