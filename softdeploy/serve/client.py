"""A Python client for ``softdeploy serve`` (standard library HTTP only; no Ray).

>>> client = Client("http://127.0.0.1:8000")          # doctest: +SKIP
>>> client.run({"X": x})["Y"]                          # doctest: +SKIP

A 400 answer is raised as the server's softdeploy error (:class:`~softdeploy.errors.InputError`, or
:class:`~softdeploy.errors.OpContractError` for a value an op refuses) carrying its one-line message
(Session's own words); any other failure as :class:`~softdeploy.errors.RuntimeFailure` naming the status.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from softdeploy import errors
from softdeploy.errors import ArgumentError, InputError, RuntimeFailure
from softdeploy.serve import wire


class Client:
    """Requests to one ``softdeploy serve`` application at ``url`` (its route prefix included).

    ``format``: the body format of :meth:`run` -- ``"npz"`` (default: any arrays, exact), ``"npy"`` (one
    input) or ``"json"`` (small inputs). ``timeout``: seconds per request."""

    def __init__(self, url: str = "http://127.0.0.1:8000", *, format: str = "npz", timeout: float = 60.0) -> None:
        if format not in wire.FORMATS:
            raise ArgumentError(f"client: format = {format!r} (rule: one of {sorted(wire.FORMATS)})")
        self.url = url.rstrip("/")
        self.format = format
        self.timeout = timeout

    def _request(self, path: str, body: bytes | None = None, content_type: str | None = None) -> tuple[bytes, Any]:
        headers = {"Content-Type": content_type} if content_type else {}
        req = urllib.request.Request(
            self.url + path, data=body, headers=headers, method="POST" if body is not None else "GET"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.read(), resp.headers
        except urllib.error.HTTPError as e:
            text = e.read()
            kind = ""
            try:
                doc = json.loads(text)
                message, kind = doc["message"], doc.get("error", "")
            except Exception:
                message = text.decode(errors="replace").strip().splitlines()[0] if text.strip() else e.reason
            if e.code == 400:
                # The server's own softdeploy error type (InputError, OpContractError, ...) where it names one.
                error = getattr(errors, kind, None) if kind else None
                if not (isinstance(error, type) and issubclass(error, errors.SoftdeployError)):
                    error = InputError
                raise error(message) from None
            raise RuntimeFailure(f"{self.url}{path}: HTTP {e.code}: {message}") from None

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None, *, format: str | None = None
    ) -> dict[str, np.ndarray]:
        """Runs the served model on ``feeds`` (input name -> array); returns output name -> array
        (``outputs``: a subset, default all)."""
        kind = wire.FORMATS[format or self.format]
        body, content_type = wire.encode_request(feeds, kind, outputs if kind == wire.JSON else None)
        path = "/" if not outputs or kind == wire.JSON else "/?outputs=" + ",".join(outputs)
        data, headers = self._request(path, body, content_type)
        names = [n for n in (headers.get("X-Softdeploy-Outputs") or "").split(",") if n]
        return wire.decode_response(data, headers.get("Content-Type"), names)

    def metadata(self) -> dict[str, Any]:
        """``/metadata``: inputs, outputs, dtypes, shapes, batching, kernel variant, int8 target."""
        return json.loads(self._request("/metadata")[0])

    def stats(self) -> dict[str, Any]:
        """``/stats`` of the replica that answers: requests, runs, rows, batch sizes."""
        return json.loads(self._request("/stats")[0])

    def healthy(self) -> bool:
        """True when ``/healthz`` answers."""
        try:
            return bool(json.loads(self._request("/healthz")[0]).get("ok"))
        except (RuntimeFailure, OSError):
            return False
