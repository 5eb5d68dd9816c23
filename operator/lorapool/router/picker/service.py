"""The endpoint picker: Envoy's ext_proc ``Process`` stream, one per HTTP request, over the request lifecycle.

Shell, a protocol adapter (Envoy messages) over ``router.lifecycle``, which runs the request's life
as it does for the HTTP proxy (limits, admission, holds, reports, request windows, the end). Each
stream reads the request's ``model`` (its body, or ``x-gateway-model-name``), admits it, answers
with the picked endpoint or an immediate 400/404/413/429/503 in the HTTP router's words, and tells
the lifecycle what the response does until its end: the endpoint that served (``x-gateway-destination-endpoint-served``) carries
its lease, and the response's end, or the stream's cancel when the client leaves, releases it.

Body modes (Envoy tells which in the first message's ``protocol_config``):

- ``FULL_DUPLEX_STREAMED``: the header answer (the pick) waits for the request body's end, and
  Envoy takes no body answer before it, so the request's body is sent back right after the pick,
  in one piece; an event stream's chunks are echoed at once, a JSON answer's whole at its end.
  Every message is a gRPC round of writes and wakeups, the picker's main cost: as few as GIE's.
- ``BUFFERED``: the headers are let through unanswered, the pick rides on the body's answer.
- ``STREAMED``: the headers must be answered before any body arrives, so the model must be in
  ``x-gateway-model-name``; without it the request gets a 400 naming the two other modes.

Holds are bounded by the gateway's per-message timeout (``--ext-proc-message-timeout``): a request
that would wait longer is sent best effort when the bound runs out, as after ``--max-wait``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from lorapool.router.core.openai import BadBody, RequestBody, parse_request
from lorapool.router.lifecycle import Answer, Lifecycle, Ticket
from lorapool.router.picker import protocol
from lorapool.router.picker.endpoints import Endpoints
from lorapool.router.settings import RouterSettings

log = logging.getLogger("lorapool.router.picker")

FULL_DUPLEX, STREAMED = protocol.FULL_DUPLEX_STREAMED, protocol.STREAMED
# A hold ends this long before the gateway's message timeout, so the answer arrives in time.
HOLD_MARGIN_S = 0.05


@dataclass
class _Exchange:
    """One HTTP request's state across its ext_proc messages."""

    start: float
    body_mode: int = 0  # the request body's mode
    response_mode: int = 0  # the response body's (a FailOpen gateway buffers requests, streams responses)
    headers: dict[str, str] = field(default_factory=dict)
    subset: frozenset[str] | None = None
    chunks: list[bytes] = field(default_factory=list)  # the request body until the pick
    size: int = 0
    hold_response: bool = False  # full duplex, not an event stream: its chunks go back together
    held: list[bytes] = field(default_factory=list)  # response bytes not sent back yet
    held_size: int = 0
    decided: bool = False
    ticket: Ticket | None = None  # once admitted (a request with a model)
    code: str = "499"  # until a response or an immediate answer says otherwise
    finished: bool = False


class Picker:
    """The ``envoy.service.ext_proc.v3.ExternalProcessor`` servicer (``Process``)."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        settings: RouterSettings,
        endpoints: Endpoints,
        upstream: Mapping[str, str] | None = None,
    ) -> None:
        self.lifecycle, self.settings, self.endpoints = lifecycle, settings, endpoints
        self.upstream = dict(upstream or {})  # set on every picked request (the engines' API key)
        self.hold_s = max(0.0, settings.ext_proc_message_timeout_s - HOLD_MARGIN_S)

    async def Process(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """The stream: answer each message in order; release the lease however the stream ends."""
        ex = _Exchange(time.monotonic())
        try:
            async for message in requests:
                for response in await self._answer(ex, message):
                    yield response
        finally:
            self._finish(ex)

    async def _answer(self, ex: _Exchange, message: Any) -> list[Any]:
        kind = message.WhichOneof("request")
        if message.HasField("protocol_config"):
            ex.body_mode = message.protocol_config.request_body_mode
            ex.response_mode = message.protocol_config.response_body_mode
        if kind == "request_headers":
            return await self._request_headers(ex, message)
        if kind == "request_body":
            return await self._request_body(ex, message.request_body)
        if kind == "response_headers":
            return self._response_headers(ex, message)
        if kind == "response_body":
            return self._response_body(ex, message.response_body)
        if kind == "response_trailers":  # the body's end, when the engine sends trailers: what is held goes first
            self._finish(ex)
            return [*self._release_held(ex, end_of_stream=False), protocol.proceed(kind)]
        return [protocol.proceed(kind)]  # trailers (and anything newer) go on unchanged

    # --- the request ---------------------------------------------------------------------
    async def _request_headers(self, ex: _Exchange, message: Any) -> list[Any]:
        ex.headers = protocol.headers_of(message.request_headers)
        ex.subset = protocol.subset_of(message)
        model = ex.headers.get(protocol.MODEL_HEADER)
        if message.request_headers.end_of_stream or model:  # no body (GET /v1/models), or told the model
            return [await self._pick(ex, model, phase="request_headers")]
        if ex.body_mode == STREAMED:
            msg = (
                f"the gateway streams request bodies to the picker only after the routing decision; give the model"
                f" in {protocol.MODEL_HEADER} or configure request_body_mode FULL_DUPLEX_STREAMED or BUFFERED"
            )
            return [self._answer_now(ex, Answer(400, msg, "BadRequestError"))]
        if ex.body_mode == FULL_DUPLEX:
            return []  # the answer waits for the body's end
        return [protocol.proceed("request_headers")]  # BUFFERED: the body follows this answer

    async def _request_body(self, ex: _Exchange, body: Any) -> list[Any]:
        duplex = ex.body_mode == FULL_DUPLEX
        if ex.decided:  # the model came in a header: the body only passes through, each chunk at once
            return [
                protocol.echo(body.body, body.end_of_stream, phase="request_body")
                if duplex
                else protocol.proceed("request_body")
            ]
        ex.chunks.append(body.body)
        ex.size += len(body.body)
        limit = self.settings.max_body_bytes
        if ex.size > limit:
            return [self._answer_now(ex, Answer.too_large(None, limit))]
        if not body.end_of_stream:
            return []  # full duplex: Envoy takes body answers only after the header answer (the pick)
        whole, ex.chunks = b"".join(ex.chunks), []
        try:
            parsed = parse_request(whole)
        except BadBody as exc:
            return [self._answer_now(ex, Answer.bad_body(exc))]
        answer = await self._pick(ex, parsed.model, phase="request_headers" if duplex else "request_body", body=parsed)
        if not duplex or not answer.HasField("request_headers"):
            return [answer]
        return [answer, *protocol.echo_held(whole, True, phase="request_body")]  # the body in one piece

    async def _pick(self, ex: _Exchange, model: str | None, *, phase: str, body: RequestBody | None = None) -> Any:
        """Admit and bind the request (or, without a model, send it to any live backend) and say
        where. ``body``: the parsed body (None when the model came in a header: its prompt is not known)."""
        ex.decided = True
        if model is None:
            return self._any_backend(ex, phase)
        try:
            return await self._route(ex, model, phase, body)
        except Exception:  # a bug of ours, not the request's: fail open here, whatever the gateway's mode
            log.exception(
                "The picker failed to route a request; naming a live endpoint instead", extra={"model": model}
            )
            ticket = ex.ticket
            if ticket is not None and ticket.lease is not None:  # bound before the failure: keep the binding
                return protocol.picked([self.endpoints.of(ticket.lease.backend)], phase=phase, upstream=self.upstream)
            return self._any_backend(ex, phase, model)

    async def _route(self, ex: _Exchange, model: str, phase: str, body: RequestBody | None) -> Any:
        """``_pick`` for a request with a model: admit, hold, bind, name the endpoint and its fallbacks."""
        ticket = ex.ticket = self.lifecycle.admit(model, ex.start, body)
        if ticket.answer is not None:  # throttled, before it counts as demand
            return self._answer_now(ex, ticket.answer)
        outside = self._outside_subset(ex.subset)
        if outside is None:
            return self._answer_now(ex, Answer.unavailable(self._empty_subset(ex.subset), self.settings.retry_after_s))
        lease = await self.lifecycle.acquire(ticket, outside, max_wait_s=self.hold_s)
        if isinstance(lease, Answer):
            return self._answer_now(ex, lease)
        chosen = [lease.backend]
        if self.settings.ext_proc_fallbacks:
            chosen += self.lifecycle.alternatives(ticket, outside, self.settings.ext_proc_fallbacks)
        return protocol.picked([self.endpoints.of(b) for b in chosen], phase=phase, upstream=self.upstream)

    def _outside_subset(self, subset: frozenset[str] | None) -> frozenset[str] | None:
        """The backends the subset hint rules out (the request counts them as tried); None: it rules out all."""
        if subset is None:
            return frozenset()
        ids = [s.id for s in self.lifecycle.backends()]
        outside = frozenset(b for b in ids if not protocol.in_subset(self.endpoints.of(b), subset))
        return None if len(outside) == len(ids) else outside

    def _empty_subset(self, subset: frozenset[str] | None) -> str:
        hint = ", ".join(sorted(subset or ())) or "empty"
        return f"no backend of the pool is in the gateway's endpoint subset ({hint}); retry later"

    def _any_backend(self, ex: _Exchange, phase: str, model: str | None = None) -> Any:
        """The least loaded live backend in the subset: for a request without a model (GET /v1/models),
        and for one the picker failed to route (``model``: preferring the backends that serve it)."""
        outside = self._outside_subset(ex.subset) or frozenset()
        live = [s for s in self.lifecycle.backends() if s.up and s.id not in outside]
        serving = [s for s in live if model is not None and model in (s.served_models() or ())]
        live = serving or live
        if not live:
            return self._answer_now(
                ex, Answer.unavailable("no backend is up; retry later", self.settings.retry_after_s)
            )
        best = min(live, key=lambda s: s.inflight_total)
        return protocol.picked([self.endpoints.of(best.id)], phase=phase, upstream=self.upstream)

    def _answer_now(self, ex: _Exchange, answer: Answer) -> Any:
        """An immediate response (no endpoint) in the HTTP router's words and headers."""
        ex.decided, ex.code = True, answer.code
        return protocol.error(
            answer.status, answer.message, answer.error_type, param=answer.param, extra=answer.headers
        )

    # --- the response --------------------------------------------------------------------
    def _response_headers(self, ex: _Exchange, message: Any) -> list[Any]:
        headers = protocol.headers_of(message.response_headers)
        ex.code = headers.get(":status", ex.code)
        ex.hold_response = not headers.get("content-type", "").startswith("text/event-stream")
        ticket = ex.ticket
        if ticket is not None and ticket.lease is not None:
            self._responded(ticket, message, headers, ex.code)
        if message.response_headers.end_of_stream:
            self._finish(ex)
        return [protocol.add_headers("response_headers", ticket.allow.headers if ticket is not None else ())]

    def _responded(self, ticket: Ticket, message: Any, headers: Mapping[str, str], code: str) -> None:
        """The backend's answer began: where it ran, what its status says about the backend."""
        served = protocol.served_of(message)
        if served is not None and served != self.endpoints.of(ticket.backend or ""):
            self._moved(ticket, served)
        if code == "404":
            self.lifecycle.model_missing(ticket)  # our view of that backend was stale
        if code == "503" and protocol.UPSTREAM_TIME not in headers:
            # The gateway's own 503 (it could not connect, or the backend reset before answering),
            # not the backend's: out of rotation until a poll succeeds, as the HTTP proxy does.
            self.lifecycle.failed(ticket, "the gateway could not reach it")
        self.lifecycle.responded(ticket, code, stream=headers.get("content-type", "").startswith("text/event-stream"))

    def _moved(self, ticket: Ticket, served: str) -> None:
        backend = next((s.id for s in self.lifecycle.backends() if self.endpoints.of(s.id) == served), None)
        if backend is None or not self.lifecycle.moved(ticket, backend):
            # not one of ours (a FailOpen route, a stale endpoint): nothing to count there
            log.debug("Served by an endpoint outside the pool", extra={"endpoint": served})

    def _response_body(self, ex: _Exchange, body: Any) -> list[Any]:
        if ex.ticket is not None:
            self.lifecycle.feed(ex.ticket, body.body)
            if body.body:
                self.lifecycle.first_byte(ex.ticket)
        if body.end_of_stream:
            self._finish(ex)
        if ex.response_mode != FULL_DUPLEX:
            return [protocol.proceed("response_body")]
        if not ex.hold_response:  # an event stream: every chunk goes on at once
            return [protocol.echo(body.body, body.end_of_stream, phase="response_body")]
        # One JSON answer: sent back whole at its end (Envoy passes its chunks in one go), not chunk
        # by chunk plus an empty end, as GIE's picker does; a large one in pieces as it comes.
        ex.held.append(body.body)
        ex.held_size += len(body.body)
        if not body.end_of_stream and ex.held_size < protocol.ECHO_PIECE_BYTES:
            return []
        return self._release_held(ex, end_of_stream=body.end_of_stream)

    def _release_held(self, ex: _Exchange, *, end_of_stream: bool) -> list[Any]:
        """The response bytes held so far, sent back (nothing when none are held)."""
        if not ex.held:
            return []
        held, ex.held, ex.held_size = b"".join(ex.held), [], 0
        return protocol.echo_held(held, end_of_stream, phase="response_body")

    def _finish(self, ex: _Exchange) -> None:
        """The request is over (answered, ended or cancelled): end its ticket, or count its answer. Once."""
        if ex.ticket is not None:
            self.lifecycle.end(ex.ticket, ex.code)
        elif ex.decided and not ex.finished:
            self.lifecycle.counted(ex.code, ex.start)
        ex.finished = True
