"""Batched answers are Session.run's bits: a replica stacks requests only where the model is batch-invariant (a
startup probe, then each new shape and stack size checked once on its requests), else runs each request alone
inside the batch. The rule in-process (ModelServer built directly), then over HTTP on a model that is not
batch-invariant (a ReduceSum pooling)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from serve.tiny import mean_pool, rowwise_mlp
from softdeploy.runtime import Session

pytestmark = pytest.mark.serve  # Ray Serve

pytest.importorskip("ray", reason="Ray is not installed (pip install 'softdeploy[serve]')")


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _server(model, tmp_path, **options):
    import onnx

    from softdeploy.serve.app import ModelServer, ServeOptions

    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return ModelServer(str(path), ServeOptions(**options)), Session(path)


def _tokens(rows: int, tokens: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, tokens, 32)).astype(np.float32)


def test_the_probe_finds_a_pooling_model_not_batch_invariant(tmp_path):
    server, ref = _server(mean_pool(), tmp_path, max_batch_size=8)
    assert server.batching and not server.invariance.stacks
    assert server.invariance.reason.startswith("a random row run alone and inside a stack of 2 rows differs")
    assert server.metadata["batching"]["stacks"] is False
    # its batches run request by request: each answer is the request's own run
    items = [({"X": _tokens(1 + i % 2, 24, seed=i)}, None) for i in range(6)]
    answers = server._run_batch_sync(items)
    for (feeds, _), answer in zip(items, answers, strict=True):
        assert _same(answer[0], ref.run(feeds)[0])
    assert server.stats["runs"] == 6 and server.stats["largest_batch"] == 2


def test_a_row_wise_model_stacks_and_each_new_shape_is_checked_once(tmp_path):
    server, ref = _server(rowwise_mlp(), tmp_path, max_batch_size=8)
    assert server.invariance.stacks
    items = [({"X": np.random.default_rng(i).standard_normal((1, 16)).astype(np.float32)}, None) for i in range(4)]
    for _ in range(3):
        answers = server._run_batch_sync(items)
        for (feeds, _), answer in zip(items, answers, strict=True):
            assert _same(answer[0], ref.run(feeds)[0])
    # three stacked runs of 4 rows; the first of them checked against the 4 requests run alone
    assert server.stats["runs"] == 3 and server.stats["largest_batch"] == 4
    assert server.stats["check_runs"] == 4 and server.invariance.stacks


def test_a_difference_on_real_requests_turns_stacking_off(tmp_path):
    """A probe that missed (here: forced) is caught by the first stacked batch of real requests."""
    server, ref = _server(mean_pool(), tmp_path, max_batch_size=8)
    server.invariance.stacks = True
    items = [({"X": _tokens(1, 64, seed=10 + i)}, None) for i in range(4)]
    answers = server._run_batch_sync(items)
    for (feeds, _), answer in zip(items, answers, strict=True):
        assert _same(answer[0], ref.run(feeds)[0])  # answered with the runs alone
    assert not server.invariance.stacks
    assert "differs from its run alone" in server.invariance.reason
    answers = server._run_batch_sync(items)  # from now on request by request
    for (feeds, _), answer in zip(items, answers, strict=True):
        assert _same(answer[0], ref.run(feeds)[0])


@pytest.fixture(scope="module")
def pooled(ray_serve: tuple[str, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Session]]:
    import onnx
    from ray import serve

    from softdeploy.serve.app import ServeOptions, build_app

    path = tmp_path_factory.mktemp("serve") / "pool.onnx"
    onnx.save(mean_pool(), path)
    options = ServeOptions(replicas=1, cpus_per_replica=1, max_batch_size=8, batch_wait_s=0.05)
    serve.run(build_app(path, options), name="pool", route_prefix="/pool", blocking=False)
    host, port = ray_serve
    yield f"http://{host}:{port}/pool", Session(path)
    serve.delete("pool")


@pytest.mark.slow
def test_a_model_that_is_not_batch_invariant_is_answered_exactly_over_http(pooled):
    from softdeploy.serve.client import Client

    url, ref = pooled
    client = Client(url, timeout=30)
    meta = client.metadata()["batching"]
    assert meta["enabled"] and meta["stacks"] is False
    inputs = [_tokens(1 + i % 2, 16 + 16 * (i % 3), seed=200 + i) for i in range(48)]
    before = client.stats()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda x: client.run({"X": x})["Y"], inputs))
    for x, y in zip(inputs, answers, strict=True):
        assert _same(y, ref.run({"X": x})[0])
    after = client.stats()
    # batched (requests handed to the worker together), yet every run held one request's rows
    assert after["largest_batch_requests"] > 1 and after["batches"] - before["batches"] < len(inputs)
    assert after["runs"] - before["runs"] == len(inputs) and after["largest_batch"] <= 2
