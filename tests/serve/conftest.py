"""A small local Ray cluster per test module (2 CPUs, no dashboard, a 100 MB object store), shut down after it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """Ray (2 CPUs) with Ray Serve's proxy on 127.0.0.1:PORT; yields ("127.0.0.1", PORT). Skips, printing the
    reason, only where Ray is not installed or cannot start here."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'softdeploy[serve]')")
    from ray import serve

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sigint = signal.getsignal(signal.SIGINT)  # Ray's driver may replace it; the tests after these keep Python's
    temp = Path("/tmp") / f"ray_sd_{os.getpid()}"  # Ray's unix sockets need a short path: not pytest's tmp_path
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=100 * 1024 * 1024,
            log_to_driver=False,
            logging_level="ERROR",
            _temp_dir=str(temp),
        )
    except Exception as e:  # a machine where Ray cannot start (no /dev/shm, sandboxed sockets, ...)
        reason = f"Ray cannot start here: {type(e).__name__}: {e}"
        print(reason)
        pytest.skip(reason)
    port = free_port()
    try:
        serve.start(
            http_options={"host": "127.0.0.1", "port": port},
            logging_config={"log_level": "WARNING", "enable_access_log": False},
        )
        yield "127.0.0.1", port
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        signal.signal(signal.SIGINT, sigint)
