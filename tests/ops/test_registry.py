"""REGISTRY (Python), ops/ops.inc (C++) and the ops the built library registers are one set."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from softdeploy.ops import REGISTRY, register_onnx_schemas
from softdeploy.runtime import Session

ROOT = Path(__file__).resolve().parents[2]


def ops_inc() -> list[tuple[str, str]]:
    text = (ROOT / "ops" / "ops.inc").read_text()
    return re.findall(r"^SD_OP\((\w+), *(\w+)\)", text, flags=re.M)


def test_registry_matches_ops_inc():
    inc = ops_inc()
    assert [n for n, _ in inc] == sorted(n for n, _ in inc), "ops.inc must stay sorted"
    assert {n for n, _ in inc} == set(REGISTRY)
    for name, stem in inc:
        assert REGISTRY[name].stem == stem
        assert (ROOT / "ops" / f"{stem}.cc").is_file()
        assert (ROOT / "softdeploy" / "ops" / f"{stem}.py").is_file()


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_library_registers_op(op):
    """A one-node model WITHOUT the function body only runs if the library provides the kernel."""
    sample = next(iter(op.samples(np.random.default_rng(0))))
    Session(op.make_model(sample, with_function=False), kernels="native").run(op.feeds(sample))


def equation_lines(doc: str) -> list[str]:
    """The lines of the docstring's indented blocks (the equation is written as one, after the summary line)
    that define something: ``lhs = rhs``."""
    lines = []
    for block in re.split(r"\n\s*\n", doc):
        rows = [r for r in block.splitlines() if r.strip()]
        if rows and all(r.startswith("  ") for r in rows):
            lines += [r.strip() for r in rows if re.search(r"(?<![<>=!])=(?!=)", r)]
    return lines


def defined_names(doc: str) -> set[str]:
    """Names on the left of ``=`` in the equation, each also without its subscript (``y_i`` -> ``y``)."""
    names = set()
    for line in equation_lines(doc):
        for lhs in re.split(r"(?<![<>=!])=(?!=)", line)[:-1]:
            for word in re.findall(r"[^\W\d]\w*", lhs):
                names |= {word, word.split("_")[0]}
    return names


def named(name: str, words: set[str]) -> bool:
    """``name`` is among ``words``; a one-letter port may be written in lower case, as its elements (X as x_j)."""
    return name in words or (len(name) == 1 and name.lower() in words)


def docstring_problems(op, doc: str) -> list[str]:
    """What ``doc``, as the docstring of ``op``, leaves out: an indented equation block that defines every output,
    a mention of every input and attribute."""
    if not equation_lines(doc):
        return ["no indented equation block (lines with '=')"]
    defined = defined_names(doc)
    problems = [f"the equation does not define output {p.name}" for p in op.outputs if not named(p.name, defined)]
    words = {w for raw in re.findall(r"[^\W\d]\w*", doc) for w in (raw, raw.split("_")[0])}
    problems += [f"input {p.name} is never named" for p in op.inputs if not named(p.name, words)]
    problems += [f"attribute {a.name} is never named" for a in op.attrs if a.name not in words]
    return problems


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_docstring_states_the_equation(op):
    """The op's docstring (its reference page, docs/ops/<name>.md) defines every output in an equation block and
    names every input and attribute: the page documents the whole signature the registry declares."""
    assert docstring_problems(op, op.doc) == [], op.name


def test_the_equation_check_finds_what_is_missing():
    op = REGISTRY["Softpick"]
    assert docstring_problems(op, op.doc.replace("eps", "epsilon")) == ["attribute eps is never named"]
    assert docstring_problems(op, op.doc.replace("y_i =", "z_i =")) == ["the equation does not define output Y"]
    prose = "\n".join(line.strip() for line in op.doc.splitlines())  # the equation block unindented: prose
    assert docstring_problems(op, prose) == ["no indented equation block (lines with '=')"]
    topk = REGISTRY["SoftmaxTopK"]
    assert docstring_problems(topk, topk.doc.replace("LogSumExp", "LSE")) == [
        "the equation does not define output LogSumExp"
    ]


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_op_module_is_complete(op):
    assert op.function.name == op.name
    register_onnx_schemas()
    assert onnx.defs.has(op.name, 1, "com.softdeploy")
    assert op.source


@pytest.mark.parametrize("op", REGISTRY.values(), ids=lambda d: d.name)
def test_models_pass_the_checker(op):
    for sample in op.samples(np.random.default_rng(0)):
        onnx.checker.check_model(op.make_model(sample), full_check=True)
