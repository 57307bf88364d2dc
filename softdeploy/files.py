"""Reading the files a user hands softdeploy (ONNX models, .npz feeds) with typed errors.

Every ONNX file the CLI and :class:`softdeploy.runtime.Session` open goes through :func:`load_model`
(or, for a path onnxruntime failed to read, :func:`diagnose_model_file`), so a missing path, a
directory, an empty file, random bytes or a truncated download is reported as a
:class:`~softdeploy.errors.ModelLoadError` that names the path and what is wrong -- not as a protobuf
``DecodeError`` or onnxruntime's "Protobuf parsing failed".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.errors import InputError, ModelLoadError

# ModelProto's fields (onnx.proto3): number -> (name, wire type). onnx serialises them in field-number
# order, ir_version (1) first; any other tag at the top level means the bytes are not a ModelProto.
_VARINT, _LEN = 0, 2
_MODEL_FIELDS = {
    1: ("ir_version", _VARINT),
    2: ("producer_name", _LEN),
    3: ("producer_version", _LEN),
    4: ("domain", _LEN),
    5: ("model_version", _VARINT),
    6: ("doc_string", _LEN),
    7: ("graph", _LEN),
    8: ("opset_import", _LEN),
    14: ("metadata_props", _LEN),
    20: ("training_info", _LEN),
    25: ("functions", _LEN),
    26: ("configuration", _LEN),
}


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """(value, next position) of the varint at ``pos``; None when the data ends inside it or it is longer
    than a 64-bit varint can be."""
    value, shift = 0, 0
    while pos < len(data) and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None


def _wire_problem(data: bytes) -> str:
    """What is wrong with ``data`` as a serialised ModelProto, judged from its top-level fields only
    (cheap: the fields' contents are skipped): "truncated ..." when a known field runs past the end,
    "not an ONNX protobuf ..." when a tag is not one of ModelProto's; "" when the top level is sound."""
    pos = 0
    seen: list[str] = []
    while pos < len(data):
        tag = _varint(data, pos)
        if tag is None:
            return f"truncated: the file ends inside a field tag at byte {pos}"
        number, wire = tag[0] >> 3, tag[0] & 7
        field = _MODEL_FIELDS.get(number)
        if field is None or field[1] != wire:
            where = f"at byte {pos}" + (f" (after {', '.join(seen[-3:])})" if seen else "")
            start = data[:8].hex(" ")
            return (
                f"not an ONNX protobuf: field tag {tag[0]:#x} {where} is not one of ModelProto's (file starts {start})"
            )
        pos = tag[1]
        if wire == _VARINT:
            value = _varint(data, pos)
            if value is None:
                return f"truncated: the file ends inside {field[0]} at byte {pos}"
            pos = value[1]
        else:
            length = _varint(data, pos)
            if length is None:
                return f"truncated: the file ends inside the length of {field[0]} at byte {pos}"
            pos = length[1] + length[0]
            if pos > len(data):
                return (
                    f"truncated: {field[0]} needs {length[0]} bytes from byte {length[1]}, "
                    f"the file ends after {len(data) - length[1]}"
                )
        seen.append(field[0])
    if "graph" not in seen:
        return "not an ONNX model: it holds no graph"
    if "opset_import" not in seen:
        return "truncated or not an ONNX model: it declares no opset (opset_import), which onnx writes after the graph"
    return ""


def _check_path(path: Path, what: str) -> None:
    if not path.exists():
        raise ModelLoadError(f"{what} {path}: no such file")
    if path.is_dir():
        raise ModelLoadError(f"{what} {path}: is a directory, not a file")
    if not path.is_file():
        raise ModelLoadError(f"{what} {path}: not a regular file")
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{what} {path}: the file is empty (0 bytes)")


def diagnose_model_file(path: str | os.PathLike[str]) -> ModelLoadError | None:
    """The ModelLoadError describing why ``path`` is not a readable ONNX model, or None when its top
    level looks sound (the failure is then elsewhere, e.g. in the graph)."""
    path = Path(path)
    try:
        _check_path(path, "model")
        problem = _wire_problem(path.read_bytes())
    except ModelLoadError as e:
        return e
    except OSError as e:
        return ModelLoadError(f"model {path}: cannot be read: {e.strerror or e}")
    return ModelLoadError(f"model {path}: {problem}") if problem else None


def check_model_proto(model: Any, where: str = "model") -> None:
    """Refuses a ModelProto without a graph or opset: onnxruntime says "No graph was found" for both."""
    if not model.HasField("graph"):
        raise ModelLoadError(f"{where}: not an ONNX model: it holds no graph")
    if not len(model.opset_import):
        raise ModelLoadError(f"{where}: not an ONNX model: it declares no opset (opset_import)")


def load_model(path: str | os.PathLike[str], *, load_external_data: bool = True) -> Any:
    """``onnx.load(path)``, refusing with :class:`ModelLoadError` a path that is missing, a directory, an
    empty file, not an ONNX protobuf or truncated; the message names the path and the problem."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    _check_path(path, "model")
    try:
        model = onnx.load(path, load_external_data=load_external_data)
    except DecodeError as e:
        found = diagnose_model_file(path)
        raise (found or ModelLoadError(f"model {path}: not an ONNX protobuf ({e})")) from e
    except OSError as e:  # unreadable, or an external-data file next to it is missing
        raise ModelLoadError(f"model {path}: cannot be read: {e}") from e
    except Exception as e:  # onnx raises ValueError & co. for bad external-data references
        raise ModelLoadError(f"model {path}: {type(e).__name__}: {e}") from e
    check_model_proto(model, f"model {path}")
    return model


def load_npz(path: str | os.PathLike[str], what: str = "feeds") -> dict[str, np.ndarray]:
    """The arrays of an .npz file by name (never unpickled); a missing or unreadable file is an InputError."""
    import zipfile

    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} {path}: no such file")
    if not path.is_file():
        raise InputError(f"{what} {path}: not a file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic not in (b"PK\x03\x04", b"PK\x05\x06"):  # a zip archive (np.savez); anything else np.load would unpickle
        raise InputError(f"{what} {path}: not an .npz file (a zip of named arrays, as np.savez writes)")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, EOFError, OSError) as e:
        raise InputError(f"{what} {path}: not a readable .npz file ({e})") from e
    except ValueError as e:  # object arrays (pickles) and malformed members
        raise InputError(f"{what} {path}: {e}") from e
