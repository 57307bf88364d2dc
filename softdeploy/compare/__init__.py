"""Comparison of model variants (torch eager, onnxruntime fp32 with stock ops and with softdeploy
kernels, int8 dynamic and static): task accuracy, agreement with fp32, latency, size, environment."""

from __future__ import annotations

from softdeploy.compare.case import Case, Evaluation, Floor, Section, Timed
from softdeploy.compare.latency import LatencyStats, measure_interleaved
from softdeploy.compare.runner import REFERENCE, VARIANTS, CompareResult, run_compare

__all__ = [
    "REFERENCE",
    "VARIANTS",
    "Case",
    "CompareResult",
    "Evaluation",
    "Floor",
    "LatencyStats",
    "Section",
    "Timed",
    "measure_interleaved",
    "run_compare",
]
