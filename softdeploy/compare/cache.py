"""Content fingerprints for the caches of ``softdeploy compare``.

A cached export is reused only while what it was made from is unchanged: the weights (every tensor's
name, dtype, shape and bytes), the data and the settings -- never by name and version alone, which
let a retrained model be compared through the previous run's export.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np


def fingerprint(*parts: Any) -> str:
    """sha256 (hex) over ``parts``: torch modules (their ``state_dict``), tensors, numpy arrays,
    ONNX models, mappings and sequences of these, and JSON-able values."""
    h = hashlib.sha256()
    for part in parts:
        _update(h, part)
    return h.hexdigest()


def _update(h: Any, value: Any) -> None:
    if hasattr(value, "state_dict") and callable(value.state_dict):
        _update(h, dict(value.state_dict()))
        return
    if hasattr(value, "SerializeToString"):  # onnx.ModelProto and other protobufs
        h.update(b"proto:")
        h.update(value.SerializeToString(deterministic=True))
        return
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        value = value.detach().cpu()
        if value.dtype.is_floating_point and value.dtype.itemsize == 2:  # bfloat16 has no numpy type
            value = value.float()
        value = value.contiguous().numpy()
    if isinstance(value, np.ndarray):
        h.update(f"array:{value.dtype.str}:{value.shape}:".encode())
        h.update(np.ascontiguousarray(value).tobytes())
        return
    if isinstance(value, Mapping):
        h.update(b"map:")
        for k in sorted(value, key=str):
            h.update(f"{k!s}=".encode())
            _update(h, value[k])
        return
    if isinstance(value, (list, tuple)):
        h.update(f"seq{len(value)}:".encode())
        for v in value:
            _update(h, v)
        return
    h.update(json.dumps(value, sort_keys=True, default=str).encode())
