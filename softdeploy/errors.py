"""The exceptions softdeploy raises. Every one derives from :class:`SoftdeployError`.

Messages follow one rule, shared with the native kernels: ``"<Op>: <what was wrong> (rule: ...)"``
names the op, the offending value and the rule it broke, so a message read from an onnxruntime
error status and one raised in Python look the same.
"""

from __future__ import annotations


class SoftdeployError(Exception):
    """Base class of every softdeploy error."""


class OpContractError(SoftdeployError, ValueError):
    """An input or attribute violates an operator's contract (see docs/ops/<Op>.md)."""


class LibraryNotFoundError(SoftdeployError, FileNotFoundError):
    """The native kernel library is missing or cannot be loaded."""


class RuntimeFailure(SoftdeployError, RuntimeError):
    """onnxruntime failed for a reason other than an operator contract violation."""


class ExportError(SoftdeployError):
    """A model could not be exported or validated."""


class ModelLoadError(SoftdeployError, ValueError):
    """A model file cannot be read as an ONNX model: missing, a directory, empty, not an ONNX protobuf or
    truncated. The message names the path and what is wrong with it."""


class InputError(SoftdeployError, ValueError):
    """The feeds of a run do not match the model's inputs (a wrong or missing name, dtype or rank). The
    message names the input, what was given and what the model expects."""


class ArgumentError(SoftdeployError, ValueError):
    """An argument of a softdeploy call or command is not one of the values it accepts; the message lists
    the accepted ones."""


class OverwriteError(SoftdeployError, FileExistsError):
    """A command would replace an existing file without being asked to (or replace its own input)."""


class OutputError(SoftdeployError, OSError):
    """An output cannot be written where it was asked for: the folder is missing or read-only, the disk is
    full, the path is a folder, or a link whose target softdeploy will not write through. The message names the
    path and the reason; nothing partial is left under the output's name."""


class CacheError(SoftdeployError, ValueError):
    """A cached artifact (a trained expert, student or classifier, an exported model) does not match the content
    digest recorded when it was written: truncated, edited or replaced. Callers set the entry aside and rebuild it;
    the message names the file."""


class WeightsError(SoftdeployError, ValueError):
    """A weights file or state dict cannot be loaded into a softdeploy module: not safetensors / a
    ``torch.save`` file readable with ``weights_only=True``, missing or unexpected keys, or a tensor of the wrong
    shape. The message names the keys and shapes."""


class AdapterError(SoftdeployError, ValueError):
    """A LoRA adapter (PEFT's adapter_config.json + adapter_model.safetensors) cannot be used: missing,
    not safetensors, a config softdeploy does not read, or a tensor of the wrong name or shape. The
    message names the file, the value and the rule."""


class SoftdeployWarning(UserWarning):
    """A warning softdeploy itself raises. The CLI shows these on the terminal; every other Python
    warning (torch's, onnxruntime's, ...) goes to its log file unless ``--verbose``."""


class DistillError(SoftdeployError, ValueError):
    """A teacher and a student cannot be distilled into one another: their tokenizers (vocabulary) or their
    embedding dimensions differ, or a checkpoint belongs to another run. The message names both sides."""


class CaseNotFoundError(SoftdeployError, LookupError):
    """A compare / quantize case name that no installed distribution registers in the ``softdeploy.cases``
    entry-point group, or whose entry point does not load. The message names the case and the installed ones."""


class WorkflowError(SoftdeployError, ValueError):
    """A workflow file, or the data and metrics it names, is not usable (the message names the key)."""
