"""``softdeploy.export(module, example_inputs)``: export, check, validate, save.

Any ``nn.Module`` with example inputs is accepted; calls to ``torch.ops.softdeploy.*`` (e.g. the
modules of :mod:`softdeploy.nn`) become ``com.softdeploy`` nodes with their function bodies attached.
The model is validated against torch eager on onnxruntime with softdeploy's kernels and on stock
onnxruntime (function bodies) -- see :mod:`softdeploy.export.validate` for the method.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from softdeploy.errors import ExportError
from softdeploy.export.torch_export import DEFAULT_OPSET, export_program
from softdeploy.export.validate import BACKENDS, DEFAULT_TOLERANCE, Tolerance, ValidationReport, validate_export


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What ``softdeploy.export`` produced: the ONNX model (com.softdeploy nodes with their function bodies,
    onnx.checker clean), where it was written (None when no path was given) and the validation report against torch
    (None when ``validate=False``)."""

    model: Any  # onnx.ModelProto: com.softdeploy nodes + their function bodies, onnx.checker clean
    path: Path | None  # where it was written, if anywhere
    validation: ValidationReport | None  # None when validate=False

    @property
    def custom_ops(self) -> list[str]:
        """The com.softdeploy op types the model uses."""
        from softdeploy.domain import DOMAIN

        return sorted({n.op_type for n in self.model.graph.node if n.domain == DOMAIN})


def export(
    module: Any,
    example_inputs: Sequence[Any] | Any,
    path: str | Path | None = None,
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    dynamic_shapes: Any = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    opset: int = DEFAULT_OPSET,
    validate: bool = True,
    tolerance: Mapping[str, Any] | Tolerance | None = None,
    backends: Sequence[str] = BACKENDS,
    strict: bool = True,
    overwrite: bool = False,
) -> ExportResult:
    """Exports ``module(*example_inputs, **example_kwargs)`` to ONNX and validates it.

    The module is exported in eval mode (its training flag is restored afterwards). ``tolerance``:
    ``(rtol, atol)`` for every float output, ``{"float32": (rtol, atol), ...}`` per dtype, or
    ``{"output_name": (rtol, atol), ...}`` per output; by default the per-dtype defaults, for a routed (LoRA-Mixer)
    model per output derived from its adapters' magnitude (:mod:`softdeploy.lora.tolerance`). With ``strict`` a failed validation raises
    ExportError carrying the report (nothing is written); otherwise the report is returned.
    ``path`` is written only after validation passed, never over an existing file unless ``overwrite``.
    """
    import torch

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    args = tuple(example_inputs)
    if path is not None and Path(path).exists() and not overwrite:
        raise ExportError(f"{path} exists; pass overwrite=True (CLI: --overwrite) to replace it")
    was_training = bool(getattr(module, "training", False))
    if hasattr(module, "eval"):
        module.eval()
    try:
        model, program = export_program(
            module,
            args,
            kwargs=dict(example_kwargs) if example_kwargs else None,
            dynamic_shapes=dynamic_shapes,
            input_names=input_names,
            output_names=output_names,
            opset=opset,
        )
        report = None
        if validate:
            checked = _normalize_tolerance(tolerance)
            if checked is None:
                checked = _routed_tolerance(module, args, example_kwargs, [o.name for o in model.graph.output])
            report = validate_export(
                model,
                module,
                args,
                kwargs=example_kwargs,
                tolerance=checked,
                exported_program=program,
                backends=backends,
            )
    finally:
        if was_training:
            module.train()
    if report is not None and not report.ok and strict:
        error = ExportError(f"the exported model disagrees with torch:\n{report.to_markdown()}")
        error.report = report  # type: ignore[attr-defined]
        raise error
    if path is not None:
        from softdeploy.files import save_model

        save_model(model, path)  # a temporary file beside ``path``, renamed once complete
    return ExportResult(model=model, path=Path(path) if path is not None else None, validation=report)


def _routed_tolerance(
    module: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None, output_names: Sequence[str]
) -> dict[str, Tolerance] | None:
    """A routed (LoRA-Mixer) model's per-output tolerance derived from its adapters' magnitude
    (:mod:`softdeploy.lora.tolerance`); None (the per-dtype defaults) for any other module."""
    from torch import nn

    from softdeploy.lora.mixer import mixers

    if not isinstance(module, nn.Module) or not mixers(module):
        return None
    from softdeploy.lora.tolerance import routed_output_tolerance

    return routed_output_tolerance(module, args, kwargs, output_names, DEFAULT_TOLERANCE) or None


def _normalize_tolerance(tolerance: Any) -> Any:
    if tolerance is None or isinstance(tolerance, Mapping):
        return tolerance
    rtol, atol = tolerance
    return {"float32": (rtol, atol), "float16": (rtol, atol), "float64": (rtol, atol)}
