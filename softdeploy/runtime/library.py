"""Finding the native kernel library (libsoftdeploy_ops.so) and asking it what it is.

Where it is looked for:
  * ``$SOFTDEPLOY_LIBRARY`` (a path to the .so) when set -- then it is the only candidate: a bad
    path is an error, never a silent fall-back to another library;
  * otherwise ``softdeploy/_lib/`` inside the imported package (where ``pip install`` puts it, and
    where a developer build ``cmake -S . -B build && cmake --build build`` copies it), then the
    ``_lib/`` of the installed softdeploy distribution, when the imported package is a source tree
    without a build (e.g. ``python -m pytest`` run from a checkout after ``pip install .``).

A candidate is softdeploy's library when it loads, exports ``RegisterCustomOps`` and answers
``SoftdeployLibraryInfo()`` (ops/register.cc) with the domain and opset version this package
implements. :func:`library_info` returns that answer: the library's version, the onnxruntime C API
version it was compiled against, its ops, and the kernel variant (ISA) it detects and selects --
the one place softdeploy learns which variant runs (SOFTDEPLOY_ISA included), rather than guessing
from /proc/cpuinfo.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import os
import sys
from pathlib import Path

from softdeploy.errors import LibraryNotFoundError

LIBRARY_NAME = {"darwin": "libsoftdeploy_ops.dylib", "win32": "softdeploy_ops.dll"}.get(
    sys.platform, "libsoftdeploy_ops.so"
)
_FIX = (
    "Reinstall the package (python -m pip install --force-reinstall --no-deps .) or, in a source "
    "checkout, build it with: cmake -S . -B build -G Ninja && cmake --build build; "
    "or point SOFTDEPLOY_LIBRARY at an existing build."
)
_ENV = "SOFTDEPLOY_LIBRARY"


def candidates() -> list[Path]:
    """Paths tried in order: ``[$SOFTDEPLOY_LIBRARY]`` alone when it is set, else the package's own."""
    env = os.environ.get(_ENV)
    if env:  # absolute, so that the file checked is the one onnxruntime's dlopen gets
        return [Path(os.path.abspath(os.path.expanduser(env)))]
    found = [Path(__file__).resolve().parent.parent / "_lib" / LIBRARY_NAME]
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        installed = Path(str(distribution("softdeploy").locate_file(f"softdeploy/_lib/{LIBRARY_NAME}")))
        if installed not in found:
            found.append(installed)
    except (PackageNotFoundError, ImportError):
        pass
    return found


@dataclasses.dataclass(frozen=True)
class LibraryInfo:
    """What the library says about itself (``SoftdeployLibraryInfo()``), at the time of asking.

    ``isa_selected`` is the variant a kernel created now runs: ``isa_detected`` lowered by
    ``SOFTDEPLOY_ISA`` (``isa_requested``), never raised above it; ``isa_note`` says why it differs
    from the request. An ``isa_requested`` that names no variant has ``isa_request_valid`` false and
    ``isa_selected`` None: kernel creation then fails. ``isa_cpu_limit`` is SOFTDEPLOY_TEST_CPU
    (portable | avx2), with which tests on any machine see what a CPU with fewer features selects:
    ``isa_detected`` is then at most that."""

    path: Path
    version: str
    ort_api_version: int
    domain: str
    opset_version: int
    ops: tuple[str, ...]
    isa_detected: str
    isa_requested: str | None
    isa_request_valid: bool
    isa_selected: str | None
    isa_note: str | None
    compiler: str
    isa_cpu_limit: str | None = None  # SOFTDEPLOY_TEST_CPU: a test setting that caps isa_detected
    # The detected variant is avx512 and CPUID reports AVX-512 VNNI: the int8 kernels' vpdpbusd tiles run
    # (RowwiseInt8MatMul's with the avx512 variant selected). CPUID, as the kernels read it.
    avx512_vnni: bool = False
    # CPUID reports AVX-VNNI and no SOFTDEPLOY_TEST_CPU is set: where the avx2 variant is selected, the int8 kernels
    # run their VEX vpdpbusd ymm tiles (RowwiseInt8MatMul's, MaxSim's).
    avx_vnni: bool = False
    # The GPU path (docs/guide/gpu.md): whether the CUDA kernels (C ABI sd_cuda_*, CUDAExecutionProvider
    # ops) are compiled into the library, for which architectures ("sm_80", ...) and with which CUDA.
    cuda_compiled: bool = False
    cuda_architectures: tuple[str, ...] = ()
    cuda_version: str | None = None
    cuda_ops: tuple[str, ...] = ()

    def cuda_summary(self) -> str:
        """One line: whether the library holds CUDA kernels, which ops, for which architectures."""
        if not self.cuda_compiled:
            return "not compiled in (built without nvcc or with SOFTDEPLOY_CUDA=OFF)"
        return (
            f"{', '.join(self.cuda_ops)} for {', '.join(self.cuda_architectures)} (CUDA {self.cuda_version}; "
            "CUDAExecutionProvider ops and the sd_cuda_* C ABI)"
        )

    @property
    def isa_honoured(self) -> bool:
        """False when SOFTDEPLOY_ISA is set and the variant that runs is not the one it names."""
        return self.isa_requested is None or (
            self.isa_request_valid and self.isa_selected == self.isa_requested.lower()
        )

    def isa_summary(self) -> str:
        """One line: what runs, what was asked and why they differ."""
        if self.isa_requested is None and self.isa_request_valid:
            return f"{self.isa_selected} (best this CPU supports; SOFTDEPLOY_ISA unset)"
        if not self.isa_request_valid:
            return f"none: {self.isa_note}"
        if self.isa_honoured:
            return f"{self.isa_selected} (SOFTDEPLOY_ISA={self.isa_requested}; this CPU supports up to {self.isa_detected})"
        return f"{self.isa_selected}, not {self.isa_requested}: {self.isa_note}"


@functools.lru_cache(maxsize=8)
def _load(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(path)


def _cuda_fields(cuda: dict) -> dict:
    """LibraryInfo's cuda_* fields from SoftdeployLibraryInfo's "cuda" object; CMake's architecture list
    ("80-real,90") becomes ("sm_80", "sm_90")."""
    if not cuda.get("compiled"):
        return {"cuda_compiled": False}
    archs = tuple(f"sm_{a.split('-')[0]}" for a in str(cuda["architectures"]).split(",") if a)
    return {
        "cuda_compiled": True,
        "cuda_architectures": archs,
        "cuda_version": str(cuda["cuda_version"]),
        "cuda_ops": tuple(str(o) for o in cuda["ops"]),
    }


def cuda_device_count(info: LibraryInfo) -> int:
    """CUDA devices the library's runtime sees (0 without a driver or GPU, or when no CUDA is compiled in)."""
    if not info.cuda_compiled:
        return 0
    fn = _load(str(info.path)).sd_cuda_device_count
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return int(fn())


def _query(path: Path) -> LibraryInfo:
    """Loads ``path`` and asks it; raises LibraryNotFoundError saying why it is not softdeploy's library."""
    if not path.exists():
        raise LibraryNotFoundError(f"{path} (missing)")
    if not path.is_file():
        raise LibraryNotFoundError(f"{path} (not a file)")
    try:
        lib = _load(str(path))
    except OSError as e:
        raise LibraryNotFoundError(f"{path} (cannot load: {e})") from None
    if not hasattr(lib, "RegisterCustomOps"):
        raise LibraryNotFoundError(
            f"{path} (loads, but exports no RegisterCustomOps: not an onnxruntime custom-op library)"
        )
    if not hasattr(lib, "SoftdeployLibraryInfo"):
        raise LibraryNotFoundError(
            f"{path} (exports RegisterCustomOps but no SoftdeployLibraryInfo: not softdeploy's kernel library, "
            "or one built from older sources)"
        )
    query = lib.SoftdeployLibraryInfo
    query.restype = ctypes.c_size_t
    query.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    size = query(None, 0)
    buf = ctypes.create_string_buffer(size + 1)
    query(buf, size + 1)
    try:
        raw = json.loads(buf.value.decode("utf-8"))
        info = LibraryInfo(
            path=path,
            version=str(raw["version"]),
            ort_api_version=int(raw["ort_api_version"]),
            domain=str(raw["domain"]),
            opset_version=int(raw["opset_version"]),
            ops=tuple(str(o) for o in raw["ops"]),
            isa_detected=str(raw["isa_detected"]),
            isa_requested=raw["isa_requested"],
            isa_request_valid=bool(raw["isa_request_valid"]),
            isa_selected=raw["isa_selected"],
            isa_note=raw["isa_note"],
            compiler=str(raw.get("compiler", "")),
            isa_cpu_limit=raw.get("isa_cpu_limit"),
            avx512_vnni=bool(raw.get("avx512_vnni", False)),
            avx_vnni=bool(raw.get("avx_vnni", False)),
            **_cuda_fields(raw.get("cuda") or {"compiled": False}),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise LibraryNotFoundError(f"{path} (SoftdeployLibraryInfo answered no valid description: {e})") from None
    from softdeploy.domain import DOMAIN, OPSET_VERSION

    if raw.get("library") != "softdeploy_ops" or info.domain != DOMAIN:
        raise LibraryNotFoundError(f"{path} (describes itself as {raw.get('library')!r} for domain {info.domain!r})")
    if info.opset_version != OPSET_VERSION:
        raise LibraryNotFoundError(
            f"{path} (implements {DOMAIN} opset {info.opset_version}; this softdeploy package implements "
            f"opset {OPSET_VERSION}: rebuild the library from these sources)"
        )
    return info


def library_info() -> LibraryInfo:
    """Asks the library (the first good candidate) what it is; raises LibraryNotFoundError saying
    where it looked, why each candidate was refused and how to fix it. The ISA fields follow
    SOFTDEPLOY_ISA as it is now (the kernels read it when a session creates them)."""
    paths = candidates()
    tried = []
    for p in paths:
        try:
            return _query(p)
        except LibraryNotFoundError as e:
            tried.append(str(e))
    if os.environ.get(_ENV):
        raise LibraryNotFoundError(
            f"{_ENV} is set, and names no usable softdeploy kernel library: {tried[0]}. "
            f"Fix the path, or unset {_ENV} to use the library inside the package."
        )
    raise LibraryNotFoundError(
        "softdeploy's native kernel library was not found. Looked in: " + "; ".join(tried) + ". " + _FIX
    )


def library_path() -> Path:
    """Path of softdeploy's native library (see :func:`library_info`)."""
    return library_info().path


@dataclasses.dataclass(frozen=True)
class LibraryStatus:
    """The library's path and description, or why there is none (``error``)."""

    path: Path | None
    error: str | None
    info: LibraryInfo | None = None

    @property
    def ok(self) -> bool:
        """Whether a usable kernel library was found."""
        return self.path is not None


def library_status() -> LibraryStatus:
    """:func:`library_info` without raising."""
    try:
        info = library_info()
    except LibraryNotFoundError as e:
        return LibraryStatus(None, str(e))
    return LibraryStatus(info.path, None, info)
