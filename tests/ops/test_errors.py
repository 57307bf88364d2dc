"""Every error rule of docs/ops/: each backend refuses the input with a message that names the op,
the value and the rule -- the kernel through an onnxruntime error status (raised by Session as
OpContractError), the reference and the torch op as OpContractError."""

from __future__ import annotations

import pytest

from softdeploy import OpContractError, conformance
from softdeploy.ops import REGISTRY

CASES = [pytest.param(op, case, id=f"{op.name}-{case.name}") for op in REGISTRY.values() for case in op.errors()]


@pytest.mark.parametrize(("op", "case"), CASES)
@pytest.mark.parametrize("backend", ["reference", "kernel", "torch"])
def test_error_names_op_value_and_rule(op, case, backend):
    from softdeploy.ops import Sample

    sample = Sample(case.name, case.inputs, case.attrs)
    with pytest.raises(OpContractError) as info:
        conformance.run(op, sample, backend)
    message = str(info.value)
    assert message.startswith(f"{op.name}: "), message
    assert case.match in message, message


def test_every_op_has_error_cases():
    for op in REGISTRY.values():
        assert list(op.errors()), f"{op.name} declares no error cases"
