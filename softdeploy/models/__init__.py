"""Finding the cases of ``softdeploy compare --case NAME`` / ``softdeploy quantize --case NAME``.

A case is a :class:`softdeploy.compare.case.Case`. Cases live outside the library, in distributions that name
their factories in the ``softdeploy.cases`` entry-point group (``NAME = "pkg.mod:factory"``; a factory takes
``quick=False`` and keyword settings and returns the case). This repository's ``cases/`` distribution
(``python -m pip install ./cases``) holds the built-in ones, :data:`DEFAULT_CASE` among them. ``CASES`` maps the
installed names to their factories, loaded on first use; ``compare --case pkg.mod:MyCase`` names a case without an
entry point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from typing import Any

from softdeploy.errors import CaseNotFoundError
from softdeploy.plugins import entry_points_by_name

ENTRY_POINT_GROUP = "softdeploy.cases"
# What `softdeploy compare` runs without --case: the README's first command
DEFAULT_CASE = "minilm_retrieval"
# Where the built-in cases come from, for the error that a case is not installed
CASES_INSTALL_HINT = "python -m pip install ./cases (the softdeploy-cases distribution in softdeploy's repository)"


def _load(name: str, ep: metadata.EntryPoint) -> Callable[..., Any]:
    """The factory behind case ``name``'s entry point; a broken installation is a CaseNotFoundError naming it."""
    try:
        factory = ep.load()
    except Exception as e:  # a broken installation: say which entry point, not a bare ImportError
        raise CaseNotFoundError(f"case {name}: cannot load its entry point {ep.value!r}: {e}") from e
    if not callable(factory):
        raise CaseNotFoundError(f"case {name}: entry point {ep.value!r} is {type(factory).__name__}, not a factory")
    return factory  # type: ignore[no-any-return]


class _InstalledCases(Mapping[str, Callable[..., Any]]):
    """The ``softdeploy.cases`` entry points as ``name -> factory``, in name order; each factory is imported when it
    is looked up, so listing the names imports no case."""

    def __getitem__(self, name: str) -> Callable[..., Any]:
        return _load(name, entry_points_by_name(ENTRY_POINT_GROUP)[name])

    def __iter__(self) -> Iterator[str]:
        return iter(entry_points_by_name(ENTRY_POINT_GROUP))

    def __len__(self) -> int:
        return len(entry_points_by_name(ENTRY_POINT_GROUP))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in entry_points_by_name(ENTRY_POINT_GROUP)


CASES: Mapping[str, Callable[..., Any]] = _InstalledCases()


def get_case(name: str, **kw: Any) -> Any:
    """The installed case ``name`` (an entry point of the ``softdeploy.cases`` group), built with ``kw``;
    :class:`CaseNotFoundError` naming the installed cases, and where the built-in ones come from, for any other
    name."""
    installed = entry_points_by_name(ENTRY_POINT_GROUP)  # one scan of the installed metadata for the check and load
    if name not in installed:
        raise CaseNotFoundError(
            f"no case {name!r} is installed; installed cases are {list(installed) or 'none'} (entry-point group "
            f"{ENTRY_POINT_GROUP!r}); the built-in cases install with: {CASES_INSTALL_HINT}"
        )
    return _load(name, installed[name])(**kw)


__all__ = ["CASES", "DEFAULT_CASE", "ENTRY_POINT_GROUP", "get_case"]
