"""Regime (h), several routers (issue 43): the targets' cells, read from results.json. Pure.

The "after" compares 3 routers sharing one set of books (``x3 shared``) with one router, per cell
and door; 3 routers with their own books (``x3``) stay in results.json and RESULTS.md as the
"before". The rate limit is judged on 3 sharing routers behind the L4 front, regime (f)'s flood
cell on 3 sharing fair-dispatch routers adapter by adapter, and the books' cost on the overhead
cell's router with shared books beside the router alone (``bench.overhead.run_shared_overhead``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from bench.fairness_report import worst_p99_ratio
from bench.results import across, runs_by_scenario
from bench.scenarios import (
    ENVOY_PICKER,
    F_FLOOD,
    H_FAIR_SYSTEMS,
    H_FLOOD,
    H_RATE_SYSTEMS,
    LORAPOOL_AFFINITY,
    SHARED_BOOKS_ROUTER,
    several,
    shared,
)

DOORS = (LORAPOOL_AFFINITY, ENVOY_PICKER)
OVERHEAD_RATE = "500"


def x3_shared(door: str) -> str:
    """The "after" system of ``door``: 3 routers (or pickers) sharing their books."""
    return shared(several(door, 3))


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf if a > 0 else math.nan


def _p99(run: dict[str, Any]) -> str:
    value = run["ttft_p99_s"]
    return f"{value:.2f} s" if math.isfinite(value) else "none: requests left unfinished"


def h_pairs(
    data: dict[str, Any], many: Callable[[str], str] = x3_shared
) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(scenario, door, one router's cell, the ``many(door)`` system's cell) for each (h) cell and door
    measured both ways (the rate-limit and flood cells have their own targets)."""
    regimes = {s["name"]: s["regime"] for s in data.get("scenarios", [])}
    out = []
    for name, runs in runs_by_scenario(data).items():
        if regimes.get(name) != "h":
            continue
        for door in DOORS:
            one, more = runs.get(door), runs.get(many(door))
            if one is not None and more is not None:
                out.append((name, door, one, more))
    return out


def ratio_cells(key: str) -> Callable[[dict[str, Any]], list[tuple[str, float]]]:
    """3 sharing routers' ``key`` over one router's, per cell and door."""

    def cells(data: dict[str, Any]) -> list[tuple[str, float]]:
        return [
            (f"{name}, {x3_shared(door)}{across(many, one)}", _ratio(many[key], one[key]))
            for name, door, one, many in h_pairs(data)
        ]

    return cells


def why_ratio(data: dict[str, Any]) -> str:
    """Where 3 sharing routers lose: their loads and p99 beside one router's and 3 with their own books'."""
    own = {(name, door): many for name, door, _, many in h_pairs(data, lambda d: several(d, 3))}
    out = []
    for name, door, one, many in h_pairs(data):
        lost = _ratio(many["goodput_rps"], one["goodput_rps"]) < 0.95
        if lost or _ratio(many["stalls_per_1k"], one["stalls_per_1k"]) > 1.1:
            text = (
                f"{name}, {door}: adapter loads {many['stalls_per_1k']:.0f} per 1k shared vs"
                f" {one['stalls_per_1k']:.0f} for one router, p99 TTFT {_p99(many)} vs {_p99(one)}"
            )
            if (before := own.get((name, door))) is not None:
                text += f" (own books: {before['stalls_per_1k']:.0f} per 1k, {_p99(before)})"
            out.append(text)
    if not out:
        return ""
    return "; ".join(out) + " (bench/NOTES.md, regime (h))"


def rate_cells(data: dict[str, Any]) -> list[tuple[str, float]]:
    """How far 3 sharing routers behind an L4 front admit from the pool's rate limit, per connection count."""
    out = []
    for name, runs in runs_by_scenario(data).items():
        run = runs.get(H_RATE_SYSTEMS[2])
        if run is None or "pool_limit_rps" not in run:
            continue
        share = _ratio(run["admitted_rps"], run["pool_limit_rps"])
        label = (
            f"{name}: admitted {run['admitted_rps']:.2f} of {run['pool_limit_rps']:g} req/s ({share:.2f}x) over"
            f" {run['connections']} connection(s), shared books"
        )
        out.append((label, abs(share - 1.0)))
    return out


def why_rate(data: dict[str, Any]) -> str:
    """Shared books split the limit by demand while the store is up; own books by 1/routers."""
    off = [label.split(":")[0] for label, value in rate_cells(data) if value > 0.05]
    if not off:
        return ""
    before = [
        f"{name} {_ratio(r['admitted_rps'], r['pool_limit_rps']):.2f}x"
        for name, runs in runs_by_scenario(data).items()
        if (r := runs.get(H_RATE_SYSTEMS[1])) is not None and "pool_limit_rps" in r
    ]
    return (
        ", ".join(off) + ": with shared books each router's share of the limit follows its share of the pool's"
        " demand (the store's counts), so a pinned connection's router should get the whole limit; the routers"
        " with their own books (1/3 each) admitted " + (", ".join(before) or "-")
    )


def flood_cells(data: dict[str, Any]) -> list[tuple[str, float]]:
    """Regime (f)'s flood with 3 sharing fair-dispatch routers: the worst well-behaved adapter's p99 TTFT
    over its p99 with one router, same arrivals."""
    runs = {k: v for k, v in runs_by_scenario(data).get(H_FLOOD, {}).items() if "per_adapter" in v}
    one, many = runs.get(H_FAIR_SYSTEMS[0]), runs.get(H_FAIR_SYSTEMS[2])
    if one is None or many is None:
        return []
    worst, who = worst_p99_ratio(one, many, F_FLOOD)
    return [(f"{H_FLOOD}, {H_FAIR_SYSTEMS[2]} vs {H_FAIR_SYSTEMS[0]}, worst: {who}{across(many, one)}", worst)]


def overhead_cells(data: dict[str, Any]) -> list[tuple[str, float]]:
    """The router with shared books: its added p50 minus the router alone's, at 500 req/s in one run."""
    for section in ("shared_overhead", "overhead"):
        systems = ((data.get(section) or {}).get("rates") or {}).get(OVERHEAD_RATE) or {}
        if SHARED_BOOKS_ROUTER in systems and LORAPOOL_AFFINITY in systems:
            books, alone = systems[SHARED_BOOKS_ROUTER]["added_p50_ms"], systems[LORAPOOL_AFFINITY]["added_p50_ms"]
            label = f"{OVERHEAD_RATE} req/s: {books:.2f} vs {alone:.2f} ms [{(data.get(section) or {}).get('date')}]"
            return [(label, books - alone)]
    return []


def why_overhead(data: dict[str, Any]) -> str:
    """The books' added p50 at every rate of the shared-books run, per repeat: a steady cost or a noisy one."""
    rates = (data.get("shared_overhead") or {}).get("rates") or {}
    parts = []
    for rate, systems in rates.items():
        books, alone = systems.get(SHARED_BOOKS_ROUTER), systems.get(LORAPOOL_AFFINITY)
        if books is None or alone is None:
            continue
        runs = zip(books["added_p50_ms_runs"], alone["added_p50_ms_runs"], strict=True)
        parts.append(f"{rate} req/s, per repeat: " + ", ".join(f"{b:.2f} vs {a:.2f} ms" for b, a in runs))
    if not parts:
        return ""
    return (
        "the router with shared books against the router alone, added p50, "
        + "; ".join(parts)
        + " (each change of a router's books is a write to the store from the router's one event loop,"
        " coalesced to about one per store round trip; bench/NOTES.md, regime (h))"
    )
