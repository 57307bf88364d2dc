"""A workflow's data: model inputs (and labels) from an .npz, a folder of .npy files or a loader
function, checked against the model's inputs before any work, cut into batches.

Forms of ``data.inputs`` (and ``data.calibration``):
  * ``inputs.npz``: one array per model input, samples along axis 0 (no pickled objects);
  * ``folder/``: ``<input name>.npy`` per model input (and ``<labels>.npy``);
  * ``pkg.mod:fn`` / ``file.py:fn``: ``fn()`` returns such a mapping of arrays, or
    ``(mapping, labels)``.
Inputs named in ``data.constant`` are not batched (a document set scored against every query batch):
each batch gets the whole array. ``data.labels`` names an array of the inputs file that is not a
model input, or an .npy file; labels are aligned with the samples (axis 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.workflow.spec import DataSpec, WorkflowError, is_callable_ref


@dataclasses.dataclass(frozen=True)
class ModelInput:
    """One graph input of the model: name, numpy dtype and dims (int, or a name for a symbolic dim)."""

    name: str
    dtype: str
    dims: tuple[int | str | None, ...]


def model_inputs(model: Any) -> list[ModelInput]:
    """The graph inputs of an onnx.ModelProto that are not initializers."""
    from onnx import helper

    init = {t.name for t in model.graph.initializer}
    out = []
    for i in model.graph.input:
        if i.name in init:
            continue
        t = i.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
        out.append(ModelInput(i.name, np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).name, dims))
    return out


def model_outputs(model: Any) -> dict[str, str]:
    """The graph outputs of an onnx.ModelProto: name -> numpy dtype name, in graph order."""
    from onnx import helper

    return {
        o.name: np.dtype(helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type)).name for o in model.graph.output
    }


@dataclasses.dataclass
class Dataset:
    """Evaluation batches (feeds of every model input), labels aligned with their samples, and the
    calibration batches."""

    batches: list[dict[str, np.ndarray]]
    labels: np.ndarray | None
    calibration: list[dict[str, np.ndarray]]
    samples: int
    description: str


def _call(ref: str) -> Any:
    from softdeploy.export.factory import load_callable

    return load_callable(ref)()


def read_arrays(source: str, what: str = "data.inputs") -> tuple[dict[str, np.ndarray], Any]:
    """``(arrays by name, labels or None)`` from one of the forms of the module docstring."""
    if is_callable_ref(source) and not Path(source).exists():
        made = _call(source)
        labels = None
        if isinstance(made, tuple) and len(made) == 2:
            made, labels = made
        if not isinstance(made, Mapping):
            raise WorkflowError(
                f"{what}: {source} returned {type(made).__name__}; expected a mapping of input name -> array "
                "(samples along axis 0), or (mapping, labels)"
            )
        return {str(k): np.asarray(v) for k, v in made.items()}, labels
    path = Path(source)
    if not path.exists():
        raise WorkflowError(f"{what}: {path} does not exist")
    if path.is_dir():
        files = sorted(path.glob("*.npy"))
        if not files:
            raise WorkflowError(f"{what}: folder {path} holds no .npy files")
        return {f.stem: _load_npy(f, what) for f in files}, None
    if path.suffix == ".npy":
        raise WorkflowError(f"{what}: {path} is one array; give an .npz or a folder of <input name>.npy files")
    from softdeploy.files import load_npz

    return load_npz(path, what), None


def _load_npy(path: Path, what: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        raise WorkflowError(f"{what}: {path} holds pickled objects, which softdeploy never loads ({e})") from e


def check_feeds(
    arrays: Mapping[str, np.ndarray], inputs: Sequence[ModelInput], constant: Sequence[str], what: str
) -> int:
    """Checks names, dtypes, ranks and fixed sizes of ``arrays`` against the model's inputs; returns
    the number of samples (the shared axis-0 length of the batched inputs)."""
    names = [i.name for i in inputs]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise WorkflowError(
            f"{what}: no array for model input(s) {missing}; the model's inputs are "
            + ", ".join(f"{i.name} {i.dtype}{list(i.dims)}" for i in inputs)
            + f"; the data has {sorted(arrays)}"
        )
    unknown_constant = sorted(set(constant) - set(names))
    if unknown_constant:
        raise WorkflowError(f"data.constant: {unknown_constant} are not model inputs; the model's inputs are {names}")
    lengths = {}
    for i in inputs:
        a = arrays[i.name]
        if a.dtype.name != i.dtype:
            raise WorkflowError(f"{what}: input {i.name!r} is {a.dtype.name}; the model expects {i.dtype}")
        if a.ndim != len(i.dims):
            raise WorkflowError(
                f"{what}: input {i.name!r} has rank {a.ndim} (shape {list(a.shape)}); the model expects rank "
                f"{len(i.dims)} {list(i.dims)}" + ("" if i.name in constant else " with samples along axis 0")
            )
        for axis, (size, want) in enumerate(zip(a.shape, i.dims, strict=True)):
            if isinstance(want, int) and want > 0 and size != want and not (axis == 0 and i.name not in constant):
                raise WorkflowError(
                    f"{what}: input {i.name!r} has size {size} on axis {axis}; the model fixes it at {want}"
                )
        if i.name not in constant:
            lengths[i.name] = a.shape[0]
    if len(set(lengths.values())) > 1:
        raise WorkflowError(
            f"{what}: the batched inputs differ in their number of samples (axis 0): {lengths}; name the inputs "
            "that are not batched in data.constant"
        )
    return next(iter(lengths.values())) if lengths else 1


def batches(
    arrays: Mapping[str, np.ndarray], inputs: Sequence[ModelInput], constant: Sequence[str], batch: int, what: str
) -> list[dict[str, np.ndarray]]:
    """Feeds of ``batch`` samples each (the last may be shorter unless the model fixes the batch)."""
    n = check_feeds(arrays, inputs, constant, what)
    fixed = {
        i.name: i.dims[0] for i in inputs if i.name not in constant and isinstance(i.dims[0], int) and i.dims[0] > 0
    }
    for name, b in fixed.items():
        if b != batch:
            raise WorkflowError(
                f"data.batch: {batch}, but the model fixes input {name!r}'s batch at {b}; set batch: {b}"
            )
        if n % b:
            raise WorkflowError(
                f"{what}: {n} samples leave a last batch of {n % b}, and the model fixes input {name!r}'s batch at "
                f"{b} (rule: a multiple of {b} samples, or export the model with a dynamic batch)"
            )
    if n == 0:
        raise WorkflowError(f"{what}: no samples")
    out = []
    for start in range(0, n, batch):
        feeds = {
            i.name: arrays[i.name]
            if i.name in constant
            else np.ascontiguousarray(arrays[i.name][start : start + batch])
            for i in inputs
        }
        out.append(feeds)
    return out


def read_labels(spec: DataSpec, arrays: dict[str, np.ndarray], loaded: Any) -> np.ndarray | None:
    """The labels of ``spec``: ``data.labels`` (an .npy file, or an array of ``arrays``, which is then taken out of
    them), else what a loader returned beside its arrays (``loaded``); None without labels."""
    labels: Any = loaded
    if spec.labels is not None:
        if spec.labels.endswith(".npy"):
            path = Path(spec.labels)
            if not path.is_file():
                raise WorkflowError(f"data.labels: {path} does not exist")
            labels = _load_npy(path, "data.labels")
        elif spec.labels in arrays:
            labels = arrays.pop(spec.labels)
        else:
            raise WorkflowError(
                f"data.labels: {spec.labels!r} is neither an .npy file nor an array of {spec.inputs} ({sorted(arrays)})"
            )
    return None if labels is None else np.asarray(labels)


def check_labels(labels: np.ndarray, source: str) -> None:
    """Float labels are finite: a NaN or inf label would make every metric that reads it NaN (or inf), found only after
    the whole run."""
    if labels.dtype.kind in "fc":
        bad = ~np.isfinite(labels)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise WorkflowError(
                f"data.labels ({source}): {int(bad.sum())} of {labels.size} labels are not finite, the first "
                f"{labels[first]} at index {list(first)} (rule: labels are finite numbers)"
            )


def load_dataset(spec: DataSpec, inputs: Sequence[ModelInput], *, read: Any = None) -> Dataset:
    """Reads, checks and batches the evaluation and calibration data of a workflow. ``read``: the data as
    :func:`softdeploy.workflow.precheck.read_data` already read it (then the files are not read again)."""
    if read is not None:
        arrays, labels = dict(read.arrays), read.labels
    else:
        arrays, loaded_labels = read_arrays(spec.inputs)
        labels = read_labels(spec, arrays, loaded_labels)
    if labels is not None:
        check_labels(labels, spec.labels or spec.inputs)
    n = check_feeds(arrays, inputs, spec.constant, "data.inputs")  # missing inputs first: the likelier mistake
    names = {i.name for i in inputs}
    extra = sorted(set(arrays) - names)
    if extra:
        raise WorkflowError(
            f"data.inputs: arrays {extra} are not model inputs (the model's inputs are {sorted(names)}); "
            "name the labels array in data.labels"
        )
    eval_batches = batches(arrays, inputs, spec.constant, spec.batch, "data.inputs")
    if labels is not None:
        labels = np.asarray(labels)
        if len(labels) != n:
            raise WorkflowError(
                f"data.labels: {len(labels)} labels for {n} samples (rule: one label per sample, axis 0)"
            )
    if spec.calibration is not None:
        cal_arrays, _ = read_arrays(spec.calibration, "data.calibration")
        calibration = batches(cal_arrays, inputs, spec.constant, spec.batch, "data.calibration")
        where = f"calibration on {spec.calibration}"
    else:
        calibration = eval_batches
        where = "calibration on the evaluation data"
    constant = f"; constant (not batched): {list(spec.constant)}" if spec.constant else ""
    return Dataset(
        batches=eval_batches,
        labels=labels,
        calibration=calibration,
        samples=n,
        description=f"{spec.inputs}: {n} samples in batches of {spec.batch}{constant}; {where}",
    )


def collect_outputs(
    run: Any, batches: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]
) -> dict[str, np.ndarray]:
    """Every output of ``run`` (feeds -> list of arrays, in ``names`` order) over ``batches``, concatenated
    along axis 0 (scalars stacked)."""
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for feeds in batches:
        for name, value in zip(names, run(feeds), strict=False):
            parts[name].append(np.asarray(value))
    return {n: np.concatenate(v) if v and v[0].ndim else np.stack(v) for n, v in parts.items()}
