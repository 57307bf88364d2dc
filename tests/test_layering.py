"""softdeploy's layers, held: every import in the package (module level, inside functions, and
``importlib.import_module("literal")``) goes down the table below or stays in its own layer, no two
packages or modules import each other round a circle, and the library never imports bench/ or the cases.

The table is the design: a module's layer is that of the longest prefix listed. A lower layer never
imports a higher one, lazily or not; a lazy import hides a dependency from the start-up time, not from
the structure. Within one layer, packages may use each other as long as no circle forms.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

import softdeploy

# Lowest first. A module belongs to the layer of the longest prefix listed here; the package root names the root
# module alone, so a new module outside every entry fails test_every_module_has_a_layer instead of landing on top.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Leaf helpers: errors, the ONNX domain, platform facts (CPU flags and the one ISA rule), files and caches,
    # terminal output and progress, Ctrl-C held during imports, entry points, packaged assets. They import nothing above this layer.
    (
        "leaf",
        (
            "softdeploy.errors",
            "softdeploy.domain",
            "softdeploy.cpu",
            "softdeploy.files",
            "softdeploy.cache",
            "softdeploy.terminal",
            "softdeploy.safetensors_check",
            "softdeploy.progress",
            "softdeploy.interrupts",
            "softdeploy.plugins",
            # packaged weights and data, located and verified (never the hub); export and distill read them too
            "softdeploy.models.assets",
        ),
    ),
    # The op registry, schemas, references and the function bodies attached to exported models.
    ("ops", ("softdeploy.ops",)),
    # onnxruntime sessions over the kernel library.
    ("runtime", ("softdeploy.runtime",)),
    # torch modules that emit softdeploy ops, and LoRA adapters over them.
    ("torch", ("softdeploy.nn", "softdeploy.attention_interface", "softdeploy.lora")),
    ("export", ("softdeploy.export",)),
    ("quant", ("softdeploy.quant",)),
    ("tvm", ("softdeploy.tvm",)),
    # Measuring: comparisons, conformance, generation loops.
    ("compare", ("softdeploy.compare", "softdeploy.conformance", "softdeploy.generate")),
    ("distill", ("softdeploy.distill",)),
    # Orchestration: workflows (quantize included), serving, the demo, the environment check.
    ("workflow", ("softdeploy.workflow", "softdeploy.serve", "softdeploy.demo", "softdeploy.doctor")),
    # Evaluation cases: they use the library, the library never uses them.
    ("cases", ("softdeploy.models",)),
    ("cli", ("softdeploy.cli",)),
    # The package's face: ``softdeploy.export(...)`` and the re-exported names. Nothing inside imports it.
    ("facade", ("softdeploy",)),
)

# Never imported from the library: benchmarks, and the cases' own distribution.
FORBIDDEN = ("bench", "cases", "softdeploy_cases")


@dataclasses.dataclass(frozen=True)
class Import:
    """One import statement's target as written in ``source`` at ``line``."""

    source: str  # importing module
    target: str  # imported module (resolved to a module of the package, or the name as written)
    path: str  # importing file, relative to the repository
    line: int


def _entry(module: str, layers: Iterable[tuple[str, tuple[str, ...]]] = LAYERS) -> tuple[int, str, str]:
    """(layer index, layer name, the entry of LAYERS) ``module`` falls under: the longest listed prefix (a prefix ends
    at a dot; a prefix without a dot, the package root, names only itself)."""
    best: tuple[int, int, str, str] | None = None
    for i, (name, prefixes) in enumerate(layers):
        for p in prefixes:
            covers = module == p or ("." in p and module.startswith(p + "."))
            if covers and (best is None or len(p) > best[0]):
                best = (len(p), i, name, p)
    if best is None:
        raise AssertionError(f"{module}: in no layer of tests/test_layering.py's LAYERS; add it to one")
    return best[1], best[2], best[3]


def layer_of(module: str, layers: Iterable[tuple[str, tuple[str, ...]]] = LAYERS) -> tuple[int, str]:
    """(index, name) of ``module``'s layer (see :func:`_entry`)."""
    index, name, _ = _entry(module, layers)
    return index, name


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` (the repository), by dotted name."""
    out = {}
    for path in sorted((root / "softdeploy").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names ``node`` imports (for ``from A import b``: ``A.b`` and ``A``, the first that is a
    module wins in :func:`imports`)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")
            if not is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            where = ".".join(base + ([node.module] if node.module else []))
        else:
            where = node.module or ""
        return [f"{where}.{a.name}|{where}" for a in node.names]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "import_module"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "importlib"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


def _resolve(name: str, modules: Mapping[str, Path]) -> str:
    """The package module ``name`` lands in: itself, else its longest dotted prefix that is a module."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports(root: Path) -> list[Import]:
    """Every import of every module of the package, lazy ones included."""
    modules = module_files(root)
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            for target in _targets(node, module, path.name == "__init__.py"):
                candidate, _, fallback = target.partition("|")
                if candidate in modules or not fallback:
                    name = candidate
                else:
                    name = fallback
                top = name.split(".")[0]
                if top == "softdeploy":
                    name = _resolve(name, modules)
                elif top not in FORBIDDEN:
                    continue
                if name != module:
                    found.append(Import(module, name, str(path.relative_to(root)), node.lineno))
    return found


def _cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    nodes = sorted(set(edges) | {t for ts in edges.values() for t in ts})

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def violations(found: Iterable[Import], layers: Iterable[tuple[str, tuple[str, ...]]] = LAYERS) -> list[str]:
    """One line per broken rule: forbidden imports, upward imports, then circles between the table's entries (a
    subpackage, a top-level module, or a module listed on its own) and between modules (each circle's imports listed
    with file:line)."""
    layers = tuple(layers)
    found = list(found)
    out = []
    for imp in sorted(set(found), key=lambda i: (i.path, i.line, i.target)):
        if imp.target.split(".")[0] in FORBIDDEN:
            out.append(
                f"{imp.path}:{imp.line}: {imp.source} imports {imp.target}: the library never imports bench/ or cases"
            )
            continue
        (low, low_name), (high, high_name) = layer_of(imp.source, layers), layer_of(imp.target, layers)
        if high > low:
            out.append(
                f"{imp.path}:{imp.line}: {imp.source} imports {imp.target}: layer {low_name!r} imports the higher layer "
                f"{high_name!r}"
            )
    library = [imp for imp in found if imp.target.split(".")[0] not in FORBIDDEN]

    def entry(module: str) -> str:
        return _entry(module, layers)[2]

    for unit in (entry, lambda m: m):
        edges: dict[str, set[str]] = {}
        for imp in library:
            a, b = unit(imp.source), unit(imp.target)
            if a != b:
                edges.setdefault(a, set()).add(b)
        for component in _cycles(edges):
            members = set(component)
            where = sorted(
                {
                    f"{imp.path}:{imp.line} -> {imp.target}"
                    for imp in library
                    if unit(imp.source) in members
                    and unit(imp.target) in members
                    and unit(imp.source) != unit(imp.target)
                }
            )
            kind = "entries" if unit is entry else "modules"
            out.append(f"circle between {kind} {', '.join(component)}: " + "; ".join(where))
    return out


def _repository() -> Path:
    return Path(softdeploy.__file__).resolve().parents[1]


def test_the_walk_finds_lazy_and_module_level_imports() -> None:
    found = {(i.source, i.target) for i in imports(_repository())}
    # module level, in a function body, and through importlib.import_module, each seen
    assert ("softdeploy.files", "softdeploy.errors") in found
    assert ("softdeploy.runtime.session", "softdeploy.ops") in found
    assert ("softdeploy", "softdeploy.export") in found


def test_every_module_has_a_layer() -> None:
    for module in module_files(_repository()):
        layer_of(module)


def test_no_upward_import_no_circle_no_bench_or_cases() -> None:
    broken = violations(imports(_repository()))
    assert not broken, f"{len(broken)} layering violation(s) (layers: tests/test_layering.py LAYERS):\n" + "\n".join(
        broken
    )


def test_violations_are_found_in_a_synthetic_graph() -> None:
    layers = (("low", ("pkg.low",)), ("high", ("pkg.high",)), ("top", ("pkg",)))
    graph = [
        Import("pkg.high.a", "pkg.low.b", "pkg/high/a.py", 3),  # down: fine
        Import("pkg.low.b", "pkg.high.c", "pkg/low/b.py", 7),  # up (and, with the first, a circle)
        Import("pkg.low.b", "bench.harness", "pkg/low/b.py", 9),  # bench
        Import("pkg.low.d", "pkg.low.e", "pkg/low/d.py", 1),  # a circle inside one layer
        Import("pkg.low.e", "pkg.low.d", "pkg/low/e.py", 2),
    ]
    found = violations(graph, layers)
    assert "pkg/low/b.py:7: pkg.low.b imports pkg.high.c: layer 'low' imports the higher layer 'high'" in found
    assert "pkg/low/b.py:9: pkg.low.b imports bench.harness: the library never imports bench/ or cases" in found
    circles = [v for v in found if v.startswith("circle")]
    assert any("pkg.high, pkg.low" in v and "pkg/low/b.py:7 -> pkg.high.c" in v for v in circles)
    assert any("modules pkg.low.d, pkg.low.e" in v for v in circles)
    assert violations(graph[:1], layers) == []
    assert layer_of("pkg.high.x.y", layers) == (1, "high")
    assert layer_of("pkg", layers) == (2, "top")
    with pytest.raises(AssertionError, match="in no layer"):  # the root names itself only: a new module must be placed
        layer_of("pkg.other", layers)
