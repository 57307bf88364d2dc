"""The case factories that ``softdeploy compare --case NAME`` / ``softdeploy quantize --case NAME`` find through the
``softdeploy.cases`` entry-point group (cases/pyproject.toml names each): ``factory(quick=False, **kw)`` builds the
case, ``quick`` a smaller one for smoke tests (cached apart by its settings)."""

from __future__ import annotations

from typing import Any


def minilm_retrieval(quick: bool = False, **kw: Any) -> Any:
    """all-MiniLM-L6-v2 as a MaxSim retriever on chatterbot-corpus (:mod:`softdeploy_cases.minilm_retrieval`)."""
    from softdeploy_cases.minilm_retrieval import MiniLMRetrieval

    return MiniLMRetrieval(**({"limit_queries": 100} if quick else {}), **kw)


def mtcnn_faces(quick: bool = False, **kw: Any) -> Any:
    """MTCNN's P-Net with Soft-NMS on scikit-image photos (:mod:`softdeploy_cases.mtcnn_faces`)."""
    from softdeploy_cases.mtcnn_faces import MtcnnFaces

    return MtcnnFaces(**kw)


def lora_mixer_retrieval(quick: bool = False, **kw: Any) -> Any:
    """MiniLM with LoRA-Mixer experts per category (:mod:`softdeploy_cases.lora_mixer_retrieval`)."""
    from softdeploy_cases.lora_mixer_retrieval import LoRAMixerRetrieval

    # quick: 2 layers, 4 categories, a few steps and queries
    small = {"layers": 2, "max_categories": 4, "steps": 4, "batch_size": 8, "limit_queries_per_category": 3}
    return LoRAMixerRetrieval(**(small if quick else {}), **kw)


def attention_variants(quick: bool = False, **kw: Any) -> Any:
    """Softmax, softpick and Nystrom-Gaussian attention classifiers (:mod:`softdeploy_cases.attention_variants`)."""
    from softdeploy_cases.attention_variants import QUICK_SEQ_LENGTHS, AttentionVariants

    # quick: 4 categories, a few steps, T up to 512 in the sweep
    small = {
        "max_categories": 4,
        "steps": 6,
        "seq_lengths": QUICK_SEQ_LENGTHS,
        "sweep_rounds": 1,
        "latency_rounds": 1,
        "latency_round_seconds": 0.02,
    }
    return AttentionVariants(**(small if quick else {}), **kw)


def minilm_distilled(quick: bool = False, **kw: Any) -> Any:
    """A 3-layer student distilled from all-MiniLM-L6-v2 (:mod:`softdeploy_cases.minilm_distilled`)."""
    from softdeploy_cases.minilm_distilled import MiniLMDistilled

    # quick: a few steps on a few texts and queries
    small = {
        "steps": 4,
        "batch_size": 8,
        "limit_texts": 64,
        "extra_texts": 64,
        "limit_queries": 40,
        "limit_documents": 120,
    }
    return MiniLMDistilled(**(small if quick else {}), **kw)


def soft_thinking(quick: bool = False, **kw: Any) -> Any:
    """A small QA decoder generating with soft thinking (:mod:`softdeploy_cases.soft_thinking_case`)."""
    from softdeploy_cases.soft_thinking_case import SoftThinkingCase

    # quick: 16 questions, 24 steps
    return SoftThinkingCase(**({"questions": 16, "steps": 24} if quick else {}), **kw)
