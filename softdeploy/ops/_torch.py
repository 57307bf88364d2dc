"""The ``softdeploy::<stem>`` torch ops, built from the registry on first use (torch is imported
only here, and only when a torch op is asked for).

Each op gets: a schema derived from its ports and attributes (OpDef.torch_schema), its eager
implementation (OpDef.torch_impl) for CPU, and a fake implementation for tracing
(OpDef.torch_fake, or torch_impl itself run on fake tensors).
"""

from __future__ import annotations

import functools
from typing import Any

from softdeploy.ops._schema import OpDef

NAMESPACE = "softdeploy"
_LIBRARY: Any = None  # the torch.library.Library that owns our definitions; must stay alive


@functools.cache
def register_torch_ops() -> dict[str, Any]:
    """Defines every registry op in torch (idempotent); returns {op name: OpOverloadPacket}."""
    import torch

    from softdeploy.ops import REGISTRY

    global _LIBRARY
    _LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
    out = {}
    for d in REGISTRY.values():
        if not hasattr(getattr(torch.ops, NAMESPACE), d.stem):
            _LIBRARY.define(d.stem + d.torch_schema())
            _LIBRARY.impl(d.stem, _eager(d), "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NAMESPACE}::{d.stem}", d.torch_fake or _eager(d), lib=_LIBRARY)
        out[d.name] = getattr(getattr(torch.ops, NAMESPACE), d.stem)
    return out


def _eager(d: OpDef) -> Any:
    names = [a.name for a in d.attrs]

    def impl(*args: Any) -> Any:
        n = len(d.inputs)
        tensors, attr_values = args[:n], args[n:]
        return d.torch_impl(*tensors, **dict(zip(names, attr_values, strict=False)))

    return impl


def torch_op(d: OpDef) -> Any:
    """The torch op of ``d``, callable as op(*tensors, **attrs)."""
    return register_torch_ops()[d.name]
