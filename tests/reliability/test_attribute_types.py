"""Attribute types: every numeric attribute of every op given in the other numeric type (INT for a
FLOAT attribute, FLOAT for an INT one, as onnx.helper.make_node(..., temperature=2) does), a string
attribute given as an INT, an out-of-range value in the wrong type, and a misspelled attribute.

The rule (issue 11, defect 2): a numeric attribute of the other numeric type is converted exactly or
refused with a clear error, never silently replaced by its default; an unknown attribute is refused;
and the kernel and the function body give the same answer (both the same values, or both an error).
"""

from __future__ import annotations

import numpy as np
import pytest

from softdeploy import OpContractError, SoftdeployError
from softdeploy.ops import REGISTRY, OpDef, Sample


def _base(op: OpDef) -> Sample:
    return next(s for s in op.samples(np.random.default_rng(0)) if s.kind == "typical")


def _run(
    op: OpDef, sample: Sample, backend: str, attrs: dict | None = None
) -> tuple[np.ndarray, ...] | SoftdeployError:
    """The op on ``sample``; ``attrs`` replace the node's attributes as given (their Python type picks
    the ONNX type, as in onnx.helper.make_node), without the typed path of make_model."""
    from onnx import helper

    from softdeploy.runtime import Session

    model = op.make_model(sample, with_function=backend == "function")
    if attrs:
        node = next(n for n in model.graph.node if n.op_type == op.name)
        keep = [a for a in node.attribute if a.name not in attrs]
        del node.attribute[:]
        node.attribute.extend(keep + [helper.make_attribute(k, v) for k, v in attrs.items()])
    try:
        session = Session(model, kernels="native" if backend == "kernel" else "portable")
        return tuple(session.run(op.feeds(sample)))
    except SoftdeployError as e:
        return e


def _cases() -> list:
    cases = []
    for op in REGISTRY.values():
        base = _base(op)
        for a in op.attrs:
            value = base.attrs.get(a.name, None if a.required else a.default)
            if a.kind is float:
                v = max(1, round(value))  # an integral, valid value
                cases.append((op.name, f"{a.name}=INT {v}", {a.name: int(v)}, {a.name: float(v)}))
                cases.append((op.name, f"{a.name}=INT 0", {a.name: 0}, {a.name: 0.0}))
                cases.append((op.name, f"{a.name}=INT -1", {a.name: -1}, {a.name: -1.0}))
            elif a.kind is int:
                cases.append((op.name, f"{a.name}=FLOAT {float(value)}", {a.name: float(value)}, {a.name: value}))
                cases.append((op.name, f"{a.name}=FLOAT {value}.5", {a.name: value + 0.5}, None))
            elif a.kind is str:
                cases.append((op.name, f"{a.name}=INT 1", {a.name: 1}, None))
        first = op.attrs[0].name if op.attrs else "axis"
        cases.append((op.name, f"misspelled {first}x", {f"{first}x": base.attrs.get(first, 1)}, None))
    return cases


CASES = _cases()


def _equal(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x, y, equal_nan=x.dtype.kind == "f") for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize(
    ("name", "label", "attrs", "typed"),
    [
        pytest.param(
            n,
            lab,
            at,
            ty,
            id=f"{n}-{lab}",
        )
        for n, lab, at, ty in CASES
    ],
)
def test_attribute_of_another_type_is_converted_exactly_or_refused(name, label, attrs, typed):
    op = REGISTRY[name]
    base = _base(op)
    answers = {}
    for backend in ("kernel", "function"):
        got = _run(op, base, backend, attrs)
        if isinstance(got, SoftdeployError):
            assert isinstance(got, OpContractError) and str(got).startswith(f"{name}: "), (backend, repr(got))
            answers[backend] = "refused"
            continue
        assert typed is not None, f"{backend} ran {label}, which has no exact conversion"
        right = _run(op, base, backend, typed)
        if isinstance(right, SoftdeployError):
            raise AssertionError(f"{backend} ran {label} but refuses the correctly typed value: {right}")
        assert _equal(got, right), f"{backend}: {label} does not run as its exact conversion {typed}"
        answers[backend] = "converted"
    assert answers["kernel"] == answers["function"], answers


# A list or tensor where a scalar is declared, as onnxruntime's kernel sees it (Session's own check refuses
# these first, so the model goes to onnxruntime directly): the kernel names the declared type and what it
# got. onnxruntime's array getters do not check the attribute's type (a FLOATS or STRINGS attribute read as
# INTS is a list of 0 values), so "INTS of 0 values" for a FLOATS or STRINGS attribute was the kernel guessing.
_NON_SCALARS = {
    "INTS": ([1, 2], "got INTS of 2 values"),
    "FLOATS": ([0.5, 1.5], "got FLOATS of 2 values"),
    "STRINGS": (["a", "b"], "got a list without numbers (STRINGS, or an empty INTS or FLOATS)"),
    "TENSOR": (None, "got TENSOR"),
}


def _kernel_error(op: OpDef, sample: Sample, attribute) -> str:
    import onnxruntime as ort

    from softdeploy.runtime import library_path

    model = op.make_model(sample, with_function=False)
    node = next(n for n in model.graph.node if n.op_type == op.name)
    keep = [a for a in node.attribute if a.name != attribute.name]
    del node.attribute[:]
    node.attribute.extend([*keep, attribute])
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(library_path()))
    so.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])  # noqa: TID251
    except Exception as e:  # onnxruntime's own exception types differ by version
        return str(e)
    return ""


@pytest.mark.parametrize("kind", list(_NON_SCALARS))
@pytest.mark.parametrize(
    ("name", "attr"),
    [pytest.param(op.name, a.name, id=f"{op.name}-{a.name}") for op in REGISTRY.values() for a in op.attrs],
)
def test_kernel_names_the_declared_and_the_actual_type_of_a_non_scalar(name, attr, kind):
    from onnx import AttributeProto, TensorProto, helper

    op = REGISTRY[name]
    declared = next(a for a in op.attrs if a.name == attr)
    value, got = _NON_SCALARS[kind]
    if kind == "TENSOR":
        value = helper.make_tensor(attr, TensorProto.FLOAT, [1], [1.0])
    attribute = helper.make_attribute(attr, value, attr_type=getattr(AttributeProto, kind))
    message = _kernel_error(op, _base(op), attribute)
    assert f"{name}: attribute '{attr}' must be {declared.onnx_type}, {got}" in message, message
    assert "INTS of 0 values" not in message
