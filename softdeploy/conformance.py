"""Run any op on any backend, so that one test (tests/ops/test_conformance.py) can compare every
op x sample x backend against the float64 reference.

Backends:
  ``reference``  the float64 NumPy oracle (softdeploy/ops/<stem>.py)
  ``function``   the standard-ONNX function body in stock onnxruntime (library not registered)
  ``kernel``     the native C++ kernel in onnxruntime, optionally forced to an ISA variant. The model
                 carries NO function bodies (:func:`kernel_model`): a dtype or op without a
                 registered kernel fails at session creation instead of running the body
  ``torch``      the ``softdeploy::<stem>`` torch op, run eagerly
  ``tvm``        TVM (Relax) for the sample's static shapes: the op's TIR compute, or its inlined
                 function body when it has none (needs apache-tvm; see softdeploy/tvm/)
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

# ISAS re-exported: tests and bench list the variants from here
from softdeploy.cpu import ISAS as ISAS
from softdeploy.cpu import cpuinfo, isa_from_flags, isas_up_to
from softdeploy.ops._schema import OpDef, Sample

BACKENDS = ("reference", "function", "kernel", "torch", "tvm")


def available_isas() -> list[str]:
    """Kernel variants this CPU can run, as the kernel library detects them (SoftdeployLibraryInfo;
    SOFTDEPLOY_ISA does not change this list). Without a usable library, the same rule as
    ops/common/cpu.cc applied to /proc/cpuinfo (kernel runs then fail on the missing library)."""
    from softdeploy.runtime.library import library_status

    info = library_status().info
    if info is not None:
        return isas_up_to(info.isa_detected)
    return isas_up_to(isa_from_flags(cpuinfo()[1]))


@contextlib.contextmanager
def forced_isa(isa: str | None) -> Iterator[None]:
    """Sets SOFTDEPLOY_ISA while sessions are created (kernels read it once, at creation)."""
    old = os.environ.get("SOFTDEPLOY_ISA")
    if isa is not None:
        os.environ["SOFTDEPLOY_ISA"] = isa
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SOFTDEPLOY_ISA", None)
        else:
            os.environ["SOFTDEPLOY_ISA"] = old


@contextlib.contextmanager
def forced_task_grain(grain: int | str | None) -> Iterator[None]:
    """Sets SOFTDEPLOY_TASK_GRAIN (test-only: units of work per task, default 65536; see NumTasks in
    ops/common/kernel.h) while sessions are created, so that small samples split into many tasks."""
    old = os.environ.get("SOFTDEPLOY_TASK_GRAIN")
    if grain is not None:
        os.environ["SOFTDEPLOY_TASK_GRAIN"] = str(grain)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SOFTDEPLOY_TASK_GRAIN", None)
        else:
            os.environ["SOFTDEPLOY_TASK_GRAIN"] = old


def kernel_model(op: OpDef, sample: Sample, *, fill_omitted: bool = True) -> Any:
    """The one-node model the ``kernel`` backend runs: without function bodies, so that a node no
    registered kernel takes (a missing dtype instance, a dispatch miss) fails loudly at session
    creation; with bodies attached onnxruntime silently ran the body and the case passed.

    ``fill_omitted``: omitted optional inputs that declare a ``Port.body_fill`` are fed their fill,
    exactly as in every model softdeploy exports (attach_function_bodies), so the kernel sees what
    it sees in production. ``False`` leaves them omitted, as in a model built by hand."""
    from softdeploy.ops import REGISTRY
    from softdeploy.ops.functions import _fill_omitted_inputs

    model = op.make_model(sample, with_function=False)
    if fill_omitted:
        _fill_omitted_inputs(model.graph, REGISTRY)
    if len(model.functions):
        raise AssertionError(f"{op.name}: the kernel backend's model carries function bodies")
    return model


def cast_sample(op: OpDef, sample: Sample, dtype: str) -> Sample | None:
    """The sample with its "T" inputs cast to ``dtype``; None when a value would not survive the cast.

    Samples whose "T" inputs are integers (int8, with their scales) are written in that type and
    never cast; float samples are never cast to an integer type."""
    t_types = {
        np.asarray(v).dtype.name
        for p, v in zip(op.inputs, sample.inputs, strict=False)
        if p.dtype == "T" and v is not None
    }
    if np.issubdtype(np.dtype(dtype), np.integer) or any(np.issubdtype(np.dtype(t), np.integer) for t in t_types):
        return sample if t_types == {dtype} else None
    if dtype == "float32":
        return sample
    info = np.finfo(dtype)
    inputs: list[np.ndarray | None] = []
    for port, value in zip(op.inputs, sample.inputs, strict=False):
        if value is not None and port.dtype == "T":
            finite = np.asarray(value)[np.isfinite(value)]
            if finite.size and np.abs(finite).max() > info.max:
                return None
            value = np.asarray(value).astype(dtype)
        inputs.append(value)
    return Sample(f"{sample.name}[{dtype}]", tuple(inputs), sample.attrs, sample.kind)


def run(
    op: OpDef,
    sample: Sample,
    backend: str,
    *,
    isa: str | None = None,
    threads: int = 1,
    task_grain: int | str | None = None,
    fill_omitted: bool = True,
) -> tuple[np.ndarray, ...]:
    """The op's outputs on ``sample`` from ``backend``. Kernel only: ``isa`` forces a variant,
    ``task_grain`` the test-only task grain, ``fill_omitted`` as in :func:`kernel_model`."""
    if backend == "reference":
        return tuple(np.asarray(o) for o in op.reference(*sample.inputs, **sample.attrs))
    if backend == "function":
        from softdeploy.runtime import Session

        session = Session(op.make_model(sample, with_function=True), kernels="portable", threads=threads)
        return tuple(session.run(op.feeds(sample)))
    if backend == "kernel":
        from softdeploy.runtime import Session

        model = kernel_model(op, sample, fill_omitted=fill_omitted)
        with forced_isa(isa), forced_task_grain(task_grain):
            session = Session(model, kernels="native", threads=threads)
        return tuple(session.run(op.feeds(sample)))
    if backend == "torch":
        import torch

        from softdeploy.ops._torch import torch_op

        args = [None if v is None else torch.from_numpy(np.array(v, copy=True)) for v in sample.inputs]
        out = torch_op(op)(*args, **sample.attrs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(o.detach().numpy() for o in outs)
    if backend == "tvm":
        from softdeploy.tvm.session import TVMSession

        shapes = {p.name: list(np.shape(v)) for p, v in zip(op.inputs, sample.inputs, strict=False) if v is not None}
        return tuple(TVMSession(op.make_model(sample), shapes=shapes, threads=threads).run(op.feeds(sample)))
    raise ValueError(f"unknown backend {backend!r}; backends are {BACKENDS}")


def parallel_sections(
    op: OpDef, sample: Sample, *, threads: int = 2, task_grain: int | str | None = None, isa: str | None = None
) -> tuple[tuple[np.ndarray, ...], int]:
    """(outputs, parallel sections) of one kernel run of ``sample`` at ``threads`` intra-op threads:
    the number of times the kernel handed work of more than one task to onnxruntime's thread pool
    (``ParallelFor`` in ops/common/kernel.h runs a single task inline). Read from onnxruntime's
    profiler, which records each parallel section of a node (``thread_scheduling_stats``)."""
    import onnxruntime as ort

    from softdeploy.runtime.library import library_path

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="softdeploy-profile-") as folder:
        so.profile_file_prefix = os.path.join(folder, "run")
        so.register_custom_ops_library(str(library_path()))
        with forced_isa(isa), forced_task_grain(task_grain):
            # Session does not expose the profiler; this is the only direct InferenceSession in the
            # package outside softdeploy.runtime, for this one measurement.
            sess = ort.InferenceSession(  # noqa: TID251
                kernel_model(op, sample).SerializeToString(), so, providers=["CPUExecutionProvider"]
            )
        outputs = tuple(sess.run(None, op.feeds(sample)))
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    sections, seen = 0, False
    for event in events:
        args = event.get("args", {})
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        if args.get("op_name") != op.name or "thread_scheduling_stats" not in args:
            continue
        seen = True
        sections += len(args["thread_scheduling_stats"]["main_thread"]["block_size"])
    if not seen:
        raise RuntimeError(f"{op.name}: onnxruntime's profile records no thread statistics for the node")
    return outputs, sections


# Stock onnxruntime's, torch's and TVM's own arithmetic (e.g. MLAS's exp) is looser than our kernels' contract; they
# are checked for semantic agreement, our kernels for the contract's error bound.
OTHERS_TOLERANCE = {"float32": (1e-4, 1e-30), "float16": (5e-3, 1e-5), "int8": (1e-4, 1e-30)}


def tolerance(op: OpDef, dtype: str, backend: str) -> tuple[float, float]:
    """(rtol, atol) that ``backend`` is held to on ``op`` in ``dtype``: the op's own for its kernel; for the others
    (function body, torch, TVM) OTHERS_TOLERANCE, never tighter than the kernel's (an approximation the op declares,
    as RowwiseInt8MatMul's GELU, is theirs to meet too). atol is per unit of the op's error scale (:func:`compare`)."""
    rtol, atol = op.tolerance[dtype]
    if backend == "kernel":
        return rtol, atol
    return max(rtol, OTHERS_TOLERANCE[dtype][0]), max(atol, OTHERS_TOLERANCE[dtype][1])


def compare(
    op: OpDef, sample: Sample, got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...], rtol: float, atol: float
) -> None:
    """Raises AssertionError unless got matches want: same number of outputs, shapes, integer
    outputs exactly, float outputs within (rtol, atol) with NaN in the same places; atol is multiplied by
    the op's error scale on the sample's inputs (OpDef.error_scale: 1 unless the op's error grows with an
    input, as attention's with |V|)."""
    # Exactly as many: an extra output is as wrong as a missing one (zip below would not look at it).
    assert len(got) == len(want), f"{op.name}: {len(got)} outputs, expected {len(want)}"
    scale = op.error_scale(sample.inputs, sample.attrs)
    for port, g, w in zip(op.outputs, got, want, strict=False):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"{op.name}.{port.name}: shape {g.shape}, expected {w.shape}"
        if np.issubdtype(w.dtype, np.integer) or w.dtype == bool:
            np.testing.assert_array_equal(g, w, err_msg=f"{op.name}.{port.name} ({sample.name})")
        else:
            # |g - w| <= atol s + rtol |w|  <=>  |g/s - w/s| <= atol + rtol |w/s|  (s > 0)
            s = np.broadcast_to(scale, w.shape) if np.ndim(scale) else scale
            np.testing.assert_allclose(
                g.astype(np.float64) / s,
                w / s,
                rtol=rtol,
                atol=atol,
                equal_nan=True,
                err_msg=f"{op.name}.{port.name} ({sample.name})"
                + ("" if np.ndim(scale) == 0 and scale == 1.0 else "; values divided by the error scale"),
            )
