"""Binds requests to backends: runs the policy, holds what fits nowhere, binds it late.

The shell around the pure policy. ``acquire`` either binds at once, raises (503 / 404 / 429),
or parks the request in its adapter's wait queue; every event that may free a slot (a request
ends, a poll lands, the backend set changes) drains the queues, oldest head first. A request
that waited ``max_wait_s`` is sent best-effort by the fallback policy. One event loop owns it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from lorapool.router.backend import Backend, DecisionKind, Request, classify
from lorapool.router.filters import healthy, serves_model
from lorapool.router.policy import Scheduling
from lorapool.router.settings import RouterSettings
from lorapool.router.state import BackendState
from lorapool.router.telemetry import Telemetry
from lorapool.router.waitqueue import WaitQueues

log = logging.getLogger("lorapool.router.scheduler")


class NoBackend(Exception):
    """No backend is up (or every one was tried): answer 503 at once."""


class UnknownModel(Exception):
    """No backend serves the model: answer 404, as vLLM would."""


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


@dataclass(eq=False)
class _Waiter:
    req: Request
    exclude: frozenset[str]
    since_s: float
    future: asyncio.Future[Lease] = field(repr=False)


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

    def base_models(self) -> frozenset[str]:
        return frozenset().union(*(s.base_models for s in self.states.values()))

    def known(self, model: str) -> bool:
        """True when some backend lists ``model`` in /v1/models."""
        return any(s.models is not None and model in s.models for s in self.states.values())

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
            if self.refresh_models is not None:
                await self.refresh_models()
            views = self._views(exclude)
            live = healthy(req, views)
            if not live:
                raise NoBackend("no backend is up")
            if not serves_model(req, live):
                raise UnknownModel(req.model)
            chosen = self.scheduling.strict.choose(req, views)
            if chosen is not None:
                return self._bind(req, chosen, views)
        if self.scheduling.hold is None:
            raise NoBackend("no backend may take the request")
        if not self.scheduling.hold(req, views):
            return self._bind_best_effort(req, views)
        return await self._hold(req, exclude)

    def _bind_best_effort(self, req: Request, views: Sequence[Backend]) -> Lease:
        """Bind by the fallback policy (over the slot limit); NoBackend when nothing is up."""
        chosen = self.scheduling.fallback.choose(req, views)
        if chosen is None:
            raise NoBackend("no backend is up")
        return self._bind(req, chosen, views)

    async def _hold(self, req: Request, exclude: frozenset[str]) -> Lease:
        now = self.clock()
        waiter = _Waiter(req, exclude, now, asyncio.get_running_loop().create_future())
        if not self.queues.push(req.model, waiter, now):
            raise QueueFull(f"{len(self.queues)} requests are already waiting")
        self.telemetry.decided(DecisionKind.QUEUED)
        if log.isEnabledFor(logging.DEBUG):
            active = {v.id: sorted(v.active) for v in self._views()}
            log.debug("Held request", extra={"model": req.model, "active": active})
        try:
            await asyncio.wait({waiter.future}, timeout=self.settings.max_wait_s)
        except asyncio.CancelledError:
            if not self.queues.remove(req.model, waiter) and waiter.future.done():
                self.release(waiter.future.result())
            raise
        if waiter.future.done():
            lease = waiter.future.result()
        else:
            self.queues.remove(req.model, waiter)
            lease = self._bind_best_effort(req, self._views(exclude))
        lease.waited_s = self.clock() - now
        self.telemetry.queue_wait.observe(lease.waited_s)
        return lease

    def _bind(self, req: Request, chosen: str, views: Sequence[Backend]) -> Lease:
        view = next(v for v in views if v.id == chosen)
        kind = classify(req, view)
        state = self.states[chosen]
        if log.isEnabledFor(logging.DEBUG):
            loads = {v.id: (v.load, len(v.active), req.model in v.active) for v in views}
            extra = {"model": req.model, "kind": kind.value, "backend": chosen, "loads": loads}
            log.debug("Bound request", extra=extra)
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
            waiter.future.set_result(self._bind(waiter.req, chosen, candidates))
            return True
        return False
