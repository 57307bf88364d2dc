from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# CI profile: derandomized (same examples every run), bounded, no wall-clock deadline on a noisy
# 2-core machine. `HYPOTHESIS_PROFILE=dev` explores more.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,  # no replay of examples saved by earlier runs: CI sees exactly the same examples
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("dev", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


class CpuidShim:
    """bench/cpuid_avx2.c built into a shared object: runs Python code in a fresh interpreter that sees an emulated
    CPU (CPUID faulting)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def run(self, code: str, *, mask: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``python -c code`` with the shim preloaded after whatever is preloaded already (the sanitizer stage's
        libasan must stay first), ``SD_CPUID_MASK=mask`` (None: the AVX2-only CPU) and without SOFTDEPLOY_TEST_CPU
        / SOFTDEPLOY_ISA (the emulated CPU is the one tested). Skips where the kernel or hypervisor has no CPUID
        faulting (the shim then exits with status 3 rather than run on the unmasked CPU)."""
        env = {k: v for k, v in os.environ.items() if k not in ("SOFTDEPLOY_TEST_CPU", "SOFTDEPLOY_ISA")}
        env["LD_PRELOAD"] = " ".join(x for x in (env.get("LD_PRELOAD", ""), str(self.path)) if x)
        if mask is not None:
            env["SD_CPUID_MASK"] = mask
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode == 3 and "no CPUID faulting" in done.stderr:
            pytest.skip(done.stderr.strip())
        return done


@pytest.fixture
def cpuid_shim(tmp_path: Path) -> CpuidShim:
    """bench/cpuid_avx2.c (the CPUID shim that emulates a CPU with fewer features) built with gcc into tmp_path;
    skips where the shim cannot be built (not x86-64, no gcc)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the CPUID shim is x86-64 only")
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build bench/cpuid_avx2.c")
    source = Path(__file__).resolve().parents[1] / "bench" / "cpuid_avx2.c"
    shim = tmp_path / "cpuid_avx2.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(source), "-o", str(shim), "-ldl"], check=True)
    return CpuidShim(shim)


@dataclasses.dataclass(frozen=True)
class CliRun:
    """What one ``softdeploy`` command gave: its exit status and what it wrote to stdout and stderr."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Runs ``softdeploy ARGV`` in this interpreter (``softdeploy.cli.main``, the console script's whole body
    but its process exit) in ``cwd`` (default: the test's tmp_path, where a log folder may appear); returns a
    :class:`CliRun`. A fresh interpreter costs
    seconds of imports per command, so the suite runs the CLI in process and keeps only a few subprocess
    smoke tests for what needs a process (the console script, Ctrl-C, a real terminal)."""
    from softdeploy.cli import main

    def run(*argv: str | os.PathLike[str], cwd: Path | None = None) -> CliRun:
        monkeypatch.chdir(tmp_path if cwd is None else cwd)
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_:  # argparse's usage errors and --help
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        out, err = capsys.readouterr()
        return CliRun(code, out, err)

    return run


# Marker -> the extra whose distributions a test so marked needs (peft: pinned by the test extra alone). Without one
# of them the test is skipped with a reason naming the extra; `pip install ".[test]"` (CI) installs them all, so
# there every marked test runs. The distributions are read from pyproject.toml, so the list cannot drift.
EXTRA_MARKERS: dict[str, str] = {"models": "models", "tvm": "tvm", "peft": "test", "serve": "serve"}
MARKER_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {"peft": ("peft",)}


@functools.cache
def _distributions(marker: str) -> tuple[str, ...]:
    if marker in MARKER_DISTRIBUTIONS:
        return MARKER_DISTRIBUTIONS[marker]
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: pytest itself depends on tomli there
        import tomli as tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    return tuple(Requirement(r).name for r in project["optional-dependencies"][EXTRA_MARKERS[marker]])


@functools.cache
def _missing_distributions(names: tuple[str, ...]) -> list[str]:
    missing = []
    for name in names:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips each test marked ``models``, ``tvm``, ``peft`` or ``serve`` whose extra is not installed, naming the extra."""
    for item in items:
        for marker, extra in EXTRA_MARKERS.items():
            if item.get_closest_marker(marker) is None:
                continue
            missing = _missing_distributions(_distributions(marker))
            if missing:
                reason = f'needs the `{extra}` extra ({", ".join(missing)} missing): pip install ".[{extra}]"'
                item.add_marker(pytest.mark.skip(reason=reason))
