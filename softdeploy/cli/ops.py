"""``softdeploy ops``: the operator registry as a table (light: no torch, onnxscript or TVM)."""

from __future__ import annotations

import argparse

from softdeploy.cli._common import terminal_console


def cmd_ops(args: argparse.Namespace) -> int:
    """``softdeploy ops``: the registry's operators with inputs and typed attributes, and the kernel variant the library
    says it runs."""
    from softdeploy.domain import OPSET_VERSION
    from softdeploy.runtime import library_status

    status = library_status()
    # What the library says runs (SOFTDEPLOY_ISA included), not a guess from the CPU's flags.
    variant = status.info.isa_summary() if status.info is not None else "none (library not found)"
    console = terminal_console()
    title = f"softdeploy ops (domain com.softdeploy, opset {OPSET_VERSION}) -- kernel variant: {variant}"
    console.print(_ops_table(title, console.width))  # type: ignore[attr-defined]
    return 0


def _ops_table(title: str, width: int) -> object:
    """The registry as a table that fits ``width`` columns without truncating anything: one column per
    field where the longest word of each fits, else op | its fields one per line (80 columns). Op names
    never wrap; other cells wrap between their items (", "-separated)."""
    from rich.table import Table

    from softdeploy.ops import REGISTRY

    heads = ("op", "inputs", "outputs", "attributes", "types")
    rows = []
    for d in REGISTRY.values():
        ins = ", ".join(p.name + ("?" if p.optional else "") for p in d.inputs)
        outs = ", ".join(p.name + ("?" if p.optional else "") for p in d.outputs)
        attrs = ", ".join(
            f"{a.name}:{a.onnx_type}" + (" (required)" if a.required else f"={a.default!r}") for a in d.attrs
        )
        rows.append((d.name, ins, outs, attrs, ", ".join(d.float_types)))
    # each column at least as wide as its longest word (the op column: its longest name); per cell 3
    # characters of border and padding, one more for the last border
    longest = [max(len(r[0]) for r in rows)] + [max(len(w) for r in rows for w in r[i].split()) for i in range(1, 5)]
    if sum(max(n, len(h)) for n, h in zip(longest, heads, strict=True)) + 3 * len(heads) + 1 <= width:
        table = Table(title=title)
        table.add_column("op", no_wrap=True)
        for h in heads[1:]:
            table.add_column(h, overflow="fold")
        for r in rows:
            table.add_row(*r)
        return table
    table = Table(title=title, show_lines=True)
    table.add_column("op", no_wrap=True)
    table.add_column("inputs / outputs / attributes / types", overflow="fold")
    for name, *fields in rows:
        table.add_row(name, "\n".join(f"{h}: {v or '-'}" for h, v in zip(heads[1:], fields, strict=True)))
    return table
