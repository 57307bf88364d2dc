"""A model read for quantizing: every node named, once (the quantizer, the routing check and the accuracy-budget
search select and report nodes by name)."""

from __future__ import annotations

import os
from typing import Any


def load_named(model: str | os.PathLike[str] | Any) -> Any:
    """The model as a ModelProto whose every node has a unique name (the quantizer selects and
    reports nodes by name; exporters sometimes leave names empty)."""
    from softdeploy.files import load_model

    proto = load_model(model) if isinstance(model, str | os.PathLike) else model
    seen: set[str] = set()
    for i, node in enumerate(proto.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    return proto
