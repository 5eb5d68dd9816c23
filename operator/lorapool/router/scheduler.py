"""Binds requests to backends: carries out the pure admission's and dispatch's decisions, and owns the waiting.

The shell around ``core.admission`` and ``core.dispatch``: ``acquire`` asks ``admit`` (and
``dispatch.gate``: fair dispatch's yield) and does what it says (binds, raises ``Refused``, parks
the request in its adapter's wait queue for ``dispatch.wait_limit``, or re-reads /v1/models once
and asks again); every event that may free a slot or make an adapter servable (a request ends,
a poll lands, the backend set changes, a sidecar's report changes) binds the held requests
``dispatch.next_bind`` names, one by one; a full queue sheds ``dispatch.shed``'s victim; a held
request whose wait ran out gets ``expire``'s answer. The policy's stateful scorers hear of every
request, bind, release and backend reset through ``Scheduling``'s hooks. What it takes from the
policy document besides the chain (fair dispatch, the per-backend caps, the wait limits, the slots
assumed until an engine reports them) is one ``SchedulerKnobs``, replaced with the chain by
``set_policy`` between two decisions. The
scheduler is the only writer of the backends' state: the poller and the proxy tell it what they
saw (``polled``, ``mark_down``, ``model_missing``...), everyone reads ``backends()``. One event
loop owns it; any front door (the HTTP proxy, an endpoint picker) drives the same scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lorapool.api.report import ReplicaReport
from lorapool.api.traffic import TrafficPolicy
from lorapool.api.vllm_metrics import VllmMetrics
from lorapool.router.core import dispatch
from lorapool.router.core.admission import (
    Bind,
    Hold,
    HoldReason,
    Refresh,
    RefusalReason,
    Refuse,
    admit,
    expire,
    lost_load,
    moved_to,
)
from lorapool.router.core.backend import Backend, DecisionKind, Request
from lorapool.router.core.books import (
    MAX_SERVICE_KEYS,
    NO_PEER_LOAD,
    BackendBooks,
    DemandMeter,
    Entry,
    PeerBooks,
    demand_share,
    peer_goes_first,
    pool_order,
)
from lorapool.router.core.document import SchedulerKnobs
from lorapool.router.core.fairness import VirtualTokenCounter, cost, estimate
from lorapool.router.core.policy import Scheduling
from lorapool.router.core.ratelimit import Allow, RateLimiter, Throttle
from lorapool.router.core.state import BackendState, ReadOnlyBackendState
from lorapool.router.core.waitqueue import WaitQueues
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry

log = logging.getLogger("lorapool.router.scheduler")

# Binds onto a free slot another router's claim beat, undone and decided again, before one stands.
CLAIM_TRIES = 3
# A held request lets a peer's older (or higher-class) held request take a freed slot for this long at
# most, then binds (the peer may not have heard of the slot, or its request may fit nowhere here).
# Regime (b), x3 shared over x1 goodput: 0.75x with 50 ms (every deferral stops the pass, so other
# held requests wait too), 0.90x with 10 ms, 0.86x without deferring (one run each, 00:38-00:52).
PEER_GRACE_S = 0.01
# A peer's held request goes first only when it began waiting this much earlier (clocks differ a little).
PEER_SLACK_S = 0.005


class Refused(Exception):
    """Admission refused the request: ``refusal`` says why and how to answer (status, message)."""

    def __init__(self, refusal: Refuse) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


@dataclass(eq=False)
class Lease:
    """A request bound to a backend; release it exactly once (``Scheduler.release``)."""

    state: ReadOnlyBackendState
    req: Request
    bind: Bind
    waited_s: float = 0.0
    released: bool = False
    charged: float = 0.0  # fair dispatch's estimate charged at bind (corrected at release)
    started: bool = False  # the response's first token came (``Scheduler.first_token``)

    @property
    def backend(self) -> str:
        """The backend's id (its URL)."""
        return self.bind.backend

    @property
    def kind(self) -> DecisionKind:
        return self.bind.kind


@dataclass(eq=False)
class _Waiter:
    req: Request
    tried: frozenset[str]
    since_s: float
    future: asyncio.Future[Lease] = field(repr=False)
    reason: HoldReason = HoldReason.SLOT
    deferred_at: float | None = None  # when it first let a peer's held request go first (shared books)


class Scheduler:
    """Owns the backend states, the wait queues and the carrying out of admission."""

    def __init__(
        self,
        scheduling: Scheduling,
        settings: RouterSettings,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.monotonic,
        *,
        knobs: SchedulerKnobs | None = None,
    ) -> None:
        """``knobs``: the policy document's dispatch and slots; None: the flags' (``settings.knobs()``)."""
        self.scheduling = scheduling
        self.settings = settings
        # Fair dispatch, the per-backend caps, the wait limits and the slots (set_policy replaces them).
        self.knobs = knobs if knobs is not None else settings.knobs()
        self.telemetry = telemetry
        self.clock = clock
        self._states: dict[str, BackendState] = {}
        self.queues: WaitQueues[_Waiter] = WaitQueues(limit=settings.max_queued)
        # Every adapter's priority and limits (api.traffic; --traffic-file, re-read when it changes).
        self.traffic = TrafficPolicy()
        self.limits = RateLimiter()
        # Fair dispatch: held requests bind by virtual token counter (core.fairness), else class then age.
        self.fairness = VirtualTokenCounter() if self.knobs.fair else None
        # Set by the poller: re-reads /v1/models when a model is unknown everywhere.
        self.refresh_models: Callable[[], Awaitable[None]] | None = None
        # Told each backend that leaves the set (its pod stopping): the HTTP door's requests waiting on it.
        self.departure_hooks: list[Callable[[str], None]] = []
        # The adapters the pool's adapter set names (``set_desired``); None: the router does not read it.
        self.desired: frozenset[str] | None = None
        # Shared books (--shared-state, core.books): the other routers' entries, and whom to tell
        # that this router's own books changed (the store's writer); None: this router's books only.
        self.peers: PeerBooks | None = None
        self.books_changed: Callable[[], None] | None = None
        self.books_up = True  # the store answers (router.sharedbooks): binds while it does not are counted
        # Asked before a bind takes a free LoRA slot whether another router took it first (backend,
        # adapter, the backend's slots, this router's other adapters there): False when one did.
        self.claim_slot: Callable[[str, str, int, list[str]], Awaitable[bool]] | None = None
        self.boot = f"{time.time():.6f}"  # this process's start, in its entries: a restart starts them again
        self.demand = DemandMeter()
        telemetry.watch(self.backends, self.queues.depths)

    # --- what the shells read -------------------------------------------------------------
    def backends(self) -> list[ReadOnlyBackendState]:
        """Every backend, read-only."""
        return list(self._states.values())

    def backend(self, url: str) -> ReadOnlyBackendState | None:
        return self._states.get(url.rstrip("/"))

    def base_models(self) -> frozenset[str]:
        return frozenset().union(*(s.base_models for s in self._states.values()))

    def known(self, model: str) -> bool:
        """True when some backend serves ``model`` (its report or /v1/models) or its report knows it."""
        return any(
            ((models := s.served_models()) is not None and model in models)
            or (s.report is not None and model in s.report.adapters)
            for s in self._states.values()
        )

    def request_for(
        self, model: str, prompt_tokens: int = 0, max_tokens: int | None = None, *, prompt: str = ""
    ) -> Request:
        """What admission reads of a request for ``model`` (its class from the traffic policy);
        ``prompt``: its text (``RequestBody.prompt``), which the policy's stateful scorers prepare
        their data from once here (``Scheduling.prepare``), for every decision and the bind to read."""
        priority = self.traffic.of(model).priority
        is_adapter = model not in self.base_models()
        req = Request(model, is_adapter, priority, prompt_tokens, max_tokens, in_pool=self.in_pool(model))
        return self.scheduling.prepare(req, prompt) if prompt else req

    def in_pool(self, model: str) -> bool | None:
        """Whether the pool's adapter set names ``model`` (None: no set read: ``--adapter-set`` not given)."""
        return None if self.desired is None else model in self.desired

    def set_desired(self, names: frozenset[str] | None) -> None:
        """The adapters the pool's adapter set names now (its ``--adapter-set`` watch); held loads of one
        it no longer names, and that no report knows, get their 404 at once."""
        self.desired = names
        self._refuse_lost_loads()
        self.changed()

    def meters(self, allow: Allow) -> bool:
        """Whether a response's token use must be read: its adapter is token-limited, or fair
        dispatch settles what it charged (``release``'s ``used``)."""
        return allow.metered or self.fairness is not None

    def limit(self, model: str, prompt_tokens: int) -> Allow | Throttle:
        """The adapter's rate limits for one more request (both doors ask before anything else is
        counted: a throttled request is not demand); a throttle is counted here. With live peers
        (shared books) this router enforces its share of the adapter's demand, else 1/routers."""
        now, share = self.clock(), None
        if self.peers is not None and model in self.limits.limited():
            self.demand.asked(model, now)
            if len(self.peers):
                share = demand_share(self.demand.rate(model, now), self.peers.demand(model))
        verdict = self.limits.check(model, prompt_tokens, now, share)
        if isinstance(verdict, Throttle):
            self.telemetry.throttled(model, verdict.limited_by)
        return verdict

    def settle(self, model: str, allow: Allow, used_tokens: int) -> None:
        """A request's response ended having used ``used_tokens``: settle its token bucket (if limited)."""
        if allow.metered:
            self.limits.settle(model, allow.charged, used_tokens, self.clock())

    # --- what the shells tell it ----------------------------------------------------------
    def set_policy(self, scheduling: Scheduling, knobs: SchedulerKnobs | None = None) -> None:
        """A new policy (a re-read policy document) for every decision from now on; leases and
        held requests keep working, and the new policy binds what it can at once. Its stateful
        scorers start empty (what the old ones kept goes with them). ``knobs``: the document's
        dispatch and slots (None: keep the ones in force): new caps and slots count for every bind
        from now on, a held request keeps the wait it was given, fair dispatch turned on starts
        with empty counters and turned off drops them."""
        self.scheduling = scheduling
        if knobs is not None and knobs != self.knobs:
            self._set_knobs(knobs)
        self.changed()

    def _set_knobs(self, knobs: SchedulerKnobs) -> None:
        """Fair dispatch on or off, and every backend's configured slots and caps."""
        if knobs.fair != (self.fairness is not None):
            self.fairness = VirtualTokenCounter() if knobs.fair else None
        self.knobs = knobs
        for state in self._states.values():
            state.set_limits(
                max_loras=knobs.max_loras,
                max_cpu_loras=knobs.max_cpu_loras,
                max_inflight=knobs.max_inflight,
                max_prefilling=knobs.max_prefilling,
            )

    def set_traffic(self, policy: TrafficPolicy) -> None:
        """A new traffic policy (``--traffic-file``): priorities for new requests, limits' buckets."""
        self.traffic = policy
        self.limits.configure(policy, self.clock())

    def set_backends(self, urls: Iterable[str]) -> tuple[list[str], list[str]]:
        """Replace the backend set; returns (added, removed). In-flight leases keep working."""
        wanted = {u.rstrip("/") for u in urls}
        added = sorted(wanted - self._states.keys())
        removed = sorted(self._states.keys() - wanted)
        for url in removed:
            del self._states[url]
            self.scheduling.reset(url)  # the plugins' state for it leaves with it
            for hook in self.departure_hooks:
                hook(url)
        for url in added:
            k = self.knobs
            self._states[url] = BackendState(
                url,
                max_loras=k.max_loras,
                max_cpu_loras=k.max_cpu_loras,
                max_inflight=k.max_inflight,
                max_prefilling=k.max_prefilling,
            )
            if self.peers is not None:
                self._states[url].set_peers(self.peers.on(url))
        self.changed()
        return added, removed

    def set_reports(self, reports: Mapping[str, ReplicaReport | None]) -> None:
        """The sidecars' reports per backend URL (missing or None: none usable); binds what they freed."""
        for url, state in self._states.items():
            state.apply_report(reports.get(url))
        self._refuse_lost_loads()
        self.changed()

    def scrape_started(self, backend: ReadOnlyBackendState) -> None:
        """A poll of ``backend``'s /metrics begins (what the router has in flight now is its own)."""
        if (state := self._own(backend)) is not None:
            state.scrape_started()

    def polled(self, backend: ReadOnlyBackendState, metrics: VllmMetrics, cards: Iterable[Mapping[str, Any]]) -> None:
        """A poll succeeded: the backend is up, with these metrics and /v1/models cards."""
        if (state := self._own(backend)) is not None:
            state.mark_up()
            state.apply_metrics(metrics)
            state.apply_models(cards)

    def models_read(self, backend: ReadOnlyBackendState, cards: Iterable[Mapping[str, Any]]) -> None:
        """A fresh /v1/models of ``backend`` (a refresh outside the poll)."""
        if (state := self._own(backend)) is not None:
            state.apply_models(cards)

    def mark_down(self, backend: ReadOnlyBackendState, reason: str) -> None:
        """Take ``backend`` out of rotation until a poll succeeds."""
        if (state := self._own(backend)) is not None:
            state.mark_down(reason)
            self.scheduling.reset(state.id)  # an engine that comes back may be a new one

    def model_missing(self, lease: Lease) -> bool:
        """The lease's backend answered 404 for its model: forget the model there; True when the 404
        is not the client's to see: another backend that is up still lists it (our view was stale), or
        the pool's adapter set names it (the engine is behind its report, e.g. a pod of a roll): retry,
        and admission holds it or answers 503 with Retry-After, never "does not exist"."""
        model = lease.req.model
        if (state := self._own(lease.state)) is not None:
            state.forget_model(model)
        if lease.req.in_pool:
            return True
        return any(
            s.up and (models := s.served_models()) is not None and model in models
            for s in self._states.values()
            if s is not lease.state
        )

    def _own(self, backend: ReadOnlyBackendState) -> BackendState | None:
        """The state behind a handle, while it is still this scheduler's (not removed or replaced)."""
        state = self._states.get(backend.id)
        return state if state is backend else None

    def _views(self) -> list[Backend]:
        return [s.view() for s in self._states.values()]

    # --- carrying out admission -----------------------------------------------------------
    async def acquire(
        self, req: Request, tried: frozenset[str] = frozenset(), *, max_wait_s: float | None = None
    ) -> Lease:
        """Bind ``req`` to a backend now, or after waiting in its adapter's queue; raises ``Refused``.
        ``max_wait_s``: a shorter wait than ``--max-wait`` (a gateway's message timeout bounds it).
        With shared books, a bind onto a free LoRA slot is claimed in the store first; when another
        router's claim took that slot meanwhile, the bind is undone and admission asked again over
        the books the store answered with (``CLAIM_TRIES`` times at most; then the last bind stands)."""
        start = self.clock()
        for attempt in range(CLAIM_TRIES):
            left = None if max_wait_s is None else max(0.0, max_wait_s - (self.clock() - start))
            lease = await self._acquire(req, tried, left)
            if await self._claimed(lease) or attempt == CLAIM_TRIES - 1:
                return lease
            self._undo(lease)
        raise AssertionError("unreachable: the last attempt returns its lease")

    async def _claimed(self, lease: Lease) -> bool:
        """Whether the bind may stand: True unless it loads an adapter into a free slot (not running
        there, not warm: no load, no claim) and another router's claim took that slot first."""
        state = self._own(lease.state)
        loads = lease.kind == DecisionKind.FREE_SLOT and not lease.bind.in_slot
        if self.claim_slot is None or state is None or not loads or not self.books_up:
            return True
        others = [m for m in state.adapter_inflight if m != lease.req.model]
        if await self.claim_slot(lease.backend, lease.req.model, state.max_loras, others):
            return True
        self.telemetry.shared_books_conflicts.inc()
        return False

    def _undo(self, lease: Lease) -> None:
        """A bind another router's claim beat: released as if it had not been (its charge refunded)."""
        if self.fairness is not None and lease.charged:
            self.fairness.correct(lease.req.model, lease.charged, 0.0, lease.req.priority)
            lease.charged = 0.0
        self.release(lease)

    async def _acquire(self, req: Request, tried: frozenset[str], max_wait_s: float | None) -> Lease:
        views = self._views()
        decision = admit(self.scheduling, req, views, tried, lists_fresh=self.refresh_models is None)
        if isinstance(decision, Refresh) and self.refresh_models is not None:
            await self.refresh_models()  # some backend has no report: its /v1/models may be stale
            views = self._views()
            decision = admit(self.scheduling, req, views, tried)
        decision = dispatch.gate(decision, req, self.fairness, dispatch.behind(self.queues, self.fairness))
        if isinstance(decision, Bind):
            return self._bind(req, decision, views)
        if isinstance(decision, Hold):
            limits = dispatch.WaitLimits(self.knobs.max_wait_s, self.knobs.max_queue_wait_s)
            return await self._hold(req, tried, decision, dispatch.wait_limit(decision.reason, limits, max_wait_s))
        if isinstance(decision, Refuse):
            raise Refused(decision)
        raise AssertionError(f"admission asked for a second refresh: {decision}")

    async def _hold(self, req: Request, tried: frozenset[str], hold: Hold, wait_s: float) -> Lease:
        now = self.clock()
        waiter = _Waiter(req, tried, now, asyncio.get_running_loop().create_future(), hold.reason)
        rank = req.priority.rank
        if self.fairness is not None and not self.queues.depth(req.model):  # it starts waiting: no banked credit
            self.fairness.backlogged(req.model, self.queues.depths())
        if not self.queues.push(req.model, waiter, now, rank) and not (
            self._shed_for(req) and self.queues.push(req.model, waiter, now, rank)
        ):
            detail = f"{len(self.queues)} requests are already waiting"
            raise Refused(Refuse(RefusalReason.QUEUE_FULL, req.model, detail))
        self.telemetry.decided(DecisionKind.QUEUED)
        if log.isEnabledFor(logging.DEBUG):
            active = {v.id: sorted(v.active) for v in self._views()}
            log.debug("Held request", extra={"model": req.model, "reason": hold.reason.value, "active": active})
        try:
            await asyncio.wait({waiter.future}, timeout=wait_s)
        except asyncio.CancelledError:
            bound = waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None
            if not self.queues.remove(req.model, waiter) and bound:
                self.release(waiter.future.result())
            raise
        if waiter.future.done():
            if waiter.future.exception() is not None:
                self.telemetry.held(req.model, hold.reason, self.clock() - now)
            lease = waiter.future.result()  # raises what ended the wait (the load failed: 404)
        else:
            self.queues.remove(req.model, waiter)
            views = self._views()
            outcome = expire(self.scheduling, req, hold.reason, views, tried, wait_s)
            if isinstance(outcome, Refuse):
                self.telemetry.held(req.model, hold.reason, self.clock() - now)
                raise Refused(outcome)
            lease = self._bind(req, outcome, views)
        lease.waited_s = self.clock() - now
        self.telemetry.held(req.model, hold.reason, lease.waited_s)
        return lease

    def _shed_for(self, req: Request) -> bool:
        """The queues are full: drop the request ``dispatch.shed`` names to make room for ``req``;
        True when one was dropped (its client gets 503, reason shed)."""
        victim = dispatch.shed(req, self.queues)
        if victim is None:
            return False
        self.queues.remove(victim.model, victim.held)
        if not victim.held.future.done():
            victim.held.future.set_exception(Refused(victim.refusal))
        self.telemetry.shed(victim.model)
        return True

    def _bind(self, req: Request, bind: Bind, views: Sequence[Backend], *, charge: bool = True) -> Lease:
        """Count ``req`` on the bound backend (and, with fair dispatch, charge its adapter's counter)."""
        state = self._states[bind.backend]
        if log.isEnabledFor(logging.DEBUG):
            loads = {v.id: (v.load, len(v.active), req.model in v.active) for v in views}
            extra = {"model": req.model, "kind": bind.kind.value, "backend": bind.backend, "loads": loads}
            log.debug("Bound request", extra=extra)
        if req.is_adapter:
            self.telemetry.routed(req.model, hit=bind.hit, slot_load=not bind.in_slot)
        state.begin(req.model, is_adapter=req.is_adapter)
        if self.peers is not None and not self.books_up:
            self.telemetry.shared_books_local.inc()
        self._books_changed()
        self.scheduling.bound(req, bind.backend)
        self.telemetry.decided(bind.kind)
        lease = Lease(state, req, bind)
        if self.fairness is not None and charge:
            lease.charged = estimate(req.prompt_tokens, req.max_tokens)
            self.fairness.charge(req.model, lease.charged, req.priority)
        return lease

    def alternatives(self, lease: Lease, tried: frozenset[str], count: int) -> list[str]:
        """Up to ``count`` backends the policy would pick next if ``lease``'s failed (a gateway's
        fallbacks, best first): admission asked again without binding, each pick then excluded."""
        views = self._views()
        picked: list[str] = []
        excluded = set(tried) | {lease.backend}
        while len(picked) < count:
            decision = admit(self.scheduling, lease.req, views, frozenset(excluded))
            if not isinstance(decision, Bind):
                break
            picked.append(decision.backend)
            excluded.add(decision.backend)
        return picked

    def moved(self, lease: Lease, backend: ReadOnlyBackendState) -> Lease:
        """The request ran on ``backend``, not where it was bound (a gateway fell back): count it
        there instead; ``lease`` is released, the new lease is what to release at the end."""
        charged, lease.charged = lease.charged, 0.0  # the same request: its charge moves with it
        self.release(lease)
        views = self._views()
        moved = self._bind(lease.req, moved_to(lease.req, views, backend.id), views, charge=False)
        moved.charged = charged
        if lease.started:
            self.first_token(moved)
        return moved

    def first_token(self, lease: Lease) -> None:
        """The lease's response streamed its first byte: the request left the engine's prefill
        queue, so with ``--max-prefilling`` another held request may go to that replica."""
        if lease.started or lease.released:
            return
        lease.started = True
        if (state := self._own(lease.state)) is not None:
            state.first_token()
            self._books_changed()
            if state.max_prefilling:
                self.changed()

    def release(self, lease: Lease, used: tuple[int, int] | None = None) -> None:
        """The request is over (done, failed or cancelled): free its share, bind waiters.
        ``used``: the (prompt, completion) tokens it used, when read (``meters``): fair dispatch
        replaces its estimate by them; None leaves the estimate charged."""
        if lease.released:
            return
        lease.released = True
        if self.fairness is not None and lease.charged and used is not None:
            self.fairness.correct(lease.req.model, lease.charged, cost(*used), lease.req.priority)
        if (state := self._own(lease.state)) is not None:  # a removed backend's books are gone with it
            state.end(lease.req.model, is_adapter=lease.req.is_adapter, started=lease.started)
            self.scheduling.released(lease.req, lease.backend)
            self._books_changed()
        self.changed()

    # --- shared books (core.books) --------------------------------------------------------
    def _books_changed(self) -> None:
        if self.books_changed is not None:
            self.books_changed()

    def books(self, router: str, seq: int) -> Entry:
        """This router's own books as the store keeps them: per backend its bound requests, those in
        prefill and per adapter; its held requests per adapter; its demand on limited adapters."""
        backends = {
            url: BackendBooks(s.inflight_total, s.prefilling, dict(s.adapter_inflight))
            for url, s in self._states.items()
            if s.inflight_total
        }
        limited = self.limits.limited()
        self.demand.forget_except(limited)
        served = self.fairness.served_recently(MAX_SERVICE_KEYS) if self.fairness is not None else {}
        now = self.clock()
        to_wall = time.time() - now
        heads = {
            m: (to_wall + w.since_s, w.req.priority.rank) for m in self.queues.depths() if (w := self.queues.head(m))
        }
        return Entry(router, seq, backends, self.queues.depths(), self.demand.rates(now), served, self.boot, heads)

    def peers_changed(self) -> None:
        """The other routers' books changed (heard, resynced or expired): fold them into each backend's
        view, and bind what waits (a peer's request that ended may have freed a slot)."""
        peers = self.peers
        for url, state in self._states.items():
            state.set_peers(peers.on(url) if peers is not None else NO_PEER_LOAD)
        if peers is not None and (served := peers.take_service()) and self.fairness is not None:
            self.fairness.add_peers(served)
        self.changed()

    def changed(self) -> None:
        """Something may have freed capacity: bind what waits, oldest head first."""
        if not self.queues:
            return
        while self._bind_one_waiter():
            pass

    def _bind_one_waiter(self) -> bool:
        """Bind the held request ``dispatch.next_bind`` names; False when none may bind now."""
        views = self._views()
        chosen = dispatch.next_bind(self.scheduling, self.queues, views, self.base_models(), self.fairness)
        if chosen is None or self._peer_first(chosen.model, chosen.held, chosen.bind.backend):
            return False
        self.queues.pop(chosen.model)
        chosen.held.future.set_result(self._bind(chosen.held.req, chosen.bind, views))
        return True

    def _peer_first(self, model: str, waiter: _Waiter, backend: str) -> bool:
        """Shared books: True while a peer holds a request that comes first in the pool's order and fits
        ``backend`` (``core.books.peer_goes_first``): ``waiter`` lets it take the slot, for
        ``PEER_GRACE_S`` at most (then it binds; a pass is due then)."""
        if self.peers is None or not len(self.peers) or not self.books_up:
            return False
        now = self.clock()
        if waiter.deferred_at is not None and now - waiter.deferred_at >= PEER_GRACE_S:
            return False
        to_wall = time.time() - now
        order = pool_order(self.fairness.counter if self.fairness is not None else None)
        mine = order(model, to_wall + waiter.since_s - PEER_SLACK_S, waiter.req.priority.rank)
        state = self._states.get(backend)
        if not peer_goes_first(mine, self.peers.heads(), order, lambda m: state is not None and state.serves(m)):
            return False
        if waiter.deferred_at is None:
            waiter.deferred_at = now
            asyncio.get_running_loop().call_later(PEER_GRACE_S, self.changed)
        return True

    def _refuse_lost_loads(self) -> None:
        """Requests waiting for a load that the reports now say failed (or vanished): 404 at once."""
        views = self._views()
        for model in list(self.queues.depths()):
            waiters = [w for w in self.queues.items(model) if w.reason == HoldReason.LOAD]
            if not waiters:
                continue
            refusal = lost_load(model, views, self.in_pool(model))
            if refusal is None:
                continue
            for waiter in waiters:
                self.queues.remove(model, waiter)
                if not waiter.future.done():
                    waiter.future.set_exception(Refused(refusal))
