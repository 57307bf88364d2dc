"""What several verbs share: the consoles they print to and the refusal to overwrite a file."""

from __future__ import annotations

from collections.abc import Sequence


def terminal_console() -> object:
    """A rich Console on the terminal (:func:`softdeploy.terminal.stdout`)."""
    from rich.console import Console

    from softdeploy import terminal

    return Console(file=terminal.stdout())  # the terminal, also while a library call's output is captured


def wide_console() -> object:
    """A rich Console on the terminal, 240 columns wide where that is a log file (comparison tables)."""
    from rich.console import Console

    from softdeploy import terminal

    console = Console(file=terminal.stdout())
    if not console.is_terminal:  # a log file: don't squeeze the wide table into 80 columns
        console = Console(file=terminal.stdout(), width=240)
    return console


def refuse_overwrite(outputs: Sequence[object], overwrite: bool, sources: Sequence[object] = ()) -> None:
    """Nothing a user saved is replaced without asking (softdeploy.files.check_outputs): an existing output needs
    --overwrite; an output that is one of the command's own inputs (a link to it included), a folder, or a dangling
    link is refused even with it."""
    from softdeploy.files import check_outputs

    check_outputs(list(map(str, outputs)), overwrite=overwrite, sources=list(map(str, sources)))
