"""The endpoint picker: Envoy's ext_proc ``Process`` stream, one per HTTP request, over the router's scheduler.

Shell. Each stream reads the request's ``model`` (its body, or ``x-gateway-model-name``), asks the
same ``Scheduler`` the HTTP proxy asks (policy, holds, reports, request windows), answers with the
picked endpoint or an immediate 400/404/413/429/503 in the HTTP router's words, and tracks the
request to its end: the endpoint that served (``x-gateway-destination-endpoint-served``) carries
its lease, and the response's end, or the stream's cancel when the client leaves, releases it.

Body modes (Envoy tells which in the first message's ``protocol_config``):

- ``FULL_DUPLEX_STREAMED``: the header answer (the pick) waits for the request body's end, and
  Envoy takes no body answer before it, so the request's chunks are sent back right after the
  pick; every response chunk is echoed at once.
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

from lorapool.router.core.openai import BadBody, RequestBody, parse_request, too_large_message
from lorapool.router.core.ratelimit import Allow, Throttle
from lorapool.router.core.requestcount import RequestCounter
from lorapool.router.core.usage import UsageMeter
from lorapool.router.picker import protocol
from lorapool.router.picker.endpoints import Endpoints
from lorapool.router.scheduler import Lease, Refused, Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry

log = logging.getLogger("lorapool.router.picker")

FULL_DUPLEX, STREAMED = protocol.FULL_DUPLEX_STREAMED, protocol.STREAMED
# A hold ends this long before the gateway's message timeout, so the answer arrives in time.
HOLD_MARGIN_S = 0.05


@dataclass
class _Exchange:
    """One HTTP request's state across its ext_proc messages."""

    start: float
    body_mode: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    subset: frozenset[str] | None = None
    chunks: list[bytes] = field(default_factory=list)  # the request body until the pick
    size: int = 0
    decided: bool = False
    lease: Lease | None = None
    model: str | None = None
    known: bool = False
    code: str = "499"  # until a response or an immediate answer says otherwise
    first_byte: bool = False
    finished: bool = False
    allow: Allow | None = None  # the rate limits' verdict once picked
    prompt_tokens: int = 0
    meter: UsageMeter | None = None  # a token-limited adapter's (or, fair dispatch: any) response


class Picker:
    """The ``envoy.service.ext_proc.v3.ExternalProcessor`` servicer (``Process``)."""

    def __init__(
        self,
        scheduler: Scheduler,
        telemetry: Telemetry,
        settings: RouterSettings,
        requests: RequestCounter,
        endpoints: Endpoints,
        upstream: Mapping[str, str] | None = None,
    ) -> None:
        self.scheduler, self.telemetry, self.settings = scheduler, telemetry, settings
        self.requests, self.endpoints = requests, endpoints
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
        if kind == "request_headers":
            return await self._request_headers(ex, message)
        if kind == "request_body":
            return await self._request_body(ex, message.request_body)
        if kind == "response_headers":
            return self._response_headers(ex, message)
        if kind == "response_body":
            return self._response_body(ex, message.response_body)
        if kind == "response_trailers":
            self._finish(ex)
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
            return [self._refuse_now(ex, 400, msg, "BadRequestError")]
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
            return [self._refuse_now(ex, 413, too_large_message(None, limit), "RequestEntityTooLarge")]
        if not body.end_of_stream:
            return []  # full duplex: Envoy takes body answers only after the header answer (the pick)
        chunks, ex.chunks = ex.chunks, []
        try:
            parsed = parse_request(b"".join(chunks))
        except BadBody as exc:
            return [self._refuse_now(ex, exc.status, exc.message, exc.error_type, param=exc.param)]
        answer = await self._pick(ex, parsed.model, phase="request_headers" if duplex else "request_body", body=parsed)
        if not duplex or not answer.HasField("request_headers"):
            return [answer]
        last = len(chunks) - 1
        return [answer, *(protocol.echo(c, i == last, phase="request_body") for i, c in enumerate(chunks))]

    async def _pick(self, ex: _Exchange, model: str | None, *, phase: str, body: RequestBody | None = None) -> Any:
        """Bind the request (or, without a model, send it to any live backend) and say where.
        ``body``: the parsed body (None when the model came in a header: its prompt is not known)."""
        ex.decided = True
        if model is None:
            return self._any_backend(ex, phase)
        ex.model = model
        ex.prompt_tokens = body.prompt_tokens if body is not None else 0
        verdict = self.scheduler.limit(model, ex.prompt_tokens)
        if isinstance(verdict, Throttle):  # before it counts as demand, as in the HTTP door
            ex.known, ex.code = self.scheduler.known(model), "429"
            return protocol.error(
                429, verdict.message, verdict.error_type, retry_after_s=verdict.retry_after_s, extra=verdict.headers
            )
        ex.allow = verdict
        max_tokens, prompt = (body.max_tokens, body.prompt) if body is not None else (None, "")
        req = self.scheduler.request_for(model, ex.prompt_tokens, max_tokens, prompt=prompt)
        known_adapter = req.is_adapter and self.scheduler.known(model)
        self.requests.count(model, is_adapter=req.is_adapter, known=known_adapter, now_s=ex.start, wall_s=time.time())
        ex.known = self.scheduler.known(model)
        outside = self._outside_subset(ex.subset)
        if outside is None:
            return self._refuse_now(ex, 503, self._empty_subset(ex.subset), "ServiceUnavailable", retry=True)
        try:
            ex.lease = await self.scheduler.acquire(req, outside, max_wait_s=self.hold_s)
        except Refused as exc:
            r = exc.refusal
            return self._refuse_now(ex, r.status, r.message, r.error_type, param=r.param, retry=r.retry)
        ex.known = True
        chosen = [ex.lease.backend]
        if self.settings.ext_proc_fallbacks:
            chosen += self.scheduler.alternatives(ex.lease, outside, self.settings.ext_proc_fallbacks)
        return protocol.picked([self.endpoints.of(b) for b in chosen], phase=phase, upstream=self.upstream)

    def _outside_subset(self, subset: frozenset[str] | None) -> frozenset[str] | None:
        """The backends the subset hint rules out (the request counts them as tried); None: it rules out all."""
        if subset is None:
            return frozenset()
        ids = [s.id for s in self.scheduler.backends()]
        outside = frozenset(b for b in ids if not protocol.in_subset(self.endpoints.of(b), subset))
        return None if len(outside) == len(ids) else outside

    def _empty_subset(self, subset: frozenset[str] | None) -> str:
        hint = ", ".join(sorted(subset or ())) or "empty"
        return f"no backend of the pool is in the gateway's endpoint subset ({hint}); retry later"

    def _any_backend(self, ex: _Exchange, phase: str) -> Any:
        """A request without a model (GET /v1/models): the least loaded live backend in the subset."""
        outside = self._outside_subset(ex.subset) or frozenset()
        live = [s for s in self.scheduler.backends() if s.up and s.id not in outside]
        if not live:
            return self._refuse_now(ex, 503, "no backend is up; retry later", "ServiceUnavailable", retry=True)
        best = min(live, key=lambda s: s.inflight_total)
        return protocol.picked([self.endpoints.of(best.id)], phase=phase, upstream=self.upstream)

    def _refuse_now(
        self, ex: _Exchange, status: int, message: str, kind: str, *, param: str | None = None, retry: bool = False
    ) -> Any:
        ex.decided, ex.code = True, str(status)
        retry_after = self.settings.retry_after_s if retry else None
        return protocol.error(status, message, kind, param=param, retry_after_s=retry_after)

    # --- the response --------------------------------------------------------------------
    def _response_headers(self, ex: _Exchange, message: Any) -> list[Any]:
        headers = protocol.headers_of(message.response_headers)
        ex.code = headers.get(":status", ex.code)
        served = protocol.served_of(message)
        if ex.lease is not None and served is not None and served != self.endpoints.of(ex.lease.backend):
            self._moved(ex, served)
        if ex.lease is not None and ex.code == "404":
            self.scheduler.model_missing(ex.lease)  # our view of that backend was stale
        if ex.lease is not None and ex.code == "503" and protocol.UPSTREAM_TIME not in headers:
            # The gateway's own 503 (it could not connect, or the backend reset before answering),
            # not the backend's: out of rotation until a poll succeeds, as the HTTP proxy does.
            self.scheduler.mark_down(ex.lease.state, "the gateway could not reach it")
        if ex.allow is not None and self.scheduler.meters(ex.allow):
            stream = headers.get("content-type", "").startswith("text/event-stream")
            ex.meter = UsageMeter(ex.prompt_tokens, stream=stream)
        if message.response_headers.end_of_stream:
            self._finish(ex)
        return [protocol.add_headers("response_headers", ex.allow.headers if ex.allow is not None else ())]

    def _moved(self, ex: _Exchange, served: str) -> None:
        assert ex.lease is not None
        state = next((s for s in self.scheduler.backends() if self.endpoints.of(s.id) == served), None)
        if state is None:  # not one of ours (a FailOpen route, a stale endpoint): nothing to count there
            log.debug("Served by an endpoint outside the pool", extra={"endpoint": served})
            return
        ex.lease = self.scheduler.moved(ex.lease, state)

    def _response_body(self, ex: _Exchange, body: Any) -> list[Any]:
        if not ex.first_byte and body.body:
            ex.first_byte = True
            self.telemetry.ttft.observe(time.monotonic() - ex.start)
            if ex.lease is not None:
                self.scheduler.first_token(ex.lease)
        if ex.meter is not None:
            ex.meter.feed(body.body)
        if body.end_of_stream:
            self._finish(ex)
        if ex.body_mode == FULL_DUPLEX:
            return [protocol.echo(body.body, body.end_of_stream, phase="response_body")]
        return [protocol.proceed("response_body")]

    def _finish(self, ex: _Exchange) -> None:
        """The request is over (answered, ended or cancelled): release its slot, count its answer. Once."""
        if ex.lease is not None:  # no body seen (the gateway's mode): fair dispatch keeps its estimate
            self.scheduler.release(ex.lease, ex.meter.split() if ex.meter is not None and ex.meter.fed else None)
        if ex.decided and not ex.finished:
            ex.finished = True
            if ex.allow is not None and ex.allow.metered:  # no body seen (the gateway's mode): the estimate
                used = ex.meter.total() if ex.meter is not None else ex.allow.charged
                self.scheduler.settle(ex.model or "", ex.allow, used)
            label = self.telemetry.model_label(ex.model, known=ex.known)
            self.telemetry.answered(label, ex.code, time.monotonic() - ex.start)
