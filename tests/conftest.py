from __future__ import annotations

import os
import platform
import shutil
import subprocess
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


@pytest.fixture
def cpuid_shim(tmp_path: Path) -> Path:
    """bench/cpuid_avx2.c (the CPUID shim that emulates a CPU with fewer features) built with gcc into tmp_path;
    skips where the shim cannot be built (not x86-64, no gcc)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the CPUID shim is x86-64 only")
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build bench/cpuid_avx2.c")
    source = Path(__file__).resolve().parents[1] / "bench" / "cpuid_avx2.c"
    shim = tmp_path / "cpuid_avx2.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(source), "-o", str(shim), "-ldl"], check=True)
    return shim
