"""``softdeploy doctor [MODEL]``: prints :func:`softdeploy.doctor.doctor_report` and, with MODEL, its int8 target."""

from __future__ import annotations

import argparse

from softdeploy.cli._common import terminal_console
from softdeploy.doctor import doctor_report


def cmd_doctor(args: argparse.Namespace) -> int:
    """``softdeploy doctor``: what the kernel library says about itself and a run of every op through its kernel; exit 1
    on any failure."""
    rows, warnings, failures = doctor_report()
    if getattr(args, "model", None):
        from softdeploy.files import load_model
        from softdeploy.quant.formats import mismatch_line

        model = load_model(args.model)
        rows += _model_int8_rows(args.model, model)
        slower = mismatch_line(model, f"model {args.model}")
        if slower:
            warnings.append(slower)
    console = terminal_console()
    lines = [f"[bold]{k:>16}[/bold]  {v}" for k, v in rows]
    lines += [f"[bold yellow]{'warning':>16}[/bold yellow]  {w}" for w in warnings]
    lines += [f"[bold red]{'FAILED':>16}[/bold red]  {f}" for f in failures]
    lines.append(f"[bold]{'doctor':>16}[/bold]  " + (f"{len(failures)} failure(s)" if failures else "all good"))
    for line in lines:  # soft_wrap: a long path or message stays on one line, greppable
        console.print(line, soft_wrap=True, highlight=False)  # type: ignore[attr-defined]
    return 1 if failures else 0


def _model_int8_rows(path: str, model: object) -> list[tuple[str, str]]:
    """``softdeploy doctor MODEL``: the model's int8 target and format (its metadata) and the kernel path its int8
    nodes take on this CPU, one row each."""
    from softdeploy.quant.formats import model_int8_lines

    return [("model", str(path))] + [("model int8", line) for line in model_int8_lines(model)]
