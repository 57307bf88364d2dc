from __future__ import annotations

import time

from softdeploy.compare.latency import LatencyStats, measure_interleaved


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
