"""Checks of a safetensors file made from its header alone, before any tensor is read or any module built.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (tensor name -> dtype, shape,
data offsets; ``__metadata__`` -> strings) and the tensor data. :func:`read_header` parses that JSON with a
duplicate-detecting hook -- the Rust reader keeps one of two entries of a repeated name silently, or reports a
misleading "invalid offset" -- and checks every entry against the file: a known dtype, a shape of positive
integers, data offsets inside the data whose length is the shape's size. What a caller builds from the shapes is
then bounded by the bytes actually present, so a few-hundred-byte file cannot ask for gigabytes.

Errors are raised as the caller's softdeploy error class (WeightsError, AdapterError, DistillError), so each
loader keeps its own exception type; every message names the file, the tensor or key, the value and the rule.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from softdeploy.errors import SoftdeployError

# bytes per element of safetensors' dtypes (sub-byte float formats are not read by softdeploy)
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
FLOAT_DTYPES = frozenset({"F8_E5M2", "F8_E4M3", "F16", "BF16", "F32", "F64"})
# the safetensors reader's own limit on the header (100 MB); a larger length field is a damaged file
MAX_HEADER_BYTES = 100_000_000


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header describes it: dtype (safetensors' name), shape and byte range in the data."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        """The number of elements of the shape (1 for a scalar)."""
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Header:
    """The checked header of one safetensors file."""

    path: Path
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_bytes: int

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape."""
        return {k: t.shape for k, t in self.tensors.items()}

    @property
    def numel(self) -> int:
        """The number of elements of all tensors together."""
        return sum(t.numel for t in self.tensors.values())


class DuplicateKeyError(ValueError):
    """A JSON object names one key twice (raised by :func:`unique_pairs`)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} appears twice")
        self.key = key


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook`` that refuses a repeated key (json keeps the last one silently)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKeyError(k)
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_unique(text: str | bytes, *, constants: bool = False) -> Any:
    """``json.loads`` refusing repeated keys (:class:`DuplicateKeyError`) at any depth, and NaN / Infinity
    (ValueError) unless ``constants`` (then they are read as Python reads them, for the caller's own check to name
    the key)."""
    if constants:
        return json.loads(text, object_pairs_hook=unique_pairs)
    return json.loads(text, object_pairs_hook=unique_pairs, parse_constant=_no_constant)


def load_json_file(path: str | os.PathLike[str], error: type[SoftdeployError], rule: str) -> Any:
    """The JSON value of the file ``path``; a missing, unreadable, non-UTF-8 or malformed file or a repeated key is
    ``error`` naming the file, the problem and ``rule``. NaN and Infinity are read as floats: the caller's check of
    the value names the key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{path}: cannot be read as UTF-8 text ({e}) (rule: {rule})") from None
    try:
        return loads_unique(text, constants=True)
    except DuplicateKeyError as e:
        raise error(
            f"{path}: key {e.key!r} appears twice (rule: {rule}, each key once -- which one is meant is unknown)"
        ) from None
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise error(f"{path}: not a JSON file ({e}) (rule: {rule})") from None


def read_header(path: str | os.PathLike[str], error: type[SoftdeployError], *, allow_empty: bool = False) -> Header:
    """The header of the safetensors file ``path``, checked against the file; reads the header bytes only.

    Refused (as ``error`` naming the file and the tensor): a missing or short file, a header length past the end of
    the file, a header that is not UTF-8 JSON of objects, a repeated key (tensor name or field), NaN / Infinity, a
    tensor entry without a known dtype, a shape of non-negative integers or data offsets ``[begin, end]`` inside the
    data with ``end - begin`` equal to the shape's size in bytes, metadata that is not strings, and -- unless
    ``allow_empty`` -- a dimension of size 0 (no softdeploy weight is empty; an empty tensor of huge declared
    dimensions is how a tiny file asks for a huge module)."""
    path = Path(path)
    rule = "a safetensors file: 8-byte header length, JSON header, tensor data"
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise error(
                    f"{path}: not a readable safetensors file: {size} bytes, too short for a header (rule: {rule})"
                )
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > MAX_HEADER_BYTES:
                raise error(
                    f"{path}: not a readable safetensors file: the header length field says {n} bytes, the file "
                    f"holds {size - 8} after it (rule: {rule}; truncated?)"
                )
            raw = f.read(n)
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        doc = loads_unique(raw.decode("utf-8"))
    except DuplicateKeyError as e:
        raise error(
            f"{path}: the header names {e.key!r} twice (rule: each tensor and field once; the safetensors reader "
            "would keep one of them silently)"
        ) from None
    except (UnicodeDecodeError, ValueError) as e:
        raise error(f"{path}: not a readable safetensors file: the header is not JSON ({e}) (rule: {rule})") from None
    if not isinstance(doc, dict):
        raise error(
            f"{path}: not a readable safetensors file: the header holds a {type(doc).__name__}, not an object "
            f"(rule: {rule})"
        )
    data_bytes = size - 8 - n
    meta_raw = doc.pop("__metadata__", None) or {}
    if not isinstance(meta_raw, dict) or not all(isinstance(v, str) for v in meta_raw.values()):
        raise error(f"{path}: __metadata__ is not a mapping of strings to strings (rule: {rule})")
    tensors: dict[str, TensorEntry] = {}
    for name, entry in doc.items():
        tensors[name] = _entry(path, name, entry, data_bytes, error, allow_empty)
    return Header(path, tensors, dict(meta_raw), data_bytes)


def _entry(
    path: Path, name: str, entry: Any, data_bytes: int, error: type[SoftdeployError], allow_empty: bool
) -> TensorEntry:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise error(
            f"{path}: tensor {name!r} is described by {entry!r} (rule: an object of dtype, shape and data_offsets)"
        )
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_BYTES:
        raise error(f"{path}: tensor {name!r} has dtype {dtype!r} (rule: one of {', '.join(DTYPE_BYTES)})")

    def is_int(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    if not isinstance(shape, list) or not all(is_int(d) for d in shape):
        raise error(f"{path}: tensor {name!r} has shape {shape!r} (rule: a list of non-negative integers)")
    if not allow_empty and 0 in shape:
        raise error(f"{path}: tensor {name!r} has shape {shape} with a dimension of size 0 (rule: no empty tensors)")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets):
        raise error(f"{path}: tensor {name!r} has data_offsets {offsets!r} (rule: [begin, end], integers)")
    begin, end = offsets
    want = math.prod(shape) * DTYPE_BYTES[dtype]
    if end < begin or end - begin != want:
        raise error(
            f"{path}: tensor {name!r} of shape {shape} ({dtype}) needs {want} bytes, its data_offsets "
            f"{offsets} span {end - begin} (rule: end - begin = elements x bytes per element)"
        )
    if end > data_bytes:
        raise error(
            f"{path}: tensor {name!r} ends at byte {end} of the data, the file holds {data_bytes} "
            "(rule: every tensor lies inside the file; truncated?)"
        )
    return TensorEntry(name, dtype, tuple(shape), begin, end)


def load_tensors(
    header: Header,
    error: type[SoftdeployError],
    names: Iterable[str] | None = None,
    *,
    finite: bool = True,
) -> dict[str, torch.Tensor]:
    """The tensors ``names`` (all by default) of the file whose checked ``header`` is given, read with safetensors
    (never unpickled). With ``finite``, a floating-point tensor holding NaN or an infinity is ``error`` naming the
    file, the tensor and how many values are not finite."""
    from safetensors import safe_open

    path = header.path
    wanted = list(header.tensors) if names is None else list(names)
    try:
        with safe_open(str(path), framework="pt") as f:
            out = {k: f.get_tensor(k) for k in wanted}
    except Exception as e:  # safetensors raises its own error type (and OSError) for a damaged file
        raise error(f"{path}: not a readable safetensors file ({e})") from None
    if finite:
        for k, t in out.items():
            check_finite(path, k, t, error)
    return out


def check_finite(path: str | os.PathLike[str], name: str, t: torch.Tensor, error: type[SoftdeployError]) -> None:
    """``error`` naming the file and the tensor when the floating-point tensor ``t`` holds NaN or an infinity."""
    if not t.is_floating_point():
        return
    bad = ~torch.isfinite(t)
    count = int(bad.sum())
    if count:
        first = t.reshape(-1)[bad.reshape(-1)][0].item()
        raise error(
            f"{path}: tensor {name!r} holds {count} non-finite value(s) of {t.numel()} (e.g. {first}) "
            "(rule: weights are finite numbers)"
        )
