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
3. Each node is judged on its own: a copy of the model in which every node input torch has a value for reads
   torch's value instead (:func:`_cut`) runs in the failing configuration, so an error that grew upstream is not
   charged to the node that merely carries it on. The nodes are walked in graph (topological) order; each output is
   compared with the torch value of the same name, or -- for values torch does not have (e.g. after an ONNX-level
   rewrite) -- with the other onnxruntime configuration, within the node's own tolerance
   ``atol + rtol * (|ref| + M)``, ``M`` the magnitude of the terms it sums (``|A| |B|`` for a MatMul: a product of
   large factors that cancels to near zero is allowed their rounding). The first node outside it is reported, with
   whether its inputs agreed (then the node itself is the cause) and its torch source location.
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
    rtol: float = 0.0  # its own tolerance: |err| <= atol + rtol * (|ref| + the magnitude of its terms)
    atol: float = 0.0

    def __str__(self) -> str:
        kind = f"{self.domain}::{self.op_type}" if self.domain else self.op_type
        cause = (
            "its inputs agree, so this node is the cause" if self.inputs_agree else "some inputs could not be compared"
        )
        where = f"; torch: {self.source}" if self.source else ""
        return (
            f"first diverging node {self.node!r} ({kind}), output {self.output!r}: max |err| "
            f"{self.max_abs_err:.3g} vs {self.reference}, beyond its own tolerance (atol {self.atol:g} + rtol "
            f"{self.rtol:g} x (|ref| + the magnitude of its terms)) ({cause}){where}"
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
    name: str,
    got: np.ndarray,
    want: np.ndarray,
    tolerance: Mapping[str, Tolerance] | Tolerance | None = None,
    *,
    magnitude: np.ndarray | None = None,
) -> OutputCheck:
    """``got`` against ``want``: floats within (rtol, atol) with NaN exactly where ``want`` has NaN;
    everything else exactly. ``tolerance`` is one (rtol, atol) or a per-dtype mapping. ``magnitude`` (broadcastable
    to ``want``): the magnitude of the terms that were summed into each element, for a value that cancels: the bound
    is then ``atol + rtol * (|want| + magnitude)``."""
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
            scale = np.abs(np.where(np.isfinite(w), w, 0.0))
            allowed = atol + rtol * (scale if magnitude is None else scale + np.nan_to_num(magnitude, posinf=0.0))
            bad = nan_mismatch | (diff > allowed)
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


def _value_types(model: Any) -> dict[str, Any]:
    """The ONNX type of every value shape inference can type (graph inputs, intermediates, outputs)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    return {v.name: v.type for v in list(g.input) + list(g.value_info) + list(g.output)}


def _with_all_outputs(model: Any, types: Mapping[str, Any] | None = None) -> tuple[Any, list[Any]]:
    """A copy of ``model`` whose every node output is also a graph output (typed, so onnxruntime
    accepts it), and the nodes in graph order."""
    import onnx

    types = _value_types(model) if types is None else types
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


def _cut(model: Any, fed: Mapping[str, np.ndarray]) -> Any:
    """A copy of ``model`` in which every node input named in ``fed`` reads a new graph input ``<name>::torch``
    instead of its producer's output: each node then computes from torch's values of its inputs, so its own error
    is what is left (upstream rounding does not reach it). The producers still run and still output their values."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        for i, name in enumerate(node.input):
            if name in fed:
                node.input[i] = name + _FED
    for name, value in fed.items():
        copy.graph.input.append(
            onnx.helper.make_tensor_value_info(
                name + _FED, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
            )
        )
    return copy


_FED = "::torch"


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
    """The first node of ``model`` (graph order) whose output on ``backend`` exceeds its own tolerance against torch
    (values recorded from ``exported_program``) or, where torch has no value of that name, against ``other_backend``.
    None when every node agrees.

    Each node is judged on its own: its inputs are torch's values wherever torch has them (:func:`_cut`), so an error
    that grew upstream is not charged to it, and its tolerance is ``atol + rtol * (|ref| + M)``, where ``M`` is the
    magnitude of the terms the node sums (:func:`_term_magnitude`: ``|A| |B|`` for a MatMul, the experts' for a
    LoRAMixer), carried along the nodes between torch's values: a product of large factors whose result cancels to
    near zero is allowed the rounding of its factors, not of its result."""
    import onnx

    types = _value_types(model)
    full, nodes = _with_all_outputs(model, types)
    got = _run_all(full, feeds, backend)
    torch_values: dict[str, np.ndarray] = {}
    if exported_program is not None:
        inputs = example_inputs if example_inputs is not None else _inputs_from_feeds(model, feeds)
        torch_values = torch_intermediates(exported_program, inputs)
    known = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    fed = {
        name: np.ascontiguousarray(torch_values[name])
        for node in nodes
        for name in node.input
        if name in torch_values and name in got and name not in known
        and np.shape(torch_values[name]) == np.shape(got[name]) and torch_values[name].dtype == got[name].dtype
    }  # fmt: skip
    local_model = _cut(full, fed) if fed else full
    local_feeds = {**feeds, **{name + _FED: value for name, value in fed.items()}}
    if fed:
        got = _run_all(local_model, local_feeds, backend)
    references: list[tuple[str, dict[str, np.ndarray]]] = []
    if torch_values:
        references.append(("torch", torch_values))
    if other_backend is not None:
        try:
            references.append((BACKEND_DESCRIPTION[other_backend], _run_all(local_model, local_feeds, other_backend)))
        except Exception:  # the other backend failing too leaves torch as the only reference
            pass
    initializers = {t.name: t for t in model.graph.initializer}

    def value(name: str) -> np.ndarray | None:
        if name in fed:
            return fed[name]
        if name in got:
            return got[name]
        if name in feeds:
            return np.asarray(feeds[name])
        if name in initializers:
            return onnx.numpy_helper.to_array(initializers[name])
        return None

    # Values known to agree: graph inputs, initializers and torch's values fed to the nodes (the same on both sides),
    # then every intermediate that was compared and agreed.
    agreed = known | set(fed)
    magnitude: dict[str, np.ndarray] = {}  # M of the values computed from other computed values (none: 0)
    for node in nodes:
        terms = _term_magnitude(node, value, magnitude)
        for k, out in enumerate(node.output):
            if out not in got:
                continue
            m = terms[k] if k < len(terms) else None
            compared = False
            for ref_name, ref in references:
                if out not in ref or np.shape(ref[out]) != np.shape(got[out]):
                    continue
                tol = _output_tolerance(tolerance, out) or tolerance
                check = compare_output(out, got[out], ref[out], tol, magnitude=m)
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
                        rtol=check.rtol,
                        atol=check.atol,
                    )
                agreed.add(out)
                compared = True
                break  # compared against the first reference that has this value
            if not compared and m is not None:
                magnitude[out] = m  # not judged here: its terms' magnitude goes on to the nodes that use it
    return None


def _term_magnitude(node: Any, value: Any, magnitude: Mapping[str, np.ndarray]) -> list[np.ndarray | None]:
    """Per output of ``node``, ``M``: the magnitude of the terms it sums (float64, broadcastable to the output), plus
    the magnitude carried in from inputs that were not compared (``magnitude``); None where there is nothing to add
    (the output's own ``|ref|`` in the tolerance covers an elementwise op's rounding)."""
    ins = [value(i) if i else None for i in node.input]
    if any(v is None for v in ins[:2]) and node.op_type in ("MatMul", "Gemm", "Add", "Sub", "Mul", "Div"):
        return []
    a64 = [np.abs(np.asarray(v, dtype=np.float64)) if v is not None and _is_float(v) else None for v in ins]
    carried = [magnitude.get(i) if i else None for i in node.input]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if node.op_type == "MatMul" and a64[0] is not None and a64[1] is not None:
            ma = a64[0] if carried[0] is None else a64[0] + carried[0]
            mb = a64[1] if carried[1] is None else a64[1] + carried[1]
            return [np.matmul(ma, mb)]
        if node.op_type == "Gemm" and a64[0] is not None and a64[1] is not None:
            attrs = {a.name: a for a in node.attribute}
            ma = a64[0] if carried[0] is None else a64[0] + carried[0]
            mb = a64[1] if carried[1] is None else a64[1] + carried[1]
            ma = ma.T if attrs.get("transA") is not None and attrs["transA"].i else ma
            mb = mb.T if attrs.get("transB") is not None and attrs["transB"].i else mb
            alpha = abs(attrs["alpha"].f) if "alpha" in attrs else 1.0
            beta = abs(attrs["beta"].f) if "beta" in attrs else 1.0
            out = alpha * (ma @ mb)
            if len(a64) > 2 and a64[2] is not None:
                out = out + beta * a64[2]
            return [out]
        if node.op_type == "LoRAMixer" and len(a64) >= 3 and all(v is not None for v in a64[:3]):
            scaling = next((abs(a.f) for a in node.attribute if a.name == "scaling"), 1.0)
            x = a64[0] if carried[0] is None else a64[0] + carried[0]
            u = np.einsum("...i,eri->...er", x, a64[1])  # |A_e| |x|, every expert: a bound over the routing
            return [scaling * np.einsum("...er,eor->...o", u, a64[2])]
        if node.op_type in ("Add", "Sub") and (carried[0] is not None or carried[1] is not None):
            return [sum(c for c in carried[:2] if c is not None)]
        if node.op_type == "Mul" and a64[0] is not None and a64[1] is not None:
            if carried[0] is None and carried[1] is None:
                return []
            return [(carried[0] if carried[0] is not None else 0.0) * a64[1]
                    + a64[0] * (carried[1] if carried[1] is not None else 0.0)]  # fmt: skip
        if node.op_type == "Div" and a64[0] is not None and a64[1] is not None:
            if carried[0] is None and carried[1] is None:
                return []
            c0 = carried[0] if carried[0] is not None else 0.0
            c1 = carried[1] if carried[1] is not None else 0.0
            return [c0 / a64[1] + a64[0] * c1 / np.square(a64[1])]
    # any other op: the largest magnitude carried in, everywhere (a shape op moves it; a bounded op does not grow it)
    present = [float(np.max(c)) for c in carried if c is not None and c.size]
    return [np.float64(max(present))] * len(node.output) if present else []


def _is_float(v: Any) -> bool:
    return np.issubdtype(np.asarray(v).dtype, np.floating)


def _inputs_from_feeds(model: Any, feeds: Mapping[str, np.ndarray]) -> list[Any]:
    import torch

    return [torch.from_numpy(np.asarray(feeds[i.name])) for i in model.graph.input]


def _fx_source(node: Any) -> str:
    for prop in node.metadata_props:
        if prop.key == "namespace":
            return prop.value.strip(": ")
    return ""
