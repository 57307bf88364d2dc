"""The built-in cases' trained weights in softdeploy's cache (:mod:`softdeploy.cache`): trained experts, distilled
students, attention classifiers.

Each is a safetensors file named by the key of what it was trained from, with a content digest beside it. A file is
used only when its bytes match the digest and it fits the model it is loaded into (every expected tensor, with the
model's shape and dtype); anything else -- a truncated or edited file, one without a digest (a run killed while
writing it, or a cache from before digests), one that does not fit -- is reported in one line, set aside as
``<file>.bad-<time>`` and trained again. The model is only changed once the whole file has been checked, so a
rejected entry never leaves it half loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

from softdeploy import cache
from softdeploy.errors import CacheError

T = TypeVar("T")


def load_or_build(
    path: str | os.PathLike[str],
    load: Callable[[Path], T],
    build: Callable[[], T],
    save: Callable[[T, Path], object],
    what: str = "cache entry",
) -> tuple[T, bool]:
    """``(load(path), True)`` for a verified entry that ``load`` accepts; else ``(build(), False)``, the result stored
    at ``path`` through ``save(value, temporary_path)`` with its digest. A bad entry is set aside with a one-line
    warning first (:func:`softdeploy.cache.load_checked`)."""
    found = cache.load_checked(path, lambda p: (load(p),))  # a 1-tuple: load may return None
    if found is not None:
        return found[0], True  # type: ignore[index]
    value = build()
    cache.store(path, lambda tmp: save(value, tmp), what=what)
    return value, False


def load_state_into(model: Any, path: str | os.PathLike[str], names: Collection[str] | None = None) -> None:
    """Loads the tensors of the safetensors file ``path`` into the torch ``model``: ``names`` (default: every entry of
    its state_dict), each with the model's shape and dtype; CacheError naming the file and the tensor otherwise (the
    model is left untouched then)."""
    from safetensors.torch import load_file

    path = Path(path)
    state = load_file(str(path))
    own = model.state_dict()
    want = list(own) if names is None else list(names)
    missing = [k for k in want if k not in state]
    if missing:
        raise CacheError(f"{path}: lacks {len(missing)} tensor(s), e.g. {missing[:3]} (rule: {len(want)} tensors)")
    for k in want:
        if k not in own:
            raise CacheError(f"{path}: tensor {k} is not a weight of the model")
        got, exp = state[k], own[k]
        if tuple(got.shape) != tuple(exp.shape) or got.dtype != exp.dtype:
            raise CacheError(
                f"{path}: tensor {k} is {got.dtype} {list(got.shape)}, the model's is {exp.dtype} {list(exp.shape)}"
            )
    model.load_state_dict({k: state[k] for k in want}, strict=names is None)


def save_state(model: Any, path: str | os.PathLike[str], names: Collection[str] | None = None) -> None:
    """Writes ``names`` of the torch ``model``'s state_dict (default: all) to the safetensors file ``path``."""
    from safetensors.torch import save_file

    state = model.state_dict()
    keep = list(state) if names is None else list(names)
    save_file({k: state[k].detach().contiguous() for k in keep}, str(path))


def cached_weights(
    path: str | os.PathLike[str],
    model: Any,
    train: Callable[[], object],
    names: Collection[str] | None = None,
    what: str = "trained weights",
    progress: Any = None,
) -> bool:
    """``model``'s weights ``names`` (default: all) from the cache entry ``path`` (True); else ``train()`` (which
    trains ``model`` in place) and the weights stored there (False). See the module docstring for bad entries.
    ``progress`` (a :class:`softdeploy.compare.case.Progress`) shows the load as a step."""

    def build() -> Any:
        train()
        return model

    def load(p: Path) -> None:
        if progress is None:
            load_state_into(model, p, names)
            return
        with progress.step(f"load the {what} from {p}"):
            load_state_into(model, p, names)

    _, from_cache = load_or_build(
        path,
        load,
        build,
        lambda m, tmp: save_state(m, tmp, names),
        what=what,
    )
    return from_cache


def check_checkpoint(path: str | os.PathLike[str], fmt: str) -> None:
    """A training checkpoint left by an interrupted run (it is written by the trainer, so it has no digest): resumed
    only when it is a readable safetensors file of format ``fmt`` with a step, every tensor readable; otherwise it
    is reported in one line and set aside, and training starts from the beginning."""
    path = Path(path)
    if not path.exists():
        return
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != fmt:
                raise CacheError(f"format {meta.get('format')!r}, not {fmt!r}")
            int(meta.get("step", ""))
            for k in f.keys():
                f.get_tensor(k)
    except Exception as e:  # SafetensorError, OSError, ValueError: every way a file can be unreadable
        cache.set_aside(path, f"training checkpoint {path}: cannot be resumed ({type(e).__name__}: {e})")
