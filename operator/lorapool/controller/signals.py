"""The pool-level autoscaling signals on the operator's /metrics (docs/autoscaling.md).

``pool_signals`` computes them (pure) each reconcile from the sidecars' reports and the placement;
``export`` (a thin shell) sets the gauges an HPA (through prometheus-adapter) or KEDA reads, one
series per pool; ``count_loads`` adds to the counter of adapter loads placement asked for (the cost
of each scale event). The metric names are checked
against the shipped HPA/KEDA examples by tests/controller/test_signals.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from lorapool.api.models import LoRAPool
from lorapool.api.pods import EnginePod
from lorapool.plan.holders import Placement
from lorapool.plan.placement import moves

LABELS = ("namespace", "pool")

REPLICAS = Gauge("lorapool_pool_replicas", "Engine replicas the pool asks for (spec.replicas)", LABELS)
REPORTING = Gauge("lorapool_pool_reporting_replicas", "Engine replicas whose sidecar reported a window", LABELS)
SLOT_PRESSURE = Gauge(
    "lorapool_pool_slot_pressure",
    "Mean over replicas of p95 distinct adapters in flight / max-loras (above 1: adapters wait for GPU slots)",
    LABELS,
)
ADAPTERS_WAITING = Gauge(
    "lorapool_pool_adapters_waiting",
    "Adapters whose requests waited for a GPU slot in the last window, plus adapters placed on no replica",
    LABELS,
)
ADAPTERS_UNPLACED = Gauge(
    "lorapool_pool_adapters_unplaced", "Adapters no replica has room for (replicas x maxCpuLoras too small)", LABELS
)
PLACEMENT_LOADS = Counter(
    "lorapool_pool_placement_loads_total",
    "Adapter copies placement told a replica to load that it was not told to hold before (scale events, k changes)",
    LABELS,
)

NAMES = tuple(
    m._name for m in (REPLICAS, REPORTING, SLOT_PRESSURE, ADAPTERS_WAITING, ADAPTERS_UNPLACED, PLACEMENT_LOADS)
)


@dataclass(frozen=True)
class PoolSignals:
    """What an HPA or KEDA should scale the pool on, from the sidecars' last windows. Pure data.

    ``slot_pressure``: mean over reporting replicas of p95 distinct adapters in flight / max-loras
    (> 1: adapters wait for GPU slots); ``adapters_waiting``: adapters whose requests waited for a
    slot in the last window, plus those placed nowhere; ``adapters_unplaced``: no replica has room.
    """

    replicas: int
    reporting_replicas: int
    slot_pressure: float
    adapters_waiting: int
    adapters_unplaced: int


def pool_signals(pool: LoRAPool, pods: Sequence[EnginePod], placement: Placement | None) -> PoolSignals:
    pressures: list[float] = []
    waiting: set[str] = set()
    for pod in pods:
        if pod.terminating:
            continue
        obs = pod.report.observations if pod.report else None
        if obs is None:
            continue
        if obs.max_loras:
            pressures.append(obs.distinct_p95 / obs.max_loras)
        waiting |= {name for name, load in obs.adapters.items() if load.waiting_s > 0}
    unplaced = (
        set() if placement is None or placement.holders is None else {a for a, h in placement.holders.items() if not h}
    )
    return PoolSignals(
        replicas=pool.spec.replicas,
        reporting_replicas=len(pressures),
        slot_pressure=round(sum(pressures) / len(pressures), 3) if pressures else 0.0,
        adapters_waiting=len(waiting | unplaced),
        adapters_unplaced=len(unplaced),
    )


def export(namespace: str, pool: str, signals: PoolSignals) -> None:
    labels = (namespace, pool)
    REPLICAS.labels(*labels).set(signals.replicas)
    REPORTING.labels(*labels).set(signals.reporting_replicas)
    SLOT_PRESSURE.labels(*labels).set(signals.slot_pressure)
    ADAPTERS_WAITING.labels(*labels).set(signals.adapters_waiting)
    ADAPTERS_UNPLACED.labels(*labels).set(signals.adapters_unplaced)


def count_loads(
    namespace: str,
    pool: str,
    before: Mapping[str, Sequence[int]] | None,
    after: Mapping[str, Sequence[int]] | None,
) -> int:
    """Add the copies ``after`` places where ``before`` did not (None: every replica; not counted)."""
    if before is None or after is None:
        return 0
    loads = moves(before, after)
    PLACEMENT_LOADS.labels(namespace, pool).inc(loads)
    return loads


def forget(namespace: str, pool: str) -> None:
    """Drop a deleted pool's series."""
    for metric in (REPLICAS, REPORTING, SLOT_PRESSURE, ADAPTERS_WAITING, ADAPTERS_UNPLACED, PLACEMENT_LOADS):
        with contextlib.suppress(KeyError):
            metric.remove(namespace, pool)
