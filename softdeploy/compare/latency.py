"""Latency: warm-up, then interleaved timed rounds; p50 / p90 per call and throughput.

Variants are timed in turn within each round (A B C, B C A, C A B, ...), so a burst of load from
another process on a shared machine hits every variant alike instead of one; per-call times from
all rounds are pooled into the percentiles. The CPU time other processes used during the whole
measurement is recorded beside the numbers (``background_load``, in cores).

Each call's CPU time (this process, all threads) is recorded too: on a loaded machine a call waits
for a core, which lengthens its wall time but not its CPU time, so ratios of CPU time are the
steadier estimate of relative speed (``cpu_p50_ms``; compare runs no other work while timing).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

import numpy as np

from softdeploy.compare.environment import LoadMeter


@dataclasses.dataclass(frozen=True)
class LatencyStats:
    """Wall-clock latency of one measurement over the timed calls (warm-up excluded): p50, p90, mean and min per call in
    ms, throughput in items per second, and the median CPU time of this process per call (all threads; shows when a
    thread pool burns more CPU than it saves)."""

    p50_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    calls: int
    warmup_calls: int
    items_per_call: int
    throughput: float  # items per second over the timed calls
    cpu_p50_ms: float | None = None  # median CPU time of this process per call (all its threads)

    @classmethod
    def from_samples(
        cls, seconds: list[float], warmup: int, items_per_call: int, cpu_seconds: list[float] | None = None
    ) -> LatencyStats:
        """The statistics of per-call wall times ``seconds`` (and CPU times ``cpu_seconds``), each call handling
        ``items_per_call`` items."""
        s = np.asarray(seconds)
        return cls(
            p50_ms=float(np.percentile(s, 50) * 1e3),
            p90_ms=float(np.percentile(s, 90) * 1e3),
            mean_ms=float(s.mean() * 1e3),
            min_ms=float(s.min() * 1e3),
            calls=len(s),
            warmup_calls=warmup,
            items_per_call=items_per_call,
            throughput=float(items_per_call * len(s) / s.sum()),
            cpu_p50_ms=float(np.percentile(cpu_seconds, 50) * 1e3) if cpu_seconds else None,
        )


def measure_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    items_per_call: int = 1,
    warmup: int = 3,
    rounds: int = 8,
    round_seconds: float = 0.25,
    min_calls_per_round: int = 1,
    on_round: Callable[[int], None] | None = None,
) -> tuple[dict[str, LatencyStats], float]:
    """Times each function; returns per-name stats and the background load (cores used by other
    processes) during the measurement."""
    names = list(fns)
    for name in names:  # warm-up: first-call allocations, lazy initialisation, caches
        for _ in range(warmup):
            fns[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    meter = LoadMeter().start()
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn = fns[name]
            start = time.perf_counter()
            done = 0
            while done < min_calls_per_round or time.perf_counter() - start < round_seconds:
                c0, t0 = time.process_time(), time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                done += 1
        if on_round is not None:
            on_round(r)
    load = meter.stop()
    return {n: LatencyStats.from_samples(samples[n], warmup, items_per_call, cpu[n]) for n in names}, load
