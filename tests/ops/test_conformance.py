"""Every op x sample x backend against the float64 reference (docs/ops/ is the contract).

Backends: the function body in stock onnxruntime, the native kernel in every ISA variant this CPU
runs, the torch op. float16 runs every sample whose values fit, against the reference evaluated on
the float16-rounded inputs.

The kernel runs models WITHOUT function bodies (conformance.kernel_model): a dtype the library does
not register fails the case instead of falling back to the body, so the kernel cases prove the
registration of every element type an op declares (test_kernel_cases_cover_every_declared_type).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from softdeploy import conformance
from softdeploy.ops import REGISTRY
from softdeploy.runtime import Session

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
                    # TVM converts and compiles each sample (seconds each): the slow tier (pyproject.toml, addopts)
                    marks = [pytest.mark.slow] if backend == "tvm" else []
                    cases.append(pytest.param(op, s, dtype, backend, isa, id=f"{op.name}-{s.name}-{tag}", marks=marks))
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
    conformance.compare(op, sample, got, want, *conformance.tolerance(op, dtype, backend))


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_samples_cover_special_values_and_boundaries(op):
    kinds = {s.kind for s in op.samples(np.random.default_rng(0))}
    assert {"typical", "edge", "special"} <= kinds


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_kernel_cases_cover_every_declared_type(op):
    """Every element type in op.float_types has kernel cases above, and those run a model with no
    function body to fall back to: without the registered kernel the session cannot even be made."""
    samples = list(op.samples(np.random.default_rng(0)))
    for dtype in op.float_types:
        cast = [s for s in (conformance.cast_sample(op, x, dtype) for x in samples) if s is not None]
        assert cast, f"{op.name}: no sample runs in {dtype}, so no case proves its kernel is registered"
        model = conformance.kernel_model(op, cast[0])
        assert not model.functions
        with pytest.raises(Exception, match=op.name):  # no library: nothing can run the node
            Session(model, kernels="portable")


def _omitting_samples() -> list:
    """(op, sample, dtype, isa) for every sample that omits an optional input with a Port.body_fill."""
    cases = []
    for op in REGISTRY.values():
        fillable = [i for i, p in enumerate(op.inputs) if p.fill is not None]
        for sample in op.samples(np.random.default_rng(0)):
            padded = list(sample.inputs) + [None] * (len(op.inputs) - len(sample.inputs))
            if not any(padded[i] is None for i in fillable):
                continue
            for dtype in op.float_types:
                s = conformance.cast_sample(op, sample, dtype)
                for isa in [] if s is None else conformance.available_isas():
                    cases.append(pytest.param(op, s, isa, id=f"{op.name}-{s.name}-{isa}"))
    return cases


@pytest.mark.parametrize(("op", "sample", "isa"), _omitting_samples())
def test_kernel_reads_an_omitted_input_as_its_fill(op, sample, isa):
    """The kernel cases feed omitted inputs their Port.body_fill (as exported models do); a model built
    by hand omits them. The kernel must give the same bits either way: "omitted" means the fill."""
    filled = conformance.run(op, sample, "kernel", isa=isa)
    omitted = conformance.run(op, sample, "kernel", isa=isa, fill_omitted=False)
    assert len(filled) == len(omitted)
    for a, b in zip(filled, omitted, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=f"{op.name} {sample.name}")


# SOFTDEPLOY_TASK_GRAIN (test-only, ops/common/kernel.h): at the default 65536 units per task the
# samples (at most 4 x 32000 entries for the row-wise ops) run as ONE task, and two threads could
# not disagree. At 1 unit per task every sample of more than one row splits into min(rows, 256) tasks.
SPLIT_GRAIN = 1


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_kernel_uses_threads_consistently(op):
    """Two intra-op threads on samples split into many tasks must equal the one-thread run bit for
    bit; the split is read from onnxruntime's profile (a test that never split could not fail)."""
    split = []
    for sample in op.samples(np.random.default_rng(1)):
        one = conformance.run(op, sample, "kernel", threads=1)
        two, sections = conformance.parallel_sections(op, sample, threads=2, task_grain=SPLIT_GRAIN)
        for a, b in zip(one, two, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{op.name} {sample.name}")
        if sections:
            split.append(sample.name)
    assert split, f"{op.name}: no sample was split into tasks at SOFTDEPLOY_TASK_GRAIN={SPLIT_GRAIN}"


def test_task_grain_is_test_only_and_checked():
    """The default grain is untouched (a 4 x 32000 softmax is one task: splitting it costs more than it
    saves); the knob is what splits it; a bad value fails kernel creation, naming the variable."""
    from softdeploy.errors import OpContractError

    op = REGISTRY["TwoPassSoftmax"]
    sample = next(s for s in op.samples(np.random.default_rng(0)) if s.name == "vocab_4x32000")
    assert conformance.parallel_sections(op, sample, threads=2)[1] == 0
    assert conformance.parallel_sections(op, sample, threads=2, task_grain=SPLIT_GRAIN)[1] >= 1
    for bad in ("0", "-5", "64k", ""):
        with pytest.raises(OpContractError, match=f"SOFTDEPLOY_TASK_GRAIN='{bad}' is not a positive integer"):
            conformance.run(op, sample, "kernel", task_grain=bad)
