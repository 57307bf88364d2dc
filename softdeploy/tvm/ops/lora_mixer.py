"""LoRAMixer in TVM: no TIR compute; its function body is imported (two dense GEMMs over all experts)."""

# Why there is no TIR compute (softdeploy.tvm.ops.FUNCTION_BODY_ONLY).
FUNCTION_BODY_ONLY = (
    "its routed form (group tokens by selected expert, then per-expert GEMMs of data-dependent "
    "sizes) has no static TE compute; the dense function body (two GEMMs over all experts) imports as is"
)
