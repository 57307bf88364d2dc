"""``softdeploy export FOLDER``: a local Hugging Face model folder (config.json + safetensors) or a
sentence-transformers folder (modules.json: Transformer, Pooling, Normalize) to a validated ONNX model.

The folder is read in two steps. :func:`inspect_folder` is cheap and reads no weights: it checks that the folder
holds a config.json that transformers reads, safetensors weights whose headers are sound
(:mod:`softdeploy.safetensors_check`) -- pickled weights (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``) are refused,
never loaded -- and, for a sentence-transformers folder, that every module is one softdeploy builds. It decides the
task (the config's ``architectures``, or the caller's). Only then :func:`load_folder` builds the transformers
``Auto*`` model (``use_safetensors=True``, eager attention, offline) and wraps it as a module of plain tensors:

    feature-extraction       (input_ids, attention_mask[, token_type_ids]) -> last_hidden_state[, pooler_output]
    text-classification      ... -> logits
    token-classification     ... -> logits
    fill-mask                ... -> logits
    causal-lm                (input_ids, attention_mask) -> logits (no KV cache)
    causal-lm-with-past      a folder of prefill.onnx + step.onnx with a flat KV cache (softdeploy.export.decoder)
    image-classification     pixel_values -> logits
    sentence-transformers    (input_ids, attention_mask[, token_type_ids]) -> token_embeddings, sentence_embedding

The graph's outputs carry transformers' own names (a ``ModelOutput``'s keys; sentence-transformers' for a
sentence-transformers folder); batch and sequence are dynamic (images: batch). Export goes through
:func:`softdeploy.export.api.export` (torch.onnx dynamo, softdeploy's rewrites and validation against torch); then
onnxruntime's transformer fusions (:mod:`onnxruntime.transformers.optimizer`, pattern fusions only: the graph stays
portable) are applied where they fuse something, and the fused model is validated against torch again -- a fusion
that breaks the agreement is dropped and the unfused graph kept, which the result says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from softdeploy.errors import ExportError

# task -> the transformers Auto class that builds it
TASK_CLASSES = {
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "fill-mask": "AutoModelForMaskedLM",
    "causal-lm": "AutoModelForCausalLM",
    "image-classification": "AutoModelForImageClassification",
}
# causal-lm with a KV cache: prefill + step graphs written to a folder by softdeploy.export.decoder
CAUSAL_LM_WITH_PAST = "causal-lm-with-past"
TASKS = (*TASK_CLASSES, CAUSAL_LM_WITH_PAST)
SENTENCE_TRANSFORMERS = "sentence-transformers"
# an architecture name's ending -> its task (``BertForSequenceClassification`` -> text-classification); a bare
# ``...Model`` is feature-extraction
ARCHITECTURE_SUFFIXES = (
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForMaskedLM", "fill-mask"),
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForImageClassification", "image-classification"),
    ("Model", "feature-extraction"),
)
# Weight files that are pickles: torch.load would run code from them. Refused, never read.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# ModelOutput keys that are not graph outputs of a single forward (no cache, no per-layer tensors)
SKIPPED_OUTPUTS = ("past_key_values", "hidden_states", "attentions", "cross_attentions", "loss")
# sentence-transformers pooling modes softdeploy builds (Pooling's config keys)
POOLING_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# sentence-transformers 6 writes one key, "pooling_mode", naming the mode (the booleans above are its older form)
POOLING_MODE_NAMES = {
    "mean": "mean",
    "cls": "cls",
    "max": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "weightedmean": "weightedmean",
    "lasttoken": "lasttoken",
}
# onnxruntime.transformers optimizer model type per transformers model type; others get the BERT fusions
# (LayerNormalization, Gelu, SkipLayerNormalization patterns are shared), kept only when they fuse something
FUSION_MODEL_TYPES = {
    "gpt2": "gpt2",
    "vit": "vit",
    "deit": "vit",
    "qwen3": "qwen3",
    "phi": "phi",
    "gpt_neox": "gpt_neox",
}
MAX_BATCH = 1024
DEFAULT_MAX_SEQUENCE = 512


@dataclasses.dataclass(frozen=True)
class FolderInfo:
    """What :func:`inspect_folder` found, before any weight is read: the folder, its kind (``hf`` or
    ``sentence-transformers``), the task, the transformers config, the folder of the transformer's own files and the
    sentence-transformers pooling and normalisation (None / False for a plain folder)."""

    path: Path
    kind: str  # "hf" | "sentence-transformers"
    task: str  # one of TASKS, or "sentence-transformers"
    config: Any  # transformers.PretrainedConfig
    model_dir: Path  # the folder with the transformer's config.json and safetensors
    weights: tuple[Path, ...]
    pooling: str | None = None
    normalize: bool = False
    max_seq_length: int | None = None

    @property
    def input_kind(self) -> str:
        """``image`` for a model fed ``pixel_values``, else ``text``."""
        return "image" if self.task == "image-classification" or _is_vision(self.config) else "text"


@dataclasses.dataclass
class FolderModel:
    """The folder's model as a torch module of plain tensors, with example inputs, dynamic shapes and the names of
    its inputs and outputs."""

    info: FolderInfo
    module: Any
    example_inputs: tuple[Any, ...]
    dynamic_shapes: dict[str, Any]  # input name -> {axis: Dim}
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


@dataclasses.dataclass
class FolderExport:
    """What :func:`export_folder` made: the ONNX model (fused when a fusion applied and kept the agreement), the
    validation of that model, the fusion statistics and a line on what happened to the fusions."""

    model: Any  # onnx.ModelProto
    path: Path | None
    folder: FolderModel
    validation: Any  # ValidationReport of the written model, None when validation was off
    fused: dict[str, int]  # onnxruntime fused op -> count in the written model (empty: unfused)
    fusion_note: str
    export_seconds: float

    @property
    def output_names(self) -> tuple[str, ...]:
        """The graph's output names."""
        return tuple(o.name for o in self.model.graph.output)

    def max_abs_error(self) -> float:
        """The largest absolute error against torch over every output and backend of the validation."""
        if self.validation is None:
            return float("nan")
        return max((o.max_abs_err for c in self.validation.checks for o in c.outputs), default=float("nan"))

    def summary(self) -> str:
        """A few lines for the terminal: folder, task, inputs, outputs, fusions, agreement with torch."""
        info = self.folder.info
        lines = [
            f"{info.path}: {info.kind} folder, task {info.task} ({type(self.folder.module.model).__name__})",
            f"inputs {list(self.folder.input_names)} -> outputs {list(self.output_names)}",
            f"exported in {self.export_seconds:.1f} s; {self.fusion_note}",
        ]
        if self.validation is not None:
            lines.append(f"max abs error vs torch: {self.max_abs_error():.3g}")
        return "\n".join(lines)


# ---- reading the folder ------------------------------------------------------------------------------


def is_model_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder with a config.json or modules.json (a Hugging Face or sentence-transformers
    folder) rather than a factory reference."""
    p = Path(path)
    return p.is_dir() and ((p / "config.json").is_file() or (p / "modules.json").is_file())


def inspect_folder(path: str | Path, task: str | None = None) -> FolderInfo:
    """Checks the folder without reading weights (config, weight files and their headers, sentence-transformers
    modules) and decides the task; ExportError naming the file, the value and the rule otherwise."""
    root = Path(path)
    if not root.exists():
        raise ExportError(f"model folder {root} does not exist")
    if not root.is_dir():
        raise ExportError(f"{root} is not a folder (rule: a Hugging Face folder with config.json and safetensors)")
    if task is not None and task not in TASKS and task != SENTENCE_TRANSFORMERS:
        raise ExportError(f"task {task!r} is not one of {[*TASKS, SENTENCE_TRANSFORMERS]}")
    modules_file = root / "modules.json"
    if modules_file.is_file() and task in (None, SENTENCE_TRANSFORMERS):
        return _inspect_sentence_transformers(root)
    if task == SENTENCE_TRANSFORMERS:
        raise ExportError(f"{root} has no modules.json (rule: a sentence-transformers folder lists its modules there)")
    config = _read_config(root)
    weights = _weight_files(root)
    return FolderInfo(root, "hf", task or task_from_config(config, root / "config.json"), config, root, weights)


def task_from_config(config: Any, where: Path | str = "config.json") -> str:
    """The task of the config's first ``architectures`` entry (``BertForSequenceClassification`` ->
    text-classification); ExportError asking for --task when it names none softdeploy knows."""
    archs = list(getattr(config, "architectures", None) or [])
    for arch in archs:
        for suffix, task in ARCHITECTURE_SUFFIXES:
            if arch.endswith(suffix):
                return task
    raise ExportError(
        f"{where}: architectures {archs} name no task softdeploy exports (rule: an architecture ending in "
        f"{[s for s, _ in ARCHITECTURE_SUFFIXES]}); give the task: --task {{{','.join(TASKS)}}}"
    )


def _read_config(folder: Path) -> Any:
    from softdeploy.models.assets import offline

    offline()
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise ExportError(f"{folder} has no config.json (rule: a Hugging Face model folder holds config.json)")
    from softdeploy.safetensors_check import load_json_file

    raw = load_json_file(cfg_file, ExportError, "config.json is a JSON object written by save_pretrained")
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ExportError(f"{cfg_file}: no 'model_type' key (rule: a transformers config names its model_type)")
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # transformers raises ValueError / KeyError / OSError for unknown or broken configs
        raise ExportError(f"{cfg_file}: transformers cannot read it ({type(e).__name__}: {_one_line(e)})") from None


def _weight_files(folder: Path) -> tuple[Path, ...]:
    """The folder's safetensors weights (single file or the shards of model.safetensors.index.json), each header
    checked; pickled weights are refused by name."""
    from softdeploy.errors import WeightsError
    from softdeploy.safetensors_check import load_json_file, read_header

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        raw = load_json_file(index, ExportError, "a safetensors index: weight_map of tensor -> shard file")
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ExportError(f"{index}: no weight_map (rule: a safetensors index maps each tensor to its shard)")
        shards = sorted({str(v) for v in weight_map.values()})
        files = []
        for shard in shards:
            shard_path = folder / shard
            if Path(shard).is_absolute() or ".." in Path(shard).parts or not shard.endswith(".safetensors"):
                raise ExportError(f"{index}: shard {shard!r} (rule: a .safetensors file inside the folder)")
            if not shard_path.is_file():
                raise ExportError(f"{index}: shard {shard_path} is missing")
            files.append(shard_path)
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    else:
        pickles = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise ExportError(
                f"{folder / pickles[0]}: pickled weights are refused (loading them runs code from the file); "
                "rule: model.safetensors (convert once where the file is trusted: "
                "model.save_pretrained(folder, safe_serialization=True))"
            )
        raise ExportError(f"{folder} has no model.safetensors (rule: the weights as safetensors)")
    for f in files:
        try:
            read_header(f, WeightsError)
        except WeightsError as e:
            raise ExportError(str(e)) from None
    return tuple(files)


def _inspect_sentence_transformers(root: Path) -> FolderInfo:
    from softdeploy.safetensors_check import load_json_file

    modules_file = root / "modules.json"
    rule = "modules.json lists Transformer, then optionally Pooling and Normalize"
    modules = load_json_file(modules_file, ExportError, rule)
    if not isinstance(modules, list) or not modules or not all(isinstance(m, dict) for m in modules):
        raise ExportError(f"{modules_file}: not a list of modules (rule: {rule})")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    known = ("Transformer", "Pooling", "Normalize")
    unknown = [(m.get("type"), k) for m, k in zip(modules, kinds, strict=True) if k not in known]
    if unknown:
        raise ExportError(f"{modules_file}: module {unknown[0][0]!r} is not one softdeploy builds (rule: {rule})")
    if kinds[0] != "Transformer" or kinds.count("Transformer") != 1 or kinds.count("Pooling") > 1:
        raise ExportError(f"{modules_file}: modules {kinds} (rule: {rule})")
    model_dir = _module_dir(root, modules[0], modules_file)
    config = _read_config(model_dir)
    weights = _weight_files(model_dir)
    pooling = None
    if "Pooling" in kinds:
        pool_dir = _module_dir(root, modules[kinds.index("Pooling")], modules_file)
        pool_file = pool_dir / "config.json"
        if not pool_file.is_file():
            raise ExportError(f"{pool_dir} has no config.json (rule: a Pooling module's settings)")
        pool_cfg = load_json_file(pool_file, ExportError, "the Pooling module's settings")
        pool_cfg = pool_cfg if isinstance(pool_cfg, dict) else {}
        if pool_cfg.get("include_prompt", True) is False:
            raise ExportError(
                f"{pool_file}: include_prompt false (rule: the prompt's length is not an input of the exported graph; "
                "pool over every token)"
            )
        named = pool_cfg.get("pooling_mode")
        if isinstance(named, list) and len(named) == 1:
            named = named[0]
        if named is not None:
            if not isinstance(named, str) or named not in POOLING_MODE_NAMES:
                raise ExportError(
                    f"{pool_file}: pooling_mode {named!r} (rule: one of {list(POOLING_MODE_NAMES)}, which softdeploy "
                    "builds)"
                )
            pooling = POOLING_MODE_NAMES[named]
        else:
            on = [k for k, v in pool_cfg.items() if k.startswith("pooling_mode") and v]
            if len(on) != 1 or on[0] not in POOLING_MODES:
                raise ExportError(
                    f"{pool_file}: pooling modes {on} (rule: exactly one of {list(POOLING_MODES)}, which softdeploy "
                    "builds)"
                )
            pooling = POOLING_MODES[on[0]]
    if "Normalize" in kinds and "Pooling" in kinds and kinds.index("Normalize") < kinds.index("Pooling"):
        raise ExportError(f"{modules_file}: Normalize before Pooling (rule: {rule})")
    max_len = None
    st_cfg = model_dir / "sentence_bert_config.json"
    if st_cfg.is_file():
        raw = load_json_file(st_cfg, ExportError, "sentence-transformers' Transformer settings")
        if isinstance(raw, dict) and isinstance(raw.get("max_seq_length"), int):
            max_len = int(raw["max_seq_length"])
    return FolderInfo(
        root,
        SENTENCE_TRANSFORMERS,
        SENTENCE_TRANSFORMERS,
        config,
        model_dir,
        weights,
        pooling=pooling,
        normalize="Normalize" in kinds,
        max_seq_length=max_len,
    )


def _module_dir(root: Path, module: Mapping[str, Any], where: Path) -> Path:
    rel = str(module.get("path", ""))
    if Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise ExportError(f"{where}: module path {rel!r} (rule: a folder inside {root})")
    return root / rel


def _is_vision(config: Any) -> bool:
    return hasattr(config, "image_size") and hasattr(config, "num_channels") and not hasattr(config, "vocab_size")


# ---- building the module -----------------------------------------------------------------------------


def load_folder(info: FolderInfo, *, batch: int = 2, seq: int = 8, attention: str = "eager") -> FolderModel:
    """Builds the folder's model (safetensors only, offline) and wraps it as a module of plain tensors with example
    inputs (``batch`` x ``seq`` tokens, the last row's two final tokens padded; or random images) and dynamic batch /
    sequence axes. ``attention``: ``eager`` (transformers' matmul-softmax-matmul, the graph onnxruntime fuses) or one
    of softdeploy's implementations (:mod:`softdeploy.attention_interface`: ``softpick`` exports to one
    SoftpickAttention node per layer, ``soft`` to one NystromGaussianAttention node per layer)."""
    import torch
    import transformers

    from softdeploy.attention_interface import IMPLEMENTATIONS, register

    if attention != "eager":
        if attention not in IMPLEMENTATIONS:
            raise ExportError(f"attention {attention!r} is not one of {['eager', *IMPLEMENTATIONS]}")
        register()

    task = "feature-extraction" if info.kind == SENTENCE_TRANSFORMERS else info.task
    if task not in TASK_CLASSES:  # causal-lm-with-past: two graphs, export_folder_with_past
        raise ExportError(f"task {task}: not one module; export it with export_folder_with_past")
    auto = getattr(transformers, TASK_CLASSES[task])
    try:
        model = auto.from_pretrained(
            str(info.model_dir), use_safetensors=True, local_files_only=True, attn_implementation=attention
        ).eval()
    except Exception as e:  # a config the Auto class has no model for, a weight of the wrong shape, ...
        raise ExportError(
            f"{info.model_dir}: transformers cannot build {auto.__name__} for task {info.task} "
            f"({type(e).__name__}: {_one_line(e)})"
        ) from None
    config = model.config
    b = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    if info.input_kind == "image":
        size = config.image_size if isinstance(config.image_size, (list, tuple)) else (config.image_size,) * 2
        gen = torch.Generator().manual_seed(0)
        pixels = torch.randn(batch, int(config.num_channels), *map(int, size), generator=gen)
        names: tuple[str, ...] = ("pixel_values",)
        example: tuple[Any, ...] = (pixels,)
        dynamic: dict[str, Any] = {"pixel_values": {0: b}}
    else:
        vocab = int(getattr(config, "vocab_size", 100) or 100)
        max_seq = min(int(getattr(config, "max_position_embeddings", 0) or DEFAULT_MAX_SEQUENCE), 8192)
        if info.max_seq_length:
            max_seq = min(max_seq, info.max_seq_length)
        seq = min(seq, max_seq)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(min(5, vocab - 1), vocab, (batch, seq), generator=gen)
        mask = torch.ones_like(ids)
        if batch > 1 and seq > 3:
            mask[-1, -2:] = 0  # a padded row: the export is validated with the masking path taken
        s = torch.export.Dim("seq", min=2, max=max_seq)
        names = ("input_ids", "attention_mask")
        example = (ids, mask)
        dynamic = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}
        if _takes_token_types(model):
            names += ("token_type_ids",)
            example += (torch.zeros_like(ids),)
            dynamic["token_type_ids"] = {0: b, 1: s}
    if info.kind == SENTENCE_TRANSFORMERS:
        module: Any = SentenceModule(model, names, info.pooling, info.normalize)
        outputs: tuple[str, ...] = ("token_embeddings", "sentence_embedding") if info.pooling else ("token_embeddings",)
    else:
        module = TaskModule(model, names, info.task)
        with torch.no_grad():
            out = model(**module.model_kwargs(example))
        outputs = tuple(k for k, v in out.items() if k not in SKIPPED_OUTPUTS and isinstance(v, torch.Tensor))
        module.output_keys = outputs
    return FolderModel(info, module.eval(), example, dynamic, names, outputs)


def _takes_token_types(model: Any) -> bool:
    """Token type ids are an input where the model has more than one type (BERT: 2; RoBERTa: 1, its tokenizer
    emits none)."""
    import inspect

    return "token_type_ids" in inspect.signature(model.forward).parameters and (
        int(getattr(model.config, "type_vocab_size", 0) or 0) > 1
    )


@functools.cache
def _module_classes() -> dict[str, Any]:
    """The wrapper classes, made on first use (torch is not imported with this module). Their ``forward`` names its
    inputs (torch.export binds dynamic shapes and the exporter's input names to the signature)."""
    import torch

    class TaskBase(torch.nn.Module):
        """A transformers model called with named tensors, returning its ModelOutput's tensors (output_keys) as a
        tuple; no cache, no per-layer tensors."""

        def __init__(self, model: Any, input_names: Sequence[str], task: str) -> None:
            super().__init__()
            self.model = model
            self.input_names = tuple(input_names)
            self.task = task
            self.output_keys: tuple[str, ...] = ()

        def model_kwargs(self, inputs: Sequence[Any]) -> dict[str, Any]:
            kwargs = {k: v for k, v in zip(self.input_names, inputs, strict=False) if v is not None}
            if "use_cache" in _forward_parameters(self.model):
                kwargs["use_cache"] = False
            return kwargs

        def run(self, *inputs: Any) -> Any:
            out = self.model(**self.model_kwargs(inputs))
            return tuple(out[k] for k in self.output_keys)

    class TextTaskModule(TaskBase):
        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            return self.run(input_ids, attention_mask, token_type_ids)

    class ImageTaskModule(TaskBase):
        def forward(self, pixel_values: Any) -> Any:
            return self.run(pixel_values)

    class SentenceModule(torch.nn.Module):
        """sentence-transformers' Transformer -> Pooling -> Normalize, as its ``encode`` computes them:
        token_embeddings (the last hidden state) and sentence_embedding."""

        def __init__(self, model: Any, input_names: Sequence[str], pooling: str | None, normalize: bool) -> None:
            super().__init__()
            self.model = model
            self.input_names = tuple(input_names)
            self.pooling = pooling
            self.normalize = normalize

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                kwargs["token_type_ids"] = token_type_ids
            tokens = self.model(**kwargs).last_hidden_state
            if self.pooling is None:
                return (tokens,)
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            if self.pooling == "cls":
                pooled = tokens[:, 0]
            elif self.pooling == "max":
                pooled = torch.where(mask > 0, tokens, torch.full_like(tokens, -1e9)).max(dim=1).values
            elif self.pooling == "weightedmean":
                # sentence-transformers' weights: 1, 2, ... from the first token that is not padding
                positions = torch.cumsum(torch.ones_like(attention_mask), dim=1).unsqueeze(-1).to(tokens.dtype)
                first = attention_mask.to(torch.int32).argmax(dim=1).view(-1, 1, 1).to(tokens.dtype)
                weights = mask * (positions - first)
                pooled = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            elif self.pooling == "lasttoken":
                # the last token that is not padding (left or right padding alike), as sentence-transformers picks it
                length = attention_mask.shape[1]
                values, from_end = attention_mask.to(torch.int32).flip(1).max(1)
                from_end = torch.where(values == 0, torch.full_like(from_end, length - 1), from_end)
                index = (length - 1 - from_end).view(-1, 1, 1).expand(-1, 1, tokens.shape[-1])
                pooled = torch.gather(tokens * mask, 1, index).squeeze(1)
            else:
                total = (tokens * mask).sum(1)
                count = mask.sum(1).clamp(min=1e-9)
                pooled = total / (count.sqrt() if self.pooling == "mean_sqrt_len" else count)
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
            return tokens, pooled

    return {"text": TextTaskModule, "image": ImageTaskModule, "sentence": SentenceModule}


def _forward_parameters(model: Any) -> Any:
    import inspect

    return inspect.signature(model.forward).parameters


def TaskModule(model: Any, input_names: Sequence[str], task: str) -> Any:
    """The wrapper of a plain transformers model: named inputs in, its ModelOutput's tensors out."""
    kind = "image" if input_names == ("pixel_values",) else "text"
    return _module_classes()[kind](model, input_names, task)


def SentenceModule(model: Any, input_names: Sequence[str], pooling: str | None, normalize: bool) -> Any:
    """The wrapper of a sentence-transformers folder's modules."""
    return _module_classes()["sentence"](model, input_names, pooling, normalize)


# ---- export ------------------------------------------------------------------------------------------


def export_folder(
    path: str | Path,
    out: str | Path | None = None,
    *,
    task: str | None = None,
    output_names: Sequence[str] | None = None,
    attention: str = "eager",
    fuse: bool = True,
    opset: int = 18,
    validate: bool = True,
    tolerance: Any = None,
    strict: bool = True,
    overwrite: bool = False,
) -> FolderExport:
    """Exports the model folder ``path`` (see the module's docstring) and writes ``out`` when given (never over an
    existing file unless ``overwrite``). ``output_names`` renames the graph's outputs (as many as it has).
    ``attention``: see :func:`load_folder`. ``fuse``: onnxruntime's transformer fusions, kept only when the fused model validates against torch (they are
    not applied without validation)."""
    from softdeploy.export.api import export

    if out is not None and Path(out).exists() and not overwrite:
        raise ExportError(f"{out} exists; pass overwrite=True (CLI: --overwrite) to replace it")
    info = inspect_folder(path, task)
    if info.task == CAUSAL_LM_WITH_PAST:
        raise ExportError(f"task {CAUSAL_LM_WITH_PAST} writes a folder of graphs: use export_folder_with_past")
    folder = load_folder(info, attention=attention)
    names = tuple(output_names) if output_names else folder.output_names
    if len(names) != len(folder.output_names) or len(set(names)) != len(names):
        raise ExportError(
            f"outputs {list(names)}: the model has {len(folder.output_names)} outputs {list(folder.output_names)} "
            "(rule: one distinct name per output)"
        )
    t0 = time.perf_counter()
    result = export(
        folder.module,
        folder.example_inputs,
        dynamic_shapes=folder.dynamic_shapes,
        input_names=folder.input_names,
        output_names=names,
        opset=opset,
        validate=validate,
        tolerance=tolerance,
        strict=strict,
    )
    seconds = time.perf_counter() - t0
    model, report = result.model, result.validation
    fused: dict[str, int] = {}
    if not fuse:
        note = "onnxruntime fusions not asked for"
    elif not validate:
        note = "onnxruntime fusions not applied (they are applied only where the fused model is validated)"
    else:
        model, report, fused, note = _fuse_checked(model, report, folder, tolerance)
    if out is not None:
        from softdeploy.files import save_model

        save_model(model, out, "exported model")
    return FolderExport(model, Path(out) if out is not None else None, folder, report, fused, note, seconds)


def export_folder_with_past(
    path: str | Path, out_dir: str | Path, *, opset: int = 18, overwrite: bool = False, progress: Any = None
) -> Any:
    """A causal LM folder with its KV cache: the folder is checked as :func:`inspect_folder` checks it (safetensors
    only, before any weight is read), then :func:`softdeploy.export.decoder.export_decoder` writes
    ``out_dir/prefill.onnx`` and ``out_dir/step.onnx`` (``input_ids``, ``attention_mask``, ``position_ids`` and, for
    the step, ``past_key_values.{i}.key/value`` in; ``logits`` and ``present.{i}.key/value`` out), each validated
    against torch eager at length 1 and longer. Returns its DecoderExport."""
    from softdeploy.export.decoder import export_decoder

    info = inspect_folder(path, CAUSAL_LM_WITH_PAST)
    return export_decoder(
        info.model_dir, out_dir, inputs_embeds=False, opset=opset, overwrite=overwrite, progress=progress
    )


def _fuse_checked(model: Any, report: Any, folder: FolderModel, tolerance: Any) -> tuple[Any, Any, dict[str, int], str]:
    """The fused model and its validation when a fusion changed something and the result still agrees with torch;
    else the unfused model. The model's own optimizer type is tried first, then the BERT fusions (LayerNormalization,
    Gelu, SkipLayerNormalization patterns that most transformers share). The note says what happened."""
    from softdeploy.export.api import _normalize_tolerance
    from softdeploy.export.validate import validate_export

    own = FUSION_MODEL_TYPES.get(str(folder.info.config.model_type), "bert")
    notes = []
    for model_type in dict.fromkeys((own, "bert")):
        try:
            fused_model, stats = fuse_transformer_ops(model, model_type, folder.info.config)
        except Exception as e:  # the optimizer's own failure leaves the export as it was
            notes.append(f"onnxruntime {model_type} fusions failed ({type(e).__name__}: {_one_line(e)})")
            continue
        if not stats:
            notes.append(f"onnxruntime {model_type} fusions: nothing to fuse")
            continue
        fused_report = validate_export(
            fused_model, folder.module, folder.example_inputs, tolerance=_normalize_tolerance(tolerance)
        )
        described = ", ".join(f"{k} x{v}" for k, v in sorted(stats.items()))
        if not fused_report.ok:
            notes.append(
                f"onnxruntime {model_type} fusions ({described}) broke validation, not kept:\n"
                + fused_report.to_markdown()
            )
            continue
        return (
            fused_model,
            fused_report,
            stats,
            "; ".join([*notes, f"onnxruntime {model_type} fusions: {described} (validated again)"]),
        )
    return model, report, {}, "; ".join([*notes, "unfused graph kept"])


def fuse_transformer_ops(model: Any, model_type: str, config: Any) -> tuple[Any, dict[str, int]]:
    """onnxruntime.transformers' pattern fusions (opt_level 0: the graph stays portable) of ``model_type`` on a copy
    of ``model``; the fused model and the count of each fused op (empty when nothing fused)."""
    import onnx
    from onnxruntime.transformers.optimizer import optimize_model

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    # The fusions log that symbolic shape inference fails on a dynamo export: it only means SkipLayerNormalization is
    # left to onnxruntime's session optimiser. Their loggers are top-level modules, so logging is off for this call.
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            optimized = optimize_model(
                copy, model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0, use_gpu=False
            )
    finally:
        logging.disable(previous)
    stats = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
    fused = optimized.model
    # the optimizer keeps the model's functions; com.softdeploy nodes keep their portable bodies
    if len(fused.functions) != len(model.functions):
        del fused.functions[:]
        fused.functions.extend(model.functions)
    domains = {n.domain for n in fused.graph.node if n.domain} - {o.domain for o in fused.opset_import}
    for domain in sorted(domains):  # the fused ops' domain (com.microsoft), which the optimizer leaves to its saver
        fused.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    onnx.checker.check_model(fused, full_check=False)
    return fused, stats


def rename_outputs(model: Any, names: Sequence[str], where: str = "outputs") -> Any:
    """Renames ``model``'s graph outputs (in place; returned) to ``names``, one per output, everywhere the values are
    read. ExportError when the count differs or a name is taken by another value."""
    outputs = [o.name for o in model.graph.output]
    names = list(names)
    if len(names) != len(outputs) or len(set(names)) != len(names):
        raise ExportError(
            f"{where}: {names}: the model has {len(outputs)} outputs {outputs} (rule: one distinct name per output)"
        )
    mapping = {old: new for old, new in zip(outputs, names, strict=True) if old != new}
    if not mapping:
        return model
    from softdeploy.ops.functions import _nodes

    taken = {v for n in _nodes(model.graph) for v in (*n.input, *n.output)}
    taken |= {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    clash = [n for n in mapping.values() if n in taken and n not in mapping]
    if clash:
        raise ExportError(f"{where}: {clash[0]!r} already names a value of the graph (rule: a new name per output)")
    for node in _nodes(model.graph):
        for i, v in enumerate(node.input):
            if v in mapping:
                node.input[i] = mapping[v]
        for i, v in enumerate(node.output):
            if v in mapping:
                node.output[i] = mapping[v]
    for o in model.graph.output:
        o.name = mapping.get(o.name, o.name)
    for vi in model.graph.value_info:
        vi.name = mapping.get(vi.name, vi.name)
    return model


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:400]
