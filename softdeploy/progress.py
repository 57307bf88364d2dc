"""Progress bars (rich) for everything that takes more than a moment; a silent version for tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class RichProgress:
    """One rich progress display; ``step(description, total)`` adds a bar (a spinner when the total
    is unknown) and yields ``advance(n=1)``."""

    def __init__(self, console: Any = None) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    @contextmanager
    def step(self, description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        """A progress bar for one step: yields ``advance(n=1)``; the bar is completed when the step ends, also when
        ``total`` was unknown."""
        task = self._progress.add_task(description, total=total)

        def advance(n: int = 1) -> None:
            self._progress.advance(task, n)

        try:
            yield advance
        finally:
            done = next(t for t in self._progress.tasks if t.id == task).completed
            final = total if total is not None else max(done, 1)
            self._progress.update(task, total=final, completed=final)


class SilentProgress:
    """A Progress that shows nothing (tests, library use)."""

    @contextmanager
    def step(self, description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        """Yields an ``advance`` that does nothing."""
        yield lambda n=1: None
