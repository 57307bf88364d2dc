"""onnxruntime's BERT pattern fusions applied to an exported encoder in place (the sentence encoders of
``softdeploy distill --export`` and of the MiniLM cases)."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path


def fuse_bert_ops(path: Path, num_heads: int, hidden: int) -> dict[str, int]:
    """Rewrites the ONNX model at ``path`` with onnxruntime's BERT fusions (opt_level 0: pattern
    fusions only, the graph stays portable); returns the count of each fused op."""
    from onnxruntime.transformers.optimizer import optimize_model

    # The fusions print/log that symbolic shape inference fails on the dynamo export: it only means
    # that SkipLayerNormalization is left to onnxruntime's session optimiser (which does fuse it).
    # Their loggers are top-level modules (onnxruntime.transformers puts its folder on sys.path), so
    # warnings are switched off for this call only.
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            model = optimize_model(
                str(path), model_type="bert", num_heads=num_heads, hidden_size=hidden, opt_level=0, use_gpu=False
            )
    finally:
        logging.disable(previous)
    model.save_model_to_file(str(path))
    return {k: int(v) for k, v in model.get_fused_operator_statistics().items() if v}
