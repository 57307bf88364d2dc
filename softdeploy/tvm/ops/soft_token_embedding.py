"""SoftTokenEmbedding in TVM: no TIR compute; its function body is imported."""

# Why there is no TIR compute (softdeploy.tvm.ops.FUNCTION_BODY_ONLY).
FUNCTION_BODY_ONLY = (
    "no TIR compute yet: TVM runs the float64 function body (a TopK over the vocabulary "
    "for the candidates over tie-free keys, since TVM's TopK does not keep lower ids first; the probability "
    "row in float64)"
)
