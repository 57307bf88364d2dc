"""Start-up cost of softdeploy's light entry points, each in fresh interpreters.

    python -m bench.import_time [--runs 5] [--source DIR ...] [--importtime]

Measures ``import softdeploy.ops`` and ``import softdeploy.runtime`` (time of the import statement,
inside the child) and ``softdeploy ops`` (wall and CPU time of the whole ``python -m softdeploy.cli ops``
process), ``--runs`` fresh interpreters each, and prints the medians as markdown with the host.
``--source`` times other source trees beside this one (e.g. an older commit: ``git worktree add`` or
``git archive REV softdeploy | tar -x -C DIR``); each child imports softdeploy from that tree only.
``--importtime`` adds the slowest modules of one ``python -X importtime`` run per entry point.

Floors (bench/results/import_time.md): ``import softdeploy.ops`` <= 0.5 s, ``softdeploy ops`` <= 1 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMPORTS = ("softdeploy.ops", "softdeploy.runtime")


def _env(source: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(source)}


def _run(args: list[str], source: Path) -> subprocess.CompletedProcess[str]:
    # The child runs in an empty folder: ``python -c`` puts the working folder first on sys.path, which
    # must not be a source tree other than ``source``.
    with tempfile.TemporaryDirectory(prefix="softdeploy-import-time-") as cwd:
        done = subprocess.run(args, capture_output=True, text=True, env=_env(source), cwd=cwd, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr}")
    return done


def time_import(module: str, source: Path) -> float:
    """Seconds the statement ``import module`` takes in a fresh interpreter (interpreter start-up excluded)."""
    code = (
        "import time\n"
        "t = time.perf_counter()\n"
        f"import {module}\n"
        "dt = time.perf_counter() - t\n"
        "import softdeploy\n"
        "print(softdeploy.__file__)\n"
        "print(dt)\n"
    )
    out = _run([sys.executable, "-c", code], source).stdout.split()
    if not Path(out[-2]).resolve().is_relative_to(source.resolve()):
        raise SystemExit(f"the child imported {out[-2]}, not softdeploy from {source}")
    return float(out[-1])


def time_ops_verb(source: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of a whole ``python -m softdeploy.cli ops`` process (interpreter start-up included).
    CPU time (user + system) is what a loaded machine inflates least: there, wall time includes waiting for a core."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    _run([sys.executable, "-m", "softdeploy.cli", "ops"], source)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def slowest_modules(args: list[str], source: Path, n: int = 8) -> list[tuple[str, float]]:
    """The ``n`` imports with the largest cumulative time in one ``python -X importtime`` run of ``args``."""
    err = _run([sys.executable, "-X", "importtime", *args], source).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        rows.append((name.strip(), int(cumulative) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:n]


def host() -> str:
    """CPU model, cores, load and Python: what the numbers depend on."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (
        f"{model}, {os.cpu_count()} logical cores, load average {load} (1/5/15 min) at the start; "
        f"Python {platform.python_version()} on {platform.system()} {platform.release()}"
    )


def main() -> None:
    """Measures and prints the markdown report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="fresh interpreters per measurement (median reported)")
    p.add_argument("--source", action="append", type=Path, default=[], help="another source tree to time too")
    p.add_argument("--importtime", action="store_true", help="also list the slowest imports of each entry point")
    args = p.parse_args()

    sources = [ROOT, *args.source]
    print(f"Host: {host()}\n")
    print(f"Median of {args.runs} fresh interpreters (min - max); seconds.\n")
    print(
        "| source | `import softdeploy.ops` | `import softdeploy.runtime` | `softdeploy ops` (whole process) "
        "| `softdeploy ops` CPU time |"
    )
    print("|---|---|---|---|---|")
    for source in sources:
        cells = []
        # Interleaved: each round times every entry point once, so a burst of load hits them alike.
        samples: dict[str, list[float]] = {m: [] for m in (*IMPORTS, "ops verb", "ops verb CPU")}
        for _ in range(args.runs):
            for m in IMPORTS:
                samples[m].append(time_import(m, source))
            wall, cpu = time_ops_verb(source)
            samples["ops verb"].append(wall)
            samples["ops verb CPU"].append(cpu)
        for values in samples.values():
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f} - {max(values):.2f})")
        print(f"| {source} | " + " | ".join(cells) + " |")
    if args.importtime:
        for source in sources:
            for label, cmd in (
                ("import softdeploy.ops", ["-c", "import softdeploy.ops"]),
                ("softdeploy ops", ["-m", "softdeploy.cli", "ops"]),
            ):
                print(f"\nSlowest imports of `{label}` ({source}), cumulative seconds:\n")
                for name, seconds in slowest_modules(cmd, source):
                    print(f"- {name}: {seconds:.3f}")


if __name__ == "__main__":
    main()
