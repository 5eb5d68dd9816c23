"""Per-backend accounting that feeds the policy: the router's own view plus the engine's. Pure.

The router's own in-flight counts are exact and immediate; the engine's metrics are up to a
poll old but include traffic from elsewhere (other router replicas, direct clients). Both
are used: an adapter or request the engine reports that this router did not have in flight
during the scrape is "foreign" and counted until the next scrape; what the router itself
sent is counted from its own books only, so a request that just finished frees its slot at
once instead of a poll later.

Only the scheduler changes a ``BackendState`` (the poller and the proxy tell it what they saw);
the other shells read it as a ``ReadOnlyBackendState``, and policies see only the ``Backend``
view it builds. Not thread-safe: one event loop owns it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any, Protocol

from lorapool.api.report import ReplicaReport
from lorapool.api.vllm_metrics import VllmMetrics
from lorapool.router.core.backend import Backend
from lorapool.router.core.books import NO_PEER_LOAD, PeerLoad
from lorapool.router.core.reports import served

# How many recently-run adapters to remember per backend (bounds memory with 1000s of adapters).
RECENT_LIMIT = 4096


class ReadOnlyBackendState(Protocol):
    """What a shell may read of a backend's state (``Scheduler.backends``); only the scheduler writes."""

    @property
    def id(self) -> str: ...
    @property
    def up(self) -> bool: ...
    @property
    def report(self) -> ReplicaReport | None: ...
    @property
    def cards(self) -> tuple[Mapping[str, Any], ...]: ...
    @property
    def inflight_total(self) -> int: ...
    def served_models(self) -> frozenset[str] | None: ...
    def view(self) -> Backend: ...


class BackendState:
    """Live state of one backend."""

    def __init__(
        self,
        url: str,
        *,
        max_loras: int = 1,
        max_cpu_loras: int | None = None,
        max_inflight: int = 0,
        max_prefilling: int = 0,
    ) -> None:
        self.id = url
        self.up = False  # until the first successful poll
        self.down_reason = "not polled yet"
        self.default_max_loras = max(1, max_loras)
        self.reported_max_loras: int | None = None
        self.max_cpu_loras = max_cpu_loras
        self.max_inflight = max_inflight  # --max-inflight (0: no cap)
        self.max_prefilling = max_prefilling  # --max-prefilling (0: no cap)
        self.models: frozenset[str] | None = None  # /v1/models ids; None until first polled
        # The sidecar's report on this backend's pod (None: no usable report, /v1/models decides).
        self.report: ReplicaReport | None = None
        self._reported: frozenset[str] = frozenset()  # adapters the report says the engine serves
        self._forgotten: frozenset[str] = frozenset()  # answered 404 since the last poll or report
        self._served_cache: frozenset[str] | None = None
        self.base_models: frozenset[str] = frozenset()
        self.cards: tuple[Mapping[str, Any], ...] = ()
        self.kv_usage = 0.0
        self.engine = VllmMetrics()
        self.inflight_total = 0
        self.prefilling = 0  # bound requests without a first token yet (first_token, end)
        self.adapter_inflight: dict[str, int] = {}
        self.foreign_active: frozenset[str] = frozenset()
        self.foreign_load = 0
        # The other routers' books here (core.books, --shared-state): fresher than the metrics' foreign load.
        self.peers: PeerLoad = NO_PEER_LOAD
        # Adapters in the order they last ran here, most recent last (a guess at vLLM's LRUs).
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._warm_cache: tuple[frozenset[str], frozenset[str]] | None = None
        self._scrape: tuple[set[str], int] | None = None  # (adapters seen, peak in-flight)

    @property
    def max_loras(self) -> int:
        """GPU LoRA slots: what the engine reports, else the configured default."""
        return self.reported_max_loras or self.default_max_loras

    def set_limits(self, *, max_loras: int, max_cpu_loras: int | None, max_inflight: int, max_prefilling: int) -> None:
        """New configured slots and caps (a re-read policy document); what the engine reports still wins."""
        self.default_max_loras = max(1, max_loras)
        self.max_cpu_loras = max_cpu_loras
        self.max_inflight, self.max_prefilling = max_inflight, max_prefilling
        self._warm_cache = None

    # --- requests -------------------------------------------------------------------------
    def begin(self, model: str, *, is_adapter: bool) -> None:
        """Count a request the router just bound to this backend."""
        self.inflight_total += 1
        self.prefilling += 1
        if is_adapter:
            self.adapter_inflight[model] = self.adapter_inflight.get(model, 0) + 1
            self._touch(model)
        if self._scrape is not None:
            seen, peak = self._scrape
            if is_adapter:
                seen.add(model)
            self._scrape = (seen, max(peak, self.inflight_total))

    def first_token(self) -> None:
        """A request bound here streamed its first token: it left the engine's prefill queue."""
        self.prefilling = max(0, self.prefilling - 1)

    def end(self, model: str, *, is_adapter: bool, started: bool = False) -> None:
        """Stop counting a request (finished, failed or cancelled); ``started``: it had streamed
        its first token (``first_token``), else it leaves the prefill count now."""
        self.inflight_total = max(0, self.inflight_total - 1)
        if not started:
            self.first_token()
        if is_adapter:
            left = self.adapter_inflight.get(model, 0) - 1
            if left > 0:
                self.adapter_inflight[model] = left
            else:
                self.adapter_inflight.pop(model, None)

    def set_peers(self, peers: PeerLoad) -> None:
        """The other routers' books here, as last heard: what they run here is warm here too."""
        if peers is self.peers:
            return
        self.peers = peers
        for model in peers.active.keys() - self.adapter_inflight.keys():
            self._touch(model)

    # --- health ---------------------------------------------------------------------------
    def mark_up(self) -> None:
        self.up, self.down_reason = True, ""

    def mark_down(self, reason: str) -> None:
        """Take the backend out of rotation until a poll succeeds; forget foreign load."""
        self.up, self.down_reason = False, reason
        self.foreign_active, self.foreign_load = frozenset(), 0
        self._scrape = None

    # --- polls ----------------------------------------------------------------------------
    def scrape_started(self) -> None:
        """Remember what the router had in flight while the engine's metrics are taken."""
        self._scrape = (set(self.adapter_inflight), self.inflight_total)

    def apply_metrics(self, metrics: VllmMetrics) -> None:
        """Fold one scrape in: foreign adapters and load, slots, KV usage, warm adapters."""
        seen, peak = self._scrape if self._scrape is not None else (set(self.adapter_inflight), 0)
        self._scrape = None
        self.engine = metrics
        self.kv_usage = metrics.kv_usage
        if metrics.slots and metrics.slots != self.reported_max_loras:
            self.reported_max_loras = metrics.slots
            self._warm_cache = None
        self.foreign_load = max(0, metrics.running + metrics.waiting - peak)
        # vLLM stamps lora_requests_info after each step, so an idle engine keeps reporting
        # the adapters of its last step: trust foreign adapters only with foreign load.
        foreign = metrics.listed_adapters - seen if self.foreign_load else frozenset()
        self.foreign_active = frozenset(foreign)
        for name in metrics.running_adapters - self.adapter_inflight.keys():
            self._touch(name)

    def apply_models(self, cards: Iterable[Mapping[str, Any]]) -> None:
        """Fold in /v1/models: adapter cards have a ``parent``, base-model cards do not."""
        kept = tuple(c for c in cards if isinstance(c.get("id"), str))
        self.cards = kept
        self.models = frozenset(str(c["id"]) for c in kept)
        self.base_models = frozenset(str(c["id"]) for c in kept if not c.get("parent"))
        self._forgotten, self._served_cache = frozenset(), None

    def apply_report(self, report: ReplicaReport | None) -> None:
        """Fold in the sidecar's report (None: no usable one, so /v1/models decides again)."""
        if report is self.report:
            return
        self.report = report
        self._reported = served(report) if report is not None else frozenset()
        self._forgotten, self._served_cache = frozenset(), None

    def forget_model(self, model: str) -> None:
        """The backend answered 404 for ``model``: stop routing it here until the next poll or report."""
        if self.models is not None:
            self.models = self.models - {model}
        self._forgotten = self._forgotten | {model}
        self._served_cache = None

    def served_models(self) -> frozenset[str] | None:
        """What the backend serves: with a report, its loaded adapters plus the base models
        ``/v1/models`` lists; without one, ``/v1/models`` (None until polled: assume any)."""
        if self.report is None:
            return self.models
        if self._served_cache is None:
            self._served_cache = (self._reported | self.base_models) - self._forgotten
        return self._served_cache

    def serves(self, model: str) -> bool:
        """True when ``model`` may be sent here (unpolled backends without a report: assumed)."""
        models = self.served_models()
        return models is None or model in models

    # --- the policy's view ----------------------------------------------------------------
    def view(self) -> Backend:
        """A ``Backend`` for one decision (shares live mappings; do not keep it). The other routers'
        books count beside this router's own: their adapters are active here, and their load is a
        floor the engine's older metrics (which include it) cannot lower."""
        active: Mapping[str, int] = self.adapter_inflight
        peers = self.peers
        if self.foreign_active or peers.active:
            merged = dict.fromkeys(self.foreign_active, 1)
            for model, n in peers.active.items():
                merged[model] = n
            for model, n in self.adapter_inflight.items():
                merged[model] = merged.get(model, 0) + n if model in peers.active else n
            active = merged
        warm, cached = self._warm_and_cached()
        return Backend(
            id=self.id,
            up=self.up,
            max_loras=self.max_loras,
            models=self.served_models(),
            active=active,
            warm=warm,
            cached=cached,
            load=self.inflight_total + max(self.foreign_load, peers.load),
            kv_usage=self.kv_usage,
            capacity=self.max_inflight,
            prefilling=self.prefilling + peers.prefilling,
            prefill_capacity=self.max_prefilling,
            report=self.report,
        )

    def _touch(self, model: str) -> None:
        recent = self._recent
        if model in recent:
            if next(reversed(recent)) == model:
                return
            recent.move_to_end(model)
        else:
            recent[model] = None
            if len(recent) > RECENT_LIMIT:
                recent.popitem(last=False)
        self._warm_cache = None

    def _warm_and_cached(self) -> tuple[frozenset[str], frozenset[str]]:
        if self._warm_cache is None:
            newest = reversed(self._recent)
            warm = frozenset(islice(newest, self.max_loras))
            extra = max(0, (self.max_cpu_loras or 0) - self.max_loras)
            cached = warm | frozenset(islice(newest, extra))
            self._warm_cache = (warm, cached)
        return self._warm_cache
