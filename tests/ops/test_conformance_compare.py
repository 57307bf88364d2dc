"""conformance.compare is the judge of every backend: it must refuse outputs that are not the reference's."""

from __future__ import annotations

import numpy as np
import pytest

from softdeploy import conformance
from softdeploy.ops import REGISTRY
from softdeploy.ops._schema import Sample

OP = REGISTRY["SoftmaxTopK"]  # three outputs: Values, Indices, LogSumExp


def _sample_and_reference() -> tuple[Sample, tuple[np.ndarray, ...]]:
    x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
    sample = Sample("rows", (x,), {"k": 4})
    return sample, tuple(OP.reference(x, k=4))


def test_the_reference_matches_itself() -> None:
    sample, want = _sample_and_reference()
    conformance.compare(OP, sample, want, want, 1e-6, 1e-30)


def test_an_extra_output_fails() -> None:
    sample, want = _sample_and_reference()
    got = (*want, np.zeros(3, np.float32))
    with pytest.raises(AssertionError, match="4 outputs, expected 3"):
        conformance.compare(OP, sample, got, want, 1e-6, 1e-30)


def test_a_missing_output_fails() -> None:
    sample, want = _sample_and_reference()
    with pytest.raises(AssertionError, match="2 outputs, expected 3"):
        conformance.compare(OP, sample, want[:2], want, 1e-6, 1e-30)


def test_a_wrong_value_fails() -> None:
    sample, want = _sample_and_reference()
    indices = want[1].copy()
    indices[0, 0] += 1
    with pytest.raises(AssertionError, match=r"SoftmaxTopK\.Indices"):
        conformance.compare(OP, sample, (want[0], indices, want[2]), want, 1e-6, 1e-30)
