"""Frozen pre-trained LoRA adapters in PEFT's format as LoRA-Mixer experts.

An adapter is a folder with ``adapter_config.json`` and ``adapter_model.safetensors`` (what
``PeftModel.save_pretrained`` writes). Tensors are read with safetensors only -- never unpickled: a
folder holding only ``adapter_model.bin`` is refused. Adapter e of the list becomes expert e of every
projection it adapts: ``A_e = lora_A`` ``[r_e, in]``, ``Bm_e = s_e * lora_B`` ``[out, r_e]`` with
PEFT's scaling ``s_e = lora_alpha / r_e`` (``/ sqrt(r_e)`` with ``use_rslora``), zero-padded to the
largest rank (zero rows and columns add nothing, so the padded expert equals the adapter exactly); the
op's ``scaling`` is then 1. An adapter that does not adapt a projection is a zero expert there.

Refused, each with an AdapterError naming the file, the tensor or key, the value and the rule: a key repeated in
``adapter_config.json`` or in the safetensors header (JSON readers keep one silently), ``r`` not an integer >= 1
or not the factors' rank, ``lora_alpha`` not a finite number > 0 (absent: PEFT's default, 8), empty dimensions,
NaN / inf factors, and factors whose scaled ``lora_B`` overflows the model's dtype. :func:`load_experts` replaces
the model's Linear layers all together or not at all.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from softdeploy.errors import AdapterError
from softdeploy.lora.mixer import LoRAMixerLinear, all_or_nothing, swap_in
from softdeploy.safetensors_check import FLOAT_DTYPES, TensorEntry, load_json_file, load_tensors, read_header

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
PEFT_DEFAULT_ALPHA = 8  # LoraConfig's lora_alpha when adapter_config.json has none, as PEFT itself reads it


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One PEFT LoRA adapter as read from its folder: rank r, scaling (lora_alpha / r, or / sqrt(r) with
    use_rslora) and per target module its factors (lora_A [r, in], lora_B [out, r])."""

    path: Path
    r: int
    scaling: float
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module name -> (lora_A [r, in], lora_B [out, r])


def read_adapter(path: str | os.PathLike[str]) -> Adapter:
    """Reads one PEFT LoRA adapter folder; errors name the file, the value and the rule."""
    folder = Path(path)
    cfg_path, w_path = folder / CONFIG, folder / WEIGHTS
    if not cfg_path.is_file():
        raise AdapterError(f"{cfg_path}: no such file (rule: a PEFT adapter folder holds {CONFIG} and {WEIGHTS})")
    if not w_path.is_file():
        hint = (
            "; it holds adapter_model.bin, a pickle, which softdeploy never loads -- re-save it with "
            "save_pretrained(..., safe_serialization=True)"
            if (folder / "adapter_model.bin").exists()
            else ""
        )
        raise AdapterError(f"{w_path}: no such file (rule: adapters are read from safetensors only){hint}")
    cfg = load_json_file(cfg_path, AdapterError, "PEFT's adapter_config.json")
    if not isinstance(cfg, dict):
        raise AdapterError(
            f"{cfg_path}: holds a {type(cfg).__name__}, not an object (rule: PEFT's adapter_config.json)"
        )
    _check_config(cfg_path, cfg)
    r = int(cfg["r"])
    alpha = float(cfg.get("lora_alpha", PEFT_DEFAULT_ALPHA))
    scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    # names, dtypes and shapes are checked from the header, before any tensor is read
    header = read_header(w_path, AdapterError)
    a_of: dict[str, TensorEntry] = {}
    b_of: dict[str, TensorEntry] = {}
    for key, t in header.tensors.items():
        name = key[len(_PREFIX) :] if key.startswith(_PREFIX) else key
        for suffix, into in ((".lora_A.weight", a_of), (".lora_B.weight", b_of)):
            if name.endswith(suffix):
                if name[: -len(suffix)] in into:  # "m.lora_A.weight" and "base_model.model.m.lora_A.weight"
                    raise AdapterError(
                        f"{w_path}: tensor {key!r} is a second {suffix[1:]} of module {name[: -len(suffix)]!r} "
                        "(rule: one lora_A and one lora_B per module)"
                    )
                into[name[: -len(suffix)]] = t
                break
        else:
            raise AdapterError(
                f"{w_path}: tensor {key!r} is not a LoRA factor (rule: only '<module>.lora_A.weight' and "
                "'<module>.lora_B.weight' are read; modules_to_save, biases and DoRA magnitudes are not experts)"
            )
    pairs: dict[str, tuple[TensorEntry, TensorEntry]] = {}
    for name in sorted(set(a_of) | set(b_of)):
        if name not in a_of or name not in b_of:
            missing = "lora_A" if name not in a_of else "lora_B"
            raise AdapterError(
                f"{w_path}: module {name!r} has no {missing}.weight (rule: each module has lora_A and lora_B)"
            )
        a, b = a_of[name], b_of[name]
        if len(a.shape) != 2 or a.shape[0] != r:
            raise AdapterError(
                f"{w_path}: {name}.lora_A.weight has shape {list(a.shape)} (rule: lora_A is [r, in_features] "
                f"with r = {r} from {CONFIG})"
            )
        if len(b.shape) != 2 or b.shape[1] != r:
            raise AdapterError(
                f"{w_path}: {name}.lora_B.weight has shape {list(b.shape)} (rule: lora_B is [out_features, r] "
                f"with r = {r} from {CONFIG})"
            )
        if a.dtype not in FLOAT_DTYPES or b.dtype not in FLOAT_DTYPES:
            raise AdapterError(
                f"{w_path}: {name} has dtype {a.dtype}/{b.dtype} (rule: LoRA factors are floating point)"
            )
        pairs[name] = (a, b)
    # NaN / inf factors would load silently and surface only as a far-away export mismatch
    tensors = load_tensors(header, AdapterError, [t.name for ab in pairs.values() for t in ab])
    factors = {name: (tensors[a.name].float(), tensors[b.name].float()) for name, (a, b) in pairs.items()}
    if not factors:
        raise AdapterError(f"{w_path}: holds no LoRA factors (rule: '<module>.lora_A.weight' / '.lora_B.weight')")
    return Adapter(folder, r, scaling, factors)


def _check_config(cfg_path: Path, cfg: dict[str, Any]) -> None:
    if cfg.get("peft_type") != "LORA":
        raise AdapterError(f"{cfg_path}: peft_type {cfg.get('peft_type')!r} (rule: only LORA adapters are experts)")
    r = cfg.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise AdapterError(f"{cfg_path}: r {r!r} (rule: r is an integer >= 1)")
    alpha = cfg.get("lora_alpha", PEFT_DEFAULT_ALPHA)
    # alpha 0 makes every expert a zero delta (the adapter silently does nothing); NaN / inf poison every output
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha) or alpha <= 0:
        raise AdapterError(f"{cfg_path}: lora_alpha {alpha!r} (rule: lora_alpha is a finite number > 0)")
    if not isinstance(cfg.get("use_rslora", False), bool):
        raise AdapterError(f"{cfg_path}: use_rslora {cfg['use_rslora']!r} (rule: true or false)")
    for key, why in (
        ("use_dora", "DoRA rescales the merged weight: not a low-rank delta"),
        ("fan_in_fan_out", "transposed (Conv1D) layers are not nn.Linear"),
        ("rank_pattern", "per-module ranks are not read"),
        ("alpha_pattern", "per-module alphas are not read"),
    ):
        if cfg.get(key):
            raise AdapterError(f"{cfg_path}: {key} = {cfg[key]!r} is not supported (rule: {why})")


def load_experts(
    model: nn.Module,
    adapters: Sequence[str | os.PathLike[str]],
    *,
    top_k: int = 1,
    train_experts: bool = False,
) -> list[str]:
    """Replaces (in place) every ``nn.Linear`` that one of ``adapters`` adapts by a
    :class:`LoRAMixerLinear` whose expert e is adapter e (frozen unless ``train_experts``; the router
    is new and trainable). Module names are those of ``model`` (PEFT's ``base_model.model.`` prefix
    stripped). Returns the wrapped names. All or nothing: every module is checked and every mixer built before the
    first Linear is replaced, so an error leaves ``model`` as it was and the call can be retried."""
    if not adapters:
        raise AdapterError("no adapters given (rule: one adapter folder per expert)")
    read = [read_adapter(p) for p in adapters]
    r_max = max(a.r for a in read)
    names = sorted({n for a in read for n in a.factors})
    # every module is checked and every mixer built before the first one replaces its Linear: an error on a later
    # module leaves the model as it was, so the call can be retried
    with all_or_nothing(model):
        built: dict[str, nn.Module] = {}
        for name in names:
            built[name] = _mixer(model, name, read, r_max, top_k, train_experts)
        swap_in(model, built)
    return names


def _mixer(
    model: nn.Module, name: str, read: Sequence[Adapter], r_max: int, top_k: int, train_experts: bool
) -> LoRAMixerLinear:
    """The LoRAMixerLinear of module ``name`` whose expert e is adapter e of ``read`` (not yet in the model)."""
    e = len(read)
    try:
        base = model.get_submodule(name)
    except AttributeError:
        owner = next(a for a in read if name in a.factors)
        raise AdapterError(
            f"{owner.path / WEIGHTS}: module {name!r} is not in the model (rule: adapters name the model's "
            "modules, as PEFT saved them)"
        ) from None
    if not isinstance(base, nn.Linear):
        raise AdapterError(f"module {name!r} is a {type(base).__name__} (rule: experts adapt nn.Linear layers)")
    a_all = torch.zeros(e, r_max, base.in_features)
    b_all = torch.zeros(e, base.out_features, r_max)
    for i, ad in enumerate(read):
        if name not in ad.factors:
            continue
        a, b = ad.factors[name]
        where = ad.path / WEIGHTS
        if a.shape[1] != base.in_features:
            raise AdapterError(
                f"{where}: {name}.lora_A.weight has shape {list(a.shape)}, the model's {name} is "
                f"Linear({base.in_features} -> {base.out_features}) (rule: lora_A is [r, in_features] = "
                f"[{ad.r}, {base.in_features}])"
            )
        if b.shape[0] != base.out_features:
            raise AdapterError(
                f"{where}: {name}.lora_B.weight has shape {list(b.shape)}, the model's {name} is "
                f"Linear({base.in_features} -> {base.out_features}) (rule: lora_B is [out_features, r] = "
                f"[{base.out_features}, {ad.r}])"
            )
        scaled = (b * ad.scaling).to(base.weight.dtype)
        if not bool(torch.isfinite(scaled).all()):
            raise AdapterError(
                f"{where}: {name}.lora_B.weight times the scaling {ad.scaling:g} (lora_alpha / r) is not finite in "
                f"{base.weight.dtype} (rule: the scaled factor fits the model's dtype)"
            )
        a_all[i, : ad.r] = a
        b_all[i, :, : ad.r] = scaled.float()
    mixer = LoRAMixerLinear(base, e, r_max, top_k=top_k, scaling=1.0, train_experts=train_experts)
    with torch.no_grad():
        mixer.A.copy_(a_all.to(mixer.A.dtype))
        mixer.Bm.copy_(b_all.to(mixer.Bm.dtype))
    return mixer
