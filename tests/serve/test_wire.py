"""The request and response bodies (softdeploy.serve.wire) and one replica's request path, in-process (no Ray
cluster): a two-input model with an int64 input and an output without a batch axis (so never batched)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from serve.tiny import two_inputs
from softdeploy.errors import InputError
from softdeploy.runtime import Session
from softdeploy.serve import wire


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"A": rng.standard_normal((3, 8)).astype(np.float32), "I": rng.integers(-5, 5, (3, 8)).astype(np.int64)}


@pytest.mark.parametrize("kind", [wire.JSON, wire.NPZ])
def test_requests_and_responses_round_trip_exactly(kind):
    feeds = _feeds()
    feeds["A"][0, 0] = np.nan
    feeds["A"][0, 1] = -0.0
    body, content_type = wire.encode_request(feeds, kind)
    back, outputs = wire.decode_request(body, content_type, {"A": "float32", "I": "int64"})
    assert outputs is None and sorted(back) == ["A", "I"]
    for name, array in feeds.items():
        assert back[name].dtype == array.dtype and back[name].tobytes() == array.tobytes()
    data, ct = wire.encode_arrays(feeds, kind)
    again = wire.decode_response(data, ct)
    assert all(again[n].tobytes() == feeds[n].tobytes() for n in feeds)


def test_json_numbers_take_the_models_type_where_they_mean_it():
    types = {"A": "float32", "I": "int64"}
    feeds, _ = wire.decode_request(json.dumps({"inputs": {"A": [[0.1, 2]], "I": [[1, 2]]}}).encode(), wire.JSON, types)
    assert feeds["A"].dtype == np.float32 and feeds["I"].dtype == np.int64
    assert feeds["A"].tolist() == [[float(np.float32(0.1)), 2.0]]
    # a fraction for an integer input is left float64, for the input checks to refuse in Session's words
    feeds, _ = wire.decode_request(json.dumps({"inputs": {"A": [[1]], "I": [[1.5]]}}).encode(), wire.JSON, types)
    assert feeds["A"].dtype == np.float32 and feeds["I"].dtype == np.float64


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (b"{", wire.JSON, "request body: not JSON"),
        (b"[1, 2]", wire.JSON, 'request body: JSON must be an object {"inputs"'),
        (b"\x93NUMPY garbage", wire.NPY, "request body: a .npy body feeds a model with one input"),
        (b"junk", wire.NPZ, "request body: not a readable .npz archive"),
        (b"x", "text/plain", "request body: Content-Type 'text/plain' is not one of"),
    ],
)
def test_unreadable_bodies_are_one_line_input_errors(body, content_type, message):
    with pytest.raises(InputError) as e:
        wire.decode_request(body, content_type, {"A": "float32", "I": "int64"})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.serve
def test_a_replica_answers_an_unbatched_model_exactly_and_refuses_in_sessions_words(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'softdeploy[serve]')")
    import onnx

    from softdeploy.serve.app import ModelServer, ServeOptions

    path = tmp_path / "two.onnx"
    onnx.save(two_inputs(), path)
    server = ModelServer(str(path), ServeOptions(max_batch_size=8, max_body_bytes=2048))
    ref = Session(path)
    assert not server.batching  # S has no batch axis
    assert server.metadata["batching"]["enabled"] is False and server.metadata["int8_target"] is None

    async def infer(feeds, kind=wire.NPZ, outputs=None):
        body, ct = wire.encode_request(feeds, kind)
        return await server.infer(body, ct, outputs)

    feeds = _feeds(1)
    status, data, ct, names = asyncio.run(infer(feeds))
    assert status == 200 and names == "Y,S"
    got = wire.decode_response(data, ct)
    for name, want in zip(ref.output_names, ref.run(feeds), strict=True):
        assert got[name].tobytes() == want.tobytes() and got[name].dtype == want.dtype
    status, data, ct, names = asyncio.run(infer(feeds, wire.JSON, "S"))
    assert status == 200 and names == "S"
    assert wire.decode_response(data, ct)["S"].tobytes() == ref.run(feeds, ["S"])[0].tobytes()

    wrong = {"A": feeds["A"], "I": feeds["I"].astype(np.int32)}
    with pytest.raises(InputError) as e:
        ref.run(wrong)
    status, data, _, _ = asyncio.run(infer(wrong))
    assert status == 400 and json.loads(data) == {"error": "InputError", "message": str(e.value)}

    big = {"A": np.zeros((64, 8), np.float32), "I": np.zeros((64, 8), np.int64)}
    status, data, _, _ = asyncio.run(infer(big))
    assert status == 400
    assert json.loads(data)["message"].endswith("bytes is over the limit of 2048 bytes (rule: --max-body-bytes)")
    assert server.stats["requests"] == 4 and server.stats["bad_requests"] == 2 and server.stats["runs"] == 2
