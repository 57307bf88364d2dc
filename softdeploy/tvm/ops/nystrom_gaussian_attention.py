"""NystromGaussianAttention in TVM: neither a TIR compute nor an importable function body."""

# Why TVM cannot import the op (softdeploy.tvm.ops.NOT_IMPORTABLE; the importer's pre-check finds it by
# itself, the conformance test holds this to the truth). The Newton-Schulz steps are an ONNX Loop in
# the body (their count is an attribute).
NOT_IMPORTABLE = (
    "its function body uses Loop for the Newton-Schulz steps (not in TVM's Relax "
    "ONNX frontend, apache/tvm#17767) and it has no TIR compute yet"
)
