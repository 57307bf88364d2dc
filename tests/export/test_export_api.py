"""softdeploy.export(): any nn.Module -> validated ONNX; the validation report and its localisation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import softdeploy
from softdeploy import DOMAIN, ExportError
from softdeploy.export.torch_export import export_program
from softdeploy.export.validate import compare_output, localize_divergence, onnx_feeds, validate_export
from softdeploy.ops._torch import register_torch_ops


class SoftmaxMLP(torch.nn.Module):
    """Linear -> ReLU -> Linear -> TwoPassSoftmax, plus a second (plain torch) output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin1, self.lin2 = torch.nn.Linear(8, 32), torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        register_torch_ops()
        hidden = torch.relu(self.lin1(x))
        return torch.ops.softdeploy.two_pass_softmax(self.lin2(hidden), axis=-1), hidden.sum(-1)


X = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def test_import_softdeploy_stays_light():
    code = (
        "import sys, json, softdeploy; f = softdeploy.export; "
        "print(json.dumps([callable(f), sorted(m for m in ('torch', 'onnxruntime', 'onnx', 'onnxscript', 'numpy') "
        "if m in sys.modules)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == [True, []]


def test_export_validates_against_torch_on_both_backends(tmp_path):
    path = tmp_path / "m.onnx"
    result = softdeploy.export(SoftmaxMLP(), (X,), path)
    assert result.custom_ops == ["TwoPassSoftmax"]
    assert [f.name for f in result.model.functions] == ["TwoPassSoftmax"]
    assert result.validation is not None and result.validation.ok
    assert {c.backend for c in result.validation.checks} == {"native", "portable"}
    assert all(len(c.outputs) == 2 for c in result.validation.checks)
    assert onnx.load(path).graph.node[-1].domain in ("", DOMAIN)
    with pytest.raises(ExportError, match="exists"):
        softdeploy.export(SoftmaxMLP(), (X,), path)
    softdeploy.export(SoftmaxMLP(), X, path, overwrite=True)


def test_any_module_is_accepted_with_dynamic_shapes():
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.LayerNorm(7)).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    result = softdeploy.export(module, (torch.randn(3, 5),), dynamic_shapes=({0: batch},))
    assert result.custom_ops == [] and result.validation is not None and result.validation.ok
    from softdeploy.runtime import Session

    x = torch.randn(11, 5)
    (y,) = Session(result.model, kernels="portable").run({result.model.graph.input[0].name: x.numpy()})
    np.testing.assert_allclose(y, module(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_export_restores_training_mode():
    module = SoftmaxMLP().train()
    softdeploy.export(module, (X,), validate=False)
    assert module.training


def test_per_output_tolerance_and_strict_failure():
    # An impossible tolerance on the first output only: that output fails, the second passes.
    name = "two_pass_softmax"
    with pytest.raises(ExportError, match="disagrees with torch") as info:
        softdeploy.export(SoftmaxMLP(), (X,), tolerance={name: (0.0, 0.0)}, validate=True)
    report = info.value.report  # type: ignore[attr-defined]
    assert not report.ok
    native = report.check("native")
    by_name = {o.name: o for o in native.outputs}
    assert by_name["sum_1"].ok
    result = softdeploy.export(SoftmaxMLP(), (X,), tolerance={name: (1e-3, 1e-6)})
    assert result.validation is not None and result.validation.ok


def test_divergence_is_localised_to_the_broken_node():
    module = SoftmaxMLP().eval()
    model, program = export_program(module, (X,))
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    relu = next(n for n in broken.graph.node if n.op_type == "Relu")
    relu.op_type = "Sigmoid"  # what a wrong translation of one node looks like
    report = validate_export(broken, module, (X,), exported_program=program)
    assert not report.ok
    for check in report.checks:
        d = check.divergence
        assert d is not None and d.node == relu.name and d.op_type == "Sigmoid" and d.reference == "torch"
        assert d.inputs_agree and "relu" in d.source
    assert "first diverging node" in report.to_markdown()


def test_kernel_vs_function_body_divergence_is_localised_without_torch():
    module = SoftmaxMLP().eval()
    model, _ = export_program(module, (X,))
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    body = next(f for f in broken.functions if f.name == "TwoPassSoftmax")
    body.node[0].op_type = "LogSoftmax"  # a function body that no longer matches the kernel
    report = validate_export(broken, module, (X,))  # no exported program: backends are the references
    assert report.check("native").ok and not report.check("portable").ok
    d = report.check("portable").divergence
    assert d is not None and d.op_type == "TwoPassSoftmax" and d.domain == DOMAIN
    assert d.reference == "onnxruntime + softdeploy kernels" and d.inputs_agree
    assert localize_divergence(broken, onnx_feeds(broken, (X,)), "native", other_backend="native") is None


def test_compare_output_rules():
    a = np.array([1.0, np.nan, np.inf, 0.0], np.float32)
    assert compare_output("y", a, a.copy()).ok
    assert not compare_output("y", np.array([1.0, 0.0, np.inf, 0.0], np.float32), a).ok  # NaN lost
    assert not compare_output("y", a[:3], a).ok  # shape
    assert compare_output("y", a + 1e-6, a, (1e-5, 2e-6)).ok
    assert not compare_output("y", a + 1e-6, a, (1e-5, 0.0)).ok  # 0 + 1e-6 vs 0 needs atol
    assert not compare_output("i", np.array([1, 2]), np.array([1, 3])).ok  # ints exactly
    assert compare_output("e", np.zeros((0, 3)), np.zeros((0, 3))).ok


def test_cli_export_from_a_factory(tmp_path, run_cli):
    factory = tmp_path / "factory.py"
    factory.write_text(
        "import torch\n"
        "from softdeploy.ops._torch import register_torch_ops\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        register_torch_ops()\n"
        "        return torch.ops.softdeploy.two_pass_softmax(x * 2.0, axis=-1)\n"
        "def make():\n"
        "    return M(), (torch.randn(3, 40),)\n"
    )
    out = tmp_path / "m.onnx"
    cmd = ["export", f"{factory}:make", str(out)]
    run = run_cli(*cmd)
    assert run.returncode == 0, run.stderr
    assert "TwoPassSoftmax" in run.stdout and "| yes |" in run.stdout
    again = run_cli(*cmd)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    bad = run_cli("export", f"{factory}:nothing", str(tmp_path / "x.onnx"))
    assert bad.returncode == 2 and "no attribute 'nothing'" in bad.stderr


@pytest.mark.slow
def test_cli_export_imports_a_factory_module_from_the_current_folder(tmp_path):
    """`softdeploy export mymodel:make` from the folder holding mymodel.py (the console script's
    sys.path[0] is its own bin folder, not the user's)."""
    import os
    import shutil

    (tmp_path / "mymodel_for_cli.py").write_text(
        "import torch\n"
        "import softdeploy.nn\n"
        "def make():\n"
        "    return softdeploy.nn.TwoPassSoftmax(), (torch.randn(3, 40),)\n"
    )
    script = shutil.which("softdeploy") or str(Path(sys.executable).with_name("softdeploy"))
    # The source tree first (the tests test it); no empty entry, which would put the cwd on sys.path.
    paths = [str(Path(__file__).resolve().parents[2]), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    run = subprocess.run(
        [script, "export", "mymodel_for_cli:make", "m.onnx"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "m.onnx").is_file()
