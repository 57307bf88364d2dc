"""The one place that builds onnxruntime sessions.

``Session(model, kernels="native")`` registers softdeploy's kernel library, so com.softdeploy nodes
run the native kernels; ``kernels="portable"`` never registers it, so onnxruntime runs the standard-ONNX
function bodies attached to the model (what a user without softdeploy gets); ``kernels="auto"``
uses the library when it loads and registers every softdeploy op of the model, and the function
bodies otherwise. ``Session.kernels`` says which ran: "native" only with softdeploy's library (one
that answers SoftdeployLibraryInfo), never while onnxruntime runs the bodies.

Before onnxruntime sees the model, every com.softdeploy node is checked against the registry, for
every ``kernels`` choice alike (:func:`softdeploy.ops._schema.check_model`): an op softdeploy does
not have, an undeclared or wrongly typed attribute, or an opset version of the domain other than
softdeploy.OPSET_VERSION raises OpContractError naming the node, the op, the attribute and the rule.
The kernels cannot see undeclared attributes or the model's opset (onnxruntime's C API does not
expose them), and the function bodies would fail in onnxruntime's words, or not at all.

``Session.bind(feeds)`` returns a :class:`BoundRun`: repeated runs on fixed input and output buffers
(onnxruntime's IO binding), for loops that call one model many times with the same shapes.
"""

from __future__ import annotations

import functools
import os
import re
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from softdeploy.errors import (
    ArgumentError,
    InputError,
    LibraryNotFoundError,
    ModelLoadError,
    OpContractError,
    RuntimeFailure,
)

Kernels = Literal["native", "portable", "auto"]
KERNELS = ("native", "portable", "auto")
OPTIMIZATIONS = ("all", "basic", "none")  # onnxruntime's graph optimization levels, by their short names
# onnxruntime graph optimizers every Session turns off, each for a measured reason:
# * SkipLayerNormFusion fuses Add (+ bias Add) + LayerNormalization into com.microsoft SkipLayerNormalization, whose
#   CPU kernel (onnxruntime 1.32) ran 2.2-5x slower than the three ops it replaces (261 against 52 us at [1, 128, 384],
#   one thread); without it all-MiniLM-L6-v2 encodes 5-6% faster in float32 and 13-27% faster in int8
#   (bench/skip_layer_norm.py, bench/results/skip_layer_norm.md). A model that already holds SkipLayerNormalization
#   nodes keeps them.
DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def _session_options(threads: int, spin: bool) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 4  # errors reach the caller as exceptions; don't also print them (3 still logs ERROR)
    # Idle ORT workers spinning on a core steal it from whatever runs next (measured on 2 cores).
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return so


class Session:
    """An onnxruntime InferenceSession with softdeploy's kernels (or their portable bodies).

    ``model``: a path, serialized bytes or an ``onnx.ModelProto``. Options and their defaults:

    * ``kernels="native"``: softdeploy's kernel library is registered (an error when it cannot be
      loaded); ``"portable"`` never registers it (onnxruntime runs the function bodies); ``"auto"``
      uses it when it loads and registers every softdeploy op of the model. ``Session.kernels`` says
      which ran.
    * ``threads=1``: onnxruntime's intra-op threads. One thread by default, unlike onnxruntime's own
      default of one per core: pass ``threads=N`` (e.g. the physical cores) to use more. Results do not
      depend on the count (kernels split rows, never a row).
    * ``spin=False``: idle workers sleep instead of spinning (a spinning worker steals its core from
      whatever runs next).
    * ``optimization="all"``: onnxruntime's graph optimization level (``"all"``, ``"basic"``, ``"none"``), less the
      optimizers of :data:`DISABLED_OPTIMIZERS` (measured slower on CPU).

    ``run(feeds)`` maps input names to numpy arrays and returns the outputs as a list; ``bind(feeds)``
    repeats one shape on fixed buffers (:class:`BoundRun`).
    """

    def __init__(
        self,
        model: Any,
        *,
        kernels: Kernels = "native",
        threads: int = 1,
        spin: bool = False,
        optimization: str = "all",
    ) -> None:
        import onnxruntime as ort

        from softdeploy.files import check_model_proto, diagnose_model_file, wire_problem
        from softdeploy.runtime.library import library_info, library_status

        if kernels not in KERNELS:
            raise ArgumentError(f"kernels must be one of {list(KERNELS)}, not {kernels!r}")
        if optimization not in OPTIMIZATIONS:
            raise ArgumentError(f"optimization must be one of {list(OPTIMIZATIONS)}, not {optimization!r}")
        so = _session_options(threads, spin)
        so.graph_optimization_level = {
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        }[optimization]
        path = None
        if hasattr(model, "SerializeToString"):
            check_model_proto(model)
            proto, model = model, model.SerializeToString()
        else:
            if isinstance(model, os.PathLike):
                model = os.fspath(model)
            if isinstance(model, str):
                path = model
            elif isinstance(model, bytes | bytearray) and not model:
                raise ModelLoadError("model: empty bytes, not an ONNX model")
            proto = _parse(model)
        # Every backend gives the same answer for a bad com.softdeploy node: the kernels cannot see an
        # undeclared attribute or the model's opset, and the function bodies fail in their own words.
        used = _check_softdeploy_nodes(proto) if proto is not None else set()
        self.library: Path | None = None
        if kernels == "native":
            info = library_info()
            missing = sorted(used - set(info.ops))
            if missing:
                raise LibraryNotFoundError(
                    f"{info.path} registers no kernel for {missing} (it registers {list(info.ops)}): "
                    "rebuild it from these sources, or run with kernels='portable'"
                )
            self.library = info.path
        elif kernels == "auto":
            status = library_status()
            if status.info is not None and used <= set(status.info.ops):
                self.library = status.path
        if self.library is not None:
            so.register_custom_ops_library(str(self.library))
        # "native" only where softdeploy's library (verified by its SoftdeployLibraryInfo) runs every
        # com.softdeploy node of the model.
        self.kernels = "native" if self.library is not None else "portable"
        self.threads = threads
        try:
            self._sess = ort.InferenceSession(
                model, so, providers=["CPUExecutionProvider"], disabled_optimizers=list(DISABLED_OPTIMIZERS)
            )
        except Exception as e:  # onnxruntime raises its own exception types
            # A path onnxruntime could not read: say what is wrong with the file (missing, empty,
            # truncated, not a protobuf) rather than "Protobuf parsing failed".
            unreadable = type(e).__name__ in ("NoSuchFile", "InvalidProtobuf") or "No graph was found" in str(e)
            found = None
            if unreadable and path is not None:
                found = diagnose_model_file(path)
            elif unreadable and isinstance(model, bytes | bytearray):
                found = ModelLoadError(f"model bytes: {wire_problem(bytes(model)) or 'not an ONNX protobuf'}")
            raise (found or _translate(e)) from e
        if proto is not None and self.kernels == "native":
            _warn_slow_int8(proto, path)
        self._inputs = frozenset(self.input_names)
        self._outputs = self.output_names
        # The C++ session behind onnxruntime's Python wrapper: a call that feeds exactly the model's
        # inputs goes to it directly, skipping the wrapper's per-call checks (~1 us of a 5.7 us call on
        # a 1 x 1000 model). Any other feed takes the wrapper, for its error messages.
        inner = getattr(self._sess, "_sess", None)
        self._run_direct = inner.run if hasattr(inner, "run") else None

    @property
    def input_names(self) -> list[str]:
        """The model's input names, in graph order (the keys ``run`` expects)."""
        return [i.name for i in self._sess.get_inputs()]

    @property
    def output_names(self) -> list[str]:
        """The model's output names, in graph order (the order ``run`` returns them in)."""
        return [o.name for o in self._sess.get_outputs()]

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        """Runs the model on ``feeds`` (input name -> array) and returns ``outputs`` (default: all, in
        graph order). Feeds that do not fit are an InputError listing the model's inputs."""
        arrays = {k: np.asarray(v) for k, v in feeds.items()}
        names = list(outputs) if outputs else self._outputs
        try:
            if self._run_direct is not None and arrays.keys() == self._inputs:
                return self._run_direct(names, arrays, None)
            return self._sess.run(names, arrays)
        except Exception as e:
            # Checked only after a failure, so that the fast path pays nothing for it.
            raise (feed_error(self._sess, arrays, names, str(e)) or _translate(e)) from e

    def bind(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> BoundRun:
        """Runs the model once on ``feeds`` and returns a :class:`BoundRun` that repeats it on fixed buffers."""
        return BoundRun(self._sess, feeds, outputs)

    @property
    def ort_session(self) -> Any:
        """The underlying ``onnxruntime.InferenceSession`` (for what this class does not wrap)."""
        return self._sess


class BoundRun:
    """Repeated runs of one onnxruntime session on fixed buffers, through onnxruntime's IO binding.

    ``bound.inputs`` maps each input name to a copy of its feed, bound in place: write new values into
    those arrays between calls (``bound.inputs["X"][...] = x``; the mapping itself is read-only, since
    a replaced array would no longer be the bound one). Each call writes the outputs into
    ``bound.outputs``, arrays allocated once from the shapes of a first run, and returns them in a
    list: the next call overwrites the arrays, so copy what you keep. One BoundRun serves one thread
    at a time (its buffers are shared by its calls); bind once per thread for concurrent calls.

    What it saves per call is ``run``'s conversion of feeds and results and the allocation of the
    outputs: TwoPassSoftmax on a 1 x 1000 input takes ~2.9 us per call instead of ~4.9 us through
    ``run`` (bench/results/two_pass_softmax.md), and a large output is not allocated again per call.

    The model's output shapes must depend on the input shapes only (not on the values, as
    SoftNMS's do): a call whose output would change shape raises :class:`RuntimeFailure`.
    ``ort_session`` may be any onnxruntime InferenceSession (the benchmarks bind their peers' too).
    """

    def __init__(self, ort_session: Any, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> None:
        import onnxruntime as ort

        names = list(outputs) if outputs else [o.name for o in ort_session.get_outputs()]
        inputs = {k: np.array(v, order="C", copy=True) for k, v in feeds.items()}
        try:
            first = ort_session.run(names, inputs)
        except Exception as e:
            raise (feed_error(ort_session, inputs, names, str(e)) or _translate(e)) from e
        self.inputs: Mapping[str, np.ndarray] = types.MappingProxyType(inputs)
        self.outputs: tuple[np.ndarray, ...] = tuple(np.empty_like(a) for a in first)
        self._binding = ort_session.io_binding()
        # OrtValues over the arrays' own memory (no copy); kept here for as long as the binding uses them.
        self._values: list[Any] = []
        for name, array in self.inputs.items():
            value = ort.OrtValue.ortvalue_from_numpy(array)
            self._binding.bind_ortvalue_input(name, value)
            self._values.append(value)
        for name, array in zip(names, self.outputs, strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(array)
            self._binding.bind_ortvalue_output(name, value)
            self._values.append(value)
        # onnxruntime's C++ session and binding behind its Python wrappers, called directly: 2.6 us per
        # call instead of 2.95 (1 x 1000 TwoPassSoftmax); the public method is the fallback. No
        # RunOptions object: with one, onnxruntime 1.32's binding costs ~30 us more per call.
        inner, binding = getattr(ort_session, "_sess", None), getattr(self._binding, "_iobinding", None)
        if binding is not None and hasattr(inner, "run_with_iobinding"):
            self._run = functools.partial(inner.run_with_iobinding, binding, None)
        else:
            self._run = functools.partial(ort_session.run_with_iobinding, self._binding)

    def __call__(self) -> list[np.ndarray]:
        try:
            self._run()
        except Exception as e:
            raise _translate(e) from e
        return list(self.outputs)


# onnxruntime's element type names (NodeArg.type "tensor(float)") -> numpy's.
_ORT_TYPES = {
    "float": "float32",
    "double": "float64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "bool": "bool",
    "string": "str",
}


def _element_type(ort_type: str) -> str:
    inner = ort_type[len("tensor(") : -1] if ort_type.startswith("tensor(") else ort_type
    return _ORT_TYPES.get(inner, inner)


def _dims(shape: Any) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in (shape or [])) + "]"


def _signature(args: Sequence[Any]) -> str:
    return ", ".join(f"{a.name}: {_element_type(a.type)} {_dims(a.shape)}" for a in args)


def feed_error(
    ort_session: Any, feeds: Mapping[str, np.ndarray], outputs: Sequence[str], error: str = ""
) -> InputError | None:
    """The InputError for feeds that do not fit ``ort_session``'s inputs -- a missing or unknown name, a
    wrong element type, rank or fixed dimension -- naming the input, what was given and what the model
    expects (its inputs listed with dtypes and shapes); None when the feeds fit (the failure is elsewhere).
    ``error``: onnxruntime's message, for the shape errors it reports that the model's metadata hides."""
    inputs = ort_session.get_inputs()
    model_outputs = [o.name for o in ort_session.get_outputs()]
    expected = f"the model's inputs: {_signature(inputs)}"
    by_name = {a.name: a for a in inputs}
    missing = [n for n in by_name if n not in feeds]
    unknown = [n for n in feeds if n not in by_name]
    if missing or unknown:
        parts = ([f"missing input(s) {missing}"] if missing else []) + (
            [f"unknown input name(s) {unknown}"] if unknown else []
        )
        return InputError(f"{'; '.join(parts)}: given {sorted(feeds)}; {expected}")
    wrong_outputs = [n for n in outputs if n not in model_outputs]
    if wrong_outputs:
        return InputError(f"unknown output name(s) {wrong_outputs}; the model's outputs: {model_outputs}")
    for arg in inputs:
        array = np.asarray(feeds[arg.name])
        want = _element_type(arg.type)
        got = "str" if array.dtype.kind in "UO" else str(array.dtype)
        if got != want:
            return InputError(f"input {arg.name!r} is {got} {list(array.shape)}, the model expects {want}; {expected}")
        shape = list(arg.shape or [])
        # onnxruntime shows a scalar and an input of unknown rank alike, as []: no rank to check then.
        if shape and array.ndim != len(shape):
            return InputError(
                f"input {arg.name!r} has shape {list(array.shape)} (rank {array.ndim}), the model expects rank "
                f"{len(shape)}: {_dims(shape)}; {expected}"
            )
        for axis, (have, need) in enumerate(zip(array.shape, shape, strict=False)):
            if isinstance(need, int) and need >= 0 and have != need:
                return InputError(
                    f"input {arg.name!r} has shape {list(array.shape)}, the model expects {_dims(shape)} "
                    f"(dimension {axis} is {have}, not {need}); {expected}"
                )
    reported = re.search(
        r"(Invalid rank for input: \S+ Got: \d+ Expected: \d+|Got invalid dimensions for input: .*)", error
    )
    if reported:  # what the checks above cannot see (a declared scalar looks like an unknown rank)
        return InputError(f"{reported.group(1).split(' Please fix')[0]}; {expected}")
    return None


def _warn_slow_int8(proto: Any, path: str | None) -> None:
    """One SoftdeployWarning when the model's int8 format runs a slower kernel path on this CPU than on the class it
    was quantized for (RowwiseInt8MatMul weights outside the lane bound on a CPU without VNNI), saying what to do."""
    import warnings

    from softdeploy.errors import SoftdeployWarning
    from softdeploy.runtime.int8_paths import mismatch_line

    line = mismatch_line(proto, f"model {path}" if path else "the model")
    if line:
        warnings.warn(line, SoftdeployWarning, stacklevel=3)


def _parse(model: Any) -> Any:
    """The ModelProto of a path or serialized model, for the checks; None when it cannot use the domain
    com.softdeploy (its name, stored as plain bytes in the protobuf, does not occur: a 92 MB model
    without it is searched in ~10 ms instead of parsed in ~170 ms) or when onnx cannot read it
    (onnxruntime then refuses it in its own words). External data is not loaded."""
    import mmap

    import onnx

    from softdeploy.domain import DOMAIN

    try:
        if isinstance(model, (bytes, bytearray, memoryview)):
            data = bytes(model)
            return onnx.load_from_string(data) if DOMAIN.encode() in data else None
        with open(model, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return None
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                if mm.find(DOMAIN.encode()) < 0:
                    return None
        return onnx.load(model, load_external_data=False)
    except Exception:
        return None


def _check_softdeploy_nodes(proto: Any) -> set[str]:
    """Raises OpContractError for a com.softdeploy node that is no op of REGISTRY, has an undeclared or
    wrongly typed attribute, or for a model importing com.softdeploy at another opset version; returns
    the op types used. Imports the registry only for models that use the domain."""
    from softdeploy.domain import DOMAIN

    imports = [*proto.opset_import, *(i for f in proto.functions for i in f.opset_import)]
    if not any(i.domain == DOMAIN for i in imports) and not any(n.domain == DOMAIN for n in proto.graph.node):
        return set()
    from softdeploy.ops import REGISTRY
    from softdeploy.ops._schema import check_model

    return check_model(proto, REGISTRY)


def _translate(e: Exception) -> Exception:
    """onnxruntime error -> typed softdeploy error carrying the kernel's own message.

    Only a report of one of softdeploy's ops is an OpContractError: the kernel's own message
    "<Op>: <what> (rule: ...)" (at run time onnxruntime wraps it as INVALID_ARGUMENT, at session
    creation -- attribute checks -- as "Exception during initialization"), or onnxruntime refusing
    the element types of one of our nodes (then the message lists the types the op accepts).
    Feeds that do not fit the model are an InputError (:func:`feed_error`, which the callers try
    first); everything else -- a standard op failing, an invalid graph -- is a RuntimeFailure. A
    run whose result does not fit a pre-allocated output (:class:`BoundRun`) is reported as such,
    not as the kernel's error."""
    text = str(e)
    changed = re.search(
        r"output '([^']*)'.* has shape \{([^}]*)\} but the computed output shape for this run is \{([^}]*)\}", text
    )
    if changed:  # a pre-allocated (bound) output that this run's result does not fit; the kernel is fine
        name, bound, now = changed.groups()
        return RuntimeFailure(
            f"bound run: output {name!r} has shape [{now}] on this call, the bound buffer [{bound}] "
            "(rule: a bound run's output shapes depend on the input shapes only; use Session.run "
            "for outputs whose size depends on the values)"
        )
    message = text
    for marker in ("Status Message: ", "Exception during initialization: "):
        if marker in message:
            message = message.split(marker, 1)[1]
    message = message.strip()
    if type(e).__name__ == "NoSuchFile":
        return ModelLoadError(message)
    if "No graph was found in the protobuf" in text:
        return ModelLoadError("model: not an ONNX model: it holds no graph")
    typed = re.search(r"(?:Type '([\w()]+)' of input parameter \((\w+)\) of operator|Optype) \((\w+)\)", text)
    no_kernel = re.search(r"no kernel def matches node inputs for Op: (\w+)", text)
    op = no_kernel.group(1) if no_kernel else typed.group(3) if typed else None
    if op is not None and _is_our_op(op):
        given = f"; given {typed.group(2)}: {_element_type(typed.group(1))}" if typed and typed.group(1) else ""
        return OpContractError(_type_rule(op) + given)
    # A kernel refusing the environment (an SOFTDEPLOY_ISA naming no variant) writes "softdeploy kernel
    # library: ..." (ops/common/cpu.h EnvironmentError), not "<Op>: ...": a RuntimeFailure below.
    if _names_our_op(message):
        return OpContractError(message)
    return RuntimeFailure(message)


def _is_our_op(op: str) -> bool:
    from softdeploy.ops import REGISTRY

    return op in REGISTRY


def _type_rule(op: str) -> str:
    """Message for a node whose input element types match none of the op's kernels."""
    from softdeploy.ops import REGISTRY

    d = REGISTRY[op]
    typed = [p.name for p in d.inputs if p.dtype == "T"]
    return (
        f"{op}: the element types of inputs {typed} match no kernel "
        f"(rule: they share one type T in {list(d.float_types)})"
    )


def _names_our_op(message: str) -> bool:
    """A message our kernels wrote (sd::Fail): "<Op>: ..." with Op one of softdeploy's ops."""
    op, sep, _ = message.partition(": ")
    return bool(sep) and _is_our_op(op)
