"""The judgement of one fuzz case: reference vs the native kernel on every ISA this CPU runs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from softdeploy import OpContractError, SoftdeployError, conformance
from softdeploy.ops import REGISTRY, OpDef, Sample


@dataclasses.dataclass
class Outcome:
    """``kind``: "ok" (the kernel matches the reference on every ISA), "refused" (reference and kernel
    refuse it with a clear error), or "finding" (``detail`` says what went wrong, per ISA)."""

    kind: str
    detail: str = ""


def reference(op: OpDef, sample: Sample) -> tuple[np.ndarray, ...] | OpContractError:
    with np.errstate(all="ignore"):
        try:
            return tuple(np.asarray(o) for o in op.reference(*sample.inputs, **sample.attrs))
        except OpContractError as e:
            return e


def _rounded(want: np.ndarray, like: np.ndarray) -> np.ndarray:
    """The reference rounded to the kernel's output type (a float64 value beyond float32's range is
    inf in float32: the correctly rounded result), back in float64 for the comparison."""
    if want.dtype.kind != "f" or like.dtype.kind != "f":
        return want
    with np.errstate(over="ignore"):
        return want.astype(like.dtype).astype(np.float64)


def compare(op: OpDef, sample: Sample, dtype: str, got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> str:
    """'' when ``got`` matches ``want`` within the op's declared tolerance for ``dtype`` (atol times the
    op's error scale on the sample's inputs, OpDef.error_scale), else why not."""
    rtol, atol = op.tolerance[dtype]
    scale = op.error_scale(sample.inputs, sample.attrs)
    if len(got) < len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for port, g, w in zip(op.outputs, got, want, strict=False):
        g = np.asarray(g)
        if port.dtype == "T" and g.dtype != np.dtype(dtype):
            return f"{port.name}: dtype {g.dtype}, expected {dtype}"
        if g.shape != w.shape:
            return f"{port.name}: shape {list(g.shape)}, expected {list(w.shape)}"
        if np.issubdtype(w.dtype, np.integer) or w.dtype == bool:
            if not np.array_equal(g, w):
                bad = np.argwhere(g != w)[0]
                return f"{port.name}: {int((g != w).sum())} of {g.size} differ, first at {bad.tolist()}: got {g[tuple(bad)]}, want {w[tuple(bad)]}"
            continue
        w64, g64 = _rounded(w, g), g.astype(np.float64)
        nan_g, nan_w = np.isnan(g64), np.isnan(w64)
        if not np.array_equal(nan_g, nan_w):
            at = np.argwhere(nan_g != nan_w)[0]
            return (
                f"{port.name}: NaN where the reference is not (or the reverse): {int((nan_g != nan_w).sum())} of "
                f"{g.size}, first at {at.tolist()}: got {g64[tuple(at)]!r}, want {w64[tuple(at)]!r}"
            )
        with np.errstate(invalid="ignore"):
            same = (g64 == w64) | nan_g | (np.abs(g64 - w64) <= atol * scale + rtol * np.abs(w64))
        if not same.all():
            at = np.argwhere(~same)
            with np.errstate(invalid="ignore", divide="ignore"):
                rel = np.abs(g64 - w64) / np.abs(w64)
            worst = tuple(at[np.nanargmax(np.where(np.isfinite(rel[~same]), rel[~same], np.inf))])
            return (
                f"{port.name}: {len(at)} of {g.size} out of tolerance (rtol {rtol:g}, atol {atol:g}"
                f"{'' if np.ndim(scale) == 0 and scale == 1.0 else ' x error scale'}); worst at "
                f"{list(worst)}: got {g64[worst]!r}, want {w64[worst]!r} (relative {rel[worst]:.3g})"
            )
    return ""


def run_kernel(
    op: OpDef, sample: Sample, isa: str | None, threads: int = 1
) -> tuple[np.ndarray, ...] | SoftdeployError:
    """The native kernel only (``isa`` None: the default variant): the model carries no function body,
    so a dispatch miss is an error, not a silent run of the body."""
    from softdeploy.runtime import Session

    model = op.make_model(sample, with_function=False)
    try:
        with conformance.forced_isa(isa):
            session = Session(model, kernels="native", threads=threads)
        return tuple(session.run(op.feeds(sample)))
    except SoftdeployError as e:
        return e


def judge(op: OpDef, sample: Sample, dtype: str, isas: list[str]) -> Outcome:
    want = reference(op, sample)
    problems = []
    for isa in isas:
        got = run_kernel(op, sample, isa)
        if isinstance(want, OpContractError):
            if not isinstance(got, SoftdeployError):
                problems.append(f"{isa}: ran where the reference refuses ({want})")
            elif not isinstance(got, OpContractError):
                problems.append(f"{isa}: refused with {type(got).__name__}, not OpContractError: {got}")
            elif not str(got).startswith(f"{op.name}: "):
                problems.append(f"{isa}: the error does not name the op: {got}")
            continue
        if isinstance(got, SoftdeployError):
            problems.append(f"{isa}: refused what the reference accepts: {type(got).__name__}: {got}")
            continue
        why = compare(op, sample, dtype, got, want)
        if why:
            problems.append(f"{isa}: {why}")
    if problems:
        return Outcome("finding", "; ".join(problems))
    return Outcome("refused" if isinstance(want, OpContractError) else "ok")


def total_elements(sample: Sample) -> int:
    return sum(math.prod(np.shape(v)) for v in sample.inputs if v is not None)


def op_names() -> list[str]:
    return list(REGISTRY)
