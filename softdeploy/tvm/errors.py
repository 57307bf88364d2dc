"""Errors of the TVM backend (all are SoftdeployErrors, so the CLI reports them cleanly)."""

from __future__ import annotations

from softdeploy.errors import SoftdeployError


class TVMNotInstalledError(SoftdeployError, ImportError):
    """apache-tvm is missing or is not the pinned version."""


class UnsupportedModelError(SoftdeployError):
    """The model holds ops that TVM's ONNX importer cannot take; ``unsupported`` maps each op to why."""

    def __init__(self, unsupported: dict[str, str]) -> None:
        self.unsupported = dict(unsupported)
        lines = "\n".join(f"  - {op}: {why}" for op, why in sorted(self.unsupported.items()))
        super().__init__(f"TVM cannot import {len(self.unsupported)} op(s) of this model:\n{lines}")


class TuningError(SoftdeployError):
    """MetaSchedule tuning produced no usable schedule (e.g. every build timed out)."""


class ScheduleError(SoftdeployError):
    """A hand schedule rule raised on a kernel (a broken rule, not one that does not apply);
    ``errors`` maps each rule (the op it was written for) to its error."""

    def __init__(self, kernel: str, errors: dict[str, str]) -> None:
        self.kernel = kernel
        self.errors = dict(errors)
        lines = "\n".join(f"  - {rule}: {why}" for rule, why in sorted(self.errors.items()))
        super().__init__(f"the hand schedule of {kernel} failed:\n{lines}")


class ScheduleWarning(UserWarning):
    """A hand schedule rule failed on a kernel of a build (BuildReport.schedule_errors): the kernel runs
    with dlight's schedule or TVM's default loop nest (BuildReport.unscheduled), many times slower."""
