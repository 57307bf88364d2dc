"""SoftNMS in TVM: neither a TIR compute nor an importable function body."""

# Why TVM cannot import the op (softdeploy.tvm.ops.NOT_IMPORTABLE; the importer's pre-check finds it by
# itself, the conformance test holds this to the truth). The body's selection loop is an ONNX Loop,
# which the Relax importer lacks; a TIR compute is not possible either: the number of selected boxes
# (the output's first dimension) depends on the data.
NOT_IMPORTABLE = (
    "its function body uses Loop (not in TVM's Relax ONNX frontend, apache/tvm#17767) and its "
    "output size depends on the data, so it has no TIR compute"
)
