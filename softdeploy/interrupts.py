"""Ctrl-C that lands inside an import is held until that import has finished, then raised as usual.

Native libraries (onnx, onnxruntime, torch: pybind11 modules) run Python from C++ while they initialise. A
``KeyboardInterrupt`` raised in that Python becomes a C++ ``pybind11::error_already_set``; thrown where C++ cannot
unwind (a destructor, a ``noexcept`` function) it aborts the whole process -- "terminate called after throwing an
instance of 'pybind11::error_already_set'", death by SIGABRT -- instead of ending the command with its one line and
exit code 130. Python runs a signal handler only between bytecodes of the main thread, and the frame it runs in
links back through every Python frame on the stack, native calls in between included; so the handler can see
whether an import is under way. If one is, the interrupt is held: it is raised as the outermost ``import`` statement
returns (``builtins.__import__`` is wrapped to count them; C code's imports go through it too), and, for imports that
bypass it (``importlib.import_module``), the signal is asked for again a moment later (:data:`RETRY_S`). Every import
is held, not only native ones: a module's import is short, and one rule needs no list of libraries to keep."""

from __future__ import annotations

import builtins
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

RETRY_S = 0.05
"""How soon a held Ctrl-C is delivered again (seconds): short beside any import, long beside a handler's run."""

_IMPORT_FRAMES = frozenset({"_load_unlocked", "_find_and_load", "_find_and_load_unlocked", "exec_module"})
"""The functions of ``importlib._bootstrap`` (frozen) that are on the stack for as long as a module is imported."""


def in_import(frame: FrameType | None) -> bool:
    """Whether ``frame`` or any frame below it belongs to importlib's loading of a module."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in _IMPORT_FRAMES and code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


class _Held:
    """The state of the hold: how deep the import statements of the main thread are nested, and whether a Ctrl-C
    arrived inside one."""

    depth = 0
    pending = False
    original_import: Callable[..., Any] | None = None


def _held_import(name: str, *args: Any, **kwargs: Any) -> Any:
    """``builtins.__import__`` with the hold: the original, then the held ``KeyboardInterrupt`` once the outermost
    import statement of the main thread has returned."""
    original = _Held.original_import
    assert original is not None
    if threading.current_thread() is not threading.main_thread():
        return original(name, *args, **kwargs)
    _Held.depth += 1
    try:
        return original(name, *args, **kwargs)
    finally:
        _Held.depth -= 1
        if _Held.depth == 0 and _Held.pending:
            _Held.pending = False
            raise KeyboardInterrupt  # the held Ctrl-C, in place of the import's result


def _redeliver() -> None:
    """Sends SIGINT to this process again (from a timer thread: the handler itself must return at once)."""
    if _Held.pending:
        os.kill(os.getpid(), signal.SIGINT)


def handle_sigint(signum: int, frame: FrameType | None) -> None:
    """The SIGINT handler: ``KeyboardInterrupt``, unless an import is under way -- then held (see the module)."""
    if _Held.depth > 0 or in_import(frame):
        _Held.pending = True
        if _Held.depth == 0:  # an import that bypasses __import__ (importlib.import_module): ask again later
            timer = threading.Timer(RETRY_S, _redeliver)
            timer.daemon = True
            timer.start()
        return
    _Held.pending = False
    raise KeyboardInterrupt


def hold_during_imports() -> None:
    """Installs :func:`handle_sigint` as the SIGINT handler and the counting ``builtins.__import__`` (main thread
    only; a command-line entry point calls it before anything heavy is imported)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if _Held.original_import is None:
        _Held.original_import = builtins.__import__
        builtins.__import__ = _held_import
    signal.signal(signal.SIGINT, handle_sigint)
