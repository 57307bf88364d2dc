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

_TVM_ALIGNMENT = 64  # bytes: what TVM's kernels assume of their parameters unless built element-aligned


def _view_out(tensor: Any) -> np.ndarray:
    """A numpy view of a local TVM tensor (it keeps the tensor alive); a copy for dtypes DLPack cannot
    hand to numpy."""
    try:
        return np.from_dlpack(tensor)
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
    any_alignment: bool = False  # BuildReport.any_alignment: inputs may be passed at any address

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> _Signature:
        d = json.loads(text)
        inputs = [tuple(i) for i in d["inputs"]]
        return cls(inputs, list(d["outputs"]), dict(d["target"]), bool(d.get("any_alignment", False)))  # type: ignore[arg-type]


def set_threads(n: int) -> None:
    """TVM's runtime thread pool (process-wide) to ``n`` threads (at most the pool's size:
    TVM_NUM_THREADS, which ``import_tvm`` sets to the physical cores unless the user did)."""
    from softdeploy.tvm.target import import_tvm

    import_tvm().get_global_func("runtime.config_threadpool")(0, int(n))


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
        self.executable, self.report = build(
            import_model(prepared, spec), target=spec, tuned=tuned, databases=databases
        )
        self.tir_ops, self.inlined_ops = prepared.tir_ops, prepared.inlined
        self._signature = _Signature(
            [(n, prepared.shapes[n], prepared.dtypes[n]) for n in prepared.shapes],
            [o.name for o in prepared.model.graph.output],
            spec,
            self.report.any_alignment,
        )
        self._open(self.executable, threads, rpc)

    @classmethod
    def load(cls, path: str | os.PathLike, *, threads: int | None = None, rpc: Any = None) -> TVMSession:
        """A session from :meth:`save`'s library and its ``.json`` signature beside it."""
        from softdeploy.tvm.target import import_tvm

        tvm = import_tvm()
        self = cls.__new__(cls)
        from softdeploy.errors import ModelLoadError

        path = Path(path)
        for part in (path, path.with_suffix(".json")):
            if not part.is_file():
                raise ModelLoadError(f"compiled model {path}: {part} is missing (save() writes the .so and its .json)")
        self._signature = _Signature.from_json(path.with_suffix(".json").read_text())
        self.executable, self.report = tvm.runtime.load_module(str(path)), None
        self.tir_ops, self.inlined_ops = (), ()
        self._open(self.executable, threads, rpc)
        return self

    def save(self, path: str | os.PathLike) -> Path:
        """Writes the compiled library (``.so``) and its signature (``.json``, input names/shapes/dtypes), each under
        a temporary name beside it and renamed once complete: an interrupted or failed save leaves the previous pair.
        The signature is renamed just before the library, so a new library never stands beside an old signature."""
        from softdeploy.files import atomic_output, write_text

        path = Path(path)
        with atomic_output(path, "compiled library") as tmp:
            # export_library picks the linker's output format from the name's suffix: keep it, then take the name
            lib = tmp.with_name(tmp.name + path.suffix) if path.suffix else tmp
            try:
                self.executable.export_library(str(lib))
                if lib != tmp:
                    os.replace(lib, tmp)
            finally:
                if lib != tmp:
                    lib.unlink(missing_ok=True)
            write_text(path.with_suffix(".json"), self._signature.to_json(), "compiled model signature")
        return path

    def _open(self, executable: Any, threads: int | None, rpc: Any) -> None:
        import tvm
        import tvm_ffi
        from tvm import relax

        self.remote = None
        # per call, looked up once: the inputs' checks as tuples and numpy dtypes, the FFI's entry points
        self._inputs = [(name, tuple(shape), np.dtype(dtype)) for name, shape, dtype in self._signature.inputs]
        self._from_dlpack = tvm_ffi.from_dlpack
        self._item = tvm_ffi.get_global_func("ffi.ArrayGetItem")
        self._staging = threading.local()  # per thread: input name -> aligned buffer (see _tensor)
        self._probe_lock = threading.Lock()
        self._probe: list[Any] | None = None  # the first call's outputs, held until the second call
        self._fresh: list[bool] | None = None  # per output: allocated anew on each call (_fresh_outputs)
        if rpc is None:
            if threads is not None:
                set_threads(threads)
            self.device = tvm.cpu()
            self._vm = relax.VirtualMachine(executable, self.device)
            self._main = self._vm["main"]  # looked up once: ~1 us per lookup
            return
        from softdeploy.tvm.rpc import connect

        self.remote = connect(rpc)
        with tempfile.TemporaryDirectory(prefix="softdeploy-tvm-") as tmp:
            lib = os.path.join(tmp, "model.so")
            executable.export_library(lib)
            self.remote.upload(lib)
        self.device = self.remote.cpu()
        self._vm = relax.VirtualMachine(self.remote.load_module("model.so"), self.device)
        self._main = self._vm["main"]

    @property
    def input_names(self) -> list[str]:
        """The compiled model's input names, in order."""
        return [name for name, _, _ in self._signature.inputs]

    @property
    def output_names(self) -> list[str]:
        """The compiled model's output names, in order."""
        return list(self._signature.outputs)

    @property
    def input_dtypes(self) -> list[str]:
        """The numpy dtype name of each input, in input order."""
        return [dtype for _, _, dtype in self._signature.inputs]

    @property
    def input_shapes(self) -> dict[str, list[int]]:
        """The static shape of each input (TVM builds are compiled for fixed shapes), by name."""
        return {name: list(shape) for name, shape, _ in self._signature.inputs}

    def _arguments(self, feeds: Mapping[str, np.ndarray]) -> list[Any]:
        return self._arguments_and_sizes(feeds)[0]

    def _arguments_and_sizes(self, feeds: Mapping[str, np.ndarray]) -> tuple[list[Any], list[int]]:
        """The VM's arguments for ``feeds`` and their sizes in bytes. (Per call: the checks are against
        the signature's tuples and numpy dtypes, made once in :meth:`_open`.)"""
        args, sizes = [], []
        for name, shape, dtype in self._inputs:
            value = feeds.get(name)
            if value is None:
                missing = [n for n in self.input_names if n not in feeds]
                raise RuntimeFailure(f"missing inputs {missing}; the model's inputs are {self.input_names}")
            value = np.asarray(value)
            if value.shape != shape or value.dtype != dtype:
                raise RuntimeFailure(
                    f"input {name}: got {value.dtype}{list(value.shape)}, compiled for {dtype}{list(shape)} "
                    "(TVM builds static shapes; compile again for other shapes)"
                )
            args.append(self._tensor(name, value if value.flags.c_contiguous else np.ascontiguousarray(value)))
            sizes.append(value.nbytes)
        return args, sizes

    def _tensor(self, name: str, value: np.ndarray) -> Any:
        """``value`` as a TVM tensor. On the local CPU zero-copy (DLPack) when the kernels can read it
        there: at any address when the build declared every kernel parameter element-aligned
        (``BuildReport.any_alignment``), else only 64-byte aligned, as TVM's kernels then assume.
        Otherwise (and for read-only arrays, which numpy does not export through DLPack) it is copied
        into this thread's aligned staging buffer for the input, reused across calls (a fresh TVM
        tensor per call cost ~60 us per 512 KiB here, most of it first-touch page faults). No output
        that shares memory with an input (staged or not) is handed out in place (:meth:`_local_outputs`).
        Remote devices: a copy."""
        import tvm

        if self.remote is not None:
            return tvm.runtime.tensor(value, self.device)
        if value.size == 0:  # nothing to copy; numpy places empty arrays at unaligned addresses
            return tvm.runtime.empty(value.shape, str(value.dtype), self.device)
        if value.flags.writeable and (self._signature.any_alignment or value.ctypes.data % _TVM_ALIGNMENT == 0):
            return self._from_dlpack(value, require_alignment=0)
        buffers = self._staging.__dict__.setdefault("buffers", {})
        staged = buffers.get(name)
        if staged is None or staged.shape != value.shape or staged.dtype != value.dtype:
            staged = buffers[name] = _aligned_empty(value.shape, value.dtype)
        np.copyto(staged, value)
        return self._from_dlpack(staged, require_alignment=_TVM_ALIGNMENT)

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        """Runs the compiled model on ``feeds`` (input name -> array, read in place when aligned) and returns
        ``outputs`` (default: all); fresh outputs are views of TVM's memory, copied only when they would alias an input,
        a constant or another output."""
        args, sizes = self._arguments_and_sizes(feeds)
        result = self._main(*args)
        if hasattr(result, "numpy"):  # one output
            values = [result]
        else:  # a tuple: its items by the FFI's own accessor (Array.__iter__ costs ~1 us per item more)
            values = [self._item(result, i) for i in range(len(self._signature.outputs))]
        if self.remote is not None:
            arrays = [v.numpy() for v in values]
        else:  # (start, end) of each input where the VM read it: the caller's array or a staging buffer
            arrays = self._local_outputs(
                values, [(a.data_ptr(), a.data_ptr() + n) for a, n in zip(args, sizes, strict=True)]
            )
        if outputs:
            index = {n: i for i, n in enumerate(self.output_names)}
            return [arrays[index[n]] for n in outputs]
        return arrays

    def _local_outputs(self, values: list[Any], taken: list[tuple[int, int]]) -> list[np.ndarray]:
        """The outputs as numpy arrays: in place (a DLPack view that keeps the TVM tensor alive) where
        the VM allocated the output for this call, a copy otherwise. In place saves a copy and the
        page faults of a fresh array (12 us per 512 KiB here); the VM's allocator hands a tensor's
        memory out again only once the array is gone. A copy where in place would share memory with
        something else: a model constant or other state of the VM (an output that is not fresh:
        :meth:`_fresh_outputs`), an input (an identity or a view of one: the caller's array, or a
        staging buffer that the next call overwrites) or an earlier output of the same call."""
        fresh = self._fresh_outputs(values)
        arrays = []
        for value, is_fresh in zip(values, fresh, strict=True):
            view, start = _view_out(value), value.data_ptr()  # (data_ptr: 0.03 us, ndarray.ctypes: 1 us)
            shared = not is_fresh
            for lo, hi in taken:
                shared = shared or lo <= start < hi
            arrays.append(view.copy() if shared else view)
            taken.append((start, start + view.nbytes))
        return arrays

    def _fresh_outputs(self, values: list[Any]) -> list[bool]:
        """Per output, whether the VM allocates it anew on each call. Learnt from the first two calls
        (both copy): the first call's outputs are held through the second, so a fresh allocation
        cannot come back at the same address, while a constant (or a view of one) does."""
        if self._fresh is not None:
            return self._fresh
        with self._probe_lock:
            if self._fresh is not None:
                return self._fresh
            if self._probe is None:
                self._probe = values
            else:
                held = {t.data_ptr() for t in self._probe}
                self._fresh, self._probe = [t.data_ptr() not in held for t in values], None
            return [False] * len(values)

    def benchmark(self, feeds: Mapping[str, np.ndarray], *, number: int = 10, repeat: int = 5) -> list[float]:
        """Seconds per call, one median-ready value per repeat, timed where the model runs (locally or on
        the RPC device, without transfer costs)."""
        args = self._arguments(feeds)
        timer = self._vm.time_evaluator("main", self.device, number=number, repeat=repeat)
        return [float(r) for r in timer(*args).results]
