"""softdeploy serve on a real local Ray cluster: HTTP answers bit-identical to Session.run, batching that
batches, bad requests answered 400 in Session's words without hurting the replica, and a killed replica
replaced with no request answered wrong."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from serve.tiny import rowwise_mlp
from softdeploy.errors import InputError, OpContractError, RuntimeFailure, SoftdeployError
from softdeploy.runtime import Session

pytestmark = pytest.mark.serve  # Ray Serve

MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def tiny(ray_serve: tuple[str, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Session]]:
    """The tiny RowwiseInt8MatMul model served by 2 replicas (batches up to 8, 20 ms wait) at /tiny; yields its
    URL and an in-process Session on the same file (the reference)."""
    import onnx
    from ray import serve

    from softdeploy.serve.app import ServeOptions, build_app

    path = tmp_path_factory.mktemp("serve") / "tiny.onnx"
    onnx.save(rowwise_mlp(), path)
    options = ServeOptions(replicas=2, cpus_per_replica=1, max_batch_size=8, batch_wait_s=0.02, max_body_bytes=MAX_BODY)
    serve.run(build_app(path, options), name="tiny", route_prefix="/tiny", blocking=False)
    host, port = ray_serve
    yield f"http://{host}:{port}/tiny", Session(path)
    serve.delete("tiny")


def _client(url: str, fmt: str = "npz") -> object:
    from softdeploy.serve.client import Client

    return Client(url, format=fmt, timeout=30)


def _rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit (NaN payloads and signed zeros included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _post(url: str, body: bytes, content_type: str) -> tuple[int, dict]:
    """A raw POST (http.client): the status and the JSON body of an error answer."""
    host_port, _, path = url.removeprefix("http://").partition("/")
    conn = http.client.HTTPConnection(host_port, timeout=30)
    try:
        conn.request("POST", "/" + path, body=body, headers={"Content-Type": content_type})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if resp.status != 200 else {})
    finally:
        conn.close()


def _replicas(url: str, asks: int = 12) -> set[str]:
    """The replica ids that answer /metadata over ``asks`` requests (those the router picked: a sample)."""
    return {_client(url).metadata()["replica"] for _ in range(asks)}


def _replica_actors(app: str = "tiny") -> set[str]:
    """The ids of the application's live replica actors, from Ray itself (a replica Ray Serve restarts or replaces
    comes back under a new id)."""
    import ray

    prefix = f"SERVE_REPLICA::{app}#"
    return {
        a["name"].rsplit("#", 1)[-1]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(prefix)
    }


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["npz", "npy", "json"])
def test_answers_are_bit_identical_to_session_run(tiny, fmt):
    url, ref = tiny
    client = _client(url, fmt)
    for i, n in enumerate((1, 3, 5)):
        x = _rows(n, seed=i)
        got = client.run({"X": x})
        assert list(got) == ["Y"]
        assert _same(got["Y"], ref.run({"X": x})[0])


def test_json_lists_without_dtype_take_the_models_float32(tiny):
    url, ref = tiny
    x = _rows(2, seed=7)
    status, _ = _post(url, json.dumps({"inputs": {"X": x.astype(np.float64).tolist()}}).encode(), "application/json")
    assert status == 200
    from softdeploy.serve import wire

    host_port, _, path = url.removeprefix("http://").partition("/")
    conn = http.client.HTTPConnection(host_port, timeout=30)
    conn.request(
        "POST", "/" + path, body=json.dumps({"inputs": {"X": x.tolist()}}), headers={"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    got = wire.decode_response(resp.read(), resp.getheader("Content-Type"))
    conn.close()
    assert _same(got["Y"], ref.run({"X": x})[0])


def test_metadata_and_health(tiny):
    url, _ = tiny
    client = _client(url)
    assert client.healthy()
    meta = client.metadata()
    assert meta["inputs"] == [{"name": "X", "dtype": "float32", "shape": ["batch", 16]}]
    assert meta["outputs"] == [{"name": "Y", "dtype": "float32", "shape": ["batch", 8]}]
    batching = meta["batching"]
    assert {k: batching[k] for k in ("enabled", "max_batch_size", "batch_wait_s", "stacks")} == {
        "enabled": True,
        "max_batch_size": 8,
        "batch_wait_s": 0.02,
        "stacks": True,  # a row-wise model: the startup probe finds it batch-invariant
    }
    assert batching["invariance"].startswith("a random row gives the same bits alone and inside stacks of [2, 8] rows")
    assert meta["kernels"] == "native" and meta["kernel_variant"]
    from softdeploy.runtime.library import library_info

    assert meta["kernel_variant"] == library_info().isa_selected
    assert meta["int8_target"] == "avx2" and meta["int8_format"] == "lane-bounded"  # the model's metadata (tiny.py)
    assert meta["threads"] == 1


def test_concurrent_requests_are_batched_and_answered_exactly(tiny):
    url, ref = tiny
    client = _client(url)
    inputs = [_rows(1 + i % 3, seed=100 + i) for i in range(96)]
    before = {r: s for r, s in _all_stats(url).items()}
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda x: client.run({"X": x})["Y"], inputs))
    for x, y in zip(inputs, answers, strict=True):
        assert _same(y, ref.run({"X": x})[0])
    after = _all_stats(url)
    runs = sum(s["runs"] for s in after.values()) - sum(s["runs"] for s in before.values())
    rows = sum(s["rows"] for s in after.values()) - sum(s["rows"] for s in before.values())
    assert rows == sum(len(x) for x in inputs)
    assert runs < len(inputs), f"{len(inputs)} concurrent requests took {runs} runs: nothing was batched"
    assert max(s["largest_batch"] for s in after.values()) > 3  # more than one request's rows in a run


def _all_stats(url: str) -> dict[str, dict]:
    """/stats of every replica (asked until both have answered)."""
    client = _client(url)
    found: dict[str, dict] = {}
    deadline = time.monotonic() + 20
    while len(found) < 2 and time.monotonic() < deadline:
        s = client.stats()
        found[s["replica"]] = s
    assert len(found) == 2, f"only replicas {sorted(found)} answered /stats"
    return found


def _bad_requests(ref: Session) -> list[tuple[bytes, str, str | None]]:
    """(body, content type, the message Session gives -- None where the rule is the server's own)."""
    import io

    def npz(**arrays: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    def session_message(feeds: dict[str, np.ndarray]) -> str:
        with pytest.raises(SoftdeployError) as e:
            ref.run(feeds)
        return str(e.value)

    x = _rows(2, seed=5)
    nan = x.copy()
    nan[1, 3] = np.nan
    cases = {
        "name": {"Z": x},
        "dtype": {"X": x.astype(np.float64)},
        "rank": {"X": x[0]},
        "width": {"X": _rows(2, seed=1)[:, :15].copy()},
        "nan": {"X": nan},
    }
    out = [(npz(**feeds), "application/x-npz", session_message(feeds)) for feeds in cases.values()]
    # JSON NaN (Python's json reads and writes it): the same refusal as the .npz body
    out.append((json.dumps({"inputs": {"X": nan.tolist()}}).encode(), "application/json", session_message({"X": nan})))
    out.append((b"\x00" * (MAX_BODY + 1), "application/x-npz", None))
    out.append((b"{not json", "application/json", None))
    out.append((b"PK\x03\x04 not an archive", "application/x-npz", None))
    return out


def test_bad_requests_get_400_with_sessions_message(tiny):
    url, ref = tiny
    for body, content_type, message in _bad_requests(ref):
        status, doc = _post(url, body, content_type)
        assert status == 400, (content_type, message, doc)
        assert "\n" not in doc["message"]
        if message is not None:
            assert doc["message"] == message
        else:
            assert doc["message"].startswith("request body:"), doc
    with pytest.raises(OpContractError, match=r"RowwiseInt8MatMul: A\[0, 0\] = nan is not finite"):
        x = _rows(1, seed=3)
        x[0, 2] = np.nan
        _client(url).run({"X": x})
    with pytest.raises(InputError, match=r"unknown input name\(s\) \['Z'\]"):
        _client(url, "json").run({"Z": _rows(1, seed=3)})


@pytest.mark.slow
def test_a_thousand_bad_requests_among_a_thousand_good_ones(tiny):
    url, ref = tiny
    replicas = _replica_actors()
    assert len(replicas) == 2 and _replicas(url) <= replicas
    bad = _bad_requests(ref)
    good = [_rows(1, seed=1000 + i) for i in range(50)]
    expected = [ref.run({"X": x})[0] for x in good]
    client = _client(url)

    def one(i: int) -> bool:
        if i % 2:
            body, content_type, message = bad[(i // 2) % len(bad)]
            status, doc = _post(url, body, content_type)
            return status == 400 and (message is None or doc["message"] == message)
        k = (i // 2) % len(good)
        return _same(client.run({"X": good[k]})["Y"], expected[k])

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(2000)))
    assert all(results), f"{results.count(False)} of 2000 requests answered wrong"
    assert _replica_actors() == replicas  # no replica was restarted or replaced: restarts caused by input, 0
    assert sum(s["bad_requests"] for s in _all_stats(url).values()) >= 1000


@pytest.mark.slow
def test_a_killed_replica_is_replaced_and_no_request_is_answered_wrong(tiny):
    import ray

    url, ref = tiny
    client = _client(url)
    before = _replica_actors()
    assert len(before) == 2
    x = _rows(2, seed=9)
    expected = ref.run({"X": x})[0]
    stop = threading.Event()
    outcomes: list[str] = []

    def load() -> None:
        while not stop.is_set():
            try:
                outcomes.append("right" if _same(client.run({"X": x})["Y"], expected) else "WRONG")
            except RuntimeFailure:
                outcomes.append("failed")  # a 5xx from the request the dying replica held: an error, never an answer

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    victim = next(a for a in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA::tiny" in a["name"])
    ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)
    deadline = time.monotonic() + 60
    now = before
    while time.monotonic() < deadline:
        now = _replica_actors()
        if len(now) == 2 and now != before:
            break
        time.sleep(0.5)
    # the replacement answers requests once it has opened its session
    answered: set[str] = set()
    while not (now - before) <= answered and time.monotonic() < deadline:
        answered |= _replicas(url, asks=6)
        time.sleep(0.2)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    assert len(now) == 2 and now != before, f"replicas before {sorted(before)}, after {sorted(now)}"
    assert (now - before) <= answered, f"the replacement {sorted(now - before)} never answered ({sorted(answered)})"
    assert "WRONG" not in outcomes
    assert outcomes.count("right") > 10
    assert outcomes.count("failed") <= 8, f"{outcomes.count('failed')} requests failed"
    assert _same(client.run({"X": x})["Y"], expected)
