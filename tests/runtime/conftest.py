"""Fixtures: shared libraries that are not softdeploy's kernel library, built with the C compiler that
builds the real one. Each loads and exports RegisterCustomOps (registering nothing), and differs in
what it says about itself."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

_REGISTER = """
void* RegisterCustomOps(void* options, const void* api_base) { (void)options; (void)api_base; return 0; }
"""
_INFO = """
#include <stddef.h>
#include <string.h>
static const char kInfo[] = "%s";
size_t SoftdeployLibraryInfo(char* out, size_t capacity) {
  size_t n = sizeof(kInfo) - 1;
  if (out != NULL && capacity > 0) {
    size_t m = n < capacity - 1 ? n : capacity - 1;
    memcpy(out, kInfo, m);
    out[m] = 0;
  }
  return n;
}
"""


def _compiler() -> str:
    for name in ("cc", "gcc", "clang", "c++", "g++"):
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError("no C compiler found; the kernel library's build needs one too")


def _info_json(ops: list[str], opset: int | None = None) -> str:
    from softdeploy import DOMAIN, OPSET_VERSION, __version__

    info = {
        "library": "softdeploy_ops",
        "version": __version__,
        "ort_api_version": 21,
        "domain": DOMAIN,
        "opset_version": OPSET_VERSION if opset is None else opset,
        "ops": ops,
        "isa_detected": "portable",
        "isa_requested": None,
        "isa_request_valid": True,
        "isa_selected": "portable",
        "isa_note": None,
        "compiler": "test",
    }
    return json.dumps(info).replace("\\", "\\\\").replace('"', '\\"')


def _build(folder: Path, kind: str) -> Path:
    """``kind``: "no_info" (RegisterCustomOps only), "no_ops" (says it registers no op), "opset2" (says it
    implements com.softdeploy opset 2), "lying" (says it registers every op of REGISTRY, registers none)."""
    from softdeploy.ops import REGISTRY

    source = _REGISTER
    if kind == "no_ops":
        source += _INFO % _info_json([])
    elif kind == "opset2":
        source += _INFO % _info_json(sorted(REGISTRY), opset=2)
    elif kind == "lying":
        source += _INFO % _info_json(sorted(REGISTRY))
    elif kind != "no_info":
        raise ValueError(kind)
    src = folder / f"fake_{kind}.c"
    out = folder / f"libfake_{kind}.so"
    src.write_text(source)
    subprocess.run([_compiler(), "-shared", "-fPIC", "-O0", "-o", str(out), str(src)], check=True, timeout=120)
    return out


@pytest.fixture(scope="session")
def fake_library(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``fake_library(kind)`` -> path of a built fake library (see _build for the kinds)."""
    folder = tmp_path_factory.mktemp("fake_libraries")
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in built:
            built[kind] = _build(folder, kind)
        return built[kind]

    return get


@pytest.fixture
def bad_library(tmp_path: Path, fake_library: Callable[[str], Path]) -> Callable[[str], Path]:
    """``bad_library(kind)`` -> a SOFTDEPLOY_LIBRARY value that is not a usable softdeploy library:
    "missing", "random_bytes", "libc", "directory", or one of fake_library's kinds."""

    def get(kind: str) -> Path:
        if kind == "missing":
            return tmp_path / "nope" / "libsoftdeploy_ops.so"
        if kind == "random_bytes":
            p = tmp_path / "libsoftdeploy_ops.so"
            p.write_bytes(bytes(range(256)) * 64)
            return p
        if kind == "libc":  # the C library this process runs on, by full path
            with open("/proc/self/maps") as f:
                paths = {line.split()[-1] for line in f if "/libc.so" in line or "/libc-" in line}
            assert paths, "libc not found in /proc/self/maps"
            return Path(sorted(paths)[0])
        if kind == "directory":
            return tmp_path
        return fake_library(kind)

    return get
