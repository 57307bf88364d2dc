"""The progress displays by their comparison-era path: the cases under softdeploy/models and softdeploy/distill
import them from here. They live in the leaf :mod:`softdeploy.progress` (export uses them too)."""

from __future__ import annotations

from softdeploy.progress import RichProgress, SilentProgress

__all__ = ["RichProgress", "SilentProgress"]
