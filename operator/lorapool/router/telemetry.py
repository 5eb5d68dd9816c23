"""The router's Prometheus metrics (one registry per router, so tests can run several).

Label cardinality is capped: a model gets its own label value only if it is in the pool's
catalog (a backend serves it, or a sidecar's report knows it) and fewer than
``max_model_labels`` (``--max-model-labels``, default 100) models have one already; the rest
are "other" (unknown models are "unknown", requests without one "none"). So every
``model``/``adapter`` label has at most min(catalog, max_model_labels) + 3 values, whatever
clients send. Queue depth is exported at scrape time for the deepest queues only. The queue-wait
histogram is labelled by why a request waited (``slot``/``load``), never by adapter: per
adapter, a counter of seconds held gives the mean with the requests counter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lorapool.router.core.backend import DecisionKind
from lorapool.router.core.state import ReadOnlyBackendState

LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class _LiveGauges(Collector):
    """Gauges read from live state at scrape time: backend up/in-flight, queue depth."""

    def __init__(
        self,
        backends: Callable[[], Iterable[ReadOnlyBackendState]],
        depths: Callable[[], Mapping[str, int]],
        max_labels: int,
    ) -> None:
        self._backends, self._depths, self._max_labels = backends, depths, max_labels

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("lorapool_router_backend_up", "1 when the backend is in rotation", labels=["backend"])
        inflight = GaugeMetricFamily(
            "lorapool_router_backend_inflight",
            "Requests the router has in flight on the backend",
            labels=["backend"],
        )
        slots = GaugeMetricFamily(
            "lorapool_router_backend_active_adapters",
            "Distinct adapters in flight on the backend (router's and foreign)",
            labels=["backend"],
        )
        reported = GaugeMetricFamily(
            "lorapool_router_backend_reported",
            "1 when the backend's pod has a usable sidecar report the router routes by (else /v1/models decides)",
            labels=["backend"],
        )
        for state in self._backends():
            view = state.view()
            up.add_metric([state.id], 1.0 if state.up else 0.0)
            reported.add_metric([state.id], 1.0 if state.report is not None else 0.0)
            inflight.add_metric([state.id], float(state.inflight_total))
            slots.add_metric([state.id], float(len(view.active)))
        depth = GaugeMetricFamily(
            "lorapool_router_queue_depth",
            "Requests waiting in an adapter's queue (deepest queues; the rest as other)",
            labels=["model"],
        )
        depths = sorted(self._depths().items(), key=lambda kv: (-kv[1], kv[0]))
        for model, n in depths[: self._max_labels]:
            depth.add_metric([model], float(n))
        rest = sum(n for _, n in depths[self._max_labels :])
        if rest:
            depth.add_metric(["other"], float(rest))
        queued = GaugeMetricFamily("lorapool_router_queued_requests", "Requests waiting in all adapter queues")
        queued.add_metric([], float(sum(n for _, n in depths)))
        yield from (up, reported, inflight, slots, depth, queued)


class Telemetry:
    """Counters and histograms the proxy updates, plus live gauges."""

    def __init__(self, *, max_model_labels: int = 100) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._max_labels = max_model_labels
        self._labelled: set[str] = set()
        self._register_request_metrics()
        self._register_adapter_metrics()
        self._register_routing_metrics()
        # Labelled children, looked up once: ``labels()`` takes a lock and checks its arguments.
        self._decided = {kind: self.decisions.labels(kind.value) for kind in DecisionKind}
        self._answered: dict[tuple[str, str], Any] = {}
        self._routed: dict[str, tuple[Any, Any, Any]] = {}

    def _register_request_metrics(self) -> None:
        """Per request: answers by model and code, and how long it took (first token, last byte, queued)."""
        self.requests = Counter(
            "lorapool_router_requests",
            "Requests answered, by model and HTTP status",
            ["model", "code"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "lorapool_router_time_to_first_token_seconds",
            "Time from a request's arrival to its first streamed chunk relayed to the client",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.duration = Histogram(
            "lorapool_router_request_duration_seconds",
            "Time from a request's arrival to its last byte",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "lorapool_router_queue_wait_seconds",
            "Time held requests waited in the router's queue, by why: slot (no LoRA slot free), load"
            " (the adapter was loading on the engines) or saturated (every replica was at its --max-inflight or --max-prefilling)",
            ["reason"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )

    def _register_adapter_metrics(self) -> None:
        """Per adapter: requests bound (hit or miss), slot loads the router caused, seconds held."""
        self.adapter_requests = Counter(
            "lorapool_router_adapter_requests",
            "Adapter requests bound to a replica, by adapter and result: hit (the adapter was in a GPU"
            " slot of that replica) or miss (it needed a load: into a slot, or first onto a replica)",
            ["adapter", "result"],
            registry=self.registry,
        )
        self.adapter_loads = Counter(
            "lorapool_router_adapter_loads",
            "Adapter loads into a GPU slot that the router's choices triggered (sent where it was"
            " neither in flight nor recently run)",
            ["adapter"],
            registry=self.registry,
        )
        self.adapter_throttled = Counter(
            "lorapool_router_adapter_throttled",
            "Requests refused with 429 because the adapter was over its rate limit, by adapter and the"
            " limit that refused (requests or tokens)",
            ["adapter", "limit"],
            registry=self.registry,
        )
        self.adapter_shed = Counter(
            "lorapool_router_adapter_shed",
            "Held requests of a sheddable adapter dropped (503) to make room for more important ones"
            " when the router's queues were full",
            ["adapter"],
            registry=self.registry,
        )
        self.adapter_held = Counter(
            "lorapool_router_adapter_held_seconds",
            "Seconds requests for the adapter spent held in the router's queue, by why (slot, load, saturated or fair)",
            ["adapter", "reason"],
            registry=self.registry,
        )

    def _register_routing_metrics(self) -> None:
        """Per routing decision: its kind, retries on another backend, responses cut short."""
        self.decisions = Counter(
            "lorapool_router_decisions",
            "Routing decisions by kind; a held request counts as queued, then as its bind",
            ["kind"],
            registry=self.registry,
        )
        self.retries = Counter(
            "lorapool_router_retries",
            "Requests retried on another backend before the first byte, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.traffic_reloads = Counter(
            "lorapool_router_traffic_reloads",
            "Changes of --traffic-file read, by result: applied, or refused (invalid: the last good policy stays)",
            ["result"],
            registry=self.registry,
        )
        self.upstream_failures = Counter(
            "lorapool_router_upstream_failures",
            "Responses cut short because a backend failed mid-response",
            registry=self.registry,
        )
        self._register_policy_metrics()
        self._register_shared_books_metrics()

    def _register_shared_books_metrics(self) -> None:
        """The shared books (--shared-state, router.sharedbooks): the store's state, its calls, and the
        decisions made from this router's own books while the store was down."""
        self.shared_books_up = Gauge(
            "lorapool_router_shared_books_up",
            "1 while the shared books' store answers within its deadline (--shared-state), else 0",
            registry=self.registry,
        )
        self.shared_books_peers = Gauge(
            "lorapool_router_shared_books_peers",
            "Other routers whose books this router reads now",
            registry=self.registry,
        )
        self.shared_books_errors = Counter(
            "lorapool_router_shared_books_errors",
            "Store calls that failed or passed their deadline, by operation (write, read, subscribe)",
            ["op"],
            registry=self.registry,
        )
        self.shared_books_seconds = Histogram(
            "lorapool_router_shared_books_call_seconds",
            "Store call latency by operation (write, read), when it answered",
            ["op"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=self.registry,
        )
        self.shared_books_conflicts = Counter(
            "lorapool_router_shared_books_claim_conflicts",
            "Binds onto a free LoRA slot undone because another router's claim took that slot first",
            registry=self.registry,
        )
        self.shared_books_local = Counter(
            "lorapool_router_shared_books_local_decisions",
            "Requests bound from this router's own books and the engines' metrics while the store was down",
            registry=self.registry,
        )

    def _register_policy_metrics(self) -> None:
        """The router policy document in force (docs/router-policy.md): one series, its hash a label."""
        self.policy_info = Gauge(
            "lorapool_router_policy_info",
            "The router policy document in force: 1 for its hash (16 hex digits of its SHA-256), name and source"
            " (file: --policy-file, with any policy flags over it; flags: no file)",
            ["hash", "policy", "source"],
            registry=self.registry,
        )
        self.policy_reloads = Counter(
            "lorapool_router_policy_reloads",
            "Changes of --policy-file read, by result: applied, or refused (invalid: the last good document stays)",
            ["result"],
            registry=self.registry,
        )

    def policy_running(self, digest: str, policy: str, source: str) -> None:
        """Say which document is in force (the previous one's series goes)."""
        self.policy_info.clear()
        self.policy_info.labels(digest, policy, source).set(1)

    def decided(self, kind: DecisionKind) -> None:
        """Count one routing decision."""
        self._decided[kind].inc()

    def routed(self, model: str, *, hit: bool, slot_load: bool) -> None:
        """Count one adapter request bound to a replica: hit or miss, and the slot load it triggers."""
        label = self.model_label(model, known=True)
        children = self._routed.get(label)
        if children is None:
            children = self._routed[label] = (
                self.adapter_requests.labels(label, "hit"),
                self.adapter_requests.labels(label, "miss"),
                self.adapter_loads.labels(label),
            )
        children[0 if hit else 1].inc()
        if slot_load:
            children[2].inc()

    def throttled(self, model: str, limit: str) -> None:
        """Count one request refused over ``model``'s rate limit (``limit``: requests or tokens)."""
        self.adapter_throttled.labels(self.model_label(model, known=True), limit).inc()

    def shed(self, model: str) -> None:
        """Count one held sheddable request dropped for a more important one."""
        self.adapter_shed.labels(self.model_label(model, known=True)).inc()

    def held(self, model: str, reason: str, seconds: float) -> None:
        """Count the time one request was held in the router's queue (``reason``: slot, load or saturated)."""
        self.queue_wait.labels(reason).observe(seconds)
        self.adapter_held.labels(self.model_label(model, known=True), reason).inc(seconds)

    def answered(self, label: str, code: str, seconds: float) -> None:
        """Count one answered request (``label`` from ``model_label``) and its duration."""
        child = self._answered.get((label, code))
        if child is None:
            child = self._answered[(label, code)] = self.requests.labels(label, code)
        child.inc()
        self.duration.observe(seconds)

    def watch(
        self,
        backends: Callable[[], Iterable[ReadOnlyBackendState]],
        depths: Callable[[], Mapping[str, int]],
    ) -> None:
        """Export live gauges read from the scheduler at scrape time."""
        self.registry.register(_LiveGauges(backends, depths, self._max_labels))

    def model_label(self, model: str | None, *, known: bool) -> str:
        """The label value for ``model`` under the cardinality cap."""
        if not model:
            return "none"
        if not known:
            return "unknown"
        if model in self._labelled:
            return model
        if len(self._labelled) < self._max_labels:
            self._labelled.add(model)
            return model
        return "other"

    def exposition(self) -> bytes:
        """The text page for /metrics."""
        return generate_latest(self.registry)
