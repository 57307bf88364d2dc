"""The validation tolerance of a routed (LoRA-Mixer) model's outputs, derived from the adapters' magnitude.

A routed projection computes ``x W^T + b + scaling * sum_e w_e Bm_e A_e x``. In float32 each of its outputs carries a
rounding error of about ``gamma * T`` with ``T = |x| |W|^T + |b| + scaling * sum_e |Bm_e| |A_e| |x|`` (the magnitudes of
its terms, every expert's included: a bound over the routing) and ``gamma = sqrt(in + r) * u`` (u = 2^-24, the typical
error of a float32 dot product of in + r terms; exporters and onnxruntime sum in other orders than torch). Larger
adapters mean larger T: the error each projection hands on grows with them, and so does what reaches the outputs
(attention logits, a product of two projections, amplify it most).

:func:`routed_output_tolerance` measures how far that much error moves each output: the model runs twice in float64,
once as it is and once with ``gamma * T`` (random signs, a fixed seed) added to every routed projection's output. The
difference ``delta`` of an output is where its own rounding takes it; its tolerance is the default (rtol, atol) with
``atol + MARGIN * max |delta|``. float64 keeps the measurement itself free of rounding (the perturbation is ~1e-7 of
the values, below float32's resolution of a difference), and the routing is that of the unperturbed run in both
(the experts are chosen from the projection's input, which the perturbation of earlier layers moves by ~1e-7 only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn

from softdeploy.lora.mixer import LoRAMixerLinear, copy_without_routing_statistics, mixers

UNIT_ROUNDOFF = 2.0**-24  # float32
# The perturbation stands for one implementation's rounding; torch and onnxruntime each have their own (x2), and the
# rest of the model (attention MatMuls, softmax, norms) rounds too, in proportion to the same magnitudes (x2).
MARGIN = 1.0


def term_magnitude(m: LoRAMixerLinear, x: Tensor) -> Tensor:
    """``T`` of the module docstring for input ``x`` ``[..., in]``: ``|x||W|^T + |b| + scaling sum_e |Bm_e||A_e||x|``."""
    ax = x.abs()
    t = ax @ m.base.weight.abs().t()
    if m.base.bias is not None:
        t = t + m.base.bias.abs()
    u = torch.einsum("...i,eri->...er", ax, m.A.abs())  # |A_e| |x|
    return t + m.scaling * torch.einsum("...er,eor->...o", u, m.Bm.abs())


def routed_output_tolerance(
    model: nn.Module,
    example_inputs: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    output_names: Sequence[str],
    base: Mapping[str, tuple[float, float]],
) -> dict[str, tuple[float, float]]:
    """Per output name (the exporter's flattened order) the ``(rtol, atol)`` of a float output of ``model``, derived
    as the module docstring says from ``base`` (per dtype); empty when ``model`` has no LoRA-Mixer projection. Integer
    and bool outputs keep their exact comparison (no entry)."""
    if not mixers(model):
        return {}
    shadow = copy_without_routing_statistics(model).double().eval()
    to64 = lambda t: t.double() if isinstance(t, Tensor) and t.is_floating_point() else t  # noqa: E731
    args = pytree.tree_map(to64, tuple(example_inputs))
    kw = pytree.tree_map(to64, dict(kwargs or {}))
    with torch.no_grad():
        want = pytree.tree_leaves(shadow(*args, **kw))
        generator = torch.Generator().manual_seed(0)
        handles = [m.register_forward_hook(_perturb(generator)) for m in mixers(shadow).values()]
        try:
            moved = pytree.tree_leaves(shadow(*args, **kw))
        finally:
            for h in handles:
                h.remove()
    out: dict[str, tuple[float, float]] = {}
    for name, w, g in zip(output_names, want, moved, strict=False):
        if not (isinstance(w, Tensor) and w.is_floating_point()):
            continue
        dtype = str(model_dtype(model)).removeprefix("torch.")
        rtol, atol = base.get(dtype, base["float32"])
        delta = float((g - w).abs().max()) if w.numel() else 0.0
        out[name] = (rtol, atol + MARGIN * delta if math.isfinite(delta) else atol)
    return out


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's first floating-point parameter (what its outputs are computed in)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _perturb(generator: torch.Generator) -> Any:
    def hook(m: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> Tensor:
        assert isinstance(m, LoRAMixerLinear)
        x = inputs[0]
        gamma = math.sqrt(m.base.in_features + m.rank) * UNIT_ROUNDOFF
        signs = torch.randint(0, 2, output.shape, generator=generator, dtype=output.dtype) * 2 - 1
        return output + gamma * term_magnitude(m, x) * signs

    return hook
