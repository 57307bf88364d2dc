"""Calibration that sees softdeploy's custom ops.

onnxruntime's static quantizer calibrates by running an *augmented* copy of the model in a session
it opens itself (``CalibraterBase.create_inference_session``) with plain ``SessionOptions``: a model
with com.softdeploy nodes fails there ("... is not a registered function/op") unless every node
carries its function body. :func:`softdeploy_calibration_sessions` replaces that one method -- for the
duration of a ``with`` block, under a lock -- with one that opens the session through
:class:`softdeploy.runtime.Session`, which registers our kernel library. ``onnxruntime.SessionOptions``
is never patched: that would also hit every other session in the process, and registering the
library twice in one SessionOptions fails ("Domain already set in registry").
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from softdeploy.runtime.session import Kernels

_PATCH_LOCK = threading.Lock()


@dataclasses.dataclass
class CalibrationRecord:
    """What the calibrator ran: ``kernels`` is "native" (our library) or "portable" (function bodies);
    the two can differ numerically, so the quantization report names it."""

    kernels: str | None = None
    sessions: int = 0


@contextmanager
def softdeploy_calibration_sessions(kernels: Kernels = "auto", threads: int = 1) -> Iterator[CalibrationRecord]:
    """Within the block, onnxruntime's calibrators open their sessions through softdeploy.runtime.Session."""
    from onnxruntime.quantization import calibrate

    from softdeploy.runtime import Session

    record = CalibrationRecord()

    def create_inference_session(self: Any) -> None:
        # Same graph optimisation level as onnxruntime's own method: the augmented model's extra
        # outputs must survive untouched.
        session = Session(self.augmented_model_path, kernels=kernels, threads=threads, optimization="none")
        self.infer_session = session.ort_session
        record.kernels = session.kernels
        record.sessions += 1

    with _PATCH_LOCK:
        original = calibrate.CalibraterBase.create_inference_session
        calibrate.CalibraterBase.create_inference_session = create_inference_session  # type: ignore[method-assign]
        try:
            yield record
        finally:
            calibrate.CalibraterBase.create_inference_session = original  # type: ignore[method-assign]


class ArrayDataReader:
    """onnxruntime ``CalibrationDataReader`` over a list of feed dicts (input name -> array)."""

    def __init__(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> None:
        if not feeds:
            raise ValueError("calibration needs at least one batch of inputs")
        self._feeds = [dict(f) for f in feeds]
        self._it: Iterator[dict[str, np.ndarray]] = iter(self._feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        """The next calibration batch, or None when done (onnxruntime's CalibrationDataReader protocol)."""
        return next(self._it, None)

    def rewind(self) -> None:
        """Starts again at the first batch (onnxruntime's CalibrationDataReader protocol)."""
        self._it = iter(self._feeds)

    def __len__(self) -> int:
        return len(self._feeds)


def as_calibration_reader(feeds: Sequence[Mapping[str, np.ndarray]]) -> Any:
    """An ArrayDataReader that is also an instance of onnxruntime's CalibrationDataReader (the
    quantizer checks the type)."""
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(ArrayDataReader, CalibrationDataReader):
        pass

    return _Reader(feeds)
