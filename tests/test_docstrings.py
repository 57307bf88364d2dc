"""Every public function, class, method and property of softdeploy has a docstring (the API reference
is rendered from them, and mkdocstrings silently leaves out what has none)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import re
from typing import Any

import softdeploy


def public_modules() -> list[str]:
    """softdeploy and its submodules whose dotted path has no component starting with '_'; TVM's only
    when TVM is installed (they import it)."""
    have_tvm = importlib.util.find_spec("tvm") is not None
    names = ["softdeploy"]
    for m in pkgutil.walk_packages(softdeploy.__path__, "softdeploy."):
        if any(part.startswith("_") for part in m.name.split(".")[1:]):
            continue
        if m.name.startswith("softdeploy.tvm.") and not have_tvm:
            continue
        names.append(m.name)
    return names


def _doc(obj: Any) -> str:
    return (getattr(obj, "__doc__", None) or "").strip()


def _auto_doc(name: str, doc: str) -> bool:
    """The docstring dataclasses and NamedTuples write for a class without one: 'Name(field, ...)'."""
    return re.fullmatch(rf"{re.escape(name)}\(.*\)", doc, re.S) is not None


def _member_doc(cls: type, name: str, member: Any) -> str:
    """The member's docstring, or that of the softdeploy base-class member it overrides (what the
    rendered reference and help() show for it)."""
    target = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
    if _doc(target):
        return _doc(target)
    for base in cls.__mro__[1:]:
        if base.__module__.startswith("softdeploy") and name in vars(base):
            inherited = vars(base)[name]
            inherited = inherited.fget if isinstance(inherited, property) else getattr(inherited, "__func__", inherited)
            if _doc(inherited):
                return _doc(inherited)
    return ""


def undocumented(module_name: str) -> list[str]:
    """The public names of one module (defined there, or exported in its ``__all__`` from a private module,
    e.g. softdeploy.ops.OpDef) that have no docstring."""
    module = importlib.import_module(module_name)
    missing = [] if _doc(module) else [f"{module_name} (module)"]
    for name, obj in vars(module).items():
        if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        exported = name in getattr(module, "__all__", ())
        if getattr(obj, "__module__", None) != module_name and not (
            exported and str(getattr(obj, "__module__", "")).startswith("softdeploy")
        ):
            continue  # imported: checked where it is defined (or here, when a private module defines it)
        doc = _doc(obj)
        if not doc or (inspect.isclass(obj) and _auto_doc(name, doc)):
            missing.append(f"{module_name}.{name}")
        if not inspect.isclass(obj):
            continue
        for member_name, member in vars(obj).items():
            if member_name.startswith("_"):
                continue
            if not (inspect.isfunction(member) or isinstance(member, (property, staticmethod, classmethod))):
                continue
            if not _member_doc(obj, member_name, member):
                missing.append(f"{module_name}.{name}.{member_name}")
    return missing


def test_every_public_name_has_a_docstring() -> None:
    modules = public_modules()
    # The walk covers what the API reference renders (a walk that found nothing would pass).
    for name in (
        "softdeploy.nn",
        "softdeploy.ops",
        "softdeploy.runtime.session",
        "softdeploy.quant.search",
        "softdeploy.compare.runner",
        "softdeploy.workflow.spec",
        "softdeploy.export.api",
    ):
        assert name in modules
    assert "softdeploy.ops._schema" not in modules
    missing = [m for name in modules for m in undocumented(name)]
    assert missing == [], f"{len(missing)} public names without a docstring:\n" + "\n".join(missing)
