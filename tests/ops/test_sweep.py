"""The native size-sweep tester (tests/native/sweep.cc, CMake target softdeploy_sweep): every kernel
written over the vector traits and LoRAMixer's and RowwiseInt8MatMul's pieces (SWEPT_OPS), for every variant the CPU runs, at generated sizes around its vector
width and tiles, against float64 references from the equations. Built here from this source tree in a
private build directory (never installed), then run as the CPU is and as an AVX2-only and a plain
x86-64 CPU (SOFTDEPLOY_TEST_CPU)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from softdeploy import conformance
from softdeploy.compare.environment import cpuinfo

ROOT = Path(__file__).resolve().parents[2]
VECTOR_VARIANTS = ["avx2", "avx512"]
# The operators whose vector kernels the sweep covers (each has an AVX2 variant).
SWEPT_OPS = {
    "AdaptiveTemperatureSoftmax",
    "LoRAMixer",
    "MaxSim",
    "MultiMax",
    "RowwiseInt8MatMul",
    "SoftNMS",
    "SoftmaxTopK",
    "Softpick",
    "TwoPassSoftmax",
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("sweep-build")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    for cmd in (
        ["cmake", "-S", str(ROOT), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release"],
        ["cmake", "--build", str(build), "--target", "softdeploy_sweep"],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return build / "softdeploy_sweep"


@pytest.mark.slow
@pytest.mark.parametrize("cpu", [None, "avx2", "portable"])
def test_sweep_matches_the_float64_references(sweep: Path, cpu: str | None) -> None:
    # The CPU as this process sees it: a SOFTDEPLOY_TEST_CPU already set around the test suite limits the
    # sweep too (as it limits available_isas() below); `cpu` lowers it further, never raises it.
    env = dict(os.environ)
    isas = conformance.available_isas()
    if cpu is not None:
        env["SOFTDEPLOY_TEST_CPU"] = cpu if cpu in isas else isas[-1]
    done = subprocess.run([str(sweep)], capture_output=True, text=True, env=env, check=False, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = re.search(r"sweep: variants \[([a-z0-9,]*)\] \(cpu: (\w+)\), (\d+) checks, 0 failures", done.stdout)
    assert summary is not None, done.stdout[-2000:]
    # Every vector variant the CPU (as limited) runs was swept, and nothing else.
    if cpu is not None:
        isas = isas[: isas.index(cpu) + 1] if cpu in isas else isas
    want = [v for v in VECTOR_VARIANTS if v in isas]
    swept = summary.group(1).split(",") if summary.group(1) else []
    assert swept == want
    if want:
        assert int(summary.group(3)) > 1000
    # Every operator's kernels were swept (none silently dropped), and MaxSim's int8 dot products are
    # the ones the library would run here: vpmaddwd and, for 7-bit documents, vpmaddubsw (and its paired form for 7-bit
    # queries too), and the sign table for 8-bit documents, on any AVX2 CPU (the only ones as an AVX2-only CPU).
    per_op = re.search(r"sweep: checks per op \[([A-Za-z0-9=,]*)\]", done.stdout)
    assert per_op is not None, done.stdout[-2000:]
    counts = dict(item.split("=") for item in per_op.group(1).split(",")) if per_op.group(1) else {}
    assert set(counts) == (SWEPT_OPS if want else set())
    assert all(int(n) > 0 for n in counts.values())
    dots = re.search(r"sweep: MaxSim int8 dot products \[([a-z0-9,-]*)\]", done.stdout)
    assert dots is not None
    if env.get("SOFTDEPLOY_TEST_CPU") == "avx2":
        assert dots.group(1) == "vpmaddwd,vpmaddubsw,vpmaddubsw-pairs,sign-table"
    # RowwiseInt8MatMul's GEMM paths: each one the library can run on this CPU as limited, and the AVX-VNNI tile's source
    # (VEX vpdpbusd) with the EVEX encoding wherever AVX-512 VNNI runs, so its logic is swept without AVX-VNNI.
    paths = re.search(r"sweep: RowwiseInt8MatMul paths \[([a-z0-9,-]*)\]", done.stdout)
    assert paths is not None
    swept_paths = set(paths.group(1).split(",")) if paths.group(1) else set()
    want_paths = {"avx2", "portable"} if want else set()
    flags = cpuinfo()[1]
    if "avx512" in want:
        want_paths |= {"avx512-bw"}
        if flags & {"avx512_vnni", "avx512vnni"}:
            want_paths |= {"avx512-vnni", "avx-vnni-as-evex"}
            assert "avx-vnni-as-evex" in dots.group(1).split(",")
    if want and flags & {"avx_vnni", "avxvnni"} and not env.get("SOFTDEPLOY_TEST_CPU"):
        want_paths |= {"avx-vnni"}
    assert swept_paths == want_paths
