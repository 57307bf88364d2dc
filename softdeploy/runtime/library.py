"""Finding the native kernel library (libsoftdeploy_ops.so).

Where it is looked for, in order:
  1. ``$SOFTDEPLOY_LIBRARY`` (a path to the .so), when set;
  2. ``softdeploy/_lib/`` inside the imported package (where ``pip install`` puts it, and where a
     developer build ``cmake -S . -B build && cmake --build build`` copies it);
  3. the ``_lib/`` of the installed softdeploy distribution, when the imported package is a source
     tree without a build (e.g. ``python -m pytest`` run from a checkout after ``pip install .``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import sys
from pathlib import Path

from softdeploy.errors import LibraryNotFoundError

LIBRARY_NAME = {"darwin": "libsoftdeploy_ops.dylib", "win32": "softdeploy_ops.dll"}.get(
    sys.platform, "libsoftdeploy_ops.so"
)
_FIX = (
    "Reinstall the package (python -m pip install --force-reinstall --no-deps .) or, in a source "
    "checkout, build it with: cmake -S . -B build -G Ninja && cmake --build build; "
    "or point SOFTDEPLOY_LIBRARY at an existing build."
)


def candidates() -> list[Path]:
    found = []
    env = os.environ.get("SOFTDEPLOY_LIBRARY")
    if env:
        found.append(Path(env))
    found.append(Path(__file__).resolve().parent.parent / "_lib" / LIBRARY_NAME)
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        installed = Path(str(distribution("softdeploy").locate_file(f"softdeploy/_lib/{LIBRARY_NAME}")))
        if installed not in found:
            found.append(installed)
    except (PackageNotFoundError, ImportError):
        pass
    return found


def library_path() -> Path:
    """Path of the native library, loadable and exporting RegisterCustomOps; raises
    LibraryNotFoundError saying where it looked and how to fix it."""
    return _checked_path(tuple(str(p) for p in candidates()))


@functools.lru_cache(maxsize=8)
def _checked_path(paths: tuple[str, ...]) -> Path:
    tried = []
    for p in map(Path, paths):
        if not p.is_file():
            tried.append(f"{p} (missing)")
            continue
        try:
            lib = ctypes.CDLL(str(p))
            lib.RegisterCustomOps  # noqa: B018 - the attribute lookup is the check
        except (OSError, AttributeError) as e:
            tried.append(f"{p} (cannot load: {e})")
            continue
        return p
    raise LibraryNotFoundError(
        "softdeploy's native kernel library was not found. Looked in: " + "; ".join(tried) + ". " + _FIX
    )


@dataclasses.dataclass(frozen=True)
class LibraryStatus:
    path: Path | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.path is not None


def library_status() -> LibraryStatus:
    try:
        return LibraryStatus(library_path(), None)
    except LibraryNotFoundError as e:
        return LibraryStatus(None, str(e))
