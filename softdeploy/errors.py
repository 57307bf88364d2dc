"""The exceptions softdeploy raises. Every one derives from :class:`SoftdeployError`.

Messages follow one rule, shared with the native kernels: ``"<Op>: <what was wrong> (rule: ...)"``
names the op, the offending value and the rule it broke, so a message read from an onnxruntime
error status and one raised in Python look the same.
"""

from __future__ import annotations


class SoftdeployError(Exception):
    """Base class of every softdeploy error."""


class OpContractError(SoftdeployError, ValueError):
    """An input or attribute violates an operator's contract (see OPS.md)."""


class LibraryNotFoundError(SoftdeployError, FileNotFoundError):
    """The native kernel library is missing or cannot be loaded."""


class RuntimeFailure(SoftdeployError, RuntimeError):
    """onnxruntime failed for a reason other than an operator contract violation."""


class ExportError(SoftdeployError):
    """A model could not be exported or validated."""
