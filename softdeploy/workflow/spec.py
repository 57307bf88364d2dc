"""A workflow file: what ``softdeploy run`` needs to know about a user's model, as data.

YAML or JSON, validated against :data:`SCHEMA` (``softdeploy/workflow/schema.json``, published with the
package); a violation is a :class:`WorkflowError` naming the key (``data.batch: 0 is less than the
minimum of 1``). Relative paths are relative to the workflow file's folder.
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

from softdeploy.errors import SoftdeployError

SCHEMA_PATH = Path(__file__).with_name("schema.json")


class WorkflowError(SoftdeployError, ValueError):
    """A workflow file, or the data and metrics it names, is not usable (the message names the key)."""


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
    model: str  # an ONNX path, or a factory 'pkg.mod:fn' when ``factory`` is True
    data: DataSpec
    factory: bool = False
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
    validate(raw, name)
    base = Path(base)
    model = raw["model"]
    if isinstance(model, Mapping):
        factory = "factory" in model
        model_ref = model["factory"] if factory else model["onnx"]
    else:
        model_ref = model
        factory = is_callable_ref(model) and not model.endswith(".onnx")
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
        name=raw.get("name", name),
        title=raw.get("title", ""),
        model=_resolve(base, model_ref) or "",
        factory=factory,
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
        ),
        variants=tuple(raw["variants"]) if "variants" in raw else None,
        threads=int(raw.get("threads", 1)),
        rounds=int(raw.get("rounds", 8)),
        out=_resolve(base, raw.get("out", "softdeploy-results")) or "softdeploy-results",
        base=base,
    )


def load_workflow(path: str | os.PathLike[str]) -> Workflow:
    """Reads a YAML (``.yaml`` / ``.yml``) or JSON workflow file and validates it."""
    p = Path(path)
    if not p.is_file():
        raise WorkflowError(f"workflow file {p} does not exist" if not p.exists() else f"workflow {p} is not a file")
    text = p.read_text()
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text)
        else:
            raw = json.loads(text)
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError
        raise WorkflowError(f"{p}: not valid {'YAML' if p.suffix in ('.yaml', '.yml') else 'JSON'}: {e}") from e
    if not isinstance(raw, Mapping):
        raise WorkflowError(f"{p}: the top level must be a mapping of keys (model, data, metrics, ...)")
    return parse(raw, base=p.resolve().parent, name=p.stem)
