"""What the ``softdeploy`` command shows on the terminal, and what it keeps in a log file instead.

torch, onnxscript, onnxruntime and TVM talk a lot on every export, quantization and build: torch's
``W1201 ... torchvision is not installed`` log lines, FutureWarnings, UserWarnings and TracerWarnings,
onnxruntime's calibration output, TVM's ``Scope Saving`` lines (from C++, straight to file descriptor
2) and MetaSchedule's TIR dumps. None of it is about the user's model, and it buries what is.

Inside :func:`cli_session` (the CLI sets it around one verb, unless ``--verbose``):

* Python warnings other than softdeploy's own (:class:`softdeploy.errors.SoftdeployWarning`), and log
  records that reach the root logger, go to the log file;
* inside :func:`captured` (the CLI wraps each library call in one), file descriptors 1 and 2, and
  ``sys.stdout`` / ``sys.stderr``, point at the log file too: output written by C++ code reaches it;
* :func:`stdout` is a stream to the real terminal for the CLI's own output (tables, progress bars),
  also while a captured call runs.

At the end the log file's path is printed in one line, if anything was written to it. The log goes to
``./softdeploy-logs/<verb>-<time>.log`` (``SOFTDEPLOY_LOG_DIR`` names another folder); where that folder cannot
be written, to the temporary folder's ``softdeploy-logs-<uid>/`` (said in one line), never failing the command. Outside a
session (library use) every function here is a no-op: Python's default warnings stay.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO


class _Capture:
    """One verb's log file (created on first use) and the real terminal's stdout."""

    def __init__(self, verb: str) -> None:
        self.verb = verb
        self.path: Path | None = None
        self.file: TextIO | None = None
        self.depth = 0  # nesting of captured(): only the outermost redirects
        self.headers = 0  # lines written by softdeploy itself (section headers), not counted as output
        self.terminal = self._terminal_stdout()
        self.showwarning_before = warnings.showwarning  # softdeploy's own warnings still go there
        self.fallback_reason = ""  # why the log is not in the folder asked for ("" when it is)
        self.discarded = False  # no folder could take the log: library output went to the null device

    @staticmethod
    def _terminal_stdout() -> TextIO:
        # The real fd 1, duplicated so that redirecting fd 1 in captured() leaves it pointing at the
        # terminal. When sys.stdout is not fd 1 (an in-process caller capturing it) it is that object.
        try:
            if sys.stdout is not None and sys.stdout.fileno() == 1:
                sys.stdout.flush()
                return os.fdopen(
                    os.dup(1), "w", buffering=1, encoding=sys.stdout.encoding, errors=sys.stdout.errors, closefd=True
                )
        except (OSError, ValueError, AttributeError):  # io.StringIO and friends have no fileno
            pass
        return sys.stdout

    def open(self) -> TextIO:
        if self.file is None:
            chosen = os.environ.get("SOFTDEPLOY_LOG_DIR") or "softdeploy-logs"
            # The log is a convenience: a folder where it cannot be written (a read-only working folder, a full
            # disk) must not fail the command, whose outputs may well go elsewhere. The next candidates are the
            # temporary folder's softdeploy-logs, then no log at all; a fallback is said once at the end.
            for folder in (Path(chosen), fallback_log_folder()):
                try:
                    self.file = self._create(folder)
                    break
                except OSError as e:
                    self.fallback_reason = self.fallback_reason or f"cannot write logs to {folder}/ ({e.strerror or e})"
            if self.file is None:
                self.path = None
                self.discarded = True
                self.file = open(os.devnull, "w", encoding="utf-8")
        return self.file

    def _create(self, folder: Path) -> TextIO:
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        # a file of its own ("x"): two sessions of one process within a second (the API, a test suite) must
        # neither share a log nor count each other's lines in close()
        for n in itertools.count():
            path = folder / f"{self.verb}-{stamp}-{os.getpid()}{f'-{n}' if n else ''}.log"
            try:
                file = open(path, "x", buffering=1, encoding="utf-8", errors="replace")
            except FileExistsError:
                continue
            self.path = path
            return file
        raise AssertionError("unreachable")

    def header(self, text: str) -> None:
        self.open().write(f"===== softdeploy {self.verb}: {text} ({time.strftime('%H:%M:%S')})\n")
        self.headers += 1

    def showwarning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        # softdeploy's own (softdeploy.errors.SoftdeployWarning) are for the user. Not "raised from a
        # softdeploy file": a library's warning points at the softdeploy line that triggered it.
        if category.__module__.split(".")[0] == "softdeploy":
            # line="": the source line that warned is not for the user; the warning stays one line
            self.showwarning_before(message, category, filename, lineno, file, "")
        else:
            self.open().write(warnings.formatwarning(message, category, filename, lineno, line))

    def close(self) -> tuple[Path | None, int]:
        """(log path, lines of third-party output); the file is removed when it holds nothing else."""
        if self.terminal is not sys.stdout and self.terminal is not sys.__stdout__:
            with contextlib.suppress(OSError):
                self.terminal.close()
        if self.file is None:
            return None, 0
        self.file.close()
        if self.path is None:  # no folder could take a log: the output went to /dev/null
            return None, 0
        with open(self.path, "rb") as f:  # newlines only: a progress bar's carriage returns are no lines
            lines = f.read().count(b"\n") - self.headers
        if lines <= 0:
            self.path.unlink(missing_ok=True)
            return None, 0
        return self.path, lines


class _ToLog(logging.Handler):
    """Root-logger handler: records of libraries that log through Python's logging (onnxruntime's
    quantization, transformers) go to the log file instead of logging's stderr fallback."""

    def __init__(self, capture: _Capture) -> None:
        super().__init__(logging.WARNING)
        self.capture = capture
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.capture.open().write(self.format(record) + "\n")
        except Exception:  # a log line must never fail the command
            self.handleError(record)


_ACTIVE: _Capture | None = None


def fallback_log_folder() -> Path:
    """Where the log goes when its folder cannot be written: ``<temporary folder>/softdeploy-logs-<uid>``."""
    return Path(tempfile.gettempdir()) / f"softdeploy-logs-{os.getuid()}"


@contextlib.contextmanager
def cli_session(verb: str, *, verbose: bool) -> Iterator[None]:
    """The CLI's terminal policy for one verb (see the module docstring). With ``verbose`` nothing is
    filtered or captured. Prints the log file's path on stderr at the end, when it holds anything."""
    global _ACTIVE
    if verbose or _ACTIVE is not None:
        yield
        return
    capture = _Capture(verb)
    handler = _ToLog(capture)
    root = logging.getLogger()
    warnings.showwarning = capture.showwarning
    root.addHandler(handler)
    _ACTIVE = capture
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True  # Ctrl-C is one line, the CLI's own: the log (kept on disk) is not announced
        raise
    finally:
        _ACTIVE = None
        root.removeHandler(handler)
        warnings.showwarning = capture.showwarning_before
        path, lines = capture.close()
        fallback = f"{capture.fallback_reason}; " if capture.fallback_reason else ""
        if interrupted:
            pass
        elif path is not None:
            print(
                f"softdeploy: {fallback}{lines} lines of library output (torch, onnxruntime, TVM) in {path}",
                file=sys.stderr,
            )
        elif capture.discarded:
            print(f"softdeploy: {fallback}library output (torch, onnxruntime, TVM) discarded", file=sys.stderr)


def active() -> bool:
    """Whether a CLI session captures library output now."""
    return _ACTIVE is not None


def stdout() -> TextIO:
    """The terminal's stdout for the CLI's own output: unaffected by :func:`captured`."""
    return _ACTIVE.terminal if _ACTIVE is not None else sys.stdout


@contextlib.contextmanager
def captured(what: str) -> Iterator[None]:
    """Runs the block with fds 1/2 and sys.stdout/sys.stderr on the session's log file (a no-op outside
    a CLI session, and inside another captured block). ``what`` heads the block's section of the log."""
    capture = _ACTIVE
    if capture is None or capture.depth:
        yield
        return
    log = capture.open()
    capture.header(what)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved: dict[int, int] = {}
    for fd in (1, 2):
        try:
            saved[fd] = os.dup(fd)
            os.dup2(log.fileno(), fd)
        except OSError:  # no such descriptor (a daemon without stdio): nothing to redirect
            saved.pop(fd, None)
    capture.depth += 1
    try:
        # Python-level writers go to the original streams, which write to fds 1/2 and so to the log:
        # sys.stdout may be a stand-in meanwhile (rich's Live display proxies it to the terminal, an
        # in-process caller captures it). Not the log file object itself: a handler created in the
        # block (torch's logging, on its import) would stay bound to it after the block.
        with (
            contextlib.redirect_stdout(sys.__stdout__ or log),
            contextlib.redirect_stderr(sys.__stderr__ or log),
        ):
            yield
    finally:
        capture.depth -= 1
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__, log):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def keep_files(paths: list[Path] | Any, title: str) -> None:
    """Appends the text files ``paths`` (MetaSchedule's per-task logs, in a folder about to be removed)
    to the session's log file; a no-op outside a CLI session."""
    capture = _ACTIVE
    if capture is None:
        return
    log = capture.open()
    for path in sorted(paths):
        capture.header(f"{title}: {Path(path).name}")
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                log.write(line)
