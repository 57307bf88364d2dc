"""ONNX-level rewrites for models nobody here exported: pattern -> check -> rewrite rules
(onnxscript rewriter) that replace standard-op subgraphs with com.softdeploy ops.

    softmax-topk       Softmax -> TopK                    => SoftmaxTopK
    maxsim             MatMul -> ReduceMax -> ReduceSum   => MaxSim
    softpick           the softpick authors' expression   => Softpick
    softpick-attention MatMul -> (Mul/Div) -> (Add) -> Softpick -> MatMul => SoftpickAttention
    two-pass-softmax   Softmax (last axis, long rows)     => TwoPassSoftmax          (rows >= 1024, measured)
    nms-to-softnms     NonMaxSuppression                  => SoftNMS(method="hard")   (on request)

:func:`optimize` runs the chosen rules in that order, reports per rule how often it fired and why each
candidate did not, attaches the function bodies, checks the model (onnx.checker, full) and verifies
that the rewritten model agrees with the original on onnxruntime, with and without softdeploy's kernels.
"""

from __future__ import annotations

from softdeploy.export.rewrites.pipeline import (
    DEFAULT_RULES,
    RULES,
    OptimizeResult,
    Rejection,
    RuleReport,
    optimize,
)

__all__ = ["DEFAULT_RULES", "RULES", "OptimizeResult", "Rejection", "RuleReport", "optimize"]
