"""Does an exported model compute what the torch module computes?

:func:`validate_export` runs the module in torch (eager) and the ONNX model on onnxruntime twice --
with softdeploy's kernels registered (``native``) and without them, so onnxruntime runs the standard-
ONNX function bodies (``portable``, what a user without softdeploy gets) -- and compares every output
with its own tolerance: floats by ``|got - want| <= atol + rtol |want|`` with NaN where torch has NaN,
integers and bools exactly.

When a backend disagrees, :func:`localize_divergence` finds the first diverging node:

1. torch side: the module's ExportedProgram (``torch.export``, the graph the ONNX model was
   translated from) runs node by node under a ``torch.fx.Interpreter`` that records every value. The
   dynamo exporter names each ONNX value after the FX node that produced it, so these recordings
   line up with the ONNX graph by name.
2. ONNX side: a copy of the model whose every node output is also a graph output runs in the failing
   configuration.
3. The nodes are walked in graph (topological) order; each output is compared with the torch value of
   the same name, or -- for values torch does not have (e.g. after an ONNX-level rewrite) -- with the
   other onnxruntime configuration. The first node whose output disagrees is reported, with whether
   its inputs agreed (then the node itself is the cause) and its torch source location.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from softdeploy.errors import RuntimeFailure

# (rtol, atol) per dtype. Looser than the op kernels' own contracts: a whole model accumulates the
# differing arithmetic of torch, MLAS and our kernels (GEMM summation order, exp approximations).
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "float64": (1e-7, 1e-9),
    "bfloat16": (2e-2, 1e-2),
}
BACKENDS = ("native", "portable")
BACKEND_DESCRIPTION = {
    "native": "onnxruntime + softdeploy kernels",
    "portable": "stock onnxruntime (function bodies)",
}

Tolerance = tuple[float, float]


@dataclasses.dataclass(frozen=True)
class OutputCheck:
    """One output of one backend against torch."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    ok: bool
    max_abs_err: float
    max_rel_err: float
    mismatched: int  # elements outside the tolerance (or the whole tensor on a shape/dtype mismatch)
    rtol: float
    atol: float
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first node (graph order) whose output disagrees with the reference."""

    node: str
    op_type: str
    domain: str
    output: str
    reference: str  # "torch" or the onnxruntime configuration compared against
    max_abs_err: float
    # True: every input is a graph input, an initializer or an intermediate that was compared and agreed,
    # so the node itself is the cause. False: some input had no reference value to compare with.
    inputs_agree: bool
    source: str  # the torch FX node the exporter recorded for it, if any

    def __str__(self) -> str:
        kind = f"{self.domain}::{self.op_type}" if self.domain else self.op_type
        cause = (
            "its inputs agree, so this node is the cause" if self.inputs_agree else "some inputs could not be compared"
        )
        where = f"; torch: {self.source}" if self.source else ""
        return (
            f"first diverging node {self.node!r} ({kind}), output {self.output!r}: max |err| "
            f"{self.max_abs_err:.3g} vs {self.reference} ({cause}){where}"
        )


@dataclasses.dataclass(frozen=True)
class BackendCheck:
    """The exported model on one onnxruntime configuration (``native`` kernels or ``portable`` function bodies) against
    torch: a check per output, the error when it could not run at all, and the first diverging node when outputs
    disagree."""

    backend: str  # "native" | "portable"
    outputs: tuple[OutputCheck, ...]
    error: str = ""  # the backend could not run the model at all
    divergence: Divergence | None = None

    @property
    def ok(self) -> bool:
        """Whether the backend ran and every output agrees with torch within tolerance."""
        return not self.error and all(o.ok for o in self.outputs)


@dataclasses.dataclass(frozen=True)
class ValidationReport:
    """The validation of an export: one BackendCheck per onnxruntime configuration."""

    checks: tuple[BackendCheck, ...]

    @property
    def ok(self) -> bool:
        """Whether every backend agrees with torch."""
        return all(c.ok for c in self.checks)

    def check(self, backend: str) -> BackendCheck:
        """The BackendCheck of ``backend`` (``native`` or ``portable``)."""
        return next(c for c in self.checks if c.backend == backend)

    def to_markdown(self) -> str:
        """A Markdown table of every backend's outputs (max abs/rel error, tolerance, mismatches), then the errors and
        the first diverging nodes."""
        lines = [
            "| backend | output | shape | dtype | max abs err | max rel err | rtol / atol | mismatched | ok |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        notes = []
        for c in self.checks:
            desc = BACKEND_DESCRIPTION[c.backend]
            if c.error:
                lines.append(f"| {desc} | (failed to run) | | | | | | | no |")
                notes.append(f"- {desc}: {c.error}")
            for o in c.outputs:
                lines.append(
                    f"| {desc} | {o.name} | {list(o.shape)} | {o.dtype} | {o.max_abs_err:.3g} | "
                    f"{o.max_rel_err:.3g} | {o.rtol:g} / {o.atol:g} | {o.mismatched} | {'yes' if o.ok else 'NO'} |"
                )
                if o.note:
                    notes.append(f"- {desc}, {o.name}: {o.note}")
            if c.divergence is not None:
                notes.append(f"- {desc}: {c.divergence}")
        return "\n".join(lines + (["", *notes] if notes else []))

    def __str__(self) -> str:
        return self.to_markdown()


# ---- comparison ----------------------------------------------------------------------------------


def compare_output(
    name: str, got: np.ndarray, want: np.ndarray, tolerance: Mapping[str, Tolerance] | Tolerance | None = None
) -> OutputCheck:
    """``got`` against ``want``: floats within (rtol, atol) with NaN exactly where ``want`` has NaN;
    everything else exactly. ``tolerance`` is one (rtol, atol) or a per-dtype mapping."""
    got, want = np.asarray(got), np.asarray(want)
    rtol, atol = _tolerance_for(want.dtype, tolerance)
    base = {"name": name, "shape": tuple(want.shape), "dtype": str(want.dtype), "rtol": rtol, "atol": atol}
    if got.shape != want.shape:
        return OutputCheck(
            **base, ok=False, max_abs_err=np.inf, max_rel_err=np.inf, mismatched=max(want.size, got.size, 1),
            note=f"shape {list(got.shape)}, torch {list(want.shape)}",
        )  # fmt: skip
    if want.size == 0:
        return OutputCheck(**base, ok=True, max_abs_err=0.0, max_rel_err=0.0, mismatched=0)
    if np.issubdtype(want.dtype, np.floating):
        g, w = got.astype(np.float64), want.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            nan_mismatch = np.isnan(g) != np.isnan(w)
            same_inf = np.isinf(w) & (g == w)
            diff = np.where(np.isnan(w) | same_inf, 0.0, np.abs(g - w))
            diff = np.where(np.isnan(diff), np.inf, diff)
            bad = nan_mismatch | (diff > atol + rtol * np.abs(np.where(np.isfinite(w), w, 0.0)))
            scale = np.abs(np.where(np.isfinite(w), w, 0.0))
            rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), 0.0)  # over nonzero references
        note = "NaN where torch has none (or the reverse)" if nan_mismatch.any() else ""
        return OutputCheck(
            **base, ok=not bad.any(), max_abs_err=float(diff.max()), max_rel_err=float(rel.max()),
            mismatched=int(bad.sum()), note=note,
        )  # fmt: skip
    bad = got != want
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64)) if want.dtype != np.bool_ else bad.astype(float)
    return OutputCheck(
        **base, ok=not bad.any(), max_abs_err=float(diff.max()), max_rel_err=0.0, mismatched=int(bad.sum()),
        note="integers and bools must match exactly" if bad.any() else "",
    )  # fmt: skip


def _tolerance_for(dtype: np.dtype, tolerance: Mapping[str, Tolerance] | Tolerance | None) -> Tolerance:
    if tolerance is not None and not isinstance(tolerance, Mapping):
        return (float(tolerance[0]), float(tolerance[1]))
    table = dict(DEFAULT_TOLERANCE)
    if tolerance is not None:
        table.update(tolerance)
    return table.get(str(np.dtype(dtype)), (0.0, 0.0))


# ---- the checks ----------------------------------------------------------------------------------


def torch_outputs(module: Any, example_inputs: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> list[Any]:
    """The module's outputs in eager torch, flattened in the exporter's output order, as numpy."""
    import torch
    import torch.utils._pytree as pytree

    with torch.no_grad():
        out = module(*example_inputs, **dict(kwargs or {}))
    return [_to_numpy(t) for t in pytree.tree_leaves(out)]


def onnx_feeds(model: Any, example_inputs: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Maps the flattened tensor inputs (args, then kwargs) onto the model's graph inputs."""
    import torch
    import torch.utils._pytree as pytree

    leaves = [x for x in pytree.tree_leaves((tuple(example_inputs), dict(kwargs or {}))) if isinstance(x, torch.Tensor)]
    names = [i.name for i in model.graph.input]
    if len(leaves) != len(names):
        raise RuntimeFailure(f"the model has {len(names)} graph inputs {names} but {len(leaves)} tensors were given")
    return {n: _to_numpy(t) for n, t in zip(names, leaves, strict=True)}


def _to_numpy(t: Any) -> np.ndarray:
    import torch

    if isinstance(t, torch.Tensor):
        return t.detach().cpu().numpy()
    return np.asarray(t)


def run_backend(
    model: Any, feeds: Mapping[str, np.ndarray], backend: str, outputs: Sequence[str] | None = None
) -> list:
    """Runs ``model`` on ``feeds`` in a Session with ``kernels=backend`` and returns ``outputs`` (default: all)."""
    from softdeploy.runtime import Session

    return Session(model, kernels=backend).run(feeds, outputs)  # type: ignore[arg-type]


def validate_export(
    model: Any,
    module: Any,
    example_inputs: Sequence[Any],
    *,
    kwargs: Mapping[str, Any] | None = None,
    tolerance: Mapping[str, Mapping[str, Tolerance] | Tolerance] | Mapping[str, Tolerance] | None = None,
    exported_program: Any = None,
    backends: Sequence[str] = BACKENDS,
) -> ValidationReport:
    """Compares ``model`` on each onnxruntime backend with ``module`` in torch eager.

    ``tolerance``: per output name ``{"logits": (rtol, atol)}`` (or a per-dtype mapping for that
    output), or per dtype ``{"float32": (rtol, atol)}`` for all outputs; DEFAULT_TOLERANCE otherwise.
    ``exported_program`` (the torch.export program the model came from) lets a failing backend be
    localised node by node against torch; without it, against the other backend only.
    """
    want = torch_outputs(module, example_inputs, kwargs)
    feeds = onnx_feeds(model, example_inputs, kwargs)
    out_names = [o.name for o in model.graph.output]
    checks = []
    for backend in backends:
        try:
            got = run_backend(model, feeds, backend)
        except Exception as e:  # any failure to run is a validation failure, reported with its message
            checks.append(BackendCheck(backend, (), error=f"{type(e).__name__}: {e}"))
            continue
        if len(got) != len(want):
            checks.append(BackendCheck(backend, (), error=f"{len(got)} ONNX outputs, torch returned {len(want)}"))
            continue
        outs = tuple(
            compare_output(name, g, w, _output_tolerance(tolerance, name))
            for name, g, w in zip(out_names, got, want, strict=True)
        )
        check = BackendCheck(backend, outs)
        if not check.ok:
            other = next((b for b in backends if b != backend), None)
            divergence = localize_divergence(
                model, feeds, backend, exported_program=exported_program, other_backend=other, tolerance=tolerance
            )
            check = dataclasses.replace(check, divergence=divergence)
        checks.append(check)
    return ValidationReport(tuple(checks))


def _output_tolerance(tolerance: Any, name: str) -> Any:
    if not tolerance:
        return None
    if name in tolerance:
        return tolerance[name]
    if all(k in DEFAULT_TOLERANCE or k.startswith(("int", "uint", "bool")) for k in tolerance):
        return tolerance  # a per-dtype table for every output
    return None


# ---- localisation --------------------------------------------------------------------------------


def torch_intermediates(exported_program: Any, example_inputs: Sequence[Any], kwargs: Any = None) -> dict:
    """Every value of the ExportedProgram's graph, by FX node name (= the ONNX value name)."""
    import torch
    import torch.utils._pytree as pytree

    gm = exported_program.module()
    values: dict[str, np.ndarray] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            result = super().run_node(n)
            if isinstance(result, torch.Tensor):
                values[n.name] = _to_numpy(result)
            elif isinstance(result, tuple | list) and n.op == "call_function":
                # multi-output ops: the exporter names the outputs getitem, getitem_1, ...
                for user in n.users:
                    if user.target is __import__("operator").getitem:
                        item = result[user.args[1]]
                        if isinstance(item, torch.Tensor):
                            values[user.name] = _to_numpy(item)
            return result

    flat = pytree.tree_leaves((tuple(example_inputs), dict(kwargs or {})))
    with torch.no_grad():
        Recorder(gm).run(*flat)
    return values


def _with_all_outputs(model: Any) -> tuple[Any, list[Any]]:
    """A copy of ``model`` whose every node output is also a graph output (typed, so onnxruntime
    accepts it), and the nodes in graph order."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output}
    for node in copy.graph.node:
        for out in node.output:
            if out and out not in present and out in types:
                vi = onnx.ValueInfoProto(name=out)
                vi.type.CopyFrom(types[out])
                copy.graph.output.append(vi)
                present.add(out)
    return copy, list(copy.graph.node)


def _run_all(model: Any, feeds: Mapping[str, np.ndarray], backend: str) -> dict[str, np.ndarray]:
    names = [o.name for o in model.graph.output]
    return dict(zip(names, run_backend(model, feeds, backend), strict=True))


def localize_divergence(
    model: Any,
    feeds: Mapping[str, np.ndarray],
    backend: str,
    *,
    exported_program: Any = None,
    example_inputs: Sequence[Any] | None = None,
    other_backend: str | None = None,
    tolerance: Any = None,
) -> Divergence | None:
    """The first node of ``model`` (graph order) whose output on ``backend`` disagrees with torch
    (values recorded from ``exported_program``) or, where torch has no value of that name, with
    ``other_backend``. None when every intermediate agrees."""
    full, nodes = _with_all_outputs(model)
    got = _run_all(full, feeds, backend)
    references: list[tuple[str, dict[str, np.ndarray]]] = []
    if exported_program is not None:
        inputs = example_inputs if example_inputs is not None else _inputs_from_feeds(model, feeds)
        references.append(("torch", torch_intermediates(exported_program, inputs)))
    if other_backend is not None:
        try:
            references.append((BACKEND_DESCRIPTION[other_backend], _run_all(full, feeds, other_backend)))
        except Exception:  # the other backend failing too leaves torch as the only reference
            pass
    # Values known to agree: graph inputs and initializers (the same on both sides), then every
    # intermediate that was compared and agreed.
    agreed = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    for node in nodes:
        for out in node.output:
            if out not in got:
                continue
            for ref_name, ref in references:
                if out not in ref or np.shape(ref[out]) != np.shape(got[out]):
                    continue
                check = compare_output(out, got[out], ref[out], _output_tolerance(tolerance, out) or tolerance)
                if not check.ok:
                    return Divergence(
                        node=node.name or out,
                        op_type=node.op_type,
                        domain=node.domain,
                        output=out,
                        reference=ref_name,
                        max_abs_err=check.max_abs_err,
                        inputs_agree=all(i in agreed for i in node.input if i),
                        source=_fx_source(node),
                    )
                agreed.add(out)
                break  # compared against the first reference that has this value
    return None


def _inputs_from_feeds(model: Any, feeds: Mapping[str, np.ndarray]) -> list[Any]:
    import torch

    return [torch.from_numpy(np.asarray(feeds[i.name])) for i in model.graph.input]


def _fx_source(node: Any) -> str:
    for prop in node.metadata_props:
        if prop.key == "namespace":
            return prop.value.strip(": ")
    return ""
