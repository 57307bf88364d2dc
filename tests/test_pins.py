"""The test extra pins exact versions, and they are the installed ones: a fresh `pip install ".[test]"`
(the README's test command, .ci/run) must give the environment the suite was made green in."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _extra(name: str) -> list[str]:
    """The requirement strings of one optional-dependency list (tomllib is not in Python 3.10)."""
    text = PYPROJECT.read_text()
    match = re.search(rf"^{name} = \[(.*?)\]\n", text, re.S | re.M)
    assert match, f"no optional-dependencies list {name!r} in pyproject.toml"
    body = "\n".join(line.split("#", 1)[0] for line in match.group(1).splitlines())
    return re.findall(r'"([^"]+)"', body)


def test_test_extra_pins_exact_versions_that_are_installed():
    pins = [r for r in _extra("test") if not r.startswith("softdeploy[")]
    assert {"pytest", "hypothesis", "ruff"} <= {re.split(r"[=<>~!\[]", r, maxsplit=1)[0] for r in pins}
    for requirement in pins:
        name, sep, version = requirement.partition("==")
        assert sep and re.fullmatch(r"[A-Za-z0-9_.-]+", name), f"{requirement!r}: not an exact (==) pin"
        installed = metadata.version(name).split("+", 1)[0]  # torch-style local builds: 2.13.0+cpu
        assert installed == version, f"{name}: pinned {version}, installed {installed}"


def test_torch_stays_pinned():
    deps = re.search(r"^dependencies = \[(.*?)\]\n", PYPROJECT.read_text(), re.S | re.M)
    assert deps and '"torch==2.13.0"' in deps.group(1)
    assert metadata.version("torch").split("+", 1)[0] == "2.13.0"
