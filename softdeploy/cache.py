"""softdeploy's cache of built artifacts (trained experts, students and classifiers, exported models): every entry
carries a content digest, checked on every use.

An entry is a file (``experts-<key>.safetensors``, ``models/fp32.onnx``, ...) and a sidecar ``<file>.sha256`` that
holds the file's sha256 and size. Both are written atomically (:func:`softdeploy.files.atomic_output`), the file
first, so a run killed at any moment leaves an entry that is either complete or lacks its digest. :func:`lookup`
returns an entry only when the file's bytes match its digest; a missing digest, a truncated, edited or replaced file
is reported in one line (a :class:`~softdeploy.errors.SoftdeployWarning`), set aside under ``<file>.bad-<time>`` (the
bytes are kept for a look, never reused) and reported as absent, so the caller rebuilds it.

The key in an entry's name says what it was built from; the digest says the bytes are the ones that build wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from softdeploy.errors import CacheError, SoftdeployWarning
from softdeploy.files import atomic_output, make_folder, write_text

CACHE_ENV = "SOFTDEPLOY_CACHE"
DIGEST_SUFFIX = ".sha256"
_CHUNK = 1 << 20


def cache_root() -> Path:
    """``$SOFTDEPLOY_CACHE``, else ``~/.cache/softdeploy``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "softdeploy")


def digest_path(path: str | os.PathLike[str]) -> Path:
    """The sidecar that holds ``path``'s digest."""
    path = Path(path)
    return path.with_name(path.name + DIGEST_SUFFIX)


def file_digest(path: str | os.PathLike[str]) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of the file at ``path``."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def verify(path: str | os.PathLike[str]) -> None:
    """Raises :class:`CacheError` naming ``path`` unless it exists with a digest sidecar that its bytes match."""
    path = Path(path)
    side = digest_path(path)
    if not side.is_file():
        raise CacheError(f"cache entry {path}: no content digest ({side.name}); it was not written completely")
    try:
        recorded = json.loads(side.read_text(encoding="utf-8"))
        want, want_size = str(recorded["sha256"]), int(recorded["bytes"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CacheError(f"cache entry {path}: its digest file {side.name} is unreadable ({e})") from e
    try:
        got, size = file_digest(path)
    except OSError as e:
        raise CacheError(f"cache entry {path}: cannot be read ({e.strerror or e})") from e
    if size != want_size:
        raise CacheError(f"cache entry {path}: {size} bytes, its digest records {want_size} (truncated or replaced)")
    if got != want:
        raise CacheError(f"cache entry {path}: content does not match its recorded sha256 (edited or replaced)")


def set_aside(path: str | os.PathLike[str], reason: str) -> Path | None:
    """Moves a bad entry (and its digest) to ``<file>.bad-<time>`` and warns in one line; returns the new path."""
    path = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved: Path | None = None
    for p in (path, digest_path(path)):
        if p.exists():
            target = p.with_name(f"{p.name}.bad-{stamp}")
            try:
                os.replace(p, target)
            except OSError:
                p.unlink(missing_ok=True)
                target = None  # type: ignore[assignment]
            if p == path:
                moved = target
    where = f"set aside as {moved.name}" if moved is not None else "removed"
    warnings.warn(f"{reason}; {where}, rebuilding it", SoftdeployWarning, stacklevel=3)
    return moved


def lookup(path: str | os.PathLike[str]) -> Path | None:
    """``path`` when it is a complete, unaltered cache entry; None when absent or bad (a bad one is set aside with a
    one-line warning, so the caller rebuilds it)."""
    path = Path(path)
    if not path.exists() and not digest_path(path).exists():
        return None
    try:
        verify(path)
    except CacheError as e:
        set_aside(path, str(e))
        return None
    return path


def store(path: str | os.PathLike[str], writer: Callable[[Path], object], what: str = "cache entry") -> Path:
    """Writes an entry: ``writer(temporary_path)`` writes the file, which is renamed onto ``path`` once complete,
    then its digest is written beside it. Returns ``path``."""
    path = Path(path)
    make_folder(path.parent)
    digest_path(path).unlink(missing_ok=True)  # a file without its digest is never taken for an entry
    with atomic_output(path, what) as tmp:
        writer(tmp)
    seal(path, what)
    return path


def seal(path: str | os.PathLike[str], what: str = "cache entry") -> None:
    """Records the digest of the (complete) file at ``path``: from now on :func:`lookup` accepts it."""
    sha, size = file_digest(path)
    write_text(digest_path(path), json.dumps({"sha256": sha, "bytes": size}) + "\n", what=f"{what} digest")


def load_checked(path: str | os.PathLike[str], loader: Callable[[Path], object]) -> object | None:
    """``loader(path)`` for a verified entry; None when the entry is absent, fails its digest, or its loader raises
    (the entry is then set aside like a bad digest, naming the loader's error)."""
    found = lookup(path)
    if found is None:
        return None
    try:
        return loader(found)
    except Exception as e:  # an entry whose bytes are as written but that the current code cannot use
        set_aside(found, f"cache entry {found}: cannot be loaded ({type(e).__name__}: {e})")
        return None
