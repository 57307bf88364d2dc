"""Running models: the one place that opens onnxruntime sessions (:class:`Session`) and finds the
native kernel library (:func:`library_info`: what it says about itself); :class:`BoundRun` repeats a
run on fixed buffers."""

from __future__ import annotations

from softdeploy.runtime.library import LibraryInfo, library_info, library_path, library_status
from softdeploy.runtime.session import BoundRun, Session

__all__ = ["BoundRun", "LibraryInfo", "Session", "library_info", "library_path", "library_status"]
