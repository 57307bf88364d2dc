"""Run any op on any backend, so that one test (tests/ops/test_conformance.py) can compare every
op x sample x backend against the float64 reference.

Backends:
  ``reference``  the float64 NumPy oracle (softdeploy/ops/<stem>.py)
  ``function``   the standard-ONNX function body in stock onnxruntime (library not registered)
  ``kernel``     the native C++ kernel in onnxruntime, optionally forced to an ISA variant
  ``torch``      the ``softdeploy::<stem>`` torch op, run eagerly
  ``tvm``        TVM (Relax) for the sample's static shapes: the op's TIR compute, or its inlined
                 function body when it has none (needs apache-tvm; see softdeploy/tvm/)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np

from softdeploy.ops._schema import OpDef, Sample

BACKENDS = ("reference", "function", "kernel", "torch", "tvm")
ISAS = ("portable", "avx2", "avx512")


def available_isas() -> list[str]:
    """Kernel variants this CPU can run, as the kernel library detects them (SoftdeployLibraryInfo;
    SOFTDEPLOY_ISA does not change this list). Without a usable library, the same rule as
    ops/common/cpu.cc applied to /proc/cpuinfo (kernel runs then fail on the missing library)."""
    from softdeploy.runtime.library import library_status

    info = library_status().info
    if info is not None:
        return list(ISAS[: ISAS.index(info.isa_detected) + 1])
    from softdeploy.compare.environment import cpuinfo

    _, flags = cpuinfo()
    out = ["portable"]
    if {"avx2", "fma"} <= flags:
        out.append("avx2")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        out.append("avx512")
    return out


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


def run(op: OpDef, sample: Sample, backend: str, *, isa: str | None = None, threads: int = 1) -> tuple[np.ndarray, ...]:
    """Runs ``op`` on ``sample`` with one backend: ``reference`` (float64 NumPy), ``function`` (the function body on
    onnxruntime), ``kernel`` (the native kernel, at variant ``isa`` when given), ``torch`` (the eager torch op) or
    ``tvm``; returns the outputs as arrays."""
    if backend == "reference":
        return tuple(np.asarray(o) for o in op.reference(*sample.inputs, **sample.attrs))
    if backend in ("function", "kernel"):
        from softdeploy.runtime import Session

        model = op.make_model(sample, with_function=True)
        kernels = "native" if backend == "kernel" else "portable"
        with forced_isa(isa if backend == "kernel" else None):
            session = Session(model, kernels=kernels, threads=threads)
        return tuple(session.run(op.feeds(sample)))
    if backend == "torch":
        import torch

        from softdeploy.ops._torch import torch_op

        args = [None if v is None else torch.from_numpy(np.array(v, copy=True)) for v in sample.inputs]
        out = torch_op(op)(*args, **sample.attrs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(o.detach().numpy() for o in outs)
    if backend == "tvm":
        from softdeploy.runtime.tvm import TVMSession

        shapes = {p.name: list(np.shape(v)) for p, v in zip(op.inputs, sample.inputs, strict=False) if v is not None}
        return tuple(TVMSession(op.make_model(sample), shapes=shapes, threads=threads).run(op.feeds(sample)))
    raise ValueError(f"unknown backend {backend!r}; backends are {BACKENDS}")


def compare(
    op: OpDef, sample: Sample, got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...], rtol: float, atol: float
) -> None:
    """Raises AssertionError unless got matches want: same number of outputs, shapes, integer
    outputs exactly, float outputs within (rtol, atol) with NaN in the same places."""
    assert len(got) >= len(want) or len(got) == len(want), f"{op.name}: {len(got)} outputs, expected {len(want)}"
    for port, g, w in zip(op.outputs, got, want, strict=False):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"{op.name}.{port.name}: shape {g.shape}, expected {w.shape}"
        if np.issubdtype(w.dtype, np.integer) or w.dtype == bool:
            np.testing.assert_array_equal(g, w, err_msg=f"{op.name}.{port.name} ({sample.name})")
        else:
            np.testing.assert_allclose(
                g.astype(np.float64),
                w,
                rtol=rtol,
                atol=atol,
                equal_nan=True,
                err_msg=f"{op.name}.{port.name} ({sample.name})",
            )
