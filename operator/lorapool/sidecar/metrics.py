"""Prometheus metrics of the sidecar (``lorapool_sidecar_*``), on a private registry so
tests and several agents in one process never collide."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from lorapool.api.report import ReplicaPhase as Phase


class SidecarMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.adapters = Gauge("lorapool_sidecar_adapters", "Adapters by phase.", ["phase"], registry=r)
        self.loads = Counter(
            "lorapool_sidecar_loads", "Adapters loaded into the engine, by reason.", ["reason"], registry=r
        )
        self.unloads = Counter("lorapool_sidecar_unloads", "Adapters unloaded from the engine.", registry=r)
        self.failures = Counter(
            "lorapool_sidecar_failures",
            "Failed adapter actions by reason (download, checksum, unsafe, invalid, rank, base-model, "
            "unservable, engine, unload, internal).",
            ["reason"],
            registry=r,
        )
        self.download_bytes = Counter(
            "lorapool_sidecar_download_bytes", "Bytes downloaded from adapter sources.", registry=r
        )
        self.kept_hits = Counter(
            "lorapool_sidecar_kept_hits",
            "Loads served by an unloaded adapter's kept files instead of a download (downloads saved).",
            registry=r,
        )
        self.kept_bytes = Gauge(
            "lorapool_sidecar_kept_bytes", "Bytes of unloaded adapters' files kept for a place-back.", registry=r
        )
        self.kept_evictions = Counter(
            "lorapool_sidecar_kept_evictions",
            "Kept adapter files deleted, by reason (off, age, bytes: the least recently used past the budget).",
            ["reason"],
            registry=r,
        )
        self.download_seconds = Histogram(
            "lorapool_sidecar_download_seconds",
            "Time to download and verify one adapter.",
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "lorapool_sidecar_reconcile_seconds",
            "Time to compute and start one reconcile.",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )
        self.engine_healthy = Gauge("lorapool_sidecar_engine_healthy", "1 when the engine answers /health.", registry=r)
        self.engine_restarts = Counter(
            "lorapool_sidecar_engine_restarts", "Engine restarts detected (all adapters reloaded).", registry=r
        )
        self.config_errors = Counter(
            "lorapool_sidecar_config_errors", "Config reads refused (the last good set was kept).", registry=r
        )
        self.report_writes = Counter(
            "lorapool_sidecar_report_writes",
            "Writes of the adapter report to the sidecar's own Pod, by result (ok, error).",
            ["result"],
            registry=r,
        )

    def set_phases(self, phases: Iterable[Phase]) -> None:
        counts = dict.fromkeys(Phase, 0)
        for phase in phases:
            counts[phase] += 1
        for phase, n in counts.items():
            self.adapters.labels(phase=str(phase)).set(n)
