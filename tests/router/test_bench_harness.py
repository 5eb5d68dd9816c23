"""The benchmark's load generator: seeded schedules, honest summaries, and a tiny live smoke."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root holds bench/

from bench.loadgen import (
    Outcome,
    RunResult,
    Workload,
    percentile,
    run_open_loop,
    schedule,
    summarize,
)

from .conftest import StartRouter, StartSim


def test_schedules_are_seeded() -> None:
    w = Workload(rate_rps=50, duration_s=20, adapters=16, seed=3)
    assert schedule(w) == schedule(w)
    assert schedule(w) != schedule(Workload(rate_rps=50, duration_s=20, adapters=16, seed=4))


@pytest.mark.parametrize(
    ("arrival", "cv", "low", "high"),
    [("poisson", 1.0, 0.8, 1.2), ("gamma", 3.0, 2.0, 4.0)],
    ids=["poisson has cv 1", "gamma is bursty"],
)
def test_arrival_processes(arrival: str, cv: float, low: float, high: float) -> None:
    plan = schedule(Workload(rate_rps=100, duration_s=100, adapters=4, arrival=arrival, cv=cv))
    gaps = [b.at_s - a.at_s for a, b in itertools.pairwise(plan)]
    assert 0.85 < len(plan) / 10_000 < 1.15  # the mean rate is kept
    assert low < statistics.pstdev(gaps) / statistics.mean(gaps) < high


def test_popularity_shapes() -> None:
    zipf = Counter(p.model for p in schedule(Workload(50, 100, 256, popularity="zipf")))
    top, second = (n for _, n in zipf.most_common(2))
    assert 1.5 < top / second < 2.7  # Zipf 1.0: the top adapter gets about twice the second
    hot = Counter(p.model for p in schedule(Workload(50, 100, 64, popularity="hot", hot_share=0.6)))
    assert 0.55 < hot.most_common(1)[0][1] / hot.total() < 0.65


def test_summary_counts_failures_as_infinitely_slow() -> None:
    result = RunResult(
        outcomes=[
            Outcome("a", 0.0, status=200, ttft_s=0.1, done_s=1.0),
            Outcome("a", 0.0, status=200, ttft_s=0.9, done_s=1.0),
            Outcome("a", 0.0, status=503, done_s=0.0, error="no backend"),
        ]
    )
    s = summarize(result, window_s=1.0, slo_ttft_s=0.5)
    assert (s["completed"], s["failed"], s["goodput_rps"]) == (2, 1, 1.0)
    assert s["ttft_p50_s"] == 0.9 and math.isinf(s["ttft_p99_s"])
    assert percentile([], 50) != percentile([], 50)  # NaN


@pytest.mark.timeout(120)
def test_bench_smoke_through_the_router(start_sim: StartSim, start_router: StartRouter) -> None:
    router = start_router([start_sim(time_scale=0)])
    plan = [
        p.__class__(p.at_s, "sql", p.prompt, p.max_tokens)
        for p in schedule(Workload(rate_rps=40, duration_s=0.5, adapters=1, output_tokens=(3, 3)))
    ]
    result = asyncio.run(run_open_loop(router, plan, drain_timeout_s=30))
    s = summarize(result, window_s=0.5, slo_ttft_s=5.0)
    assert s["requests"] == len(plan) > 5
    assert s["completed"] == s["requests"], s["codes"]
    assert s["tokens"] == 3 * s["completed"]  # every streamed token was counted


@pytest.mark.envoy
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["envoy", "envoy-noop"])
def test_the_pickers_floors_proxy_every_request(start_sim: StartSim, kind: str) -> None:
    """Envoy alone and Envoy with the policy-free ext_proc server (the overhead cell's floors under
    the picker) answer streamed requests through a real Envoy, every token relayed."""
    from bench.systems import System
    from lorapool_dev.testing.envoy import envoy_or_skip

    envoy_or_skip()
    plan = [
        p.__class__(p.at_s, "sql", p.prompt, p.max_tokens)
        for p in schedule(Workload(rate_rps=40, duration_s=0.5, adapters=1, output_tokens=(3, 3)))
    ]
    with System(kind, kind).start([start_sim(time_scale=0)]) as url:
        result = asyncio.run(run_open_loop(url, plan, drain_timeout_s=30))
    s = summarize(result, window_s=0.5, slo_ttft_s=5.0)
    assert s["completed"] == s["requests"] == len(plan) > 5, s["codes"]
    assert s["tokens"] == 3 * s["completed"]
