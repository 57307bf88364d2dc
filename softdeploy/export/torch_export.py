"""torch -> ONNX: modules that call ``torch.ops.softdeploy.*`` export to com.softdeploy nodes.

The translation table is built from the registry: each ``softdeploy::<stem>`` torch op maps to a
function emitting the com.softdeploy node (onnxscript finds the op through the ONNX schema
registered by register_onnx_schemas). torch.onnx inlines every function it records, so the portable
function bodies are attached *after* export (attach_function_bodies).
"""

from __future__ import annotations

import contextlib
import inspect
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from softdeploy.domain import DOMAIN, OPSET_VERSION
from softdeploy.errors import ExportError
from softdeploy.ops._schema import OpDef
from softdeploy.ops.functions import attach_function_bodies

DEFAULT_OPSET = 18


def _translator(d: OpDef) -> Any:
    """A Python function with the op's exact signature (inputs, then typed attributes) that emits
    the com.softdeploy node; the exporter reads inputs vs attributes from the signature."""
    from onnxscript import values

    opset = values.Opset(DOMAIN, OPSET_VERSION)
    attr_names = [a.name for a in d.attrs]

    def translate(*args: Any, **kwargs: Any) -> Any:
        n = len(d.inputs)
        inputs = list(args[:n])
        attrs = dict(zip(attr_names, args[n:], strict=False))
        attrs.update(kwargs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        return (
            getattr(opset, d.name)(*inputs, **attrs, _num_outputs=len(d.outputs))
            if len(d.outputs) > 1
            else getattr(opset, d.name)(*inputs, **attrs)
        )

    params = [
        inspect.Parameter(
            p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None if p.optional else inspect.Parameter.empty
        )
        for p in d.inputs
    ]
    params += [
        inspect.Parameter(
            a.name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=a.kind,
            default=inspect.Parameter.empty if a.required else a.default,
        )
        for a in d.attrs
    ]
    translate.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    translate.__annotations__ = {a.name: a.kind for a in d.attrs}
    translate.__name__ = d.stem
    return translate


def translation_table() -> dict[Any, Any]:
    """The torch.onnx custom translation table: each ``torch.ops.softdeploy.<stem>`` op to the function emitting its
    com.softdeploy node (registers the torch ops and ONNX schemas first)."""
    from softdeploy.ops import REGISTRY, register_onnx_schemas
    from softdeploy.ops._torch import register_torch_ops

    register_onnx_schemas()
    ops = register_torch_ops()
    return {ops[name].default: _translator(d) for name, d in REGISTRY.items()}


def drop_unused_optional_outputs(model: Any) -> Any:
    """Removes (in place, and returns) the trailing outputs of com.softdeploy nodes that their op
    declares optional and nothing reads. A torch op always returns all of its outputs, so without
    this every exported node would ask the kernel for outputs the model never uses (e.g.
    SoftmaxTopK's LogSumExp)."""
    from softdeploy.ops import REGISTRY
    from softdeploy.ops.functions import _nodes

    read = {name for node in _nodes(model.graph) for name in node.input}
    read |= {o.name for o in model.graph.output}
    for node in _nodes(model.graph):
        d = REGISTRY.get(node.op_type) if node.domain == DOMAIN else None
        if d is None:
            continue
        outputs = list(node.output)
        while len(outputs) > 1 and outputs[-1] not in read and d.outputs[len(outputs) - 1].optional:
            outputs.pop()
        for i in range(len(outputs), len(node.output)):
            node.output[i] = ""
    return model


def export_module(
    module: Any,
    args: Sequence[Any],
    path: str | Path | None = None,
    *,
    dynamic_shapes: Any = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    opset: int = DEFAULT_OPSET,
    overwrite: bool = False,
) -> Any:
    """Exports ``module(*args)`` with torch.onnx (dynamo) to an onnx.ModelProto whose soft ops are
    com.softdeploy nodes carrying their function bodies; checked with onnx.checker. Writes ``path``
    when given (refuses to replace an existing file unless ``overwrite``)."""
    model, _ = export_program(
        module,
        args,
        path,
        dynamic_shapes=dynamic_shapes,
        input_names=input_names,
        output_names=output_names,
        opset=opset,
        overwrite=overwrite,
    )
    return model


@contextlib.contextmanager
def _interrupts_kept() -> Iterator[None]:
    """Ctrl-C during the block ends it as KeyboardInterrupt even where a library catches it: torch's exporter reports
    an import that the interrupt broke as an ordinary export failure (a many-line report, exit code 2), where the
    user asked to stop. Only in the main thread and while Python's own SIGINT handler is installed."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    hit: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        hit.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        if hit:
            raise KeyboardInterrupt from e
        raise
    else:
        if hit:
            raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def export_program(
    module: Any,
    args: Sequence[Any],
    path: str | Path | None = None,
    *,
    kwargs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    opset: int = DEFAULT_OPSET,
    overwrite: bool = False,
) -> tuple[Any, Any]:
    """:func:`export_module`, also returning the torch.export ExportedProgram the ONNX graph was
    translated from (its FX node names are the ONNX value names; validation localises with it)."""
    import onnx
    import torch

    if path is not None and Path(path).exists() and not overwrite:
        raise ExportError(f"{path} exists; pass overwrite=True (CLI: --overwrite) to replace it")
    with _interrupts_kept():
        try:
            program = torch.onnx.export(
                module,
                tuple(args),
                kwargs=kwargs,
                dynamo=True,
                custom_translation_table=translation_table(),
                dynamic_shapes=dynamic_shapes,
                input_names=list(input_names) if input_names else None,
                output_names=list(output_names) if output_names else None,
                opset_version=opset,
                optimize=True,
                verbose=False,
            )
        except Exception as e:  # torch raises many exception types from the exporter
            raise ExportError(f"torch.onnx.export failed: {e}") from e
    model = attach_function_bodies(drop_unused_optional_outputs(program.model_proto))
    onnx.checker.check_model(model, full_check=True)
    lost = specialized_dims(model, module, dynamic_shapes)
    if lost:
        raise ExportError(_specialization_message(lost, module, args, kwargs, dynamic_shapes))
    if path is not None:
        from softdeploy.files import save_model

        save_model(model, path)  # a temporary file beside ``path``, renamed once complete
    return model, program.exported_program


# ---- dynamic dimensions ---------------------------------------------------------------------------------


def _is_required_dynamic(dim: Any) -> bool:
    """Whether one entry of a dynamic_shapes spec asks for a dimension that must stay symbolic.

    ``torch.export.Dim("name")``, ``Dim.DYNAMIC`` and a string name must; ``Dim.AUTO`` lets torch
    decide and ``Dim.STATIC`` / ``None`` / an int ask for a fixed size."""
    import torch

    if dim is None or isinstance(dim, int):
        return False
    if isinstance(dim, str):
        return True
    hint = getattr(torch.export.Dim, "AUTO", None), getattr(torch.export.Dim, "STATIC", None)
    if any(dim is h or (h is not None and dim == h) for h in hint):
        return False
    return True


def requested_dynamic_dims(module: Any, dynamic_shapes: Any) -> list[tuple[int, str, int]]:
    """``(input position, input name, axis)`` of every dimension ``dynamic_shapes`` asks to keep symbolic.

    Top-level tensor arguments only: a spec given by position (tuple / list) or by the name of a
    ``forward`` parameter (dict); nested structures are not checked."""
    if dynamic_shapes is None:
        return []
    if isinstance(dynamic_shapes, dict):
        forward = getattr(module, "forward", module)
        names = [p for p in inspect.signature(forward).parameters if p != "self"]
        by_position = [(names.index(k), k, v) for k, v in dynamic_shapes.items() if k in names]
    else:
        by_position = [(i, str(i), v) for i, v in enumerate(_flat_specs(dynamic_shapes))]
    out = []
    for position, name, spec in by_position:
        if isinstance(spec, dict):
            axes = spec.items()
        elif isinstance(spec, (list, tuple)):
            axes = enumerate(spec)
        else:
            continue
        out += [(position, name, int(axis)) for axis, dim in axes if _is_required_dynamic(dim)]
    return out


def _flat_specs(specs: Any) -> list[Any]:
    """A positional spec with nested groups (a ``*args`` tuple of tensors has a tuple of per-tensor specs) flattened
    into one spec per graph input, in the order the exporter flattens the inputs. A list or tuple holding a dict is a
    group; any other entry (a dict, a tuple of Dims, None) is one input's spec."""
    flat: list[Any] = []
    for spec in specs:
        if isinstance(spec, (list, tuple)) and any(isinstance(s, dict) for s in spec):
            flat += _flat_specs(spec)
        else:
            flat.append(spec)
    return flat


def specialized_dims(model: Any, module: Any, dynamic_shapes: Any) -> list[tuple[str, int, int]]:
    """The requested dynamic dimensions that the written model fixed: ``(input name, axis, size)``."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    lost = []
    for position, _, axis in requested_dynamic_dims(module, dynamic_shapes):
        if position >= len(inputs):
            continue
        dims = inputs[position].type.tensor_type.shape.dim
        if axis < len(dims) and not dims[axis].dim_param:
            lost.append((inputs[position].name, axis, int(dims[axis].dim_value)))
    return lost


def _specialization_message(
    lost: list[tuple[str, int, int]], module: Any, args: Sequence[Any], kwargs: Any, dynamic_shapes: Any
) -> str:
    """Names each dimension that became a constant and, from torch's draft export, the code that fixed it
    (a softdeploy op names itself by its module ``softdeploy/ops/<stem>.py``)."""
    which = ", ".join(f"{name!r} axis {axis} (fixed at {size})" for name, axis, size in lost)
    cause = _specialization_cause(module, args, kwargs, dynamic_shapes)
    return (
        f"the exported model lost the dynamic dimension(s) asked for: {which}. {cause}"
        " (rule: every dimension marked dynamic stays symbolic in the written model; make the code shape-generic, "
        "or mark the dimension static)"
    )


def _specialization_cause(module: Any, args: Sequence[Any], kwargs: Any, dynamic_shapes: Any) -> str:
    import re

    import torch

    from softdeploy.ops import REGISTRY

    try:
        program = torch.export.draft_export(module, tuple(args), kwargs=kwargs, dynamic_shapes=dynamic_shapes)
        report = str(getattr(program, "_report", ""))
    except Exception as e:  # the draft export is only a diagnosis; its own failure is reported as such
        return f"(torch's draft export, run to find the cause, failed: {type(e).__name__}: {e})"
    guard = re.search(r"this guard was added: (.*)", report)
    frames = re.findall(r"File (\S+), lineno (\d+), in (\w+)", report)
    stems = {d.stem: d.name for d in REGISTRY.values()}
    for path, line, func in frames:
        stem = Path(path).stem
        if Path(path).parent.name == "ops" and stem in stems:
            return f"softdeploy op {stems[stem]} fixed it ({path}:{line} in {func}: {guard.group(1) if guard else ''})."
    import os

    torch_dir = os.path.dirname(torch.__file__)
    user = [f for f in frames if not f[0].startswith(torch_dir)]
    if user:
        path, line, func = user[-1]  # innermost frame of the user's code
        return f"Fixed at {path}:{line} in {func}" + (f" (guard {guard.group(1)})." if guard else ".")
    code = re.search(r"This occurred at the following stacktrace:(?:\s*File .*\n)*\s*(\S.*?):?\n", report)
    if code:
        return f"Fixed in: {code.group(1).strip()}" + (f" (guard {guard.group(1)})." if guard else ".")
    return "torch's draft export did not say where."
