"""What the router itself costs: added latency at 500 req/s, and first-chunk relay delay.

Overhead: one replica with ``--time-scale 0`` (no simulated delay), short non-streamed
requests at 100 and 500 req/s open loop, sent directly and through each router; the router's cost is
the difference of the latency percentiles. Relay: streamed requests on a real-time replica;
the first chunk's arrival (TTFT) directly vs through the router.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from pathlib import Path
from typing import Any

from bench.loadgen import Workload, percentile, run_open_loop, schedule
from bench.scenarios import LORAPOOL_AFFINITY, lorapool_system
from bench.systems import FleetSpec, System, sim_fleet
from lorapool.api.common import RouterPolicy

RATES_RPS = (100.0, 500.0)
DURATION_S = 6.0
WARMUP_S = 1.0
REPEATS = 3  # interleaved, medians reported: the machine is shared and noisy
SYSTEMS = (
    System("direct", "direct"),
    lorapool_system(RouterPolicy.AFFINITY),
    System("nginx round-robin", "nginx"),
    System("vllm-router round_robin", "vllm-router", "round_robin"),
)


def _latencies(
    system: System, fleet: FleetSpec, work: Workload, adapter_root: Path, *, stream: bool
) -> tuple[list[float], int]:
    with sim_fleet(fleet, adapter_root) as sims, system.start(sims) as url:
        result = asyncio.run(run_open_loop(url, schedule(work), stream=stream, drain_timeout_s=30))
    kept = [o for o in result.outcomes if o.sent_s >= WARMUP_S]
    ok = [o.ttft_s for o in kept if o.status == 200 and not o.error and o.ttft_s is not None]
    return sorted(ok), len(kept) - len(ok)


def _stats(values: list[float], errors: int) -> dict[str, Any]:
    ms = [v * 1000.0 for v in values]
    return {
        "n": len(ms),
        "errors": errors,
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "cdf_ms": [percentile(ms, q) for q in range(1, 100)] if ms else [],
    }


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "n": sum(r["n"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "p50_ms": statistics.median(r["p50_ms"] for r in runs),
        "p99_ms": statistics.median(r["p99_ms"] for r in runs),
        "p50_ms_runs": [r["p50_ms"] for r in runs],
        "p99_ms_runs": [r["p99_ms"] for r in runs],
    }
    middle = sorted(runs, key=lambda r: r["p99_ms"])[len(runs) // 2]
    out["cdf_ms"] = middle["cdf_ms"]
    return out


def run_overhead(adapter_root: Path) -> dict[str, Any]:
    """Measure both experiments; every run gets a fresh replica."""
    fast = FleetSpec(replicas=1, adapters=4, max_loras=4, max_cpu_loras=4, time_scale=0)
    overhead: dict[str, Any] = {"duration_s": DURATION_S, "repeats": REPEATS, "rates": {}}
    for rate in RATES_RPS:
        work = Workload(
            rate_rps=rate,
            duration_s=DURATION_S,
            adapters=4,
            prompt_tokens=(8, 16),
            output_tokens=(1, 1),
            seed=11,
        )
        runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in SYSTEMS}
        for _ in range(REPEATS):
            for system in SYSTEMS:
                values, errors = _latencies(system, fast, work, adapter_root, stream=False)
                runs[system.name].append(_stats(values, errors))
        systems = {name: _median_of(r) for name, r in runs.items()}
        direct = systems["direct"]
        for stats in systems.values():
            stats["added_p50_ms"] = stats["p50_ms"] - direct["p50_ms"]
            stats["added_p99_ms"] = stats["p99_ms"] - direct["p99_ms"]
        overhead["rates"][f"{rate:g}"] = systems
    realtime = FleetSpec(replicas=1, adapters=4, max_loras=4, max_cpu_loras=4, time_scale=1)
    streamed = Workload(
        rate_rps=20.0,
        duration_s=10.0,
        adapters=4,
        prompt_tokens=(32, 64),
        output_tokens=(16, 32),
        seed=12,
    )
    relay: dict[str, Any] = {}
    for system in SYSTEMS[:2]:
        values, errors = _latencies(system, realtime, streamed, adapter_root, stream=True)
        relay[system.name] = _stats(values, errors)
    relay["added_p50_ms"] = relay[LORAPOOL_AFFINITY]["p50_ms"] - relay["direct"]["p50_ms"]
    relay["added_p99_ms"] = relay[LORAPOOL_AFFINITY]["p99_ms"] - relay["direct"]["p99_ms"]
    overhead["relay"] = relay
    overhead["loadavg_1m"] = os.getloadavg()[0]
    return overhead
