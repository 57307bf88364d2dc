"""Never the Hugging Face hub: softdeploy reads model folders and packaged weights from disk only.

A leaf. :func:`offline` is called before transformers, tokenizers or sentence-transformers read anything, so that
a missing file is an error naming it, never a download.
"""

from __future__ import annotations

import os


def offline() -> None:
    """Never reach for the Hugging Face hub: every asset is local."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


__all__ = ["offline"]
