"""The CUDA kernels through their C ABI (``sd_cuda_*``, ops/cuda/c_api.cc), without onnxruntime.

A ctypes driver over device buffers: torch CUDA tensors, or CuPy arrays, whichever the caller hands
in (outputs are allocated with the same library). Used by the GPU conformance tests
(tests/ops/test_cuda.py) and the GPU benchmark (bench/gpu/). Launches go on the current stream of the
input's library (torch.cuda.current_stream / cupy's current stream) and are asynchronous, like any
kernel of that library; a contract violation raises OpContractError with the CPU kernel's message
before anything is launched. Nothing here imports torch or CuPy at module import.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

from softdeploy.errors import OpContractError, SoftdeployError
from softdeploy.runtime.library import LibraryInfo, _load, library_info

# sd::cuda::Dtype codes.
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "sd_cuda_last_error": (ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
    "sd_cuda_device_count": (ctypes.c_int, []),
    "sd_cuda_softmax_topk_workspace_size": (ctypes.c_size_t, [_I64, _I64, _I64, _I64]),
    "sd_cuda_softmax_topk": (
        ctypes.c_int,
        [ctypes.c_int, _PTR, _I64, _I64, _I64, _I64, ctypes.c_float, _PTR, _PTR, _PTR, _PTR, ctypes.c_size_t, _PTR],
    ),
    "sd_cuda_two_pass_softmax": (ctypes.c_int, [ctypes.c_int, _PTR, _I64, _I64, _I64, _PTR, _PTR]),
    "sd_cuda_softpick": (ctypes.c_int, [ctypes.c_int, _PTR, _I64, _I64, _I64, ctypes.c_float, _PTR, _PTR]),
    "sd_cuda_max_sim": (
        ctypes.c_int,
        [ctypes.c_int, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR],
    ),
    "sd_cuda_soft_token_embedding": (
        ctypes.c_int,
        [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64]
        + [ctypes.c_double, _I64, ctypes.c_double, ctypes.c_double] * 2
        + [_I64, ctypes.c_int, ctypes.c_float, ctypes.c_float, ctypes.c_float, ctypes.c_float]
        + [_PTR, _PTR, _PTR, _PTR, _PTR],
    ),
}
SYMBOLS = tuple(_SIGNATURES)


class CudaUnavailableError(SoftdeployError):
    """The library holds no CUDA kernels, or the machine has no CUDA device."""


def _layout(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    outer = inner = 1
    for i, s in enumerate(shape):
        if i < axis:
            outer *= s
        elif i > axis:
            inner *= s
    return outer, shape[axis], inner


class _Arrays:
    """torch or CuPy, whichever owns ``like``: dtype names, allocation, pointers, the current stream."""

    def __init__(self, like: Any) -> None:
        self.torch = type(like).__module__.startswith("torch")
        if self.torch:
            import torch

            self.lib = torch
            self.device = like.device
        else:
            import cupy

            self.lib = cupy

    def dtype_name(self, a: Any) -> str:
        return str(a.dtype).removeprefix("torch.")

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        if self.torch:
            return self.lib.empty(shape, dtype=getattr(self.lib, dtype), device=self.device)
        return self.lib.empty(shape, dtype=dtype)

    @staticmethod
    def ptr(a: Any) -> int | None:
        if a is None:
            return None
        return int(a.data_ptr()) if hasattr(a, "data_ptr") else int(a.data.ptr)

    def stream(self) -> int:
        if self.torch:
            return int(self.lib.cuda.current_stream().cuda_stream)
        return int(self.lib.cuda.get_current_stream().ptr)

    def contiguous(self, a: Any) -> Any:
        if self.torch:
            return a.contiguous()
        return self.lib.ascontiguousarray(a)


@dataclasses.dataclass
class CudaKernels:
    """softdeploy's CUDA kernels in the library at ``info.path`` (default: the one softdeploy loads)."""

    info: LibraryInfo

    @classmethod
    def load(cls, info: LibraryInfo | None = None) -> CudaKernels:
        """The kernels of ``info`` (default :func:`library_info`); CudaUnavailableError when the library was
        built without CUDA."""
        info = info or library_info()
        if not info.cuda_compiled:
            raise CudaUnavailableError(f"{info.path} holds no CUDA kernels: {info.cuda_summary()}")
        return cls(info)

    def _fn(self, name: str) -> Any:
        fn = getattr(_load(str(self.info.path)), name)
        fn.restype, fn.argtypes = _SIGNATURES[name]
        return fn

    def device_count(self) -> int:
        """CUDA devices the library's runtime sees (0 without a driver or device)."""
        return int(self._fn("sd_cuda_device_count")())

    def _check(self, status: int) -> None:
        if status == 0:
            return
        buf = ctypes.create_string_buffer(4096)
        self._fn("sd_cuda_last_error")(buf, len(buf))
        message = buf.value.decode("utf-8", "replace")
        if status == 1:
            raise OpContractError(message)
        raise SoftdeployError(f"CUDA error: {message}")

    def softmax_topk_workspace_size(self, outer: int, n: int, inner: int, k: int) -> int:
        """Bytes of workspace sd_cuda_softmax_topk needs for this layout on the current device."""
        return int(self._fn("sd_cuda_softmax_topk_workspace_size")(outer, n, inner, k))

    def softmax_topk(self, x: Any, *, k: int, axis: int = -1, temperature: float = 1.0) -> tuple[Any, Any, Any]:
        """SoftmaxTopK of device array ``x`` (float32/float16): (Values, Indices int64, LogSumExp)."""
        arr = _Arrays(x)
        x = arr.contiguous(x)
        shape = tuple(x.shape)
        if not shape:
            raise OpContractError("SoftmaxTopK: input must have rank >= 1, got a scalar")
        a = _axis("SoftmaxTopK", axis, len(shape))
        outer, n, inner = _layout(shape, a)
        dt = arr.dtype_name(x)
        out_shape, lse_shape = list(shape), list(shape)
        out_shape[a] = max(k, 0)
        lse_shape[a] = 1
        values = arr.empty(tuple(out_shape), dt)
        indices = arr.empty(tuple(out_shape), "int64")
        lse = arr.empty(tuple(lse_shape), dt)
        ws_bytes = self.softmax_topk_workspace_size(outer, n, inner, k) if 1 <= k <= n else 0
        ws = arr.empty((max(ws_bytes, 1),), "uint8")
        status = self._fn("sd_cuda_softmax_topk")(
            _code(dt), arr.ptr(x), outer, n, inner, k, temperature, arr.ptr(values), arr.ptr(indices), arr.ptr(lse),
            arr.ptr(ws), ws_bytes, arr.stream(),
        )  # fmt: skip
        self._check(status)
        self._keepalive = ws  # the launch is asynchronous: keep the workspace until the next call
        return values, indices, lse

    def two_pass_softmax(self, x: Any, *, axis: int = -1) -> Any:
        """TwoPassSoftmax of device array ``x`` along ``axis``."""
        arr = _Arrays(x)
        x = arr.contiguous(x)
        shape = tuple(x.shape)
        if not shape:
            raise OpContractError("TwoPassSoftmax: input must have rank >= 1, got a scalar")
        outer, n, inner = _layout(shape, _axis("TwoPassSoftmax", axis, len(shape)))
        y = arr.empty(shape, arr.dtype_name(x))
        fn = self._fn("sd_cuda_two_pass_softmax")
        self._check(fn(_code(arr.dtype_name(x)), arr.ptr(x), outer, n, inner, arr.ptr(y), arr.stream()))
        return y

    def softpick(self, x: Any, *, axis: int = -1, eps: float = 1e-6) -> Any:
        """Softpick of device array ``x`` along ``axis``."""
        arr = _Arrays(x)
        x = arr.contiguous(x)
        shape = tuple(x.shape)
        if not shape:
            raise OpContractError("Softpick: input must have rank >= 1, got a scalar")
        outer, n, inner = _layout(shape, _axis("Softpick", axis, len(shape)))
        y = arr.empty(shape, arr.dtype_name(x))
        fn = self._fn("sd_cuda_softpick")
        self._check(fn(_code(arr.dtype_name(x)), arr.ptr(x), outer, n, inner, eps, arr.ptr(y), arr.stream()))
        return y

    def max_sim(
        self,
        q: Any,
        d: Any,
        q_mask: Any = None,
        d_mask: Any = None,
        q_scale: Any = None,
        d_scale: Any = None,
    ) -> Any:
        """MaxSim scores [B, N] (float32) of device arrays Q [B, Lq, dim], D [N, Ld, dim] (float32, float16 or
        bfloat16), bool masks and float32 scales optional."""
        arr = _Arrays(q)
        q, d = arr.contiguous(q), arr.contiguous(d)
        if len(q.shape) != 3 or len(d.shape) != 3:
            raise OpContractError(f"MaxSim: Q and D must have rank 3, got {tuple(q.shape)} and {tuple(d.shape)}")
        B, Lq, dim = (int(s) for s in q.shape)
        N, Ld = int(d.shape[0]), int(d.shape[1])
        if int(d.shape[2]) != dim:
            raise OpContractError(
                f"MaxSim: Q has dim {dim} but D has dim {int(d.shape[2])} (rule: Q and D share the last dimension)"
            )
        side = [None if v is None else arr.contiguous(v) for v in (q_mask, d_mask, q_scale, d_scale)]
        scores = arr.empty((B, N), "float32")
        fn = self._fn("sd_cuda_max_sim")
        status = fn(
            _code(arr.dtype_name(q)), arr.ptr(q), arr.ptr(d), *(arr.ptr(v) for v in side), B, Lq, N, Ld, dim,
            arr.ptr(scores), arr.stream(),
        )  # fmt: skip
        self._check(status)
        return scores

    def soft_token_embedding(
        self, logits: Any, embedding: Any, uniform: Any = None, mode: Any = None, **attrs: Any
    ) -> tuple[Any, Any, Any, Any]:
        """SoftTokenEmbedding of device arrays (float32): (Mixed [B, E], Weights, Ids int64 [B, max_topk], Entropy
        [B]). The contract is checked here first (the CPU kernel's messages); Mode and Noise values are not read
        back: a bad one gives its row NaN outputs (ops/cuda/soft_token_embedding.cu)."""
        from softdeploy.ops import soft_token_embedding as ste

        arr = _Arrays(logits)
        logits, embedding = arr.contiguous(logits), arr.contiguous(embedding)
        a = ste.DEF.resolve_attrs(attrs)
        noise_shape = None if uniform is None else tuple(uniform.shape)
        ste.validate(tuple(logits.shape), tuple(embedding.shape), noise_shape, None, a)
        if mode is not None and tuple(mode.shape) != (int(logits.shape[0]),):
            raise OpContractError(
                f"SoftTokenEmbedding: Mode has shape {list(mode.shape)}, expected [B] = [{int(logits.shape[0])}]"
            )
        for name, t in (("Logits", logits), ("Embedding", embedding), ("Noise", uniform)):
            if t is not None and arr.dtype_name(t) != "float32":
                raise OpContractError(
                    f"SoftTokenEmbedding: {name} is {arr.dtype_name(t)} (rule: the CUDA kernel is float32 only)"
                )
        b, v = (int(n) for n in logits.shape)
        e, k = int(embedding.shape[1]), int(a["max_topk"])
        u = None if uniform is None or len(uniform.shape) == 0 else arr.contiguous(uniform)
        m = None if mode is None else arr.contiguous(mode)
        mixed, weights = arr.empty((b, e), "float32"), arr.empty((b, k), "float32")
        ids, entropy = arr.empty((b, k), "int64"), arr.empty((b,), "float32")
        filters = []
        for prefix in ("", "after_thinking_"):
            filters += [a[prefix + "temperature"], a[prefix + "top_k"], a[prefix + "top_p"], a[prefix + "min_p"]]
        status = self._fn("sd_cuda_soft_token_embedding")(
            arr.ptr(logits), arr.ptr(embedding), arr.ptr(u), arr.ptr(m), b, v, e, *filters, k,
            1 if a["noise"] == "gumbel" else 0, a["tau"], a["noise_factor"], a["clamp_min"], a["clamp_max"],
            arr.ptr(mixed), arr.ptr(weights), arr.ptr(ids), arr.ptr(entropy), arr.stream(),
        )  # fmt: skip
        self._check(status)
        return mixed, weights, ids, entropy


def _code(dtype: str) -> int:
    try:
        return DTYPE_CODES[dtype]
    except KeyError:
        raise OpContractError(f"element type {dtype} has no CUDA kernel (rule: one of {sorted(DTYPE_CODES)})") from None


def _axis(op: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise OpContractError(
            f"{op}: axis {axis} is out of range for an input of rank {rank} (rule: -rank <= axis < rank)"
        )
    return axis % rank


__all__ = ["DTYPE_CODES", "SYMBOLS", "CudaKernels", "CudaUnavailableError"]
