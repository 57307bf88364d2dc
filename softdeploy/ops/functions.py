"""The portable fallback: every com.softdeploy node of a model carries a standard-ONNX function body
as a model-local FunctionProto. onnxruntime prefers a registered kernel over a model-local function
of the same domain/name and runs the body when softdeploy's library is not registered; TVM and
onnx.reference need the bodies inlined first (:func:`inline_function_bodies`).
"""

from __future__ import annotations

from typing import Any

from softdeploy.domain import DOMAIN
from softdeploy.ops._attach import _fill_omitted_inputs as _fill_omitted_inputs
from softdeploy.ops._attach import _nodes as _nodes
from softdeploy.ops._attach import attach_bodies
from softdeploy.ops._attach import default_opset as default_opset


def attach_function_bodies(model: Any) -> Any:
    """Appends (in place, and returns) the function body of every com.softdeploy op the model uses
    and does not already define, targeted at the model's default opset; adds the domain import.
    Omitted optional inputs with a ``Port.body_fill`` get their fill, missing trailing outputs an
    empty slot (both needed for stock onnxruntime to load the bodies; see _fill_omitted_inputs).
    Every op's ONNX schema is registered first (onnx.checker and shape inference then know them)."""
    from softdeploy.ops import REGISTRY, register_onnx_schemas

    register_onnx_schemas()
    return attach_bodies(model, REGISTRY)


def inline_function_bodies(model: Any) -> Any:
    """A copy of the model with every com.softdeploy function inlined (standard ops only)."""
    import onnx.inliner

    attach_function_bodies(model)
    targets = [(DOMAIN, f.name) for f in model.functions if f.domain == DOMAIN]
    return onnx.inliner.inline_selected_functions(model, targets, exclude=False)
