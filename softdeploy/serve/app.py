"""The Ray Serve application of ``softdeploy serve`` (the ``serve`` extra: ``pip install "softdeploy[serve]"``).

Each replica opens one :class:`softdeploy.runtime.Session` on the model: the kernel library registered,
``threads`` = the replica's CPUs (Ray sets OMP_NUM_THREADS=1 in its workers, which onnxruntime ignores
anyway: its intra-op pool is sized here, from the CPUs Ray reserved), idle workers sleeping rather than
spinning (a spinning pool steals the cores of the replica next to it). Runs go through one worker thread
per replica, so a replica never runs two sessions' pools over the same cores while its event loop keeps
taking requests (which is what lets a batch fill up).

Routes (any route prefix): ``POST /`` (or ``/infer``) runs the model (bodies: :mod:`softdeploy.serve.wire`),
``GET /healthz``, ``GET /metadata`` (inputs, outputs, dtypes, shapes, batching, the kernel variant running,
the model's int8 target where its metadata names one), ``GET /stats`` (this replica's counters: requests,
runs, rows, the largest batch). A request the model cannot take -- a wrong name, dtype or shape, a NaN that
an op refuses, a body over ``max_body_bytes`` -- is a 400 whose body is ``{"error": TYPE, "message": ...}``
with Session's own one-line message; it never reaches the replica's health.

Dynamic batching (``@serve.batch``) applies to models whose inputs and outputs all have a symbolic first
dimension: the requests that arrive together are handed to the replica's worker as one batch. Every answer is
bit-identical to ``Session.run`` of that request alone, so the worker stacks requests of one shape (concatenates
them along the first dimension, runs once and splits back) only where that gives the same bits, and otherwise runs
them one by one inside the batch (still one hand-off per batch, not per request). Whether it gives the same bits is
a property of the model's operators (onnxruntime's and softdeploy's kernels alike): onnxruntime's ReduceSum over a middle axis, for one, sums
``[1, T, D]`` (which it treats as ``[T, D]``) in another order than ``[B, T, D]``, so a mean-pooled encoder's
sentence embedding moves in the last bit when stacked. The rule (:class:`BatchInvariance`):

* at startup the replica runs a random input alone and inside stacks of 2 and ``max_batch_size`` rows (symbolic
  dimensions other than the batch set to 16, integer inputs 0 or 1, the other rows' floats 4x larger); if any output
  row of it differs, or the probe cannot run, the replica never stacks;
* otherwise it stacks, and checks each new (shape, stacked rows) combination once on the real requests of that
  batch (their stacked answer against each run alone, answering with the latter); the first difference turns
  stacking off for good.

``/metadata`` says which (``batching.stacks`` and ``batching.invariance``). A batch that fails is run again request
by request, so one bad request never fails the others.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.errors import ArgumentError, InputError, ModelLoadError, SoftdeployError

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ServeOptions:
    """What one application serves and how.

    * ``replicas``: Ray Serve replicas of the model; ``cpus_per_replica``: CPUs Ray reserves for each, and
      the session's intra-op threads.
    * ``max_batch_size``: the largest batch of requests run together (1: no batching);
      ``batch_wait_s``: how long a replica waits for a batch to fill.
    * ``kernels``: Session's ``kernels`` (``"native"`` registers softdeploy's library).
    * ``max_body_bytes``: larger request bodies are refused with a 400.
    """

    replicas: int = 1
    cpus_per_replica: int = 1
    max_batch_size: int = 16
    batch_wait_s: float = 0.005
    kernels: str = "native"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def check(self) -> None:
        """Raises ArgumentError for a value out of its range."""
        for name, low in (("replicas", 1), ("cpus_per_replica", 1), ("max_batch_size", 1), ("max_body_bytes", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ArgumentError(f"serve: {name} = {value!r} (rule: an integer >= {low})")
        if not (0 <= self.batch_wait_s <= 10):
            raise ArgumentError(f"serve: batch_wait_s = {self.batch_wait_s!r} (rule: seconds in [0, 10])")
        if self.kernels not in ("native", "portable", "auto"):
            raise ArgumentError(f"serve: kernels = {self.kernels!r} (rule: one of ['native', 'portable', 'auto'])")


def _arg_info(args: Sequence[Any]) -> list[dict[str, Any]]:
    from softdeploy.runtime.session import _element_type

    return [
        {
            "name": a.name,
            "dtype": _element_type(a.type),
            "shape": [d if isinstance(d, int) else str(d) for d in a.shape or []],
        }
        for a in args
    ]


def _batchable(sess: Any) -> bool:
    """Every input and output has a symbolic first dimension (a batch axis requests can be stacked on)."""
    args = [*sess.get_inputs(), *sess.get_outputs()]
    return bool(args) and all(a.shape and not isinstance(a.shape[0], int) for a in args)


def int8_target(metadata: Mapping[str, str]) -> str | None:
    """The deployment target a quantized model's metadata records (``softdeploy quantize --target``), else None."""
    from softdeploy.quant.formats import TARGET_KEY

    return metadata.get(TARGET_KEY)


def int8_format(metadata: Mapping[str, str]) -> str | None:
    """The int8 weight format a quantized model's metadata records, else None."""
    from softdeploy.quant.formats import FORMAT_KEY

    return metadata.get(FORMAT_KEY)


PROBE_DIM = 16  # the size of a symbolic non-batch dimension in the startup probe (MTCNN's P-Net needs >= 12)
MAX_CHECKED = 1024  # (shape, rows) combinations remembered as checked; past it the memory starts over


def _probe_input(arg: Any, rows: int, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """A random ``rows``-row input for the ORT input ``arg``: N(0, scale^2) floats, 0/1 integers (a valid token id,
    mask or index for any table), random booleans; symbolic dimensions past the first are PROBE_DIM."""
    from softdeploy.runtime.session import _element_type

    shape = [rows] + [d if isinstance(d, int) and d > 0 else PROBE_DIM for d in (arg.shape or [])[1:]]
    dtype = np.dtype(_element_type(arg.type))
    if dtype.kind == "f":
        return (scale * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    raise InputError(f"input {arg.name!r}: no random probe for element type {dtype}")


def _rows_differ(stacked: Sequence[np.ndarray], start: int, alone: Sequence[np.ndarray]) -> str | None:
    """Where the rows ``start:start + len`` of a stacked run's outputs differ from the same request run alone
    (bit for bit); None when they are the same."""
    for k, (s, a) in enumerate(zip(stacked, alone, strict=True)):
        part = s[start : start + a.shape[0]] if s.ndim else s
        if part.shape != a.shape or part.dtype != a.dtype or part.tobytes() != a.tobytes():
            return f"output {k} rows {start}..{start + a.shape[0] - 1}"
    return None


@dataclass
class BatchInvariance:
    """Whether stacking requests gives each the bits of its own run: ``stacks`` (the replica stacks), ``reason``
    (the probe's finding, said in /metadata), and the (shape, rows) combinations checked on real requests."""

    stacks: bool
    reason: str
    checked: set[Any]

    @classmethod
    def probe(cls, session: Any, max_batch_size: int, seed: int = 0) -> BatchInvariance:
        """Runs a random input alone and as one row of stacks of 2 and ``max_batch_size`` rows."""
        ort = session.ort_session
        rng = np.random.default_rng(seed)
        try:
            alone = {a.name: _probe_input(a, 1, rng) for a in ort.get_inputs()}
            want = session.run(alone)
            for rows in sorted({2, max_batch_size}):
                at = rows // 2
                # the other rows 4x larger: a value shared across rows (one dynamic int8 scale for the whole
                # tensor, a norm over the batch) then differs between the stack and the row alone
                others = {a.name: _probe_input(a, rows - 1, rng, scale=4.0) for a in ort.get_inputs()}
                stacked = {n: np.concatenate([others[n][:at], alone[n], others[n][at:]]) for n in alone}
                where = _rows_differ(session.run(stacked), at, want)
                if where is not None:
                    return cls(
                        False,
                        f"a random row run alone and inside a stack of {rows} rows differs ({where}): "
                        "each request runs alone",
                        set(),
                    )
        except (SoftdeployError, ValueError) as e:
            first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
            return cls(False, f"the random probe could not run ({first}): each request runs alone", set())
        return cls(
            True,
            f"a random row gives the same bits alone and inside stacks of {sorted({2, max_batch_size})} rows: "
            "requests are stacked, each new (shape, rows) checked once on its requests",
            set(),
        )


class ModelServer:
    """One replica: a Session on the model, the HTTP routes, the batch handler and the counters."""

    def __init__(self, model_path: str, options: ServeOptions) -> None:
        from ray import serve

        from softdeploy.runtime import Session
        from softdeploy.runtime.library import library_status
        from softdeploy.runtime.session import _element_type

        self.options = options
        self.session = Session(model_path, kernels=options.kernels, threads=options.cpus_per_replica, spin=False)  # type: ignore[arg-type]
        ort = self.session.ort_session
        self._inputs = ort.get_inputs()
        self._input_types = {a.name: _element_type(a.type) for a in self._inputs}
        self.batching = options.max_batch_size > 1 and _batchable(ort)
        self.invariance = (
            BatchInvariance.probe(self.session, options.max_batch_size)
            if self.batching
            else BatchInvariance(False, "no batching", set())
        )
        meta = ort.get_modelmeta()
        status = library_status()
        variant = status.info.isa_selected if (self.session.kernels == "native" and status.info) else None
        with open(model_path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        custom = dict(meta.custom_metadata_map or {})
        self.metadata = {
            "model": Path(model_path).name,
            "sha256": digest,
            "inputs": _arg_info(self._inputs),
            "outputs": _arg_info(ort.get_outputs()),
            "batching": {
                "enabled": self.batching,
                "max_batch_size": options.max_batch_size if self.batching else 1,
                "batch_wait_s": options.batch_wait_s if self.batching else 0.0,
                "stacks": self.invariance.stacks,
                "invariance": self.invariance.reason,
            },
            "kernels": self.session.kernels,
            "kernel_variant": variant,
            "threads": self.session.threads,
            "int8_target": int8_target(custom),
            "int8_format": int8_format(custom),
            "model_metadata": custom,
            "max_body_bytes": options.max_body_bytes,
        }
        self.stats = {
            "requests": 0,
            "bad_requests": 0,
            "runs": 0,
            "rows": 0,
            "largest_batch": 0,
            "batch_sizes": {},
            "check_runs": 0,
            "batches": 0,
            "largest_batch_requests": 0,
        }
        self.replica = os.environ.get("RAY_SERVE_REPLICA_ID") or f"pid {os.getpid()}"
        try:
            self.replica = serve.get_replica_context().replica_tag
        except Exception:  # outside a replica (a unit test builds the class directly)
            pass
        self.started = time.time()
        # One worker: a replica's runs take its CPUs one at a time (their intra-op pool is sized to them).
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="softdeploy-run")
        handler = self._run_batch
        if hasattr(handler, "set_max_batch_size"):  # the @serve.batch handler of the deployment class
            handler.set_max_batch_size(options.max_batch_size)
            handler.set_batch_wait_timeout_s(options.batch_wait_s)

    # ---- running -------------------------------------------------------------------------------

    def _count(self, batch: int) -> None:
        """One run of ``batch`` rows (a request's rows, or several requests' stacked; 1 for an unbatched model)."""
        self.stats["runs"] += 1
        self.stats["rows"] += batch
        self.stats["largest_batch"] = max(self.stats["largest_batch"], batch)
        sizes = self.stats["batch_sizes"]
        sizes[str(batch)] = sizes.get(str(batch), 0) + 1

    def _run_one(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None, counted: bool = True
    ) -> list[np.ndarray] | Exception:
        try:
            result = self.session.run(feeds, outputs)
        except SoftdeployError as e:
            return e
        if not counted:  # a check of a stacked run against this request alone
            self.stats["check_runs"] += 1
            return result
        first = next(iter(feeds.values()), None)
        self._count(int(first.shape[0]) if self.batching and first is not None else 1)
        return result

    def _run_group(self, items: list[tuple[dict[str, np.ndarray], list[str] | None]], key: Any) -> list[Any]:
        """Runs requests of one shape (``key``): stacked as one batch where the model is batch-invariant, else one by
        one. A new (shape, rows) combination is checked once against each request run alone (answered with the
        latter); a difference turns stacking off. On a failure (one request's NaN, an output whose first dimension
        is not the batch) the requests run one by one, so each gets its own answer."""
        if len(items) == 1 or not self.invariance.stacks:
            return [self._run_one(*item) for item in items]
        outputs = items[0][1]
        stacked = {name: np.concatenate([f[name] for f, _ in items]) for name in items[0][0]}
        rows = [next(iter(f.values())).shape[0] for f, _ in items]
        total = sum(rows)
        try:
            result = self.session.run(stacked, outputs)
        except SoftdeployError:
            return [self._run_one(*item) for item in items]
        if any(a.ndim == 0 or a.shape[0] != total for a in result):
            return [self._run_one(*item) for item in items]
        self._count(total)
        checked = self.invariance.checked
        if (key, total) not in checked:
            alone = [self._run_one(*item, counted=False) for item in items]
            starts = np.cumsum([0, *rows[:-1]])
            for i, (start, answer) in enumerate(zip(starts, alone, strict=True)):
                where = None if isinstance(answer, Exception) else _rows_differ(result, int(start), answer)
                if where is not None:
                    self.invariance.stacks = False
                    self.invariance.reason = (
                        f"request {i} of a stack of {total} rows (inputs {key[0]}) differs from its run alone "
                        f"({where}): each request runs alone"
                    )
                    break
            else:
                if len(checked) >= MAX_CHECKED:
                    checked.clear()
                checked.add((key, total))
            return alone
        cuts = np.cumsum(rows)[:-1]
        parts = [np.split(a, cuts) for a in result]
        return [[p[i] for p in parts] for i in range(len(items))]

    def _run_batch_sync(self, items: list[tuple[dict[str, np.ndarray], list[str] | None]]) -> list[Any]:
        """Answers one batch of the batch handler: its requests grouped by shape, each group run by _run_group."""
        self.stats["batches"] += 1
        self.stats["largest_batch_requests"] = max(self.stats["largest_batch_requests"], len(items))
        groups: dict[Any, list[int]] = {}
        for i, (feeds, outputs) in enumerate(items):
            key = (tuple((n, a.dtype.str, a.shape[1:]) for n, a in sorted(feeds.items())), tuple(outputs or ()))
            groups.setdefault(key, []).append(i)
        answers: list[Any] = [None] * len(items)
        for key, members in groups.items():
            for i, answer in zip(members, self._run_group([items[i] for i in members], key), strict=True):
                answers[i] = answer
        return answers

    async def _in_pool(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _run_batch(self, items: list[tuple[dict[str, np.ndarray], list[str] | None]]) -> list[Any]:
        return await self._in_pool(self._run_batch_sync, items)

    # ---- HTTP ----------------------------------------------------------------------------------

    def _check(self, feeds: dict[str, np.ndarray], outputs: list[str] | None) -> None:
        """Session's own input checks, before a request joins a batch (a bad one never enters it)."""
        from softdeploy.runtime.session import feed_error

        error = feed_error(self.session.ort_session, feeds, outputs or self.session.output_names)
        if error is not None:
            raise error
        if self.batching and any(a.ndim == 0 for a in feeds.values()):
            raise InputError(f"inputs {sorted(feeds)}: a scalar has no batch dimension")
        if self.batching and len({a.shape[0] for a in feeds.values()}) > 1:
            shapes = {n: list(a.shape) for n, a in feeds.items()}
            raise InputError(
                f"inputs {shapes}: the first (batch) dimension differs between inputs (rule: one batch size)"
            )

    async def infer(
        self, body: bytes, content_type: str | None, query_outputs: str | None
    ) -> tuple[int, bytes, str, str]:
        """Runs one request body; returns (status, body, content type, output names)."""
        from softdeploy.serve import wire

        self.stats["requests"] += 1
        try:
            if len(body) > self.options.max_body_bytes:
                raise InputError(
                    f"request body: {len(body)} bytes is over the limit of {self.options.max_body_bytes} bytes "
                    "(rule: --max-body-bytes)"
                )
            feeds, outputs = wire.decode_request(body, content_type, self._input_types)
            if query_outputs:
                outputs = [o for o in query_outputs.split(",") if o]
            self._check(feeds, outputs)
            if self.batching:
                answer = await self._run_batch((feeds, outputs))
            else:
                answer = await self._in_pool(self._run_one, feeds, outputs)
            if isinstance(answer, Exception):
                raise answer
        except SoftdeployError as e:
            self.stats["bad_requests"] += 1
            return 400, _error_body(e), wire.JSON, ""
        names = list(outputs or self.session.output_names)
        data, kind = wire.encode_arrays(dict(zip(names, answer, strict=True)), wire.media_type(content_type))
        return 200, data, kind, ",".join(names)

    async def __call__(self, request: Any) -> Any:
        """The HTTP entry point (a Starlette request; routes relative to the application's prefix)."""
        from starlette.responses import JSONResponse, Response

        root = request.scope.get("root_path", "")
        path = request.url.path
        if root and path.startswith(root):
            path = path[len(root) :]
        path = "/" + path.strip("/")
        if request.method == "GET" and path == "/healthz":
            return JSONResponse({"ok": True, "replica": self.replica})
        if request.method == "GET" and path == "/metadata":
            batching = {
                **self.metadata["batching"],
                "stacks": self.invariance.stacks,
                "invariance": self.invariance.reason,
            }
            return JSONResponse({**self.metadata, "batching": batching, "replica": self.replica, "stats": self.stats})
        if request.method == "GET" and path == "/stats":
            return JSONResponse(
                {
                    "replica": self.replica,
                    "pid": os.getpid(),
                    "uptime_s": time.time() - self.started,
                    "stacks": self.invariance.stacks,
                    **self.stats,
                }
            )
        if request.method == "POST" and path in ("/", "/infer"):
            declared = request.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > self.options.max_body_bytes:
                self.stats["requests"] += 1
                self.stats["bad_requests"] += 1
                e = InputError(
                    f"request body: {declared} bytes is over the limit of {self.options.max_body_bytes} bytes "
                    "(rule: --max-body-bytes)"
                )
                return Response(_error_body(e), status_code=400, media_type="application/json")
            body = await request.body()
            status, data, kind, names = await self.infer(
                body, request.headers.get("content-type"), request.query_params.get("outputs")
            )
            return Response(data, status_code=status, media_type=kind, headers={"X-Softdeploy-Outputs": names})
        return JSONResponse(
            {
                "error": "NotFound",
                "message": f"{request.method} {path}: no such route (POST /, GET /healthz, /metadata, /stats)",
            },
            status_code=404,
        )


def _error_body(e: Exception) -> bytes:
    import json

    message = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
    return json.dumps({"error": type(e).__name__, "message": message}).encode()


def _deployment_class() -> Any:
    """ModelServer as a Ray Serve deployment class, with its batch handler (built here: Ray is imported lazily)."""
    from ray import serve

    class _Server(ModelServer):
        # Placeholders: each replica sets the application's own size and wait in ModelServer.__init__.
        @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
        async def _run_batch(self, items: list[tuple[dict[str, np.ndarray], list[str] | None]]) -> list[Any]:
            return await self._in_pool(self._run_batch_sync, items)

    _Server.__name__ = _Server.__qualname__ = "SoftdeployModel"
    return _Server


def build_app(model: str | os.PathLike[str], options: ServeOptions | None = None) -> Any:
    """The Ray Serve application serving ``model`` (an ONNX file: every node of a cluster reads it at the
    same path) with ``options``. Pass it to ``ray.serve.run``; :func:`serve_model` does everything."""
    from ray import serve

    options = options or ServeOptions()
    options.check()
    path = Path(model).resolve()
    if not path.is_file():
        raise ModelLoadError(f"{model}: no such model file")
    deployment = serve.deployment(
        _deployment_class(),
        name="SoftdeployModel",
        num_replicas=options.replicas,
        ray_actor_options={"num_cpus": options.cpus_per_replica},
        # Enough for full batches to queue behind the running one.
        max_ongoing_requests=max(64, 4 * options.max_batch_size),
    )
    return deployment.bind(str(path), options)


@dataclass(frozen=True)
class Started:
    """Where a started application answers."""

    url: str
    name: str
    options: dict[str, Any]


def serve_model(
    model: str | os.PathLike[str],
    options: ServeOptions | None = None,
    *,
    address: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str = "softdeploy",
    route_prefix: str = "/",
    num_cpus: int | None = None,
) -> Started:
    """Starts Ray (a local one, or joins ``address``), Ray Serve's HTTP proxy on ``host:port`` and the
    application; returns once every replica has opened its session. ``num_cpus``: CPUs of a local Ray
    (default: the machine's)."""
    import logging

    import ray
    from ray import serve

    options = options or ServeOptions()
    app = build_app(model, options)
    # Ray Serve's driver-side INFO lines (started, connecting, ready) would bury the one line the CLI prints.
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    if not ray.is_initialized():
        if address:
            ray.init(address=address, logging_level="ERROR")
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="ERROR")
    # Ray Serve's per-request access log would print a line per request on the driver's terminal.
    logging = {"log_level": "WARNING", "enable_access_log": False}
    serve.start(http_options={"host": host, "port": port}, logging_config=logging)
    serve.run(app, name=name, route_prefix=route_prefix, blocking=False, logging_config=logging)
    prefix = route_prefix.rstrip("/")
    return Started(url=f"http://{host}:{port}{prefix}", name=name, options=asdict(options))
