"""Decoder-step export of a transformers causal LM: a prefill graph and a step graph with a flat KV cache.

:func:`export_decoder` turns a ``*ForCausalLM`` (Llama, Qwen2, GPT-2 and others whose forward takes
``inputs_embeds``, ``attention_mask``, ``position_ids`` and a ``DynamicCache``) into two ONNX graphs:

* ``prefill.onnx``: inputs ``inputs_embeds`` [batch, seq, hidden] (or ``input_ids`` [batch, seq]),
  ``attention_mask`` [batch, seq] int64, ``position_ids`` [batch, seq] int64; outputs ``logits``
  [batch, seq, vocab] and ``present.{i}.key`` / ``present.{i}.value`` [batch, kv_heads, seq, head_dim]
  for every layer ``i``.
* ``step.onnx``: the same inputs plus ``past_key_values.{i}.key`` / ``.value`` [batch, kv_heads, past,
  head_dim]; ``attention_mask`` covers past + new positions [batch, past + seq]; the presents come out
  with ``past + seq`` positions, ready to be fed back as the next step's pasts.

Batch, sequence and past lengths are dynamic. torch.export specialises a dimension whose example is 0
or 1, so both graphs are exported with examples of length >= 2 and then validated at length 1 (the
decode step) and at the example length against torch eager; :attr:`DecoderExport.max_error` records
the worst absolute difference of each graph (logits and cache, over the positions the mask keeps).

Positions follow transformers' convention for left padding: ``position_ids = cumsum(mask) - 1``
(clipped at 0); the generation loop (:mod:`softdeploy.generate`) computes them. The token embedding
table is written beside the graphs as ``embedding.npy`` ([vocab, hidden] float32, read with
``allow_pickle=False``), so a loop that feeds ``inputs_embeds`` can mix rows of it (soft tokens).
``decoder.json`` describes the export; :meth:`DecoderExport.load` reads a folder back.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.errors import ArgumentError, ExportError

MANIFEST = "decoder.json"
PREFILL = "prefill.onnx"
STEP = "step.onnx"
EMBEDDING = "embedding.npy"
INPUT_KINDS = ("inputs_embeds", "input_ids")
# Worst |onnxruntime - torch| accepted on logits and cache in float32. Both run the same float32 graph;
# the differences are reassociation in MatMul / softmax kernels: ~1e-7 relative per op, a few 1e-6
# absolute after a few layers on logits of magnitude ~10. 1e-3 leaves room for 30+ layer models.
DEFAULT_ATOL = 1e-3


def past_names(num_layers: int) -> list[str]:
    """``past_key_values.{i}.key`` and ``.value`` for every layer, in the step graph's input order."""
    return [f"past_key_values.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


def present_names(num_layers: int) -> list[str]:
    """``present.{i}.key`` and ``.value`` for every layer, in the graphs' output order (after ``logits``)."""
    return [f"present.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


@dataclasses.dataclass(frozen=True)
class DecoderExport:
    """An exported decoder: the folder, its graphs and what a generation loop needs to drive them.

    ``input_kind`` is ``"inputs_embeds"`` or ``"input_ids"`` (what the graphs' first input is);
    ``embedding`` the ``[vocab, hidden]`` token table file; ``max_error`` the worst absolute difference to
    torch eager per validated graph and shape (e.g. ``{"step b2 s1": 3e-7}``); ``eos_token_id`` the
    model's end-of-sequence ids (from its generation config, possibly empty).
    """

    folder: Path
    input_kind: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    model_type: str
    eos_token_ids: tuple[int, ...] = ()
    max_error: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def prefill(self) -> Path:
        """The prefill graph (no past inputs)."""
        return self.folder / PREFILL

    @property
    def step(self) -> Path:
        """The step graph (past key/values in, presents out)."""
        return self.folder / STEP

    @property
    def embedding(self) -> Path:
        """The token embedding table, ``[vocab, hidden]`` float32 ``.npy``."""
        return self.folder / EMBEDDING

    @property
    def past_names(self) -> list[str]:
        """The step graph's cache inputs, in order."""
        return past_names(self.num_layers)

    @property
    def present_names(self) -> list[str]:
        """Both graphs' cache outputs, in order (after ``logits``)."""
        return present_names(self.num_layers)

    def load_embedding(self) -> np.ndarray:
        """The token embedding table as a float32 array (``allow_pickle=False``)."""
        try:
            table = np.load(self.embedding, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise ExportError(f"{self.embedding}: not a readable .npy embedding table ({e})") from None
        if table.shape != (self.vocab_size, self.hidden_size):
            raise ExportError(
                f"{self.embedding}: shape {list(table.shape)}, {self.folder / MANIFEST} says "
                f"[{self.vocab_size}, {self.hidden_size}]"
            )
        return np.ascontiguousarray(table, dtype=np.float32)

    def to_json(self) -> str:
        """The manifest text (``decoder.json``)."""
        d = dataclasses.asdict(self)
        d.pop("folder")
        d["eos_token_ids"] = list(self.eos_token_ids)
        d["files"] = {"prefill": PREFILL, "step": STEP, "embedding": EMBEDDING}
        return json.dumps(d, indent=2) + "\n"

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> DecoderExport:
        """Reads an export folder written by :func:`export_decoder`; ExportError naming what is missing."""
        folder = Path(folder)
        manifest = folder / MANIFEST
        if not manifest.is_file():
            raise ExportError(f"{folder}: no {MANIFEST} (not a folder written by softdeploy's decoder export)")
        try:
            d = json.loads(manifest.read_text(encoding="utf-8"))
            d.pop("files", None)
            found = cls(folder=folder, **{**d, "eos_token_ids": tuple(d.get("eos_token_ids", ()))})
        except (ValueError, TypeError) as e:
            raise ExportError(f"{manifest}: not a decoder manifest ({e})") from None
        missing = [p.name for p in (found.prefill, found.step, found.embedding) if not p.is_file()]
        if missing:
            raise ExportError(f"{folder}: missing {missing} (written by export_decoder beside {MANIFEST})")
        return found


def load_causal_lm(model_or_folder: Any) -> Any:
    """A transformers causal LM in eval mode: the model itself, or one read from a local folder (config.json +
    safetensors weights; never a hub download, never a pickle). ArgumentError / ExportError naming the folder."""
    if not isinstance(model_or_folder, str | os.PathLike):
        if not hasattr(model_or_folder, "get_input_embeddings") or not hasattr(model_or_folder, "config"):
            raise ArgumentError(
                f"export_decoder: {type(model_or_folder).__name__} is not a transformers causal LM "
                "(rule: a *ForCausalLM model or a folder holding one)"
            )
        return model_or_folder.eval()
    folder = Path(model_or_folder)
    if not (folder / "config.json").is_file():
        raise ArgumentError(f"{folder}: no config.json (rule: a local transformers model folder)")
    if not any(folder.glob("*.safetensors")):
        raise ArgumentError(f"{folder}: no *.safetensors weights (rule: safetensors only; pickles are not loaded)")
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, use_safetensors=True)
    except (ValueError, OSError, KeyError) as e:
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ExportError(f"{folder}: not loadable as a causal LM: {first}") from None
    return model.eval()


def _geometry(model: Any) -> tuple[int, int, int, int, int]:
    """(layers, kv heads, head dim, hidden, vocab) from the model's config."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers = int(cfg.num_hidden_layers)
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    hidden = int(cfg.hidden_size)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    return layers, kv, head_dim, hidden, vocab


def decoder_graph(model: Any, num_layers: int, *, input_kind: str, with_past: bool) -> Any:
    """The torch module exported as one graph: ``forward(first, attention_mask, position_ids, *past)`` ->
    ``(logits, *presents)`` with the cache flat (key, value per layer). ``with_past=False`` is the prefill graph (the
    cache starts empty). ``first`` is ``inputs_embeds`` or ``input_ids`` by ``input_kind``. Also the torch eager
    side of the validation and of :mod:`softdeploy.generate`'s reference loop."""
    import inspect

    import torch
    from transformers import DynamicCache

    # transformers 5.2x names the cache argument ``cache`` (``past_key_values`` is deprecated); older: the latter
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    class DecoderGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, first: Any, attention_mask: Any, position_ids: Any, *past: Any) -> tuple[Any, ...]:
            cache = DynamicCache(config=self.model.config)
            for i in range(num_layers if with_past else 0):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(
                **{input_kind: first},
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                **{cache_arg: cache},
            )
            kv = getattr(out, "cache", None) or out.past_key_values
            flat = [t for layer in kv.layers[:num_layers] for t in (layer.keys, layer.values)]
            return (out.logits, *flat)

    return DecoderGraph().eval()


def positions(mask: np.ndarray) -> np.ndarray:
    """transformers' positions for a (left-)padded ``attention_mask`` [batch, length]: ``cumsum - 1``, clipped at
    0 (padding positions get 0)."""
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int64)


def _example(
    model: Any, geometry: tuple[int, int, int, int, int], input_kind: str, batch: int, seq: int, past: int, seed: int
) -> list[Any]:
    """Inputs for one graph call: random embeddings (or ids), a mask whose row 0 is left-padded by one position
    when there is room, positions from the mask, random past keys/values."""
    import torch

    layers, kv, head_dim, _, vocab = geometry
    g = torch.Generator().manual_seed(seed)
    if input_kind == "inputs_embeds":
        table = model.get_input_embeddings().weight.detach()
        ids = torch.randint(0, vocab, (batch, seq), generator=g)
        first: Any = table[ids].clone()
    else:
        first = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = np.ones((batch, past + seq), np.int64)
    if past + seq >= 3:
        mask[0, 0] = 0
    pos = positions(mask)[:, past:]
    pasts = [torch.randn(batch, kv, past, head_dim, generator=g) for _ in range(2 * layers if past else 0)]
    return [first, torch.from_numpy(mask), torch.from_numpy(np.ascontiguousarray(pos)), *pasts]


def _max_error(onnx_out: Sequence[np.ndarray], torch_out: Sequence[Any], mask: np.ndarray, seq: int) -> float:
    """Worst |a - b| over logits (new positions the mask keeps) and presents (positions the mask keeps)."""
    keep_new = mask[:, -seq:].astype(bool)
    worst = 0.0
    for i, (a, t) in enumerate(zip(onnx_out, torch_out, strict=True)):
        b = t.detach().numpy()
        if a.shape != b.shape:
            raise ExportError(f"decoder export: output {i} has shape {list(a.shape)}, torch's {list(b.shape)}")
        if i == 0:
            diff = np.abs(a - b)[keep_new]
        else:
            diff = np.abs(a - b).transpose(0, 2, 1, 3)[mask.astype(bool)]
        if diff.size:
            worst = max(worst, float(np.nanmax(diff)) if np.isfinite(diff).all() else float("inf"))
    return worst


def export_decoder(
    model_or_folder: Any,
    out_dir: str | os.PathLike[str],
    *,
    inputs_embeds: bool = True,
    example_length: int = 3,
    example_past: int = 4,
    atol: float = DEFAULT_ATOL,
    opset: int = 18,
    overwrite: bool = False,
    progress: Any = None,
) -> DecoderExport:
    """Exports a transformers causal LM as ``out_dir/prefill.onnx`` and ``out_dir/step.onnx`` (see the module
    docstring for their inputs and outputs), writes ``embedding.npy`` and ``decoder.json`` beside them, and returns
    the :class:`DecoderExport`.

    ``model_or_folder``: a ``*ForCausalLM`` model (Llama, Qwen2, GPT-2 style; put in eval mode) or a local folder
    with its config.json and safetensors weights. ``inputs_embeds=True`` makes the graphs take
    ``inputs_embeds`` [batch, seq, hidden] (what a soft-thinking loop feeds); ``False`` takes ``input_ids``.
    ``example_length`` / ``example_past`` (both >= 2: torch.export specialises 0 and 1) size the export
    examples. Each graph is validated against torch eager at batch 1 and 2, at length 1 and at the example
    length (a left-padded row included); a worst difference above ``atol`` raises ExportError and nothing is
    written. Existing files in ``out_dir`` are replaced only with ``overwrite``. ``progress`` (a
    :class:`softdeploy.compare.case.Progress`) shows the steps.

    This is the public entry point other softdeploy commands call for causal-LM export; the returned
    object's ``prefill``, ``step``, ``embedding``, ``past_names`` and ``present_names`` are what a caller
    needs to run the graphs (or :func:`softdeploy.generate.ort_generator` to drive them).
    """
    import torch

    from softdeploy.export.torch_export import export_program
    from softdeploy.files import check_outputs, make_folder, save_model, write_text, write_with
    from softdeploy.progress import SilentProgress
    from softdeploy.runtime import Session

    progress = progress or SilentProgress()
    if example_length < 2 or example_past < 2:
        raise ArgumentError(
            f"export_decoder: example_length {example_length}, example_past {example_past} "
            "(rule: both >= 2; torch.export specialises a dimension whose example is 0 or 1)"
        )
    input_kind = "inputs_embeds" if inputs_embeds else "input_ids"
    out = Path(out_dir)
    outputs = [out / n for n in (PREFILL, STEP, EMBEDDING, MANIFEST)]
    check_outputs([str(p) for p in outputs], overwrite=overwrite)
    model = load_causal_lm(model_or_folder)
    geometry = _geometry(model)
    layers, kv, head_dim, hidden, vocab = geometry
    batch_dim = torch.export.Dim("batch")
    seq_dim = torch.export.Dim("sequence")
    past_dim = torch.export.Dim("past_sequence")
    first_shape = {0: batch_dim, 1: seq_dim}
    errors: dict[str, float] = {}
    models = {}
    for name, with_past in (("prefill", False), ("step", True)):
        module = decoder_graph(model, layers, input_kind=input_kind, with_past=with_past)
        past = example_past if with_past else 0
        example = _example(model, geometry, input_kind, 2, example_length, past, seed=0)
        total = torch.export.Dim.AUTO if with_past else seq_dim
        # by position; the past tensors (the forward's *past) are one group
        dynamic: tuple[Any, ...] = (
            first_shape,
            {0: batch_dim, 1: total},
            {0: batch_dim, 1: seq_dim},
        ) + ((tuple({0: batch_dim, 2: past_dim} for _ in range(2 * layers)),) if with_past else ())
        in_names = [input_kind, "attention_mask", "position_ids", *(past_names(layers) if with_past else [])]
        out_names = ["logits", *present_names(layers)]
        with progress.step(f"export the {name} graph"), torch.no_grad():
            proto, _ = export_program(
                module,
                example,
                dynamic_shapes=dynamic,
                input_names=in_names,
                output_names=out_names,
                opset=opset,
            )
        _name_dims(proto, with_past)
        with progress.step(f"validate the {name} graph against torch", total=4) as advance:
            sess = Session(proto, kernels="auto")
            for batch in (1, 2):
                for seq in (1, example_length):
                    inputs = _example(model, geometry, input_kind, batch, seq, past, seed=10 * batch + seq)
                    with torch.no_grad():
                        ref = module(*inputs)
                    got = sess.run(dict(zip(in_names, [t.numpy() for t in inputs], strict=True)))
                    err = _max_error(got, ref, inputs[1].numpy(), seq)
                    errors[f"{name} b{batch} s{seq}"] = err
                    if not err <= atol:
                        raise ExportError(
                            f"decoder export: the {name} graph differs from torch eager by {err:.3g} at batch "
                            f"{batch}, length {seq} (rule: <= atol {atol:g})"
                        )
                    advance(1)
        models[name] = proto
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list | tuple) else [eos] if eos is not None else []))
    result = DecoderExport(
        folder=out,
        input_kind=input_kind,
        num_layers=layers,
        num_kv_heads=kv,
        head_dim=head_dim,
        hidden_size=hidden,
        vocab_size=vocab,
        model_type=str(getattr(model.config, "model_type", "")),
        eos_token_ids=eos_ids,
        max_error=errors,
    )
    make_folder(out, "decoder export folder")
    table = model.get_input_embeddings().weight.detach().float().numpy()
    save_model(models["prefill"], result.prefill, "prefill graph")
    save_model(models["step"], result.step, "step graph")
    write_with(result.embedding, lambda p: _save_npy(p, table), "embedding table")
    write_text(out / MANIFEST, result.to_json(), "decoder manifest")
    return result


def _save_npy(path: Path, table: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(table, dtype=np.float32), allow_pickle=False)


def _name_dims(proto: Any, with_past: bool) -> None:
    """Readable names for the symbolic dims torch left unnamed (the mask's total length)."""
    for value in proto.graph.input:
        if value.name == "attention_mask" and with_past:
            dim = value.type.tensor_type.shape.dim[1]
            if dim.dim_param and not dim.dim_param.startswith("past"):
                old = dim.dim_param
                for v in [*proto.graph.input, *proto.graph.output]:
                    for d in v.type.tensor_type.shape.dim:
                        if d.dim_param == old:
                            d.dim_param = "total_sequence"
