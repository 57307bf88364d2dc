"""Entry points by name: how the library finds what other distributions add to it (cases, distillation texts)."""

from __future__ import annotations

from importlib import metadata


def entry_points_by_name(group: str) -> dict[str, metadata.EntryPoint]:
    """The installed entry points of ``group``, by name in name order (read from the installed distributions' metadata
    at each call: one scan, so a caller that looks up and lists takes one snapshot)."""
    return {ep.name: ep for ep in sorted(metadata.entry_points(group=group), key=lambda ep: ep.name)}


__all__ = ["entry_points_by_name"]
