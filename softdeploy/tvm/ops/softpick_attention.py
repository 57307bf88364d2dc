"""SoftpickAttention in TVM: no TIR compute; its function body is imported."""

# Why there is no TIR compute (softdeploy.tvm.ops.FUNCTION_BODY_ONLY).
FUNCTION_BODY_ONLY = (
    "no TIR flash-style compute yet: TVM runs the float64 function body, which materialises the [B, H, Tq, Tk] scores"
)
