"""One request's life, the same under either front door: the HTTP proxy (``app``) and the endpoint
picker (``picker.service``) are protocol adapters over it (bytes; Envoy messages). Shell.

As the GIE endpoint picker's ``Director`` runs a request under any protocol handler, a
``Lifecycle`` runs each step over the scheduler, and the doors only say when a step happened:

1. ``admit`` a parsed request: whether its model is known (read once per request), its adapter's
   rate limits (a throttle is a 429 before the request counts as demand), the request as
   admission reads it, its count in the request windows -> a ``Ticket``, which carries the
   immediate ``Answer`` when there is one (the throttle's).
2. ``acquire`` a backend for the ticket (held as long as the door allows) -> the lease, or the
   refusal's ``Answer`` (404, 429 queue full, 503); ``alternatives``: the fallbacks a gateway lists.
3. ``responded`` (the backend's status line and headers), ``first_byte`` (the first body bytes:
   the request left the engine's prefill queue; time to first token for a stream), ``feed`` (the
   body, read for usage when the adapter's tokens or fair dispatch need it).
4. When a backend fails it: ``retry`` (before anything reached the client: try another backend),
   ``moved`` (a gateway fell back to another), ``model_missing`` (it answered 404 for the model),
   ``failed`` (take it out of rotation).
5. ``end`` with the status the client got: release the lease with the usage read, settle the
   adapter's token bucket, count the answer. Once per ticket, however the request ended (done,
   refused, failed, or the client gone: "499"); a request answered before admission (a bad or
   oversized body; no model) is ``counted`` instead.

Answers carry the same status, OpenAI error body and headers (``Retry-After``, ``x-ratelimit-*``)
at both doors. Usage is what the door read of the response body (``UsageMeter.fed``); a door that
did not see the body (a gateway's body mode) leaves the estimates charged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from lorapool.router.core.admission import Refuse
from lorapool.router.core.backend import Request
from lorapool.router.core.openai import BadBody, RequestBody, error_body, too_large_message
from lorapool.router.core.ratelimit import ALLOW, Allow, Throttle
from lorapool.router.core.requestcount import RequestCounter
from lorapool.router.core.state import ReadOnlyBackendState
from lorapool.router.core.usage import UsageMeter
from lorapool.router.scheduler import Lease, Refused, Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry

__all__ = ["Answer", "Lifecycle", "ReadOnlyBackendState", "Scheduler", "Ticket"]


@dataclass(frozen=True, slots=True)
class Answer:
    """An immediate answer (no backend): the status, the OpenAI-shaped error and the headers."""

    status: int
    message: str
    error_type: str
    param: str | None = None
    headers: tuple[tuple[str, str], ...] = ()  # Retry-After first when there is one, then x-ratelimit-*

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.error_type, self.param)

    @property
    def code(self) -> str:
        return str(self.status)

    @classmethod
    def refusal(cls, refusal: Refuse, retry_after_s: int) -> Answer:
        """Admission's refusal: its status and message, and for 503/429 ``Retry-After``."""
        headers = (("Retry-After", str(retry_after_s)),) if refusal.retry else ()
        return cls(refusal.status, refusal.message, refusal.error_type, refusal.param, headers)

    @classmethod
    def throttle(cls, throttle: Throttle) -> Answer:
        """429 over an adapter's rate limit, with ``Retry-After`` and OpenAI's x-ratelimit-* headers."""
        return cls(429, throttle.message, throttle.error_type, headers=throttle.all_headers())

    @classmethod
    def bad_body(cls, exc: BadBody) -> Answer:
        """400: the body is not JSON or has no ``model``."""
        return cls(exc.status, exc.message, exc.error_type, exc.param)

    @classmethod
    def too_large(cls, size: int | None, limit: int) -> Answer:
        """413: the body is over ``--max-body-bytes``."""
        return cls(413, too_large_message(size, limit), "RequestEntityTooLarge")

    @classmethod
    def unavailable(cls, message: str, retry_after_s: int) -> Answer:
        """503 with ``Retry-After``: nothing may take the request now."""
        return cls(503, message, "ServiceUnavailable", headers=(("Retry-After", str(retry_after_s)),))


@dataclass(eq=False)
class Ticket:
    """One admitted request, from admission to its end (``Lifecycle.end``)."""

    req: Request
    allow: Allow
    start: float  # time.monotonic() at arrival
    # Some backend serves the model, or a report knows it: read once at admission; True once bound.
    known: bool
    answer: Answer | None = None  # answered at once, unbound (the throttle's 429; a refusal)
    code: str = "499"  # the status the client got so far: "499" until an answer or a response began
    tried: set[str] = field(default_factory=set)  # backends that failed it before its first byte
    lease: Lease | None = None
    meter: UsageMeter | None = None  # the response's usage, read when the limits or fairness need it
    stream: bool = False  # the response is an event stream (``responded``)
    first_byte: bool = False
    ended: bool = False

    @property
    def model(self) -> str:
        return self.req.model

    @property
    def backend(self) -> str | None:
        """Where the request is bound (None: not bound)."""
        return self.lease.backend if self.lease is not None else None


class Lifecycle:
    """Runs each request's steps over the scheduler, for any door (module docstring)."""

    def __init__(
        self, scheduler: Scheduler, telemetry: Telemetry, settings: RouterSettings, requests: RequestCounter
    ) -> None:
        self.scheduler, self.telemetry, self.settings, self.requests = scheduler, telemetry, settings, requests

    def backends(self) -> list[ReadOnlyBackendState]:
        """Every backend, read-only (a door's subset hint, endpoints, readiness)."""
        return self.scheduler.backends()

    # --- admission ----------------------------------------------------------------------
    def counted(self, code: str, start: float) -> None:
        """Count a request answered without a ticket: before admission (a bad or oversized body)
        or without a model (a gateway's ``GET /v1/models``)."""
        self.telemetry.answered(self.telemetry.model_label(None, known=False), code, time.monotonic() - start)

    def admit(self, model: str, start: float, body: RequestBody | None = None) -> Ticket:
        """A request for ``model`` (``body``: its parsed body; None when the model came in a header)
        -> its ticket, counted in the request windows; a throttled one carries its 429 instead."""
        known = self.scheduler.known(model)
        prompt_tokens = body.prompt_tokens if body is not None else 0
        verdict = self.scheduler.limit(model, prompt_tokens)
        if isinstance(verdict, Throttle):  # before it counts as demand (core.ratelimit says why)
            return Ticket(Request(model), ALLOW, start, known, Answer.throttle(verdict), "429")
        max_tokens, prompt = (body.max_tokens, body.prompt) if body is not None else (None, "")
        req = self.scheduler.request_for(model, prompt_tokens, max_tokens, prompt=prompt)
        # Counted once per client request, at admission: retries and waits do not count again.
        counted_known = req.is_adapter and known
        self.requests.count(model, is_adapter=req.is_adapter, known=counted_known, now_s=start, wall_s=time.time())
        return Ticket(req, verdict, start, known)

    async def acquire(
        self, ticket: Ticket, outside: frozenset[str] = frozenset(), *, max_wait_s: float | None = None
    ) -> Lease | Answer:
        """Bind the ticket (``outside``: backends it may not go to, a gateway's subset hint;
        ``max_wait_s``: the door's bound on a hold) -> the lease, or admission's refusal."""
        try:
            lease = await self.scheduler.acquire(ticket.req, outside | ticket.tried, max_wait_s=max_wait_s)
        except Refused as exc:
            ticket.answer = Answer.refusal(exc.refusal, self.settings.retry_after_s)
            ticket.code = ticket.answer.code
            return ticket.answer
        ticket.lease, ticket.known, ticket.answer = lease, True, None
        return lease

    def alternatives(self, ticket: Ticket, outside: frozenset[str], count: int) -> list[str]:
        """Up to ``count`` backends to fall back to if the bound one fails, best first."""
        assert ticket.lease is not None
        return self.scheduler.alternatives(ticket.lease, outside | ticket.tried, count)

    # --- the response -------------------------------------------------------------------
    def responded(self, ticket: Ticket, status: int | str, *, stream: bool) -> None:
        """The backend's answer began (``status`` and headers, on their way to the client): its body
        is read for usage from now when the adapter is token-limited or fair dispatch settles it."""
        ticket.code, ticket.stream = str(status), stream
        if self.scheduler.meters(ticket.allow):
            ticket.meter = UsageMeter(ticket.req.prompt_tokens, stream=stream)

    def feed(self, ticket: Ticket, chunk: bytes) -> None:
        """Response body bytes, as relayed (before the write: a client that leaves cancels mid-write)."""
        if ticket.meter is not None and chunk:
            ticket.meter.feed(chunk)

    def first_byte(self, ticket: Ticket) -> None:
        """The response's first body bytes reached the client: out of the engine's prefill queue;
        a stream's time to first token."""
        if ticket.first_byte:
            return
        ticket.first_byte = True
        if ticket.stream:
            self.telemetry.ttft.observe(time.monotonic() - ticket.start)
        if ticket.lease is not None:
            self.scheduler.first_token(ticket.lease)

    # --- a backend that fails it ----------------------------------------------------------
    def retry(self, ticket: Ticket, reason: str, *, down: bool) -> None:
        """The bound backend failed before anything reached the client (``reason``: connect,
        disconnect, 503, 404, dropped): release it, count the retry, and (``down``) take it out
        of rotation; the next ``acquire`` goes elsewhere."""
        lease = ticket.lease
        assert lease is not None
        ticket.tried.add(lease.backend)
        self.telemetry.retries.labels(reason).inc()
        if down:
            self.scheduler.mark_down(lease.state, reason)
        self.scheduler.release(lease, (ticket.req.prompt_tokens, 0))  # it ran nothing: the prompt at most
        ticket.lease, ticket.meter, ticket.first_byte, ticket.code = None, None, False, "499"

    def moved(self, ticket: Ticket, backend: str) -> bool:
        """A gateway sent the request to ``backend`` (a backend id), not where it was bound: count
        it there; False when ``backend`` is not one of the pool's."""
        state = self.scheduler.backend(backend)
        if ticket.lease is None or state is None:
            return False
        ticket.lease = self.scheduler.moved(ticket.lease, state)
        return True

    def model_missing(self, ticket: Ticket) -> bool:
        """The backend answered 404 for the model: forget it there; True when another backend
        that is up lists it (retry there)."""
        return ticket.lease is not None and self.scheduler.model_missing(ticket.lease)

    def failed(self, ticket: Ticket, reason: str) -> None:
        """The bound backend failed the request (mid-response, or the gateway could not reach it):
        out of rotation until a poll succeeds."""
        if ticket.lease is not None:
            self.scheduler.mark_down(ticket.lease.state, reason)

    # --- the end ------------------------------------------------------------------------
    def end(self, ticket: Ticket, code: str | None = None) -> None:
        """The request is over: release its lease with the usage read, settle its tokens, count the
        answer with ``code`` (None: the status the client got, ``Ticket.code``; "499" when the
        client left before any answer began). Once."""
        if ticket.ended:
            return
        ticket.ended = True
        code = code or ticket.code
        meter = ticket.meter if ticket.meter is not None and ticket.meter.fed else None
        if ticket.lease is not None:  # unread (no body seen): fair dispatch keeps its estimate
            self.scheduler.release(ticket.lease, meter.split() if meter is not None else None)
        if ticket.allow.metered:  # unread: the estimate charged at admission stands
            self.scheduler.settle(
                ticket.model, ticket.allow, meter.total() if meter is not None else ticket.allow.charged
            )
        label = self.telemetry.model_label(ticket.model, known=ticket.known)
        self.telemetry.answered(label, code, time.monotonic() - ticket.start)
