"""Running a model compiled by TVM with the same surface as :class:`softdeploy.runtime.Session`
(``input_names``, ``output_names``, ``run(feeds)``), so ``compare`` and the tests treat it as one
more backend.

    sess = TVMSession("model.onnx", shapes={"input_ids": [1, 128], "attention_mask": [1, 128]})
    sess = TVMSession("model.onnx", tuned=False)            # TVM without schedules, for comparison
    sess.save("model_tvm.so"); sess = TVMSession.load("model_tvm.so")
    sess = TVMSession(..., rpc=RPCSpec("tracker-host", 9190, "epyc"))   # runs on a remote device

Importing this module does not import TVM; constructing a session does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.errors import RuntimeFailure

_TVM_ALIGNMENT = 64  # bytes: tvm.runtime.from_dlpack refuses less (TVM buffers are 64-byte aligned)


def _copy_out(tensor: Any) -> np.ndarray:
    """A fresh numpy copy of a local TVM tensor (DLPack view, then numpy's copy); dtypes DLPack cannot
    hand to numpy take TVM's own conversion."""
    try:
        return np.from_dlpack(tensor).copy()
    except (BufferError, TypeError, RuntimeError, ValueError):
        return tensor.numpy()


def _aligned_empty(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a _TVM_ALIGNMENT boundary."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + _TVM_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _TVM_ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


@dataclasses.dataclass(frozen=True)
class _Signature:
    inputs: list[tuple[str, list[int], str]]  # name, static shape, numpy dtype
    outputs: list[str]
    target: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> _Signature:
        d = json.loads(text)
        return cls([tuple(i) for i in d["inputs"]], list(d["outputs"]), dict(d["target"]))  # type: ignore[misc]


def set_threads(n: int) -> None:
    """TVM's runtime thread pool (process-wide) to ``n`` threads."""
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(0, int(n))


class TVMSession:
    """A model compiled with TVM (Relax VM) for the host CPU or an RPC device."""

    def __init__(
        self,
        model: Any,
        *,
        shapes: Mapping[str, Sequence[int]] | None = None,
        tuned: bool = True,
        databases: Sequence[str | os.PathLike] = (),
        target: dict[str, Any] | None = None,
        threads: int | None = None,
        use_tir: bool = True,
        rpc: Any = None,
    ) -> None:
        from softdeploy.tvm.build import build
        from softdeploy.tvm.frontend import import_model, prepare
        from softdeploy.tvm.target import host_target, import_tvm

        import_tvm()
        prepared = prepare(model, shapes, use_tir=use_tir)
        spec = dict(target or host_target())
        self.executable, self.report = build(import_model(prepared), target=spec, tuned=tuned, databases=databases)
        self.tir_ops, self.inlined_ops = prepared.tir_ops, prepared.inlined
        self._signature = _Signature(
            [(n, prepared.shapes[n], prepared.dtypes[n]) for n in prepared.shapes],
            [o.name for o in prepared.model.graph.output],
            spec,
        )
        self._open(self.executable, threads, rpc)

    @classmethod
    def load(cls, path: str | os.PathLike, *, threads: int | None = None, rpc: Any = None) -> TVMSession:
        """A session from :meth:`save`'s library and its ``.json`` signature beside it."""
        import tvm

        self = cls.__new__(cls)
        path = Path(path)
        self._signature = _Signature.from_json(path.with_suffix(".json").read_text())
        self.executable, self.report = tvm.runtime.load_module(str(path)), None
        self.tir_ops, self.inlined_ops = (), ()
        self._open(self.executable, threads, rpc)
        return self

    def save(self, path: str | os.PathLike) -> Path:
        """Writes the compiled library (``.so``) and its signature (``.json``, input names/shapes/dtypes)."""
        path = Path(path)
        self.executable.export_library(str(path))
        path.with_suffix(".json").write_text(self._signature.to_json())
        return path

    def _open(self, executable: Any, threads: int | None, rpc: Any) -> None:
        import tvm
        from tvm import relax

        self.remote = None
        self._staging = threading.local()  # per thread: input name -> aligned buffer (see _tensor)
        if rpc is None:
            if threads is not None:
                set_threads(threads)
            self.device = tvm.cpu()
            self._vm = relax.VirtualMachine(executable, self.device)
            return
        from softdeploy.tvm.rpc import connect

        self.remote = connect(rpc)
        with tempfile.TemporaryDirectory(prefix="softdeploy-tvm-") as tmp:
            lib = os.path.join(tmp, "model.so")
            executable.export_library(lib)
            self.remote.upload(lib)
        self.device = self.remote.cpu()
        self._vm = relax.VirtualMachine(self.remote.load_module("model.so"), self.device)

    @property
    def input_names(self) -> list[str]:
        return [name for name, _, _ in self._signature.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self._signature.outputs)

    @property
    def input_dtypes(self) -> list[str]:
        return [dtype for _, _, dtype in self._signature.inputs]

    @property
    def input_shapes(self) -> dict[str, list[int]]:
        return {name: list(shape) for name, shape, _ in self._signature.inputs}

    def _arguments(self, feeds: Mapping[str, np.ndarray]) -> list[Any]:

        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise RuntimeFailure(f"missing inputs {missing}; the model's inputs are {self.input_names}")
        args = []
        for name, shape, dtype in self._signature.inputs:
            value = np.asarray(feeds[name])
            if list(value.shape) != list(shape) or value.dtype != np.dtype(dtype):
                raise RuntimeFailure(
                    f"input {name}: got {value.dtype}{list(value.shape)}, compiled for {dtype}{list(shape)} "
                    "(TVM builds static shapes; compile again for other shapes)"
                )
            args.append(self._tensor(name, np.ascontiguousarray(value)))
        return args

    def _tensor(self, name: str, value: np.ndarray) -> Any:
        """``value`` as a TVM tensor. On the local CPU: zero-copy (DLPack) when its data is 64-byte
        aligned, as TVM's kernels assume; otherwise copied into this thread's aligned staging buffer for
        the input, reused across calls (a fresh TVM tensor per call cost ~60 us per 512 KiB here, most
        of it first-touch page faults; the reused buffer's copy stays in cache). Outputs are copied out
        before run returns, so no result aliases a staging buffer. Remote devices: a copy."""
        import tvm

        if self.remote is not None:
            return tvm.runtime.tensor(value, self.device)
        if value.size == 0:  # nothing to copy; numpy places empty arrays at unaligned addresses
            return tvm.runtime.empty(value.shape, str(value.dtype), self.device)
        if value.ctypes.data % _TVM_ALIGNMENT != 0 or not value.flags.writeable:
            # read-only arrays do not export through DLPack either
            buffers = self._staging.__dict__.setdefault("buffers", {})
            staged = buffers.get(name)
            if staged is None or staged.shape != value.shape or staged.dtype != value.dtype:
                staged = buffers[name] = _aligned_empty(value.shape, value.dtype)
            np.copyto(staged, value)
            value = staged
        return tvm.runtime.from_dlpack(value)

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        result = self._vm["main"](*self._arguments(feeds))
        values = [result] if hasattr(result, "numpy") else list(result)
        # outputs are copied: a zero-copy view could alias a model constant or an input of the caller.
        # Locally through a DLPack view and numpy's copy: 12 us per 512 KiB against 20 us for .numpy().
        arrays = [v.numpy() if self.remote is not None else _copy_out(v) for v in values]
        if outputs:
            index = {n: i for i, n in enumerate(self.output_names)}
            return [arrays[index[n]] for n in outputs]
        return arrays

    def benchmark(self, feeds: Mapping[str, np.ndarray], *, number: int = 10, repeat: int = 5) -> list[float]:
        """Seconds per call, one median-ready value per repeat, timed where the model runs (locally or on
        the RPC device, without transfer costs)."""
        args = self._arguments(feeds)
        timer = self._vm.time_evaluator("main", self.device, number=number, repeat=repeat)
        return [float(r) for r in timer(*args).results]
