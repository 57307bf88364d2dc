"""Your own model, data and metrics through export -> quantize -> compare.

A workflow file (YAML or JSON, schema ``softdeploy/workflow/schema.json``) names the model (an ONNX
file or a torch factory), its data (.npz, a folder of .npy, or a loader function), the metrics
(built-in or your own functions) and the variants; ``softdeploy run WORKFLOW.yaml`` runs it::

    model: {factory: mymodel.py:make}
    data: {inputs: eval.npz, labels: labels, batch: 16}
    metrics: [{name: accuracy}, {name: mymetrics.py:macro_f1}]
    quantize: {mode: static, max_drop: 0.01}

Anything the file cannot express: implement :class:`softdeploy.compare.case.Case` and run
``softdeploy compare --case pkg.mod:MyCase``.
"""

from softdeploy.workflow.spec import Workflow, WorkflowError, load_workflow, parse, schema

__all__ = ["Workflow", "WorkflowError", "load_workflow", "parse", "run_workflow", "schema"]


def run_workflow(*args, **kwargs):  # type: ignore[no-untyped-def]
    """See :func:`softdeploy.workflow.run.run_workflow` (imported on use: it pulls in onnxruntime)."""
    from softdeploy.workflow.run import run_workflow as run

    return run(*args, **kwargs)
