"""Export: torch -> ONNX with com.softdeploy nodes, and their portable function bodies."""

from __future__ import annotations

from softdeploy.export.functions import attach_function_bodies, inline_function_bodies

__all__ = ["attach_function_bodies", "inline_function_bodies"]
