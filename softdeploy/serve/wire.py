"""The request and response bodies of ``softdeploy serve``, shared by the server and the client (no Ray here).

Three body formats, chosen by the request's Content-Type; the response uses the request's format:

* ``application/json``: ``{"inputs": {NAME: VALUE}, "outputs": [NAME, ...]}`` (``outputs`` optional).
  VALUE is a nested list, or ``{"dtype": "int64", "data": nested list}``. JSON has one number type,
  so numbers for a float input take the model's float type (the nearest value; every float32 sent as
  JSON reads back to itself), and integers take an integer input's type where they fit. Any other
  mismatch (a fraction for an integer input) is left for the input checks, which refuse it in
  Session's words. The response is ``{"outputs": {NAME: {"dtype", "shape", "data"}}}``: ``data`` holds the exact
  values (float32 printed through float64 round-trips bit for bit; NaN and infinities as Python's
  json writes them).
* ``application/x-npy``: one array, for a model with one input; the response is ``.npy`` where the
  model (or the request's ``?outputs=``) gives one output, ``.npz`` otherwise.
* ``application/x-npz``: one array per input name (``numpy.savez``); the response is ``.npz``.

Errors: a body that cannot be read is an :class:`~softdeploy.errors.InputError` naming the format and
what is wrong; the server answers it with status 400 and ``{"error": TYPE, "message": MESSAGE}``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from softdeploy.errors import InputError

JSON = "application/json"
NPY = "application/x-npy"
NPZ = "application/x-npz"
FORMATS = {"json": JSON, "npy": NPY, "npz": NPZ}


def media_type(content_type: str | None) -> str:
    """The body format of a Content-Type header (parameters dropped); JSON when none is given."""
    base = (content_type or JSON).split(";", 1)[0].strip().lower()
    if base in ("application/octet-stream",):
        return NPY
    return base


def _json_array(name: str, value: Any, want: str | None) -> np.ndarray:
    if isinstance(value, Mapping):
        if "data" not in value:
            raise InputError(
                f"input {name!r}: a JSON object value needs 'data' (and optionally 'dtype'); given {sorted(value)}"
            )
        dtype = value.get("dtype")
        try:
            return np.asarray(value["data"], dtype=np.dtype(dtype) if dtype else None)
        except (TypeError, ValueError) as e:
            raise InputError(f"input {name!r}: cannot read {dtype or 'the data'} from JSON ({e})") from e
    try:
        array = np.asarray(value)
    except ValueError as e:  # ragged lists
        raise InputError(f"input {name!r}: the JSON list is not a rectangular array ({e})") from e
    if want is None or array.dtype.kind not in "biuf" or str(array.dtype) == want:
        return array
    target = np.dtype(want) if want not in ("str", "bfloat16") else None
    if target is None:
        return array
    # JSON has one number type: a number given for a float input means the nearest value of that type (every float32
    # sent as JSON reads back to itself). Integers take an integer input's type where they fit; anything else -- a
    # fraction for an integer input -- is left for the input checks to refuse in Session's words.
    if target.kind == "f" and array.dtype.kind in "fiub":
        return array.astype(target)
    if target.kind in "iu" and array.dtype.kind in "iub":
        info = np.iinfo(target)
        if array.size == 0 or (int(array.min()) >= info.min and int(array.max()) <= info.max):
            return array.astype(target)
    return array


def decode_request(
    body: bytes, content_type: str | None, input_types: Mapping[str, str]
) -> tuple[dict[str, np.ndarray], list[str] | None]:
    """The feeds (input name -> array) and the requested outputs (None: all) of a request body.
    ``input_types`` maps the model's input names to their numpy element type names."""
    kind = media_type(content_type)
    if kind == JSON:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"request body: not JSON ({e})") from e
        if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), dict):
            raise InputError('request body: JSON must be an object {"inputs": {NAME: VALUE, ...}}')
        outputs = doc.get("outputs")
        if outputs is not None and (not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs)):
            raise InputError(f"request body: 'outputs' must be a list of output names, not {outputs!r}")
        feeds = {str(k): _json_array(str(k), v, input_types.get(str(k))) for k, v in doc["inputs"].items()}
        return feeds, outputs
    if kind == NPY:
        if len(input_types) != 1:
            raise InputError(
                f"request body: a .npy body feeds a model with one input; this one has {list(input_types)} "
                "(send .npz with one array per input name)"
            )
        return {next(iter(input_types)): _load_npy(body)}, None
    if kind == NPZ:
        try:
            with np.load(io.BytesIO(body), allow_pickle=False) as z:
                return {k: z[k] for k in z.files}, None
        except Exception as e:
            raise InputError(f"request body: not a readable .npz archive ({type(e).__name__}: {e})") from e
    raise InputError(f"request body: Content-Type {kind!r} is not one of {sorted(FORMATS.values())}")


def _load_npy(body: bytes) -> np.ndarray:
    try:
        return np.load(io.BytesIO(body), allow_pickle=False)
    except Exception as e:
        raise InputError(f"request body: not a readable .npy array ({type(e).__name__}: {e})") from e


def encode_arrays(arrays: Mapping[str, np.ndarray], kind: str) -> tuple[bytes, str]:
    """A response (or request) body holding ``arrays`` in format ``kind`` (a media type); its Content-Type."""
    if kind == JSON:
        doc = {n: {"dtype": str(a.dtype), "shape": list(a.shape), "data": a.tolist()} for n, a in arrays.items()}
        return json.dumps({"outputs": doc}).encode(), JSON
    buf = io.BytesIO()
    if kind == NPY and len(arrays) == 1:
        np.save(buf, next(iter(arrays.values())), allow_pickle=False)
        return buf.getvalue(), NPY
    np.savez(buf, **arrays)
    return buf.getvalue(), NPZ


def encode_request(
    feeds: Mapping[str, np.ndarray], kind: str, outputs: Sequence[str] | None = None
) -> tuple[bytes, str]:
    """A request body for ``feeds`` in format ``kind`` (a media type): JSON carries each array's dtype."""
    if kind == JSON:
        doc: dict[str, Any] = {
            "inputs": {n: {"dtype": str(np.asarray(a).dtype), "data": np.asarray(a).tolist()} for n, a in feeds.items()}
        }
        if outputs:
            doc["outputs"] = list(outputs)
        return json.dumps(doc).encode(), JSON
    buf = io.BytesIO()
    if kind == NPY:
        if len(feeds) != 1:
            raise InputError(f"a .npy request carries one input; given {sorted(feeds)} (use npz)")
        np.save(buf, np.asarray(next(iter(feeds.values()))), allow_pickle=False)
        return buf.getvalue(), NPY
    np.savez(buf, **{n: np.asarray(a) for n, a in feeds.items()})
    return buf.getvalue(), NPZ


def decode_response(body: bytes, content_type: str | None, outputs: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """The output arrays of a response body (``outputs`` names a lone .npy array)."""
    kind = media_type(content_type)
    if kind == JSON:
        doc = json.loads(body)["outputs"]
        return {n: np.asarray(v["data"], dtype=np.dtype(v["dtype"])).reshape(v["shape"]) for n, v in doc.items()}
    if kind == NPY:
        return {outputs[0] if outputs else "output": np.load(io.BytesIO(body), allow_pickle=False)}
    with np.load(io.BytesIO(body), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
