from __future__ import annotations

import time

import pytest

from softdeploy.compare.latency import (
    BatchTiming,
    LatencyStats,
    calls_per_batch,
    measure_interleaved,
    time_batches_interleaved,
    time_batches_quietly,
)


def test_interleaved_measurement_orders_and_counts() -> None:
    calls = {"slow": 0, "fast": 0}

    def slow() -> None:
        calls["slow"] += 1
        time.sleep(0.004)

    def fast() -> None:
        calls["fast"] += 1

    rounds_seen = []
    stats, load = measure_interleaved(
        {"slow": slow, "fast": fast},
        items_per_call=2,
        warmup=2,
        rounds=3,
        round_seconds=0.02,
        on_round=rounds_seen.append,
    )
    assert rounds_seen == [0, 1, 2]
    assert stats["slow"].p50_ms >= 4.0 > stats["fast"].p50_ms
    assert stats["slow"].p90_ms >= stats["slow"].p50_ms >= stats["slow"].min_ms
    assert calls["slow"] == stats["slow"].calls + 2  # timed calls + warm-up
    assert stats["slow"].throughput < 2 / 0.004
    # sleeping takes wall time but (almost) no CPU time
    assert stats["slow"].cpu_p50_ms is not None and stats["slow"].cpu_p50_ms < 0.5 * stats["slow"].p50_ms
    assert load >= 0.0


def test_stats_from_samples() -> None:
    s = LatencyStats.from_samples([0.001, 0.002, 0.003, 0.004], warmup=1, items_per_call=8)
    assert s.p50_ms == 2.5 and s.min_ms == 1.0 and s.calls == 4
    assert abs(s.throughput - 8 * 4 / 0.010) < 1e-6
    assert s.cpu_p50_ms is None
    c = LatencyStats.from_samples([0.002, 0.004], warmup=0, items_per_call=1, cpu_seconds=[0.001, 0.003])
    assert c.cpu_p50_ms == 2.0


def test_batch_timing_statistics() -> None:
    t = BatchTiming(samples=(1.0, 2.0, 3.0, 4.0, 10.0), inner=7)
    assert t.median == 3.0 and t.min == 1.0 and t.q1 == 2.0 and t.q3 == 4.0 and t.inner == 7
    assert t.spread == pytest.approx((4.0 - 2.0) / 3.0)
    assert BatchTiming(samples=(0.0, 0.0), inner=1).spread == 0.0


def test_batches_run_in_turn_rotated_and_one_call_a_round_at_zero_seconds() -> None:
    order: list[str] = []
    fns = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    timings = time_batches_interleaved(fns, rounds=3, batch_seconds=0.0, warmup_rounds=1)
    # one untimed warm-up call each (no batch to size), then one call per round, the order rotated every round
    assert order[:3] == ["a", "b", "c"]
    assert order[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert all(t.inner == 1 and len(t.samples) == 3 for t in timings.values())
    assert all(list(t.samples) == sorted(t.samples) for t in timings.values())


def test_batches_are_sized_to_the_batch_seconds_and_time_per_call() -> None:
    def slow() -> None:
        time.sleep(0.002)

    assert calls_per_batch(slow, 0.02) in range(3, 11)  # ~10 calls of >= 2 ms; fewer on a loaded machine
    timings = time_batches_interleaved({"slow": slow, "fast": lambda: None}, rounds=3, batch_seconds=0.01)
    assert timings["slow"].median >= 0.002 > timings["fast"].median
    assert timings["fast"].inner > timings["slow"].inner
    with pytest.raises(ValueError, match="rounds must be at least 1, got 0"):
        time_batches_interleaved({"f": lambda: None}, rounds=0)


def test_quiet_batches_report_the_background_load_of_the_kept_try() -> None:
    timings, load = time_batches_quietly(
        {"f": lambda: None}, rounds=2, batch_seconds=0.001, max_tries=2, wait_seconds=0
    )
    assert set(timings) == {"f"} and len(timings["f"].samples) == 2 and load >= 0.0
