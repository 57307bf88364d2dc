"""Reports of a comparison: a rich table in the terminal, and report.md, results.csv, results.json
and accuracy_vs_latency.png in the output folder."""

from __future__ import annotations

import csv
import json
import math
import textwrap
from pathlib import Path
from typing import Any

from softdeploy.compare.runner import REFERENCE, CompareResult

# Columns shown in the terminal table and the markdown summary (all columns go to CSV/JSON).
_ALWAYS = ("variant", "precision", "softdeploy ops")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.3f}" if a < 10 else f"{v:.2f}"
        if a >= 1e-3:
            return f"{v:.4f}"
        return f"{v:.2e}"
    return str(v)


def summary_columns(result: CompareResult) -> list[str]:
    """The columns of the summary table: variant, the task metrics, every cosine, top-k agreement, KL, per phase the p50
    wall and CPU ms, speed-ups and size; only those some row has."""
    cols = list(_ALWAYS) + list(result.metric_names)
    rows = result.rows()
    cols += sorted({k for r in rows for k in r if k.endswith("cosine")})
    cols += [f"top{result.agreement_k} agreement", "KL"]
    # p50 wall and CPU time per phase; p90, mean, min and throughput are in the latency details
    for phase in result.timed_phases:
        cols += [f"{phase} p50 ms", f"{phase} CPU ms"]
    first = result.timed_phases[0]
    cols += [f"{first} speed-up", f"{first} speed-up (CPU time)", "size MiB"]
    # once each: a task metric may also be an agreement column (`--metric cosine` is both a metric and a "cosine")
    return [c for c in dict.fromkeys(cols) if any(c in r for r in rows)]


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table of ``rows`` under ``headers`` (numbers formatted as in the terminal table)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def to_markdown(result: CompareResult) -> str:
    """report.md: warnings first, then the description, floors, the summary table, latency details, quantization
    settings and the environment."""
    rows = result.rows()
    cols = summary_columns(result)
    env = result.environment
    out = [f"# {result.title}", ""]
    out += [f"> **WARNING**: {w}" for w in result.warnings] + ([""] if result.warnings else [])
    desc = result.description
    out += [f"- **{k}**: {v}" for k, v in desc.items()]
    out += [
        f"- **reference** for agreement and speed-up: `{REFERENCE}`; latency at {result.threads} thread(s), "
        "p50/p90 per call over interleaved rounds after warm-up",
        "",
    ]
    if result.floors:  # a case without acceptance floors gets no empty section
        out += [
            "## Floors",
            "",
            markdown_table(
                ["floor", "measured", "target", "met", "detail"],
                [[f.name, f.value, f.target, "yes" if f.met else "**NO**", f.detail] for f in result.floors],
            ),
            "",
        ]
    out += [
        "## Results",
        "",
        markdown_table(cols, [[r.get(c) for c in cols] for r in rows]),
        "",
        "![accuracy vs latency](accuracy_vs_latency.png)",
        "",
    ]
    for section in result.sections:
        out += [f"## {section.title}", "", section.markdown, ""]
    out += [
        "## Quantization",
        "",
    ]
    for v in result.variants:
        if v.quantized is None:
            continue
        q = v.quantized
        line = (
            f"- `{v.spec.name}`: {q.config.describe()}; {len(q.quantized_nodes)} nodes int8, "
            f"{len(q.float_nodes)} candidate nodes left in float; {q.weights} weights"
        )
        if q.calibration_kernels:
            line += f"; calibration ran softdeploy ops as **{q.calibration_kernels}** kernels"
        out.append(line + f"; {q.seconds:.1f} s")
        if q.int8_format:
            out.append(f"  - {q.int8_format}")
    notes = sorted({f"{k}: {val}" for r in rows for k, val in r.items() if k in ("scorer", "post-processing")})
    if notes:
        out += ["", "Post-processing per variant: " + "; ".join(notes)]
    out += [
        "",
        "## Latency details",
        "",
        markdown_table(
            [
                "variant",
                "phase",
                "p50 ms",
                "p90 ms",
                "mean ms",
                "min ms",
                "CPU ms p50",
                "calls",
                "warm-up calls",
                "items/call",
                "items/s",
            ],
            [
                [
                    v.spec.name,
                    p,
                    s.p50_ms,
                    s.p90_ms,
                    s.mean_ms,
                    s.min_ms,
                    s.cpu_p50_ms,
                    s.calls,
                    s.warmup_calls,
                    s.items_per_call,
                    s.throughput,
                ]
                for v in result.variants
                for p, s in v.latency.items()
            ],
        ),
        "",
        "CPU ms: this process's CPU time per call (all its threads); on a loaded machine it excludes the "
        "time a call waits for a core, so its ratios are the steadier speed comparison.",
        "",
        "Background load (cores used by other processes while timing): "
        + ", ".join(f"{p}: {x}" for p, x in result.latency_background_load.items()),
        "",
        "## Environment",
        "",
        f"- CPU: {env['cpu']} ({env['cores']} cores); ISA: {' '.join(env['isa'])}",
        f"- softdeploy kernels: {env.get('softdeploy_kernels') or 'library not found'}; threads: {env['threads']}",
        "- packages: " + ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v),
        f"- python {env['python']} on {env['platform']}; {env['time']}",
        f"- run time: {result.seconds:.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in result.steps.items()) + ")",
        "",
    ]
    return "\n".join(out)


def write_csv(result: CompareResult, path: Path) -> None:
    """results.csv: one row per variant, every column any row has."""
    rows = result.rows()
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def plot(result: CompareResult, path: Path) -> None:
    """accuracy_vs_latency.png: the primary metric and the cosine against the first phase's p50 latency, one point per
    variant (a dotted line marks twice the reference's speed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.rows()
    phase = result.timed_phases[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ref = next((r for r in rows if r["variant"] == REFERENCE), None)
    half = ref.get(f"{phase} p50 ms") if ref is not None else None
    for ax, metric in zip(axes, (result.primary_metric, result.cosine_name), strict=True):
        if half is not None:  # where "2x faster than the reference" begins (left of the line)
            ax.axvline(half / 2, color="grey", linestyle=":", linewidth=1)
            ax.annotate(
                f"\u2190 2x faster than {REFERENCE}",
                (half / 2, 0),
                xycoords=("data", "axes fraction"),
                xytext=(3, 4),
                textcoords="offset points",
                ha="left",
                va="bottom",
                fontsize=7,
                color="grey",
            )
        for i, r in enumerate(rows):
            x, y = r.get(f"{phase} p50 ms"), r.get(metric)
            if x is None or y is None:
                continue
            marker = "s" if r["precision"] == "int8" else "o"
            ax.scatter([x], [y], marker=marker, s=60)
            # staggered labels: fp32 variants often sit on top of each other
            ax.annotate(r["variant"], (x, y), textcoords="offset points", xytext=(5, 4 - 11 * (i % 3)), fontsize=8)
        ax.set_xlabel(f"{phase} latency p50 (ms, {result.threads} thread(s))")
        ax.set_ylabel(metric if metric != result.cosine_name else f"{metric} to {REFERENCE}")
        ax.grid(alpha=0.3)
        ax.ticklabel_format(axis="y", useOffset=False)  # 0.9990, not "+1" and -0.001
        ax.margins(x=0.25, y=0.25)
    fig.suptitle(result.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")  # not from the name: write_reports passes a temporary one
    plt.close(fig)


# The files write_reports writes into the results folder, by kind.
REPORT_FILES = {
    "markdown": "report.md",
    "csv": "results.csv",
    "json": "results.json",
    "plot": "accuracy_vs_latency.png",
}


def write_reports(result: CompareResult, out: str | Path) -> dict[str, Path]:
    """Writes report.md, results.csv, results.json and accuracy_vs_latency.png into ``out``; returns their paths by
    kind."""
    from softdeploy.files import make_folder, write_text, write_with

    out = make_folder(out, "results folder")
    paths = {kind: out / name for kind, name in REPORT_FILES.items()}
    # each file under a temporary name, renamed once complete: an interrupted run leaves the previous reports whole
    write_text(paths["markdown"], to_markdown(result), "report")
    write_with(paths["csv"], lambda tmp: write_csv(result, tmp), "results table")
    write_text(paths["json"], json.dumps(result.to_json(), indent=1, default=str), "results")
    write_with(paths["plot"], lambda tmp: plot(result, tmp), "plot")
    return paths


def _text_width(header: str, cells: list[str]) -> int:
    """The width of a column's text: its widest cell (never wrapped) or its header's longest word (headers wrap at
    spaces)."""
    return max([len(c) for c in cells] + [max(len(w) for w in header.split())])


def _cell_width(header: str, cells: list[str]) -> int:
    """Terminal columns a column takes: its text and rich's padding and border."""
    return _text_width(header, cells) + 3


def table_groups(headers: list[str], cells: dict[str, list[str]], width: int) -> list[list[str]]:
    """``headers`` split into consecutive groups that each fit ``width`` columns with the variant column repeated at
    the left of every group (one group when everything fits). A column too wide for any group gets one of its own."""
    key = [h for h in headers if h == "variant"]
    rest = [h for h in headers if h != "variant"]
    base = 1 + sum(_cell_width(h, cells[h]) for h in key)  # the table's left border
    groups: list[list[str]] = []
    current: list[str] = []
    used = base
    for h in rest:
        need = _cell_width(h, cells[h])
        if current and used + need > width:
            groups.append(key + current)
            current, used = [], base
        current.append(h)
        used += need
    if current or not groups:
        groups.append(key + current)
    return groups


def print_table(result: CompareResult, console: Any) -> None:
    """The summary table and the floors on a rich console. Numbers and variant names are never wrapped or cut (a
    number split over two lines reads as two numbers); where the columns do not fit the console's width the table is
    split into several, each headed by the variant column."""
    from rich.table import Table

    cols = summary_columns(result)
    rows = result.rows()
    cells = {c: [_fmt(r.get(c)) for r in rows] for c in cols}
    for w in result.warnings:
        console.print(f"[bold red]WARNING[/bold red]: {w}")
    groups = table_groups(cols, cells, console.width)
    for n, group in enumerate(groups):
        title = result.title if len(groups) == 1 else f"{result.title} ({n + 1}/{len(groups)})"
        table = Table(title=title, show_lines=False)
        for c in group:
            # no_wrap holds for the header too: it is broken into lines here, at spaces, to the column's width
            header = "\n".join(textwrap.wrap(c, _text_width(c, cells[c]), break_long_words=False))
            table.add_column(header, justify="left" if c in _ALWAYS else "right", no_wrap=True)
        for i in range(len(rows)):
            table.add_row(*[cells[c][i] for c in group])
        console.print(table)
    for f in result.floors:
        mark = "[green]met[/green]" if f.met else "[bold red]NOT MET[/bold red]"
        console.print(f"  floor {f.name}: {_fmt(f.value)} (target {f.target}) {mark} {f.detail}")
