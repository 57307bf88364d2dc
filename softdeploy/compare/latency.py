"""Latency: warm-up, then interleaved timed rounds; p50 / p90 per call and throughput.

Variants are timed in turn within each round (A B C, B C A, C A B, ...), so a burst of load from
another process on a shared machine hits every variant alike instead of one; per-call times from
all rounds are pooled into the percentiles. The CPU time other processes used during the whole
measurement is recorded beside the numbers (``background_load``, in cores).

Each call's CPU time (this process, all threads) is recorded too: on a loaded machine a call waits
for a core, which lengthens its wall time but not its CPU time, so ratios of CPU time are the
steadier estimate of relative speed (``cpu_p50_ms``; compare runs no other work while timing).

Calls of a few microseconds are timed in batches instead (:func:`time_batches_interleaved`): each round runs a
batch of calls per function, sized once so that a batch takes about ``batch_seconds``, and the per-call time of a
round is the batch's time over its calls (the clock's own cost spread over the batch); the result is the median
over rounds (:class:`BatchTiming`). The benchmarks under bench/ and the CLI's TVM-against-onnxruntime note use it.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping

import numpy as np

from softdeploy.compare.environment import LoadMeter, wait_quiet


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


@dataclasses.dataclass(frozen=True)
class BatchTiming:
    """Per-call seconds of one function over interleaved rounds (:func:`time_batches_interleaved`): one sample per
    round (a timed batch of ``inner`` calls, its time divided by ``inner``), sorted; the median and quartiles over
    the rounds."""

    samples: tuple[float, ...]  # per-call seconds of each round, ascending
    inner: int  # calls per timed batch

    @property
    def median(self) -> float:
        """Median per-call seconds over the rounds."""
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        """Fastest round's per-call seconds."""
        return self.samples[0]

    @property
    def q1(self) -> float:
        """Lower quartile of the rounds' per-call seconds (the sample at rank (n - 1) // 4)."""
        return self.samples[max(0, (len(self.samples) - 1) // 4)]

    @property
    def q3(self) -> float:
        """Upper quartile of the rounds' per-call seconds (the sample at rank (3 (n - 1) + 3) // 4)."""
        n = len(self.samples)
        return self.samples[min(n - 1, (3 * (n - 1) + 3) // 4)]

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median (0 for a zero median)."""
        median = self.median
        return (self.q3 - self.q1) / median if median > 0 else 0.0


def calls_per_batch(fn: Callable[[], object], batch_seconds: float, max_calls: int = 100_000) -> int:
    """How many calls of ``fn`` take about ``batch_seconds``, from one call timed after one untimed warm-up call
    (first-call allocations and lazy initialisation); at least 1, at most ``max_calls``; 1 for ``batch_seconds`` 0."""
    fn()
    if batch_seconds <= 0:
        return 1
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    if elapsed <= 0:
        return max_calls
    return int(max(1, min(max_calls, round(batch_seconds / elapsed))))


def time_batches_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 15,
    batch_seconds: float = 0.02,
    warmup_rounds: int = 1,
) -> dict[str, BatchTiming]:
    """Times each function in batches, the functions in turn within each round and the order rotated every round
    (A B C, B C A, C A B, ...), so that a burst of load from another process hits every function alike; the first
    ``warmup_rounds`` rounds are run and dropped. ``batch_seconds`` 0 times one call per round."""
    if rounds < 1:
        raise ValueError(f"time_batches_interleaved: rounds must be at least 1, got {rounds}")
    names = list(fns)
    inner = {n: calls_per_batch(fns[n], batch_seconds) for n in names}
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup_rounds + rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn, calls = fns[name], inner[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if r >= warmup_rounds:
                samples[name].append((time.perf_counter() - start) / calls)
    return {n: BatchTiming(tuple(sorted(samples[n])), inner[n]) for n in names}


def time_batches_quietly(
    fns: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 15,
    batch_seconds: float = 0.02,
    max_tries: int = 3,
    wait_seconds: float = 30.0,
    threshold: float = 0.3,
) -> tuple[dict[str, BatchTiming], float]:
    """:func:`time_batches_interleaved`, measured again (up to ``max_tries`` times, each after waiting up to
    ``wait_seconds`` for other processes to use less than ``threshold`` cores) while other processes used more than
    ``threshold`` cores during the measurement. Returns the timings of the quietest try and the background load
    (cores) during it."""
    best: tuple[dict[str, BatchTiming], float] | None = None
    for attempt in range(max(1, max_tries)):
        if attempt:
            wait_quiet(wait_seconds, threshold)
        meter = LoadMeter().start()
        timings = time_batches_interleaved(fns, rounds=rounds, batch_seconds=batch_seconds)
        load = meter.stop()
        if best is None or load < best[1]:
            best = (timings, load)
        if load <= threshold:
            break
    assert best is not None
    return best
