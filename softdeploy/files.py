"""Reading the files a user hands softdeploy (ONNX models, .npz feeds) with typed errors, and writing its outputs so
that nothing partial is ever taken for a result.

Every ONNX file the CLI and :class:`softdeploy.runtime.Session` open goes through :func:`load_model`
(or, for a path onnxruntime failed to read, :func:`diagnose_model_file`), so a missing path, a
directory, an empty file, random bytes or a truncated download is reported as a
:class:`~softdeploy.errors.ModelLoadError` that names the path and what is wrong -- not as a protobuf
``DecodeError`` or onnxruntime's "Protobuf parsing failed".
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.errors import InputError, ModelLoadError, OutputError, OverwriteError, WorkflowError

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


def wire_problem(data: bytes) -> str:
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
        problem = wire_problem(path.read_bytes())
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


# ---- writing outputs ---------------------------------------------------------------------------------------------
#
# Every file softdeploy writes (models, reports, caches, checkpoints) is written under a temporary name in the
# folder of its final name and renamed onto that name only once complete and flushed to disk. A kill, an interrupt
# or a full disk at any moment leaves either the complete previous file or the complete new one under the final
# name, never a partial one; the temporary name (``.NAME.partial-PID-TOKEN``) is never read as a result and is
# removed by the next write of the same output once its process is gone.

_PARTIAL = ".partial-"
# Rust's io::Error in a library's message (safetensors'): its Debug form "Os { code: 28, ... }" or its Display form
# "I/O error: No space left on device (os error 28)" (safetensors 0.8)
_OS_CODE = re.compile(r"\b(?:code: |os error )(\d+)\b")


def _partial_name(path: Path) -> Path:
    return path.with_name(f".{path.name}{_PARTIAL}{os.getpid()}-{secrets.token_hex(4)}")


_PARTIAL_NAME = re.compile(r"^\.(.+)\.partial-\d+-[0-9a-f]{8}$")


def final_name(path: Path) -> Path:
    """The output a temporary name of :func:`atomic_output` stands for (``path`` itself when it is no such name): a
    writer handed the temporary path that writes through :func:`atomic_output` again (quantize() under quantize_file)
    names the user's path in its errors, not its own temporary one."""
    while (m := _PARTIAL_NAME.match(path.name)) is not None:
        path = path.with_name(m.group(1))
    return path


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's included): a temporary file of a live writer is never
    removed."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: somebody else's live process
        return True
    return True


def _replaced_mode(path: Path) -> int:
    """The permission bits a new ``path`` gets: those of the regular file it replaces, else 0666 less the umask."""
    with contextlib.suppress(OSError):
        st = os.stat(path)  # follows a link: the mode of the file the user had there
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def remove_stale_partials(path: str | os.PathLike[str]) -> list[Path]:
    """Removes the temporary files -- or folders, for an output written as a whole folder (distill's student folder)
    -- that writes of ``path`` left behind when their process was killed (their pid is gone); returns the paths
    removed. Partials of live processes are left alone."""
    path = Path(path)
    removed = []
    # A write that goes through a temporary name itself (quantize_file's model: quantize() writes its temporary file
    # atomically too) leaves ``..NAME.partial-PID-T.partial-PID-T2``: the leading dots are stripped before matching.
    prefix = f"{path.name.lstrip('.')}{_PARTIAL}"
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            name = entry.name.lstrip(".")
            if not (entry.name.startswith(".") and name.startswith(prefix)):
                continue
            pid = name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                with contextlib.suppress(OSError):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
                    removed.append(entry)
    return removed


def output_error(path: str | os.PathLike[str], exc: BaseException, what: str = "output") -> OutputError | None:
    """The one-line OutputError for a write of ``path`` that failed with ``exc`` (an OSError, or a library's error
    wrapping an OS error code, as safetensors' does); None when ``exc`` is not about the file system."""
    code: int | None = None
    if isinstance(exc, OSError):
        code = exc.errno
        if code is None:
            return OutputError(f"{what} {path}: cannot be written: {exc}")
    else:
        m = _OS_CODE.search(str(exc))
        if m is None:
            return None
        code = int(m.group(1))
    reason = os.strerror(code)
    hint = {
        errno.ENOSPC: "free some space or write elsewhere",
        errno.EDQUOT: "free some space or write elsewhere",
        errno.EFBIG: "the file size limit (ulimit -f) is below the file's size",
        errno.EROFS: "write it to another folder",
        errno.EACCES: "write it to a folder you may write to",
        errno.EPERM: "write it to a folder you may write to",
        errno.ENOENT: "its folder does not exist",
        errno.EISDIR: "the path is a folder; give a file path",
        errno.ENOTDIR: "a part of the path is a file, not a folder",
    }.get(code)
    return OutputError(f"{what} {path}: cannot be written: {reason}" + (f" ({hint})" if hint else ""))


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], what: str = "output") -> Iterator[Path]:
    """Yields a temporary path beside ``path`` to write the whole output to; on a clean exit the file is flushed to
    disk and renamed onto ``path`` (an existing file, or a symbolic link itself -- never the link's target -- is
    replaced in one step). On any exception, Ctrl-C included, the temporary file is removed and ``path`` is left as
    it was; a file-system error (full disk, read-only folder, file size limit) is re-raised as one-line
    :class:`OutputError` naming ``path``. ``what`` names the output in that message ("model", "report", ...)."""
    path = Path(path)
    shown = final_name(path)
    try:
        if path.is_dir():
            raise OutputError(f"{what} {shown}: is a folder; give a file path")
        if not path.parent.is_dir():
            raise OutputError(f"{what} {shown}: cannot be written: the folder {path.parent} does not exist")
    except PermissionError as e:
        raise output_error(shown, e, what) from e  # type: ignore[misc]
    remove_stale_partials(path)
    tmp = _partial_name(path)
    try:
        yield tmp
        if not tmp.exists():
            raise OutputError(f"{what} {shown}: the writer produced no file")
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        # the mode a plain open() would give (some writers, safetensors', create their files 0600), or the mode of
        # the file it replaces
        os.chmod(tmp, _replaced_mode(path))
        os.replace(tmp, path)
        with contextlib.suppress(OSError):  # the rename itself is durable once the folder is synced
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OutputError):
            raise
        if isinstance(e, Exception):
            found = output_error(shown, e, what)
            if found is not None:
                raise found from e
        raise


def make_folder(path: str | os.PathLike[str], what: str = "output folder") -> Path:
    """Creates the folder ``path`` (and its parents) unless it is there; a folder that cannot be created (a read-only
    or full file system, a file in the way) is one-line :class:`OutputError` naming ``path``. Returns the path."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(path, e, what) from e  # type: ignore[misc]
    return path


def write_bytes(path: str | os.PathLike[str], data: bytes, what: str = "output") -> Path:
    """Writes ``data`` to ``path`` through :func:`atomic_output`; returns the path."""
    with atomic_output(path, what) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str, what: str = "output") -> Path:
    """Writes ``text`` (UTF-8) to ``path`` through :func:`atomic_output`; returns the path."""
    return write_bytes(path, text.encode("utf-8"), what)


def save_model(model: Any, path: str | os.PathLike[str], what: str = "model") -> Path:
    """``onnx.save(model, path)`` through :func:`atomic_output` (no partial model under ``path``, ever)."""
    import onnx

    with atomic_output(path, what) as tmp:
        onnx.save(model, os.fspath(tmp))
    return Path(path)


def write_with(path: str | os.PathLike[str], writer: Callable[[Path], object], what: str = "output") -> Path:
    """Calls ``writer(temporary_path)`` and renames the result onto ``path`` (:func:`atomic_output`)."""
    with atomic_output(path, what) as tmp:
        writer(tmp)
    return Path(path)


def check_outputs(
    outputs: Sequence[str | os.PathLike[str]],
    *,
    overwrite: bool,
    sources: Sequence[str | os.PathLike[str]] = (),
) -> None:
    """Refuses, before any work, an output that cannot or must not be written:

    * one that is one of ``sources`` (the command's inputs) -- the same path, a symbolic link to it or a hard link
      to the same file (same device and inode) -- even with ``overwrite``;
    * one that is a folder;
    * a symbolic link whose target does not exist (softdeploy never writes through a link: the new file would
      replace the link itself, which is not what a dangling link given as an output usually means);
    * one that exists (a file, or a link to one) without ``overwrite``. With ``overwrite`` an existing file is
      replaced; a symbolic link is replaced by the new file and its target is left untouched.
    """
    for out in map(Path, outputs):
        for src in map(Path, sources):
            same = out.resolve() == src.resolve()
            with contextlib.suppress(OSError):
                same = same or os.path.samefile(out, src)
            if same:
                raise OverwriteError(f"{out} is also the input {src}; write the result to another path")
        if out.is_dir():
            raise OutputError(f"output {out}: is a folder; give a file path")
        if out.is_symlink() and not out.exists():
            raise OutputError(
                f"output {out}: is a symbolic link to {os.readlink(out)}, which does not exist; softdeploy does not "
                "write through links: remove the link or give another path"
            )
        if out.exists() and not overwrite:
            kind = f"is a symbolic link to {os.readlink(out)}" if out.is_symlink() else "exists"
            raise OverwriteError(f"{out} {kind}; pass --overwrite to replace it")


def folder_name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain folder name (one path component, not ``.`` or ``..``, no separator), or None.
    A workflow's or case's name is the folder of its results inside the output folder; anything else would write
    outside it."""
    if not isinstance(name, str) or not name:
        return "an empty name"
    if set(name) == {"."}:  # '.' and '..' name the output folder and the one above it
        return f"{name!r} is not a folder of its own"
    bad = next((c for c in name if c in "/\\\0"), None)
    if bad is not None:
        return f"{name!r} holds the path separator or NUL {bad!r}"
    return None


def check_folder_name(name: object, where: str) -> str:
    """``name`` when it is a plain folder name (:func:`folder_name_problem`); else WorkflowError naming ``where``."""
    problem = folder_name_problem(name)
    if problem is not None:
        raise WorkflowError(
            f"{where}: name: {problem} (rule: a plain folder name of letters, digits, '_', '.' and '-', not only dots; "
            "the results go to OUT/NAME/)"
        )
    return str(name)


def folder_name_for(stem: str) -> str:
    """A results folder name made from a file's stem (``compare MODEL``): every run of characters outside the rule of
    :func:`check_folder_name` becomes one ``_`` ("my model (v2)" -> "my_model_v2_"); "model" when nothing is left."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip(".")
    return name if folder_name_problem(name) is None else "model"
