"""TVM RPC for users with more than one machine: a tracker hands out devices by key; tuning
(MetaSchedule's RPCRunner, see :mod:`softdeploy.tvm.tuning`) and measurement
(:class:`softdeploy.tvm.session.TVMSession` with ``rpc=``) run on them.

On the machines::

    python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190                 # one, anywhere
    python -m tvm.exec.rpc_server --tracker TRACKER:9190 --key epyc           # on each device

then ``softdeploy compile model.onnx --backend tvm --tune-trials 200 --rpc TRACKER:9190 --key epyc
--target-cpu znver4`` (the build happens here, for the device's CPU). The tracker needs ``tornado``.

:class:`LocalCluster` starts a tracker and one server on loopback (the tests use it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from softdeploy.tvm.tuning import RPCSpec


def connect(rpc: RPCSpec, timeout_s: float = 60.0) -> Any:
    """A session on a device of key ``rpc.key``, requested from the tracker."""
    from tvm import rpc as tvm_rpc

    tracker = tvm_rpc.connect_tracker(rpc.host, rpc.port)
    return tracker.request(rpc.key, priority=1, session_timeout=rpc.session_timeout_s, max_retry=int(timeout_s))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalCluster:
    """A tracker and ``servers`` RPC servers on 127.0.0.1, as subprocesses; a context manager."""

    def __init__(self, key: str = "softdeploy-local", servers: int = 1) -> None:
        self.key = key
        self.port = _free_port()
        self._servers = servers
        self._procs: list[subprocess.Popen] = []

    @property
    def spec(self) -> RPCSpec:
        """The RPCSpec (127.0.0.1, port, key) that reaches this local tracker."""
        return RPCSpec("127.0.0.1", self.port, self.key)

    def __enter__(self) -> LocalCluster:
        # --port-end: both scripts search [port, port-end) and default the end to 9199
        tracker = [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(self.port)]
        tracker += ["--port-end", str(self.port + 1)]
        self._procs.append(self._start(tracker))
        try:
            self._wait_tracker()
            for _ in range(self._servers):
                server = [
                    sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
                    "--port", str(port := _free_port()), "--port-end", str(port + 1),
                    "--tracker", f"127.0.0.1:{self.port}", "--key", self.key,
                ]  # fmt: skip
                self._procs.append(self._start(server))
            self._wait_servers()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @staticmethod
    def _start(command: list[str]) -> subprocess.Popen:
        # own process group: a server forks popen workers that must end with it (see __exit__)
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def _wait_tracker(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._procs[0].poll() is not None:
                raise RuntimeError("the RPC tracker exited at start (is tornado installed?)")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"no RPC tracker on 127.0.0.1:{self.port} after {timeout_s} s")

    def _wait_servers(self, timeout_s: float = 120.0) -> None:
        from tvm import rpc as tvm_rpc

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            summary = tvm_rpc.connect_tracker("127.0.0.1", self.port).summary()
            free = sum(q.get("free", 0) for k, q in summary.get("queue_info", {}).items() if k == self.key)
            if free >= self._servers:
                return
            time.sleep(0.5)
        raise TimeoutError(f"RPC servers with key {self.key!r} did not register within {timeout_s} s")

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self._procs):
            _signal_group(proc, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            _signal_group(proc, signal.SIGKILL)  # workers the server forked, if any outlived it
        self._procs.clear()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Signals the process group that :meth:`LocalCluster._start` created for ``proc`` (and only it)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
