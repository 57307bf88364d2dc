"""Quantization: dynamic int8 (per-channel by default), static QDQ with calibration that runs our
custom ops, and an accuracy-budget search that keeps the most sensitive nodes in float."""

from __future__ import annotations

from softdeploy.quant.calibration import ArrayDataReader, softdeploy_calibration_sessions
from softdeploy.quant.quantize import (
    QuantConfig,
    QuantizationError,
    QuantizedModel,
    candidate_nodes,
    cpu_has_vnni,
    quantize,
)
from softdeploy.quant.search import BudgetResult, NodeSensitivity, budget_search, output_cosine

__all__ = [
    "ArrayDataReader",
    "BudgetResult",
    "NodeSensitivity",
    "QuantConfig",
    "QuantizationError",
    "QuantizedModel",
    "budget_search",
    "candidate_nodes",
    "cpu_has_vnni",
    "output_cosine",
    "quantize",
    "softdeploy_calibration_sessions",
]
