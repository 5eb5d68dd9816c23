"""What a router itself costs: added latency over a capacity curve, and first-chunk relay delay.

Overhead: one replica with ``--time-scale 0`` (no simulated delay), short non-streamed requests
open loop at rising rates (100 to 1000 req/s), sent directly and through each router; a router's cost is its latency
percentile minus direct's in the same repeat. Each repeat starts every system fresh and runs
the rates from low to high on it; systems are interleaved within a repeat, so a noisy minute
of the shared machine hits all of them. Capacity: the highest rate whose median added p99 stays
within 5 ms. The load generator is one Python process too: where it falls behind its own
schedule (direct, > 1 % of sends late) the curve measures it, not the routers, and the report
says so. Relay: streamed requests on a real-time replica; the first chunk's arrival (TTFT)
directly vs through lorapool, nginx and Envoy with the lorapool picker. The GIE endpoint picker
(issue 47's peer) is on the curve, behind the same Envoy as ours. Envoy alone (round robin) and
Envoy asking a policy-free ext_proc server (``bench.noop_ext_proc``) split the picker's cost into
Envoy's, the ext_proc round trips' and the policy's. Shared books (issue 43): the router with a
Redis store on 127.0.0.1 and a second, idle router sharing its books, beside the router alone.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.loadgen import Workload, percentile, run_open_loop, schedule
from bench.scenarios import (
    ENVOY_ALONE,
    ENVOY_NOOP,
    ENVOY_PICKER,
    EPP_LORA_WEIGHT,
    GIE_EPP_LORA,
    LORAPOOL_AFFINITY,
    SHARED_BOOKS_ROUTER,
    lorapool_system,
)
from bench.systems import FleetSpec, System, sim_fleet
from lorapool.api.common import RouterPolicy

RATES_RPS = (100.0, 250.0, 500.0, 750.0, 1000.0)
DURATION_S = 5.0
WARMUP_S = 1.0
REPEATS = 3
LATE_LIMIT_PCT = 1.0
RELAY_RATE_RPS = 30.0
SYSTEMS = (
    System("direct", "direct"),
    lorapool_system(RouterPolicy.AFFINITY),
    System("nginx round-robin", "nginx"),
    System(ENVOY_PICKER, "envoy-picker", str(RouterPolicy.AFFINITY)),
    System(ENVOY_NOOP, "envoy-noop"),
    System(ENVOY_ALONE, "envoy"),
    System("vllm-router round_robin", "vllm-router", "round_robin"),
    System(GIE_EPP_LORA, "gie-epp", f"{EPP_LORA_WEIGHT:g}"),  # issue 47: the peer behind the same Envoy
)
RELAY_SYSTEMS = SYSTEMS[:6]
# Issue 43: the router with shared books (a store on 127.0.0.1) and a second, idle router sharing them.
SHARED_BOOKS = replace(lorapool_system(RouterPolicy.AFFINITY), name=SHARED_BOOKS_ROUTER, shared_books=True, idle=1)


def _stats(outcomes: list[Any], late: int) -> dict[str, Any]:
    kept = [o for o in outcomes if o.sent_s >= WARMUP_S]
    ok = sorted(o.ttft_s * 1000.0 for o in kept if o.status == 200 and not o.error and o.ttft_s is not None)
    return {
        "n": len(ok),
        "errors": len(kept) - len(ok),
        "late_pct": 100.0 * late / max(1, len(outcomes)),
        "p50_ms": percentile(ok, 50),
        "p99_ms": percentile(ok, 99),
        "cdf_ms": [percentile(ok, q) for q in range(1, 100)] if ok else [],
    }


def _curve(
    system: System, fleet: FleetSpec, adapter_root: Path, rates: tuple[float, ...] = RATES_RPS
) -> dict[str, dict[str, Any]]:
    """Every rate, low to high, on one fresh replica and one fresh router."""
    out = {}
    with sim_fleet(fleet, adapter_root) as sims, system.start(sims) as url:
        for rate in rates:
            work = Workload(
                rate_rps=rate,
                duration_s=DURATION_S,
                adapters=4,
                prompt_tokens=(8, 16),
                output_tokens=(1, 1),
                seed=11,
            )
            result = asyncio.run(run_open_loop(url, schedule(work), stream=False, drain_timeout_s=30))
            out[f"{rate:g}"] = _stats(result.outcomes, result.late_starts)
    return out


def _relay(system: System, adapter_root: Path) -> dict[str, Any]:
    realtime = FleetSpec(replicas=1, adapters=4, max_loras=4, max_cpu_loras=4, time_scale=1)
    streamed = Workload(
        rate_rps=RELAY_RATE_RPS,
        duration_s=8.0,
        adapters=4,
        prompt_tokens=(32, 64),
        output_tokens=(16, 32),
        seed=12,
    )
    with sim_fleet(realtime, adapter_root) as sims, system.start(sims) as url:
        result = asyncio.run(run_open_loop(url, schedule(streamed), stream=True, drain_timeout_s=30))
    return _stats(result.outcomes, result.late_starts)


def _summary(runs: list[dict[str, Any]], direct: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats; added = this run's percentile minus direct's in the same repeat."""
    added50 = [r["p50_ms"] - d["p50_ms"] for r, d in zip(runs, direct, strict=True)]
    added99 = [r["p99_ms"] - d["p99_ms"] for r, d in zip(runs, direct, strict=True)]
    middle = sorted(runs, key=lambda r: r["p99_ms"])[len(runs) // 2]
    return {
        "n": sum(r["n"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "late_pct": statistics.median(r["late_pct"] for r in runs),
        "p50_ms": statistics.median(r["p50_ms"] for r in runs),
        "p99_ms": statistics.median(r["p99_ms"] for r in runs),
        "p50_ms_runs": [r["p50_ms"] for r in runs],
        "p99_ms_runs": [r["p99_ms"] for r in runs],
        "added_p50_ms": statistics.median(added50),
        "added_p99_ms": statistics.median(added99),
        "added_p50_ms_runs": added50,
        "added_p99_ms_runs": added99,
        "cdf_ms": middle["cdf_ms"],
    }


def run_overhead(
    adapter_root: Path,
    systems: tuple[System, ...] = SYSTEMS,
    relay_systems: tuple[System, ...] = RELAY_SYSTEMS,
    rates_rps: tuple[float, ...] = RATES_RPS,
) -> dict[str, Any]:
    """The capacity curve (every system, every rate, REPEATS times) and the relay delay."""
    fast = FleetSpec(replicas=1, adapters=4, max_loras=4, max_cpu_loras=4, time_scale=0)
    curves: dict[str, list[dict[str, dict[str, Any]]]] = {s.name: [] for s in systems}
    relays: dict[str, list[dict[str, Any]]] = {s.name: [] for s in relay_systems}
    for _ in range(REPEATS):
        for system in systems:
            curves[system.name].append(_curve(system, fast, adapter_root, rates_rps))
        for system in relay_systems:
            relays[system.name].append(_relay(system, adapter_root))
    rates: dict[str, dict[str, Any]] = {}
    for rate in (f"{r:g}" for r in rates_rps):
        direct = [c[rate] for c in curves["direct"]]
        rates[rate] = {name: _summary([c[rate] for c in runs], direct) for name, runs in curves.items()}
    behind = [float(r) for r, s in rates.items() if s["direct"]["late_pct"] > LATE_LIMIT_PCT]
    relay: dict[str, Any] = {name: _summary(runs, relays["direct"]) for name, runs in relays.items()}
    lorapool = relay[LORAPOOL_AFFINITY]
    relay.update(
        rate_rps=RELAY_RATE_RPS,
        added_p50_ms=lorapool["added_p50_ms"],
        added_p99_ms=lorapool["added_p99_ms"],
        added_p99_ms_runs=lorapool["added_p99_ms_runs"],
    )
    return {
        "duration_s": DURATION_S,
        "repeats": REPEATS,
        "rates": rates,
        "loadgen_limit_rps": min(behind) if behind else None,
        "relay": relay,
        "loadavg_1m": os.getloadavg()[0],
    }


def run_peer_overhead(adapter_root: Path) -> dict[str, Any]:
    """Issue 47: direct, our picker and the GIE EPP interleaved in one run at 100 and 500 req/s (the
    relay beside lorapool affinity, which the relay summary needs), for the ``peer:`` targets."""
    names = ("direct", ENVOY_PICKER, GIE_EPP_LORA)
    systems = tuple(s for s in SYSTEMS if s.name in names)
    relay = (SYSTEMS[0], lorapool_system(RouterPolicy.AFFINITY))
    return run_overhead(adapter_root, systems, relay, (100.0, 500.0))


def run_shared_overhead(adapter_root: Path) -> dict[str, Any]:
    """Issue 43: direct, the router and the router with shared books interleaved in one run at 100 and
    500 req/s (the relay of direct and the router, which the summary needs), for the shared-books target.
    The shared row's router writes its books to a store on 127.0.0.1 and reads a second router's, which
    is idle, so each request pays the books' exchange and still meets one router."""
    relay = (SYSTEMS[0], lorapool_system(RouterPolicy.AFFINITY))
    return run_overhead(adapter_root, (*relay, SHARED_BOOKS), relay, (100.0, 500.0))
