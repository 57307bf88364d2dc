"""The CUDA kernels (ops/cuda/) against the float64 references, through the C ABI (softdeploy.runtime.cuda).

Two halves:
  * everywhere: the library says whether it holds CUDA kernels, and says it truthfully -- a build on a
    machine with nvcc (SOFTDEPLOY_CUDA=AUTO) must report them compiled for sm_80 and sm_90 and export
    every sd_cuda_* symbol; a build without must export none. The C ABI's contract checks run on the
    host before any launch, so their messages are checked here too, GPU or not.
  * where a CUDA device and torch.cuda or CuPy are present: every sample of every op of
    ops/cuda/cuda_ops.inc, in every float type the contract declares (plus bfloat16 for MaxSim), within
    the op's tolerance of the float64 reference on the rounded inputs. Elsewhere these tests skip and
    say why (no kernels compiled in / no device / no array library).

SOFTDEPLOY_EXPECT_CUDA=1|0 states what the build must contain; unset, it is "1 where nvcc is on PATH"
(the default build, SOFTDEPLOY_CUDA=AUTO, compiles the kernels exactly there).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from softdeploy import conformance
from softdeploy.errors import OpContractError
from softdeploy.ops import REGISTRY, Sample
from softdeploy.runtime.cuda import SYMBOLS, CudaKernels
from softdeploy.runtime.library import library_info

ROOT = Path(__file__).resolve().parents[2]


def cuda_ops_inc() -> list[tuple[str, str]]:
    """(OpType, stem) of every SD_CUDA_OP line of ops/cuda/cuda_ops.inc, the one CUDA op list."""
    text = (ROOT / "ops" / "cuda" / "cuda_ops.inc").read_text()
    return re.findall(r"^SD_CUDA_OP\((\w+), *(\w+)\)", text, re.M)


CUDA_OPS = tuple(name for name, _ in cuda_ops_inc())


def test_cuda_op_table_names_ops_of_the_registry_by_their_stems():
    """Each line of ops/cuda/cuda_ops.inc is an op of REGISTRY with its stem, which names the C ABI entry point
    (sd_cuda_<stem>, ops/cuda/c_api.cc) and the driver's method (CudaKernels.<stem>)."""
    table = cuda_ops_inc()
    assert table, "ops/cuda/cuda_ops.inc lists no op"
    assert [n for n, _ in table] == sorted(n for n, _ in table), "cuda_ops.inc must stay sorted"
    for name, stem in table:
        assert name in REGISTRY, f"cuda_ops.inc names {name}, which is not an op of REGISTRY"
        assert REGISTRY[name].stem == stem, f"cuda_ops.inc: {name}'s stem is {REGISTRY[name].stem}, not {stem}"
        assert f"sd_cuda_{stem}" in SYMBOLS, f"softdeploy.runtime.cuda has no signature for sd_cuda_{stem}"
        assert callable(getattr(CudaKernels, stem, None)), f"CudaKernels has no method {stem} for {name}"


def _expect_cuda() -> bool:
    v = os.environ.get("SOFTDEPLOY_EXPECT_CUDA")
    if v is not None:
        return v == "1"
    return shutil.which("nvcc") is not None


def test_library_reports_cuda_kernels_as_built():
    info = library_info()
    lib = ctypes.CDLL(str(info.path))
    exported = [s for s in SYMBOLS if hasattr(lib, s)]
    if _expect_cuda():
        assert info.cuda_compiled, f"built where nvcc is found, yet the library says: {info.cuda_summary()}"
        assert {"sm_80", "sm_90"} <= set(info.cuda_architectures), info.cuda_architectures
        assert info.cuda_ops == CUDA_OPS
        assert set(info.cuda_ops) <= set(REGISTRY)
        assert exported == list(SYMBOLS), f"missing C ABI symbols: {sorted(set(SYMBOLS) - set(exported))}"
    else:
        assert not info.cuda_compiled, info.cuda_summary()
        assert exported == [], f"a library without CUDA exports {exported}"


def _kernels() -> CudaKernels:
    info = library_info()
    if not info.cuda_compiled:
        pytest.skip(f"the library holds no CUDA kernels ({info.cuda_summary()})")
    return CudaKernels.load(info)


def test_device_count_answers_without_a_driver():
    """No driver, no GPU: the query answers 0 instead of failing (the library must load and run CPU ops there)."""
    k = _kernels()
    assert k.device_count() >= 0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda k: k._fn("sd_cuda_softmax_topk")(0, None, 2, 3, 1, 0, 1.0, None, None, None, None, 0, None),
         "SoftmaxTopK: k 0 is out of range (rule: k >= 1)"),
        (lambda k: k._fn("sd_cuda_softmax_topk")(0, None, 2, 3, 1, 4, 1.0, None, None, None, None, 0, None),
         "SoftmaxTopK: k 4 is larger than the axis length 3"),
        (lambda k: k._fn("sd_cuda_softmax_topk")(0, None, 2, 3, 1, 1, -1.5, None, None, None, None, 0, None),
         "SoftmaxTopK: temperature -1.5 is out of range (rule: temperature > 0)"),
        (lambda k: k._fn("sd_cuda_softmax_topk")(2, None, 2, 3, 1, 1, 1.0, None, None, None, None, 0, None),
         "SoftmaxTopK: element type bfloat16 is not supported"),
        (lambda k: k._fn("sd_cuda_softpick")(0, None, 2, 3, 1, -1.0, None, None),
         "Softpick: eps -1 is not a finite number >= 0 (rule: 0 <= eps < inf)"),
        (lambda k: k._fn("sd_cuda_two_pass_softmax")(7, None, 2, 3, 1, None, None),
         "TwoPassSoftmax: dtype code 7 names no element type"),
    ],
    ids=["k_zero", "k_above_n", "temperature", "bf16_topk", "eps", "dtype_code"],
)  # fmt: skip
def test_c_abi_refuses_contract_violations_before_launching(call, match):
    """Host-side checks: status 1 and the CPU kernel's message, with null device pointers (nothing launched)."""
    k = _kernels()
    with pytest.raises(OpContractError, match=match.replace("(", r"\(").replace(")", r"\)")):
        k._check(call(k))


def test_softmax_topk_workspace_is_sized_without_a_device():
    k = _kernels()
    assert k.softmax_topk_workspace_size(4096, 128000, 1, 50) >= 0
    assert k.softmax_topk_workspace_size(2, 3, 1, 4) == 0  # k > n: no plan


# ---- on a CUDA device ---------------------------------------------------------------------------


def _array_lib():
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            return "torch"
    if importlib.util.find_spec("cupy") is not None:
        return "cupy"
    return None


def _device() -> tuple[CudaKernels, str]:
    k = _kernels()
    n = k.device_count()
    if n == 0:
        pytest.skip("no CUDA device visible to the library's runtime (sd_cuda_device_count() == 0)")
    lib = _array_lib()
    if lib is None:
        pytest.skip("a CUDA device is present but neither torch.cuda nor CuPy is installed for device buffers")
    return k, lib


def _to_device(lib: str, a: np.ndarray | None, dtype: str | None = None):
    if a is None:
        return None
    if lib == "torch":
        import torch

        t = torch.from_numpy(np.ascontiguousarray(a)).cuda()
        return t.to(getattr(torch, dtype)) if dtype else t
    import cupy

    return cupy.asarray(a)


def _to_host(a) -> np.ndarray:
    if type(a).__module__.startswith("torch"):
        import torch

        if a.dtype == torch.bfloat16:
            a = a.float()
        return a.cpu().numpy()
    return a.get()


def _bf16_round(a: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(torch.bfloat16).float().numpy()


def _cases() -> list:
    cases = []
    for name in CUDA_OPS:
        op = REGISTRY[name]
        dtypes = [t for t in op.float_types if t in ("float32", "float16")]
        if name == "MaxSim":
            dtypes.append("bfloat16")
        for sample in op.samples(np.random.default_rng(0)):
            for dtype in dtypes:
                cases.append(pytest.param(name, sample, dtype, id=f"{name}-{sample.name}-{dtype}"))
    return cases


@pytest.mark.parametrize(("name", "sample", "dtype"), _cases())
def test_cuda_kernel_matches_reference(name, sample, dtype):
    k, lib = _device()
    op = REGISTRY[name]
    if any(v is not None and np.asarray(v).dtype.kind in "iu" for v in sample.inputs[:2]):
        pytest.skip("int8 sample: MaxSim's int8 path has no CUDA kernel (onnxruntime runs the CPU one)")
    if dtype == "bfloat16":
        if lib != "torch":
            pytest.skip("bfloat16 buffers need torch")
        inputs = tuple(_bf16_round(v) if (v is not None and i < 2) else v for i, v in enumerate(sample.inputs))
        s = Sample(f"{sample.name}[bfloat16]", inputs, sample.attrs, sample.kind)
        rtol, atol = op.tolerance["float16"]
    else:
        s = conformance.cast_sample(op, sample, dtype)
        if s is None:
            pytest.skip(f"values of {sample.name} do not survive the cast to {dtype}")
        rtol, atol = op.tolerance[dtype]
    want = op.reference(*s.inputs, **s.attrs)
    dev_dtype = "bfloat16" if dtype == "bfloat16" else None
    if name == "MaxSim":
        q, d, *rest = list(s.inputs) + [None] * (6 - len(s.inputs))
        side = [_to_device(lib, v) for v in rest]
        got = (_to_host(k.max_sim(_to_device(lib, q, dev_dtype), _to_device(lib, d, dev_dtype), *side)),)
    elif name == "SoftTokenEmbedding":
        got = tuple(_to_host(o) for o in k.soft_token_embedding(*(_to_device(lib, v) for v in s.inputs), **s.attrs))
    else:
        x = _to_device(lib, s.inputs[0])
        attrs = dict(s.attrs)
        out = getattr(k, op.stem)(x, **attrs)
        got = tuple(_to_host(o) for o in (out if isinstance(out, tuple) else (out,)))
    conformance.compare(op, s, got, want, rtol, atol)
