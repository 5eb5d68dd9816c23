"""Regime (e)'s pure parts: the shifted Zipf schedule, the convergence time, and the placement step
the benchmark feeds the way the operator does (sidecar observations -> reports -> decide)."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the repo root holds bench/

from bench.large_catalog import (  # noqa: E402
    AFFINITY,
    PLACED_BEFORE_S,
    PLACEMENT,
    Move,
    bench_pool,
    convergence_s,
    decide,
    goodput_timeline,
    holders_over_time,
    hottest,
    in_simulated_time,
    popularity_shift,
    requests_in_simulated_time,
    router_pod_list,
    shifted_schedule,
)
from bench.large_catalog_report import section  # noqa: E402
from bench.loadgen import Outcome, Workload, schedule  # noqa: E402
from bench.targets import TARGETS  # noqa: E402
from lorapool.api.report import AdapterLoad, Observations  # noqa: E402
from lorapool.api.requests import RequestWindow, pod_requests  # noqa: E402
from lorapool.plan.placement import KState  # noqa: E402

ZIPF = Workload(rate_rps=50.0, duration_s=20.0, adapters=200, popularity="zipf", seed=3)


def test_popularity_shift_is_a_seeded_permutation() -> None:
    shift = popularity_shift(200, seed=11)
    assert sorted(shift) == sorted(shift.values())
    assert shift == popularity_shift(200, seed=11)
    assert shift != popularity_shift(200, seed=12)


def test_shifted_schedule_renames_only_requests_after_the_shift() -> None:
    plain, shifted = schedule(ZIPF), shifted_schedule(ZIPF, shift_at_s=10.0, seed=11)
    shift = popularity_shift(ZIPF.adapters, 11)
    assert [p.at_s for p in plain] == [p.at_s for p in shifted]
    for p, q in zip(plain, shifted, strict=True):
        assert q.max_tokens == p.max_tokens
        if p.at_s < 10.0:
            assert q == p
        else:
            assert q.model == shift[p.model]
            assert q.prompt.startswith(f"[{q.model}] ") and len(q.prompt.split()) == len(p.prompt.split())
    assert hottest(shifted, 10.0) == shift[hottest(plain, 0.0, 10.0)]  # a new hot adapter
    assert hottest(shifted, 10.0) != hottest(shifted, 0.0, 10.0)


@pytest.mark.parametrize(
    ("initial", "moves", "k", "expected"),
    [
        (["0", "1"], [], 2, 0.0),
        (["0"], [Move(12.0, "load", "a", "1")], 2, 2.0),
        (["0"], [Move(12.0, "load", "b", "1")], 2, None),
        (["0"], [Move(11.0, "load", "a", "1"), Move(13.0, "unload", "a", "0"), Move(16.0, "load", "a", "2")], 2, 6.0),
        (["0"], [Move(8.0, "load", "a", "1")], 2, 0.0),
        ([], [Move(10.5, "load", "a", "3")], 1, 0.5),
    ],
    ids=["held before", "one load", "another adapter", "dips below k", "before the shift", "placed nowhere"],
)
def test_convergence_counts_from_the_shift_until_the_holders_stay_at_k(
    initial: list[str], moves: list[Move], k: int, expected: float | None
) -> None:
    got = convergence_s(holders_over_time(initial, moves, "a"), k, since_s=10.0)
    assert got == (None if expected is None else pytest.approx(expected))


def test_goodput_timeline_counts_good_requests_by_the_second_they_were_sent() -> None:
    outs = [
        Outcome("a", 0.2, status=200, ttft_s=0.1, done_s=1.0),
        Outcome("a", 0.7, status=200, ttft_s=0.6, done_s=1.5),  # over the SLO
        Outcome("a", 1.1, status=200, ttft_s=0.4, done_s=1.9),
        Outcome("a", 1.2, status=503, error="busy"),
        Outcome("a", 2.5, status=200, ttft_s=0.3, done_s=3.0, error="cut"),
    ]
    assert goodput_timeline(outs, slo_ttft_s=0.5, duration_s=3.0) == [1.0, 1.0, 0.0]


def _obs(ttft_p99_s: float | None, adapters: dict[str, float], window_s: float = 2.0) -> Observations:
    return Observations(
        window_s=window_s, end=0.0, samples=8, max_loras=4, distinct_p50=1, distinct_p95=2, distinct_max=2,
        slot_wait_s=0.0, kv_wait_s=0.0, kv_usage_p50=0.1, kv_usage_p95=0.1, kv_usage_max=0.1,
        running_p95=1, waiting_p95=0, preemptions=0, ttft_p99_s=ttft_p99_s,
        adapters={a: AdapterLoad(inflight_s=s) for a, s in adapters.items()},
    )  # fmt: skip


NAMES = [f"lora-{i:04d}" for i in range(40)]
POOL = bench_pool(replicas=4, max_cpu_loras=12)
SETTLED = {a: KState(1, PLACED_BEFORE_S) for a in NAMES}


def test_decide_places_every_adapter_once_within_capacity() -> None:
    holders, k = decide(POOL, NAMES, SETTLED, {}, now_s=0.0)
    assert all(len(h) == 1 for h in holders.values()) and set(holders) == set(NAMES)
    per_replica = [sum(r in h for h in holders.values()) for r in "0123"]
    assert max(per_replica) <= 12 and sum(per_replica) == 40
    assert {s.k for s in k.values()} == {1}


@pytest.mark.parametrize(
    ("ttft_p99_s", "inflight_s", "k"),
    [(5.0, 2.0, 2), (5.0, 0.5, 1), (1.5, 2.0, 1), (None, 2.0, 1)],
    ids=["slow replica, busy adapter: expands", "only briefly there", "p99 under 2 s", "no TTFT"],
)
def test_decide_expands_an_adapter_that_kept_a_slow_replica_busy(
    ttft_p99_s: float | None, inflight_s: float, k: int
) -> None:
    hot = NAMES[7]
    holders, _ = decide(POOL, NAMES, SETTLED, {}, now_s=0.0)
    home = holders[hot][0]
    observed = {r: _obs(None, {}) for r in "0123"}
    observed[home] = _obs(ttft_p99_s, {hot: inflight_s})
    after, ks = decide(POOL, NAMES, SETTLED, observed, now_s=10.0)
    assert ks[hot].k == k and len(after[hot]) == k and after[hot][0] == home


def test_decide_sizes_k_from_the_routers_request_counts_as_the_operator_does() -> None:
    """The router's window reaches ``next_k`` through its Pod's annotation and ``observed_load``: 4 replicas
    at 40 req/s (a mean replica's share 10), an adapter with 6 req/s needs ceil(6 / 2.5) = 3 holders at once."""
    hot = NAMES[7]
    window = RequestWindow(window_s=2.0, end=9.5, counts={hot: 12, NAMES[1]: 4}, other=64)
    assert pod_requests(router_pod_list(window)[0]) == window and router_pod_list(None) == []
    holders, ks = decide(POOL, NAMES, SETTLED, {}, now_s=10.0, requests=window)
    assert ks[hot] == KState(3, 10.0) and len(holders[hot]) == 3
    assert ks[NAMES[1]].k == 1
    stale = dataclasses.replace(window, end=5.0)  # closed more than two windows before now: no rate
    assert decide(POOL, NAMES, SETTLED, {}, now_s=10.0, requests=stale)[1][hot].k == 1


def test_the_routers_window_moves_to_the_loops_simulated_clock() -> None:
    wall = RequestWindow(window_s=16.0, end=1_000_160.0, counts={"a": 400}, other=40)
    got = requests_in_simulated_time(wall, wall_t0=1_000_000.0, scale=8.0)
    assert (got.window_s, got.end, got.rate("a"), got.total) == (2.0, 20.0, 200.0, 440)


def test_observations_move_to_simulated_seconds() -> None:
    obs = in_simulated_time(_obs(8.0, {}), scale=4.0)
    assert obs.ttft_p99_s == 2.0 and in_simulated_time(_obs(None, {}), 4.0).ttft_p99_s is None
    assert not math.isnan(obs.window_s)


def _cell(system: str, goodput: float, disk: float, p99: float, **extra: object) -> dict[str, object]:
    return {
        "scenario": "e-x", "system": system, "goodput_rps": goodput, "goodput_after_shift_rps": goodput,
        "disk_loads_per_1k": disk, "stalls_per_1k": disk, "ttft_p50_s": 0.1, "ttft_p99_s": p99, "failed": 0,
        "hot_after": "lora-0001", **extra,
    }  # fmt: skip


def _e(*runs: dict[str, object]) -> dict[str, object]:
    scenario = {
        "name": "e-x", "regime": "e", "about": "x", "slo_ttft_s": 0.5, "warmup_s": 5.0, "shift_at_s": 10.0,
        "placement_window_s": 2.0, "fleet": {"replicas": 16, "max_loras": 4, "max_cpu_loras": 96, "time_scale": 8.0},
        "workload": {"duration_s": 24.0}, "scaling_rule": {}, "note": "why it missed",
    }  # fmt: skip
    return {"date": "d", "scenarios": [scenario, {"name": "a-x", "regime": "a"}], "runs": list(runs)}


PLACED = dict(placement_loads=10, placement_unloads=2, hot_after_k=2)


@pytest.mark.parametrize(
    ("target", "runs", "verdict"),
    [
        ("regime (e): lorapool placement's goodput", [_cell(PLACEMENT, 100, 5, 1), _cell(AFFINITY, 50, 50, 1)], "met"),
        ("regime (e): lorapool placement's goodput", [_cell(PLACEMENT, 90, 5, 1), _cell(AFFINITY, 50, 50, 1)], "missed"),
        ("regime (e): lorapool placement's goodput", [_cell(PLACEMENT, 90, 5, 1)], "not measured"),
        ("regime (e): all-replica affinity's disk", [_cell(PLACEMENT, 1, 0, 1), _cell(AFFINITY, 1, 50, 1)], "met"),
        ("regime (e): all-replica affinity's disk", [_cell(PLACEMENT, 1, 30, 1), _cell(AFFINITY, 1, 50, 1)], "missed"),
        ("regime (e): placement's p99", [_cell(PLACEMENT, 1, 1, 1.0), _cell(AFFINITY, 1, 1, 1.0)], "met"),
        ("regime (e): placement's p99", [_cell(PLACEMENT, 1, 1, 1.1), _cell(AFFINITY, 1, 1, 1.0)], "missed"),
        ("regime (e): simulated seconds", [_cell(PLACEMENT, 1, 1, 1, convergence_s=29.0, **PLACED)], "met"),
        ("regime (e): simulated seconds", [_cell(PLACEMENT, 1, 1, 1, convergence_s=None, **PLACED)], "missed"),
    ],
    ids=["2x goodput", "1.8x goodput", "no affinity cell", "no disk loads", "1.7x fewer", "p99 equal",
         "p99 10 % worse", "29 s", "never reached"],
)  # fmt: skip
def test_regime_e_verdicts_come_from_the_cells(target: str, runs: list[dict[str, object]], verdict: str) -> None:
    chosen = next(t for t in TARGETS if t.what.startswith(target))
    assert chosen.verdict(_e(*runs))[1] == verdict


def test_section_shows_each_system_the_ratios_and_the_note() -> None:
    data = _e(_cell(PLACEMENT, 100, 5, 2, convergence_s=4.5, **PLACED), _cell(AFFINITY, 50, 50, 1))
    text = "\n".join(section(data))
    assert "| lorapool placement | 100.0 | 100.0 |" in text and "lora-0001: k 2, after 4.5 s | 10 / 2 |" in text
    assert "goodput 2.00x (target >= 2x), disk loads per 1k requests 10.00x fewer" in text
    assert "p99 TTFT 2.00x (target <= 1x)" in text and "why it missed" in text
    assert section({"scenarios": [{"name": "a-x", "regime": "a"}], "runs": [_cell(AFFINITY, 1, 1, 1)]}) == []
    assert "router's request counts" not in text and "at most doubling" in text  # a cell of the TTFT rule alone
    rated = _e(_cell(PLACEMENT, 100, 5, 2, convergence_s=4.5, **PLACED), _cell(AFFINITY, 50, 50, 1))
    rated["scenarios"][0]["scaling_rule"] = {"pool_replicas": 16, "expand_share": 0.25, "shrink_share": 0.125}  # type: ignore[index]
    said = "\n".join(section(rated))
    assert "on the router's request counts per adapter and the sidecars' observations" in said
    assert "k straight to ceil(rate / (0.25 x the pool's rate per replica)), given back below 0.125 of it" in said
