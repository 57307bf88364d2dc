"""`softdeploy serve --address` joins a Ray cluster that is already running: a real head node started with
`ray start --head` in a subprocess, the CLI serving into it, real HTTP requests answered bit-identically to
Session.run by a replica that runs inside that cluster, and the cluster stopped afterwards.

The cluster is stopped through its own `ray start --block` process (SIGINT: it ends the processes it started), then
any of its processes still alive are killed by their ids. Not `ray stop`: it ends every Ray process of the machine,
other users' clusters included."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from serve.conftest import free_port
from serve.tiny import rowwise_mlp
from softdeploy.runtime import Session

pytestmark = pytest.mark.serve  # Ray Serve

START_TIMEOUT_S = 120


TOKEN = secrets.token_hex(32)


def _env() -> dict[str, str]:
    """The environment of the head node and the CLI: this softdeploy first on the path (Ray's workers import it), and
    token authentication with a token of this test's own (what `ray start` turns on where ~/.ray/auth_token exists;
    a process joining such a cluster needs RAY_AUTH_MODE=token and the token)."""
    import softdeploy

    root = str(Path(softdeploy.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN"] = TOKEN
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    return env


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _stop(proc: subprocess.Popen[str], pids: list[int], grace_s: float = 30) -> None:
    """SIGINT to ``proc`` (it shuts down what it started), then SIGKILL to it and to ``pids`` still alive."""
    import psutil

    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                p.kill()
        except psutil.Error:
            pass


@pytest.fixture
def ray_head() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A Ray head node (2 CPUs, no dashboard, every port chosen free) in a subprocess with its own short temp dir;
    yields ("127.0.0.1:PORT", its process). Skips, printing the reason, only where Ray cannot start here."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'softdeploy[serve]')")
    ray_cli = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    if not Path(ray_cli).is_file():
        reason = "Ray cannot start here: no `ray` command beside the Python interpreter"
        print(reason)
        pytest.skip(reason)
    temp = Path("/tmp") / f"ray_sda_{os.getpid()}"  # Ray's unix sockets need a short path
    port = free_port()
    ports = {
        "--ray-client-server-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--dashboard-agent-grpc-port": free_port(),
        "--runtime-env-agent-port": free_port(),
        "--metrics-export-port": free_port(),
    }
    command = [
        ray_cli,
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
        f"--object-store-memory={100 * 1024 * 1024}",
        *(f"{k}={v}" for k, v in ports.items()),
    ]
    head = subprocess.Popen(
        command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    pids: list[int] = []
    try:
        # The head is up once its GCS answers; `ray start --block` keeps running, so poll the port.
        deadline = time.monotonic() + START_TIMEOUT_S
        import socket

        while True:
            if head.poll() is not None:
                output = head.stdout.read() if head.stdout else ""
                reason = f"Ray cannot start here: `ray start --head` exited {head.returncode}: {output[-2000:]}"
                print(reason)
                pytest.skip(reason)
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                reason = f"Ray cannot start here: no GCS on port {port} after {START_TIMEOUT_S} s"
                print(reason)
                pytest.skip(reason)
            time.sleep(0.5)
        pids = _descendants(head.pid)
        yield f"127.0.0.1:{port}", head
    finally:
        pids = sorted(set(pids) | set(_descendants(head.pid)))
        _stop(head, pids)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_serve_with_address_joins_the_running_cluster(ray_head, tmp_path):
    from softdeploy.serve.client import Client

    address, head = ray_head
    model = tmp_path / "tiny.onnx"
    import onnx

    onnx.save(rowwise_mlp(), model)
    http_port = free_port()
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "softdeploy.cli",
            "serve",
            str(model),
            "--address",
            address,
            "--port",
            str(http_port),
            "--replicas",
            "1",
            "--max-batch-size",
            "8",
            "--batch-wait-ms",
            "20",
        ],
        env=_env(),
        cwd=tmp_path,  # not the repository root: the softdeploy on PYTHONPATH is the one imported
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client = Client(f"http://127.0.0.1:{http_port}", timeout=30)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not client.healthy():
            if cli.poll() is not None:
                pytest.fail(f"softdeploy serve --address exited {cli.returncode}: {cli.stderr.read()[-3000:]}")
            assert time.monotonic() < deadline, f"no /healthz after {START_TIMEOUT_S} s"
            time.sleep(0.5)
        # the replica is a process of the cluster started above (the CLI joined it rather than starting its own)
        replica_pid = client.stats()["pid"]
        assert replica_pid in _descendants(head.pid), (replica_pid, _descendants(head.pid))
        meta = client.metadata()
        assert meta["batching"]["enabled"] and meta["batching"]["stacks"]
        ref = Session(model)
        inputs = [np.random.default_rng(i).standard_normal((1 + i % 3, 16)).astype(np.float32) for i in range(48)]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda x: client.run({"X": x})["Y"], inputs))
        for x, y in zip(inputs, answers, strict=True):
            want = ref.run({"X": x})[0]
            assert y.dtype == want.dtype and y.shape == want.shape and y.tobytes() == want.tobytes()
        stats = client.stats()
        assert stats["rows"] >= sum(len(x) for x in inputs) and stats["runs"] < len(inputs)
    finally:
        cli.send_signal(signal.SIGINT)  # Ctrl-C: the CLI shuts its application down and exits
        try:
            cli.wait(60)
        except subprocess.TimeoutExpired:
            cli.kill()
            cli.wait(10)
    assert cli.returncode is not None
