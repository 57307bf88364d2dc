"""The documentation: the operator reference is what docs/gen_ops.py writes from the code, nothing
points to a contract file that is not in the repository, the site builds with `mkdocs build --strict`
and renders the API from the docstrings, and the README's "Your own model" example is a valid workflow."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_operator_reference_is_what_the_generator_writes() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_ops.py"), "--check"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_reference_has_a_page_per_op_with_its_contract() -> None:
    from softdeploy.ops import REGISTRY

    index = (ROOT / "docs" / "ops" / "index.md").read_text()
    nav = (ROOT / "mkdocs.yml").read_text()
    for name, d in REGISTRY.items():
        assert f"ops/{name}.md" in nav, f"mkdocs.yml's nav lacks ops/{name}.md"
        page = (ROOT / "docs" / "ops" / f"{name}.md").read_text()
        assert f"]({name}.md)" in index
        for a in d.attrs:
            assert f"| `{a.name}` | {a.onnx_type} |" in page
        for p in d.inputs + d.outputs:
            assert f"| `{p.name}` |" in page
        for case in d.errors():  # every error rule, with the words the backends must use
            assert f"**{case.name}**" in page and case.match in page
        for dtype, (rtol, atol) in d.tolerance.items():
            assert f"| {dtype} | {rtol:g} | {atol:g} |" in page


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    keep = {".py", ".md", ".cc", ".h", ".toml", ".yml", ".yaml", ".txt", ".inc", ".json", ""}
    return [ROOT / f for f in out.splitlines() if Path(f).suffix in keep and (ROOT / f).is_file()]


def test_nothing_points_to_an_operator_contract_outside_the_repository() -> None:
    """The README, docstrings, kernel comments and the attribute-type error named OPS.md, a file that
    was never in the repository or the package."""
    offenders = []
    for path in _tracked_text_files():
        if path == Path(__file__).resolve():
            continue  # this test names it
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if re.search(r"\bOPS\.md\b", line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


def test_readme_links_to_the_generated_reference() -> None:
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
    assert "docs/ops/index.md" in readme


def _workflow_example(markdown: str) -> str:
    block = re.search(r"```yaml\n(.*?)```", markdown, re.S)
    assert block, "no ```yaml workflow example"
    return block.group(1)


@pytest.mark.parametrize("page", ["README.md", "docs/guide/workflow.md"])
def test_the_your_own_model_example_is_a_valid_workflow(page: str) -> None:
    yaml = pytest.importorskip("yaml")
    from softdeploy.workflow import parse

    text = (ROOT / page).read_text()
    if page == "README.md":
        text = text.split("## Your own model", 1)[1].split("\n## ", 1)[0]
        assert "softdeploy run" in text and "softdeploy compare" in text and "--data" in text
    workflow = parse(yaml.safe_load(_workflow_example(text)), base=ROOT)
    assert workflow.metrics and workflow.quantize is not None


def test_the_test_extra_installs_the_docs_extra() -> None:
    """CI installs `.[test]`: the mkdocs build below must never skip there."""
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is Python >= 3.11; we support 3.10)
    extras = dict(re.findall(r"^(\w+) = \[(.*?)\]$", text.split("[project.optional-dependencies]")[1], re.M | re.S))
    assert re.search(r'"softdeploy\[[^\]]*\bdocs\b[^\]]*\]"', extras["test"])
    pins = re.findall(r'"([^"]+)"', extras["docs"])
    assert pins and all("==" in p for p in pins)  # exact pins: the build is strict


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
    reason="mkdocs / mkdocstrings not installed (pip install '.[docs]'; the test extra includes it)",
)
def test_the_site_builds_strict_without_a_warning(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    assert "WARNING" not in log, log
    api = (tmp_path / "site" / "api" / "runtime" / "index.html").read_text()
    assert 'id="softdeploy.runtime.session.Session"' in api  # rendered from the docstrings
    assert "threads=1" in api and "One thread by default" in api  # Session's default, where users look
    assert (tmp_path / "site" / "ops" / "MaxSim" / "index.html").exists()


@pytest.mark.slow
def test_the_export_guide_example_runs(tmp_path: Path) -> None:
    """The guide's first example (a model of softdeploy.nn modules, exported with a dynamic batch and validated)
    runs as written."""
    code = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "guide" / "export.md").read_text(), re.S)
    assert code
    script = tmp_path / "example.py"
    script.write_text(code.group(1))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "['SoftpickAttention']" in run.stdout and (tmp_path / "model.onnx").exists()
