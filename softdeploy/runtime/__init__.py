"""Running models: the one place that opens onnxruntime sessions (:class:`Session`) and finds the
native kernel library; :class:`BoundRun` repeats a run on fixed buffers."""

from __future__ import annotations

from softdeploy.runtime.library import library_path, library_status
from softdeploy.runtime.session import BoundRun, Session

__all__ = ["BoundRun", "Session", "library_path", "library_status"]
