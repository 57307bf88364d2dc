"""A workflow file: what ``softdeploy run`` needs to know about a user's model, as data.

YAML or JSON, validated against :data:`SCHEMA` (``softdeploy/workflow/schema.json``, published with the
package); a violation is a :class:`WorkflowError` naming the key (``data.batch: 0 is less than the
minimum of 1``). Relative paths are relative to the workflow file's folder.

Beyond the schema: the file is UTF-8 text, each key appears once per mapping (YAML and JSON would keep the last
silently), ``name`` is a plain folder name (not ``.`` or ``..``: the results go to ``OUT/NAME/`` and nowhere else),
and ``threads`` above this machine's CPU count is lowered to it with a one-line
:class:`~softdeploy.errors.SoftdeployWarning` (more threads than cores only slows every variant down, and tens of
thousands of them took minutes to start).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# WorkflowError and the folder-name and thread-count rules are leaf facts (the comparison runner holds a case to
# them too); re-exported here, where a workflow file is read.
from softdeploy.cpu import bounded_threads as bounded_threads
from softdeploy.cpu import cpu_count as cpu_count
from softdeploy.errors import WorkflowError as WorkflowError
from softdeploy.files import check_folder_name as check_folder_name
from softdeploy.files import folder_name_for as folder_name_for
from softdeploy.files import folder_name_problem as folder_name_problem

SCHEMA_PATH = Path(__file__).with_name("schema.json")


@functools.cache
def schema() -> dict[str, Any]:
    """The workflow file's JSON Schema (draft 2020-12)."""
    return json.loads(SCHEMA_PATH.read_text())


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One metric: a built-in name (:data:`softdeploy.workflow.metrics.BUILTIN`) or ``pkg.mod:fn``."""

    name: str
    output: str | None = None
    label: str | None = None
    k: int | None = None
    goal: str | None = None  # "max" | "min"; None: the built-in's own, "max" for a function


@dataclasses.dataclass(frozen=True)
class QuantizeSpec:
    """How the int8 variants are made (the budget search when ``max_drop`` is set)."""

    mode: str = "static"
    max_drop: float | None = None
    metric: str | None = None
    per_channel: bool = True
    calibrate_method: str = "minmax"
    exclude: tuple[str, ...] = ()
    # the CPU class the int8 model is for (softdeploy.quant.formats.TARGETS; "auto": the quantizing CPU's)
    target: str = "auto"


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """Where the inputs (and labels) come from; see the schema for the forms."""

    inputs: str
    labels: str | None = None
    batch: int = 8
    constant: tuple[str, ...] = ()
    calibration: str | None = None


@dataclasses.dataclass(frozen=True)
class Workflow:
    """A parsed, validated workflow (paths resolved)."""

    name: str
    model: str  # an ONNX path, a factory 'pkg.mod:fn' when ``factory`` is True, or a folder when ``folder`` is set
    data: DataSpec
    factory: bool = False
    folder: str | None = None  # "hf" | "sentence-transformers": ``model`` is a model folder (softdeploy.export.hf)
    task: str | None = None  # the folder's task (None: from its config.json)
    attention: str = "eager"  # the folder's attention implementation (softdeploy.attention_interface)
    outputs: tuple[str, ...] | None = None  # names given to the model's outputs, in order
    opset: int = 18
    title: str = ""
    metrics: tuple[MetricSpec, ...] = ()
    primary: str | None = None
    quantize: QuantizeSpec = QuantizeSpec()
    variants: tuple[str, ...] | None = None
    threads: int = 1
    rounds: int = 8
    out: str = "softdeploy-results"
    base: Path = Path(".")  # the folder relative paths were resolved against


def is_callable_ref(value: str) -> bool:
    """``pkg.mod:fn`` or ``path/to/file.py:fn`` (a factory, loader or metric function)."""
    return re.fullmatch(r"[\w./\\-]+\.py:\w+|[A-Za-z_][\w.]*:\w+", value) is not None


def _resolve(base: Path, value: str | None) -> str | None:
    """A path relative to the workflow file (also the file of 'file.py:fn'); 'pkg.mod:fn' stays as it is."""
    if value is None:
        return None
    if is_callable_ref(value):
        target, _, fn = value.rpartition(":")
        if not target.endswith(".py"):
            return value
        return f"{_resolve(base, target)}:{fn}"
    return value if Path(value).is_absolute() else str(base / value)


def validate(raw: Any, where: str = "workflow") -> None:
    """Raises WorkflowError naming the first key that breaks the schema."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(raw), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        e = errors[0]
        key = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        raise WorkflowError(f"{where}: {key}: {e.message}")


def parse(raw: Mapping[str, Any], *, base: str | os.PathLike[str] = ".", name: str = "workflow") -> Workflow:
    """A Workflow from an already-loaded mapping (validated first)."""
    if isinstance(raw, Mapping) and isinstance(raw.get("name"), str):
        check_folder_name(raw["name"], name)  # before the schema: its pattern alone lets '.' and '..' through
    from softdeploy.export.hf import CAUSAL_LM_WITH_PAST

    model = raw.get("model") if isinstance(raw, Mapping) else None
    if isinstance(model, Mapping) and model.get("task") == CAUSAL_LM_WITH_PAST:  # before the schema: say why not
        raise WorkflowError(
            f"{name}: model.task: {CAUSAL_LM_WITH_PAST} exports two graphs, prefill.onnx and step.onnx with a KV cache "
            "(rule: a workflow exports and compares one model on one dataset; use task causal-lm here (logits, no "
            f"cache), or on the command line `softdeploy export FOLDER OUT_DIR --task {CAUSAL_LM_WITH_PAST}` and "
            "`softdeploy generate FOLDER`)"
        )
    validate(raw, name)
    base = Path(base)
    model = raw["model"]
    folder = None
    if isinstance(model, Mapping):
        factory = "factory" in model
        folder = "hf" if "hf" in model else "sentence-transformers" if "sentence_transformers" in model else None
        key = "factory" if factory else "hf" if folder == "hf" else "sentence_transformers" if folder else "onnx"
        model_ref = model[key]
    else:
        model_ref = model
        factory = is_callable_ref(model) and not model.endswith(".onnx")
        if not factory:
            from softdeploy.export.hf import is_model_folder

            if is_model_folder(_resolve(base, model) or ""):  # a folder named as a plain string: what it holds says
                folder = (
                    "sentence-transformers" if (Path(_resolve(base, model) or "") / "modules.json").is_file() else "hf"
                )
    d = raw["data"]
    labels = d.get("labels")  # an .npy file, or the name of an array of the inputs file
    data = DataSpec(
        inputs=_resolve(base, d["inputs"]) or "",
        labels=_resolve(base, labels) if labels and labels.endswith(".npy") else labels,
        batch=int(d.get("batch", 8)),
        constant=tuple(d.get("constant", ())),
        calibration=_resolve(base, d.get("calibration")),
    )
    q = raw.get("quantize", {})
    return Workflow(
        name=check_folder_name(raw.get("name", name), name),
        title=raw.get("title", ""),
        model=_resolve(base, model_ref) or "",
        factory=factory,
        folder=folder,
        task=model.get("task") if isinstance(model, Mapping) else None,
        attention=model.get("attention", "eager") if isinstance(model, Mapping) else "eager",
        outputs=tuple(model["outputs"]) if isinstance(model, Mapping) and "outputs" in model else None,
        opset=int(model.get("opset", 18)) if isinstance(model, Mapping) else 18,
        data=data,
        metrics=tuple(MetricSpec(**m) for m in raw.get("metrics", ())),
        primary=raw.get("primary"),
        quantize=QuantizeSpec(
            mode=q.get("mode", "static"),
            max_drop=q.get("max_drop"),
            metric=q.get("metric"),
            per_channel=q.get("per_channel", True),
            calibrate_method=q.get("calibrate_method", "minmax"),
            exclude=tuple(q.get("exclude", ())),
            target=q.get("target", "auto"),
        ),
        variants=tuple(raw["variants"]) if "variants" in raw else None,
        threads=bounded_threads(int(raw.get("threads", 1)), f"{name}: threads"),
        rounds=int(raw.get("rounds", 8)),
        out=_resolve(base, raw.get("out", "softdeploy-results")) or "softdeploy-results",
        base=base,
    )


def load_workflow(path: str | os.PathLike[str]) -> Workflow:
    """Reads a YAML (``.yaml`` / ``.yml``) or JSON workflow file and validates it. Every problem with the file (not
    UTF-8, not valid YAML/JSON, a key twice in one mapping, a schema violation) is a one-line WorkflowError naming
    the file."""
    p = Path(path)
    if not p.is_file():
        raise WorkflowError(f"workflow file {p} does not exist" if not p.exists() else f"workflow {p} is not a file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise WorkflowError(f"workflow file {p}: cannot be read ({e.strerror or e})") from e
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise WorkflowError(
            f"{p}: not UTF-8 text: byte {data[e.start]:#04x} at line {line} (rule: save the workflow file as UTF-8)"
        ) from None
    is_yaml = p.suffix in (".yaml", ".yml")
    try:
        raw = _load_yaml(text) if is_yaml else json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise WorkflowError(
            f"{p}: {e} (rule: each key once; {'YAML' if is_yaml else 'JSON'} would keep the last)"
        ) from None
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError
        raise WorkflowError(f"{p}: not valid {'YAML' if is_yaml else 'JSON'}: {_one_line(e)}") from None
    if not isinstance(raw, Mapping):
        raise WorkflowError(f"{p}: the top level must be a mapping of keys (model, data, metrics, ...)")
    return parse(raw, base=p.resolve().parent, name=p.stem)


class _DuplicateKey(ValueError):
    """A key that appears twice in one mapping of the file."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: the object as a dict, refusing a key that appears twice."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


@functools.cache
def _unique_key_loader() -> Any:
    """yaml.SafeLoader refusing a key that appears twice in one mapping (made on first use: yaml is imported then)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the constructor below reports it
                    continue
                if dup:
                    mark = key_node.start_mark
                    raise _DuplicateKey(
                        f"line {mark.line + 1}, column {mark.column + 1}: key {key!r} appears twice in one mapping"
                    )
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def _load_yaml(text: str) -> Any:
    import yaml

    return yaml.load(text, Loader=_unique_key_loader())  # a SafeLoader subclass: no arbitrary objects


def _one_line(e: Exception) -> str:
    """A parser's error in one line: PyYAML's span several (the problem, then the offending line and a caret)."""
    problem = getattr(e, "problem", None)
    mark = getattr(e, "problem_mark", None)
    if problem and mark is not None:
        context = getattr(e, "context", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        return f"{where}: {problem}" + (f" ({context})" if context else "")
    return " ".join(str(e).split())
