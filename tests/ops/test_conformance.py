"""Every op x sample x backend against the float64 reference (docs/ops/ is the contract).

Backends: the function body in stock onnxruntime, the native kernel in every ISA variant this CPU
runs, the torch op. float16 runs every sample whose values fit, against the reference evaluated on
the float16-rounded inputs.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from softdeploy import conformance
from softdeploy.ops import REGISTRY

# Stock onnxruntime's and torch's own arithmetic (e.g. MLAS's exp) is looser than our kernels'
# contract; they are checked for semantic agreement, our kernels for the contract's error bound.
OTHERS_TOLERANCE = {"float32": (1e-4, 1e-30), "float16": (5e-3, 1e-5), "int8": (1e-4, 1e-30)}


# TVM backend: only where apache-tvm is installed (an optional extra). Ops TVM cannot import are
# listed in softdeploy.tvm.ops.NOT_IMPORTABLE with the reason; for them the test asserts that the
# backend refuses them naming the op, so the list cannot go stale silently.
HAVE_TVM = importlib.util.find_spec("tvm") is not None


def _tvm_samples(op) -> set[str]:
    """TVM compiles every sample (5-10 s each here), so it runs the first typical, edge and special
    sample of each op in float32 -- every op and every kind of value, within CI's time."""
    first: dict[str, str] = {}
    for s in op.samples(np.random.default_rng(0)):
        first.setdefault(s.kind, s.name)
    return set(first.values())


def _cases() -> list:
    cases = []
    for op in REGISTRY.values():
        for sample in op.samples(np.random.default_rng(0)):
            for dtype in op.float_types:
                s = conformance.cast_sample(op, sample, dtype)
                if s is None:
                    continue
                backends = [("function", None), ("torch", None)]
                backends += [("kernel", isa) for isa in conformance.available_isas()]
                if HAVE_TVM and dtype == "float32" and sample.name in _tvm_samples(op):
                    backends.append(("tvm", None))
                for backend, isa in backends:
                    tag = backend if isa is None else f"{backend}-{isa}"
                    cases.append(pytest.param(op, s, dtype, backend, isa, id=f"{op.name}-{s.name}-{tag}"))
    return cases


@pytest.mark.parametrize(("op", "sample", "dtype", "backend", "isa"), _cases())
def test_matches_reference(op, sample, dtype, backend, isa):
    want = conformance.run(op, sample, "reference")
    if backend == "tvm":
        from softdeploy.tvm.errors import UnsupportedModelError
        from softdeploy.tvm.ops import NOT_IMPORTABLE

        if op.name in NOT_IMPORTABLE:
            with pytest.raises(UnsupportedModelError, match=op.name):
                conformance.run(op, sample, backend)
            return
    got = conformance.run(op, sample, backend, isa=isa)
    for g, p in zip(got, op.outputs, strict=False):
        if p.dtype == "T":
            assert g.dtype == np.dtype(dtype), f"{op.name}.{p.name}: dtype {g.dtype}, expected {dtype}"
    rtol, atol = op.tolerance[dtype] if backend == "kernel" else OTHERS_TOLERANCE[dtype]
    conformance.compare(op, sample, got, want, rtol, atol)


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_samples_cover_special_values_and_boundaries(op):
    kinds = {s.kind for s in op.samples(np.random.default_rng(0))}
    assert {"typical", "edge", "special"} <= kinds


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_kernel_uses_threads_consistently(op):
    """Two intra-op threads split rows; results must equal the one-thread run bit for bit."""
    for sample in op.samples(np.random.default_rng(1)):
        one = conformance.run(op, sample, "kernel", threads=1)
        two = conformance.run(op, sample, "kernel", threads=2)
        for a, b in zip(one, two, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{op.name} {sample.name}")
