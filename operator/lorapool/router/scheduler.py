"""Binds requests to backends: runs the policy, holds what fits nowhere, binds it late.

The shell around the pure policy. ``acquire`` either binds at once, raises (503 / 404 / 429),
or parks the request in its adapter's wait queue; every event that may free a slot or make an
adapter servable (a request ends, a poll lands, the backend set changes, a sidecar's report
changes) drains the queues, oldest head first. A request held for a LoRA slot that waited
``max_wait_s`` is sent best-effort by the fallback policy; one held because its adapter is
still loading on the engines (the sidecars' reports, ``reports.standing``) gets 503 instead.
One event loop owns it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lorapool.api.report import ReplicaReport
from lorapool.router.core.backend import Backend, DecisionKind, Request, classify
from lorapool.router.core.filters import healthy, serves_model
from lorapool.router.core.policy import Scheduling
from lorapool.router.core.reports import Standing, Verdict, standing
from lorapool.router.core.state import BackendState
from lorapool.router.core.waitqueue import WaitQueues
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry

log = logging.getLogger("lorapool.router.scheduler")


class NoBackend(Exception):
    """No backend is up (or every one was tried): answer 503 at once."""


class UnknownModel(Exception):
    """No backend serves the model: answer 404 with the reports' reason, else as vLLM would."""

    def __init__(self, model: str, reason: str = "") -> None:
        super().__init__(reason or model)
        self.model, self.reason = model, reason


class StillLoading(Exception):
    """The adapter was still loading on the engines when the request's wait ran out: answer 503."""


class QueueFull(Exception):
    """The wait queues are full: answer 429."""


@dataclass
class Lease:
    """A request bound to a backend; release it exactly once."""

    state: BackendState
    req: Request
    kind: DecisionKind
    waited_s: float = 0.0
    released: bool = False


class HoldReason:
    """Why a request waits in the router (the queue-wait metric's ``reason`` label)."""

    SLOT = "slot"  # no replica has a LoRA slot for it: grouping (waits, then best effort)
    LOAD = "load"  # its adapter is loaded nowhere yet, loading somewhere (waits, then 503)


@dataclass(eq=False)
class _Waiter:
    req: Request
    exclude: frozenset[str]
    since_s: float
    future: asyncio.Future[Lease] = field(repr=False)
    reason: str = HoldReason.SLOT


class Scheduler:
    """Owns the backend states, the wait queues and the routing decisions."""

    def __init__(
        self,
        scheduling: Scheduling,
        settings: RouterSettings,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scheduling = scheduling
        self.settings = settings
        self.telemetry = telemetry
        self.clock = clock
        self.states: dict[str, BackendState] = {}
        self.queues: WaitQueues[_Waiter] = WaitQueues(limit=settings.max_queued)
        # Set by the poller: re-reads /v1/models when a model is unknown everywhere.
        self.refresh_models: Callable[[], Awaitable[None]] | None = None
        telemetry.watch(lambda: list(self.states.values()), self.queues.depths)

    # --- backends -------------------------------------------------------------------------
    def set_backends(self, urls: Iterable[str]) -> tuple[list[str], list[str]]:
        """Replace the backend set; returns (added, removed). In-flight leases keep working."""
        wanted = {u.rstrip("/") for u in urls}
        added = sorted(wanted - self.states.keys())
        removed = sorted(self.states.keys() - wanted)
        for url in removed:
            del self.states[url]
        for url in added:
            self.states[url] = BackendState(
                url, max_loras=self.settings.max_loras, max_cpu_loras=self.settings.max_cpu_loras
            )
        self.changed()
        return added, removed

    def set_reports(self, reports: Mapping[str, ReplicaReport | None]) -> None:
        """The sidecars' reports per backend URL (missing or None: none usable); binds what they freed."""
        for url, state in self.states.items():
            state.apply_report(reports.get(url))
        self._refuse_lost_loads()
        self.changed()

    def _refuse_lost_loads(self) -> None:
        """Requests waiting for a load that the reports now say failed (or vanished): 404 at once."""
        views = self._views()
        for model in list(self.queues.depths()):
            waiters = [w for w in self.queues.items(model) if w.reason == HoldReason.LOAD]
            if not waiters:
                continue
            verdict = self.standing(model, views)
            if verdict.standing not in (Standing.FAILED, Standing.UNKNOWN):
                continue
            for waiter in waiters:
                self.queues.remove(model, waiter)
                if not waiter.future.done():
                    waiter.future.set_exception(UnknownModel(model, verdict.reason))

    def base_models(self) -> frozenset[str]:
        return frozenset().union(*(s.base_models for s in self.states.values()))

    def known(self, model: str) -> bool:
        """True when some backend serves ``model`` (its report or /v1/models) or its report knows it."""
        return any(
            ((models := s.served_models()) is not None and model in models)
            or (s.report is not None and model in s.report.adapters)
            for s in self.states.values()
        )

    def standing(self, model: str, views: Sequence[Backend]) -> Verdict:
        """Where ``model`` stands over the reports of ``views``' backends (pure ``reports.standing``)."""
        return standing(model, {v.id: self.states[v.id].report for v in views if v.id in self.states})

    def request_for(self, model: str) -> Request:
        return Request(model, is_adapter=model not in self.base_models())

    # --- binding --------------------------------------------------------------------------
    def _views(self, exclude: frozenset[str] = frozenset()) -> list[Backend]:
        return [s.view() for url, s in self.states.items() if url not in exclude]

    async def acquire(self, req: Request, exclude: frozenset[str] = frozenset()) -> Lease:
        """Bind ``req`` to a backend now, or after waiting in its adapter's queue."""
        views = self._views(exclude)
        chosen = self.scheduling.strict.choose(req, views)
        if chosen is not None:  # the common case: the policy's own filters said all there is to say
            return self._bind(req, chosen, views)
        live = healthy(req, views)
        if not live:
            raise NoBackend("no backend is up" if not exclude else "every backend was tried")
        if not serves_model(req, live):
            if self.refresh_models is not None and any(self.states[v.id].report is None for v in live):
                await self.refresh_models()  # some backend has no report: its /v1/models may be stale
                views = self._views(exclude)
                live = healthy(req, views)
                if not live:
                    raise NoBackend("no backend is up")
            if not serves_model(req, live):
                return await self._not_served(req, exclude, live)
            chosen = self.scheduling.strict.choose(req, views)
            if chosen is not None:
                return self._bind(req, chosen, views)
        if self.scheduling.hold is None:
            raise NoBackend("no backend may take the request")
        if not self.scheduling.hold(req, views):
            return self._bind_best_effort(req, views)
        return await self._hold(req, exclude)

    async def _not_served(self, req: Request, exclude: frozenset[str], live: Sequence[Backend]) -> Lease:
        """No live backend serves the model: wait for a load the reports announce, else 404 with their reason.

        The reports of every backend count (down or already tried ones too): an adapter held only
        by replicas that are down is a 503, not a 404 "not in the pool"."""
        verdict = self.standing(req.model, self._views()) if req.is_adapter else Verdict(Standing.UNREPORTED)
        if verdict.standing == Standing.LOADED:
            held_by = ", ".join(verdict.loaded_on)
            raise NoBackend(f"adapter {req.model!r} is loaded only on replicas that are down or were tried ({held_by})")
        if verdict.standing == Standing.LOADING:
            return await self._hold(req, exclude, reason=HoldReason.LOAD)
        if verdict.standing in (Standing.FAILED, Standing.UNKNOWN):
            raise UnknownModel(req.model, verdict.reason)
        raise UnknownModel(req.model)  # no reports: as vLLM would answer

    def _bind_best_effort(self, req: Request, views: Sequence[Backend], *, loaded_late: bool = False) -> Lease:
        """Bind by the fallback policy (over the slot limit); NoBackend when nothing is up."""
        chosen = self.scheduling.fallback.choose(req, views)
        if chosen is None:
            raise NoBackend("no backend is up")
        return self._bind(req, chosen, views, loaded_late=loaded_late)

    async def _hold(self, req: Request, exclude: frozenset[str], reason: str = HoldReason.SLOT) -> Lease:
        now = self.clock()
        waiter = _Waiter(req, exclude, now, asyncio.get_running_loop().create_future(), reason)
        if not self.queues.push(req.model, waiter, now):
            raise QueueFull(f"{len(self.queues)} requests are already waiting")
        self.telemetry.decided(DecisionKind.QUEUED)
        if log.isEnabledFor(logging.DEBUG):
            active = {v.id: sorted(v.active) for v in self._views()}
            log.debug("Held request", extra={"model": req.model, "active": active})
        try:
            await asyncio.wait({waiter.future}, timeout=self.settings.max_wait_s)
        except asyncio.CancelledError:
            bound = waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None
            if not self.queues.remove(req.model, waiter) and bound:
                self.release(waiter.future.result())
            raise
        if waiter.future.done():
            if waiter.future.exception() is not None:
                self.telemetry.held(req.model, reason, self.clock() - now)
            lease = waiter.future.result()  # raises what ended the wait (the load failed: 404)
        else:
            self.queues.remove(req.model, waiter)
            views = self._views(exclude)
            if reason == HoldReason.LOAD and not serves_model(req, healthy(req, views)):
                self.telemetry.held(req.model, reason, self.clock() - now)
                verdict = self.standing(req.model, self._views())
                if verdict.standing in (Standing.FAILED, Standing.UNKNOWN):
                    raise UnknownModel(req.model, verdict.reason)
                if verdict.standing == Standing.LOADED:
                    raise NoBackend(f"adapter {req.model!r} is loaded only on replicas that are down or were tried")
                why = verdict.reason or f"adapter {req.model!r} is not loaded on any replica yet"
                raise StillLoading(f"{why}; waited {self.settings.max_wait_s:g} s (--max-wait)")
            lease = self._bind_best_effort(req, views, loaded_late=reason == HoldReason.LOAD)
        lease.waited_s = self.clock() - now
        self.telemetry.held(req.model, reason, lease.waited_s)
        return lease

    def _bind(self, req: Request, chosen: str, views: Sequence[Backend], *, loaded_late: bool = False) -> Lease:
        """Count ``req`` on ``chosen``; ``loaded_late``: it waited for a sidecar to load its adapter."""
        view = next(v for v in views if v.id == chosen)
        kind = classify(req, view)
        state = self.states[chosen]
        if log.isEnabledFor(logging.DEBUG):
            loads = {v.id: (v.load, len(v.active), req.model in v.active) for v in views}
            extra = {"model": req.model, "kind": kind.value, "backend": chosen, "loads": loads}
            log.debug("Bound request", extra=extra)
        if req.is_adapter:
            # Resident: in a GPU slot there (in flight or among the last max-loras to run), so no load.
            in_slot = view.runs(req.model) or req.model in view.warm
            self.telemetry.routed(req.model, hit=in_slot and not loaded_late, slot_load=not in_slot)
        state.begin(req.model, is_adapter=req.is_adapter)
        self.telemetry.decided(kind)
        return Lease(state, req, kind)

    def release(self, lease: Lease) -> None:
        """The request is over (done, failed or cancelled): free its share, bind waiters."""
        if lease.released:
            return
        lease.released = True
        lease.state.end(lease.req.model, is_adapter=lease.req.is_adapter)
        self.changed()

    def changed(self) -> None:
        """Something may have freed capacity: bind what waits, oldest head first."""
        if not self.queues:
            return
        while self._bind_one_waiter():
            pass

    def _bind_one_waiter(self) -> bool:
        views = self._views()
        live = [v for v in views if v.up]
        if not live:
            return False
        free_slot = any(len(v.active) < v.max_loras for v in live)
        # Without a free slot only adapters already running somewhere (or the base) can bind:
        # skip the rest without running the policy, which matters with 1000s of queues.
        runnable = set().union(*(v.active.keys() for v in live)) | self.base_models()
        eligible = None if free_slot else runnable.__contains__
        for model in self.queues.models_by_age(eligible):
            waiter = self.queues.head(model)
            assert waiter is not None
            candidates = [v for v in views if v.id not in waiter.exclude]
            chosen = self.scheduling.strict.choose(waiter.req, candidates)
            if chosen is None:
                continue
            self.queues.pop(model)
            lease = self._bind(waiter.req, chosen, candidates, loaded_late=waiter.reason == HoldReason.LOAD)
            waiter.future.set_result(lease)
            return True
        return False
