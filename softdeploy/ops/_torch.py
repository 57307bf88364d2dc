"""The ``softdeploy::<stem>`` torch ops, built from the registry on first use (torch is imported
only here, and only when a torch op is asked for).

Each op gets: a schema derived from its ports and attributes (OpDef.torch_schema), its eager
implementation (OpDef.torch_impl) for CPU, a fake implementation for tracing (OpDef.torch_fake, or
torch_impl itself run on fake tensors), and an autograd formula -- the gradient of torch_impl,
recomputed in the backward pass -- so models that use the ops train as they will be exported.
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
            setup_context, backward = _autograd(d)
            torch.library.register_autograd(
                f"{NAMESPACE}::{d.stem}", backward, setup_context=setup_context, lib=_LIBRARY
            )
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


def _autograd(d: OpDef) -> tuple[Any, Any]:
    """Backward = autograd through torch_impl on the saved inputs (recomputed: the ops are cheap next
    to the layers around them, and this keeps one definition of the math)."""
    import torch

    n = len(d.inputs)
    names = [a.name for a in d.attrs]

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.op_inputs = inputs

    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        tensors, attrs = ctx.op_inputs[:n], dict(zip(names, ctx.op_inputs[n:], strict=False))
        with torch.enable_grad():
            leaves = [
                t.detach().requires_grad_(True) if t is not None and t.is_floating_point() else t for t in tensors
            ]
            out = d.torch_impl(*leaves, **attrs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            pairs = [(o, g) for o, g in zip(outs, grads, strict=False) if g is not None and o.requires_grad]
            wrt = [leaf for leaf in leaves if leaf is not None and leaf.requires_grad]
            got = (
                torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
                if pairs and wrt
                else [None] * len(wrt)
            )
        it = iter(got)
        per_input = [next(it) if leaf is not None and leaf.requires_grad else None for leaf in leaves]
        return (*per_input, *([None] * len(names)))

    return setup_context, backward
