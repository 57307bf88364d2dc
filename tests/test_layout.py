"""The test tree must not hide the packages it tests: pytest puts tests/ on sys.path (its folders have no __init__.py),
so a folder named like an installed package (tests/tvm once) shadows it wherever that package is missing and turns
skips into failures."""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Packages the suite imports or skips on (the extras'); a folder of tests/ must never take one of these names.
GUARDED = {"softdeploy", "tvm", "tvm_ffi", "torch", "onnx", "onnxruntime", "onnxscript", "transformers", "peft"}
GUARDED |= {"safetensors", "numpy", "hypothesis", "rich", "yaml", "jsonschema", "matplotlib", "mkdocs", "ray"}


def test_no_test_folder_shadows_an_installed_or_guarded_package() -> None:
    elsewhere = [p for p in sys.path if Path(p or ".").resolve() != TESTS]
    for folder in sorted(p for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))):
        assert folder.name not in GUARDED, f"tests/{folder.name} shadows the {folder.name} package; rename it"
        if (folder / "__init__.py").exists():
            continue
        found = importlib.machinery.PathFinder.find_spec(folder.name, elsewhere)
        if found is None or found.origin is None:  # absent, or a bare folder elsewhere (a namespace, no package)
            continue
        raise AssertionError(f"tests/{folder.name} shadows the installed {folder.name} ({found.origin}); rename it")
