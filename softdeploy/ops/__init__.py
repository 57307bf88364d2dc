"""The operator registry: the one Python list of softdeploy's ops.

Adding an op = ``softdeploy/ops/<stem>.py`` (defines ``DEF``) + its entry here + ``ops/<stem>.cc`` +
one line in ``ops/ops.inc`` (docs/guide/add-an-op.md: every other list is derived).
tests/ops/test_registry.py checks that this list, ops.inc and the ops the built library registers are
the same set.

Importing the registry is cheap (numpy and the op modules): an op's onnxscript function body is
decorated with ``@function_body`` (softdeploy/ops/_body.py) and compiled the first time it is needed,
so listing, documenting or running ops through the kernels never imports onnxscript.
"""

from __future__ import annotations

# One op per line, sorted by op name (merge-friendly; test_registry.py checks it against ops.inc).
from softdeploy.ops import (
    adaptive_temperature_softmax,
    lora_mixer,
    max_sim,
    multi_max,
    nystrom_gaussian_attention,
    rowwise_int8_matmul,
    signed_max_sim,
    soft_nms,
    soft_token_embedding,
    softmax_topk,
    softpick,
    softpick_attention,
    two_pass_softmax,
)
from softdeploy.ops._schema import ErrorCase, OpDef, Sample

_DEFS = (
    adaptive_temperature_softmax.DEF,
    lora_mixer.DEF,
    max_sim.DEF,
    multi_max.DEF,
    nystrom_gaussian_attention.DEF,
    rowwise_int8_matmul.DEF,
    signed_max_sim.DEF,
    soft_nms.DEF,
    soft_token_embedding.DEF,
    softmax_topk.DEF,
    softpick.DEF,
    softpick_attention.DEF,
    two_pass_softmax.DEF,
)
REGISTRY: dict[str, OpDef] = {d.name: d for d in sorted(_DEFS, key=lambda d: d.name)}


def get(name: str) -> OpDef:
    """The OpDef of op ``name``; SoftdeployError listing softdeploy's ops for an unknown name."""
    from softdeploy.errors import SoftdeployError

    try:
        return REGISTRY[name]
    except KeyError:
        raise SoftdeployError(f"unknown op {name!r}; softdeploy ops are {sorted(REGISTRY)}") from None


_schemas_registered = False


def register_onnx_schemas() -> None:
    """Registers every op's schema with onnx (idempotent), so onnx.checker and shape inference know
    domain com.softdeploy."""
    global _schemas_registered
    if _schemas_registered:
        return
    for d in REGISTRY.values():
        d.register_onnx_schema()
    _schemas_registered = True


__all__ = ["REGISTRY", "ErrorCase", "OpDef", "Sample", "get", "register_onnx_schemas"]
