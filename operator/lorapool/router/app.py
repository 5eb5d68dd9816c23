"""The router's HTTP surface: an OpenAI-compatible proxy in front of the scheduler.

Shell only, a protocol adapter over ``lifecycle`` (which runs the request's life, as it does for
the endpoint picker): parses just enough of a request to route it (``model``), hands the raw body to
the chosen backend unchanged and relays the answer; streamed (SSE) answers are relayed chunk
by chunk as they arrive. Retries another backend on connect failure, 503 or a backend that
fails before anything reached the client; after that, a failing backend ends the stream with an
SSE error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from lorapool.api.requests import encode
from lorapool.router.core.openai import BadBody, error_body, parse_request
from lorapool.router.core.requestcount import RequestCounter
from lorapool.router.lifecycle import Answer, Lifecycle, Ticket
from lorapool.router.scheduler import Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry

log = logging.getLogger("lorapool.router")

# Headers that describe one hop, not the message (RFC 9110 7.6.1), plus those we recompute.
HOP_HEADERS = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length",
        "accept-encoding", "content-encoding", "date", "server",
    }
)  # fmt: skip
BACKEND_HEADER = "X-Lorapool-Backend"

SCHEDULER: web.AppKey[Scheduler] = web.AppKey("scheduler", Scheduler)
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)
TELEMETRY: web.AppKey[Telemetry] = web.AppKey("telemetry", Telemetry)
SETTINGS: web.AppKey[RouterSettings] = web.AppKey("settings", RouterSettings)
REQUESTS: web.AppKey[RequestCounter] = web.AppKey("requests", RequestCounter)


def error_response(answer: Answer) -> web.Response:
    """An immediate answer as the client sees it: its status, OpenAI error body and headers."""
    return web.json_response(answer.body(), status=answer.status, headers=dict(answer.headers) or None)


def forward_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_HEADERS)


class _Retry(Exception):
    """The backend failed before anything reached the client: try another one."""

    def __init__(self, reason: str, *, down: bool) -> None:
        super().__init__(reason)
        self.reason, self.down = reason, down


class Proxy:
    """Request handlers; one instance per app."""

    def __init__(
        self,
        scheduler: Scheduler,
        session: aiohttp.ClientSession,
        telemetry: Telemetry,
        settings: RouterSettings,
        requests: RequestCounter,
    ) -> None:
        self.scheduler, self.session = scheduler, session
        self.telemetry, self.settings = telemetry, settings
        self.requests = requests
        self.lifecycle = Lifecycle(scheduler, telemetry, settings, requests)
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=settings.connect_timeout_s, sock_read=settings.read_timeout_s
        )
        self._urls: dict[tuple[str, str], URL] = {}
        # Handler tasks still waiting for a backend's first byte, by backend; those given up on.
        self._awaiting: dict[str, set[asyncio.Task[Any]]] = {}
        self._gave_up: set[asyncio.Task[Any]] = set()
        scheduler.departure_hooks.append(self._departed)

    # --- OpenAI endpoints -----------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        """The request's life (``lifecycle``) over HTTP: read and parse the body, admit, route,
        relay; ended once, with the status the client got ("499": it left before any answer began)."""
        start = time.monotonic()
        tickets: list[Ticket] = []
        response: web.StreamResponse | None = None
        try:
            response = await self._completions(request, start, tickets)
            return response
        finally:
            code = str(response.status) if response is not None else None
            if tickets:
                self.lifecycle.end(tickets[0], code)
            else:
                self.lifecycle.counted(code or "499", start)

    async def _completions(self, request: web.Request, start: float, tickets: list[Ticket]) -> web.StreamResponse:
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return error_response(Answer.too_large(request.content_length, limit))
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return error_response(Answer.too_large(None, limit))
        try:
            parsed = parse_request(body)
        except BadBody as exc:
            return error_response(Answer.bad_body(exc))
        ticket = self.lifecycle.admit(parsed.model, start, parsed)
        tickets.append(ticket)
        if ticket.answer is not None:
            return error_response(ticket.answer)
        return await self._route(request, body, ticket)

    async def _route(self, request: web.Request, body: bytes, ticket: Ticket) -> web.StreamResponse:
        while True:
            lease = await self.lifecycle.acquire(ticket)
            if isinstance(lease, Answer):
                return error_response(lease)
            try:
                return await self._forward(request, body, ticket, lease.backend)
            except _Retry as exc:
                self.lifecycle.retry(ticket, exc.reason, down=exc.down)
                log.debug("Retried request elsewhere", extra={"backend": lease.backend})

    def _upstream_url(self, backend: str, request: web.Request) -> URL:
        """The backend's URL for the request's path, parsed once per backend and path."""
        key = (backend, request.raw_path)
        url = self._urls.get(key)
        if url is None:
            url = URL(f"{backend}{request.raw_path}", encoded=True)
            if not request.query_string:  # query strings vary: do not let them grow the cache
                self._urls[key] = url
        return url

    # --- a backend that leaves --------------------------------------------------------------
    def _departed(self, backend: str) -> None:
        """``backend`` left the pool's endpoints (its pod is stopping): each request still waiting
        for its first byte gets ``departed_grace_s`` more (a draining engine answers in that time),
        then is retried elsewhere. Safe: nothing of its answer reached the client yet."""
        loop = asyncio.get_running_loop()
        for task in self._awaiting.get(backend, ()):
            loop.call_later(self.settings.departed_grace_s, self._give_up, backend, task)

    def _give_up(self, backend: str, task: asyncio.Task[Any]) -> None:
        if task in self._awaiting.get(backend, ()):
            self._gave_up.add(task)
            task.cancel()

    async def _forward(self, request: web.Request, body: bytes, ticket: Ticket, backend: str) -> web.StreamResponse:
        """``_send`` while the task is counted as waiting on ``backend``; a give-up becomes a retry."""
        task = asyncio.current_task()
        assert task is not None
        awaiting = self._awaiting.setdefault(backend, set())
        awaiting.add(task)
        try:
            return await self._send(request, body, ticket, backend, lambda: awaiting.discard(task))
        except asyncio.CancelledError:
            if task not in self._gave_up:
                raise  # the client left (aiohttp cancels its handler)
            self._gave_up.discard(task)
            task.uncancel()
            raise _Retry("departed", down=False) from None
        finally:
            awaiting.discard(task)
            if not awaiting:
                self._awaiting.pop(backend, None)

    async def _send(
        self, request: web.Request, body: bytes, ticket: Ticket, backend: str, arrived: Callable[[], None]
    ) -> web.StreamResponse:
        """Send the request to ``backend`` and relay its answer; ``arrived``: its first byte came."""
        url = self._upstream_url(backend, request)
        headers = forward_headers(request.headers)
        if "Authorization" in self.session.headers:
            headers.popall("Authorization", None)  # the engines want their key, not the client's
        try:
            upstream = await self.session.post(url, data=body, headers=headers, timeout=self.timeout)
        except aiohttp.ClientConnectorError as exc:
            raise _Retry("connect", down=True) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Closed before any answer: maybe a stale pooled connection, maybe a dying
            # backend. Try elsewhere; the poller decides whether it is down.
            raise _Retry("disconnect", down=False) from exc
        try:
            if upstream.status == 503:
                raise _Retry("503", down=False)
            if upstream.status == 404 and self.lifecycle.model_missing(ticket):  # our view of it was stale
                raise _Retry("404", down=False)
            headers = forward_headers(upstream.headers)
            if self.settings.backend_header:
                headers[BACKEND_HEADER] = backend
            headers.extend(ticket.allow.headers)
            stream = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            self.lifecycle.responded(ticket, upstream.status, stream=stream)
            if stream:
                return await self._relay_stream(request, upstream, headers, ticket, arrived)
            try:
                data = await upstream.read()
            except (aiohttp.ClientError, TimeoutError) as exc:  # nothing reached the client yet
                raise _Retry("dropped", down=True) from exc
            arrived()
            self.lifecycle.feed(ticket, data)
            self.lifecycle.first_byte(ticket)
            return web.Response(body=data, status=upstream.status, headers=headers)
        except BaseException:
            upstream.close()  # drop the connection: the backend sees the cancel at once
            raise
        finally:
            upstream.release()

    async def _relay_stream(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        headers: CIMultiDict[str],
        ticket: Ticket,
        arrived: Callable[[], None],
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, headers=headers)
        response.enable_chunked_encoding()
        chunks = upstream.content.iter_any()
        while True:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError) as exc:
                if not response.prepared:  # the backend sent headers, then died: nothing reached the client yet
                    raise _Retry("dropped", down=True) from exc
                self._failed_mid_response(ticket, exc)
                event = error_body(502, f"backend failed mid-stream: {exc!r}", "BadGateway")
                with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionError):
                    await response.write(f"data: {json.dumps(event)}\n\n".encode())
                return response
            arrived()  # from here the client may see bytes: never given up on, never retried
            self.lifecycle.feed(ticket, chunk)  # before the write: a client that leaves cancels us mid-write
            try:
                if not response.prepared:
                    await response.prepare(request)
                    self.lifecycle.first_byte(ticket)
                await response.write(chunk)
            except (ConnectionError, aiohttp.ClientConnectionError):
                upstream.close()  # our client left: cancel the generation upstream
                return response
        if not response.prepared:
            await response.prepare(request)
        await response.write_eof()
        return response

    def _failed_mid_response(self, ticket: Ticket, exc: BaseException) -> None:
        self.telemetry.upstream_failures.inc()
        self.lifecycle.failed(ticket, f"failed mid-response: {exc!r}")
        log.warning("Marked backend down", extra={"backend": ticket.backend, "error": repr(exc)})

    # --- the rest -------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        """The union of the models the backends serve, base models first."""
        cards: dict[str, Mapping[str, Any]] = {}
        states = sorted(self.scheduler.backends(), key=lambda s: (not s.up, s.id))
        for state in states:
            for card in state.cards:
                cards.setdefault(str(card["id"]), card)
        data = sorted(cards.values(), key=lambda c: (bool(c.get("parent")), str(c["id"])))
        return web.json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        """200 while at least one backend is up (readiness), else 503."""
        states = self.scheduler.backends()
        up = sum(s.up for s in states)
        body = {"status": "ok" if up else "unavailable", "backends_up": up, "backends": len(states)}
        return web.json_response(body, status=200 if up else 503)

    async def livez(self, request: web.Request) -> web.Response:
        """200 while the process serves (liveness must not depend on the backends)."""
        return web.json_response({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.telemetry.exposition(), content_type="text/plain", charset="utf-8")

    async def request_counts(self, request: web.Request) -> web.Response:
        """The last closed window's requests per adapter (``api.requests``'s JSON); 404 before the first closes."""
        self.requests.roll(time.monotonic(), time.time())
        last = self.requests.last
        if last is None:
            msg = f"no window has closed yet; the first closes {self.requests.window_s:g} s after start"
            return web.json_response({"error": msg}, status=404)
        return web.Response(text=encode(last), content_type="application/json")


def build_app(
    scheduler: Scheduler,
    session: aiohttp.ClientSession,
    telemetry: Telemetry,
    settings: RouterSettings,
    requests: RequestCounter | None = None,
) -> web.Application:
    """The aiohttp application (run it with ``handler_cancellation=True``); ``requests``: the
    per-adapter request counter (a new one, windows from now, when not given)."""
    # Bodies above the limit fail in request.read(); the handler turns that into a 413.
    app = web.Application(client_max_size=settings.max_body_bytes)
    if requests is None:
        requests = RequestCounter(settings.requests_window_s, time.monotonic())
    proxy = Proxy(scheduler, session, telemetry, settings, requests)
    app[SCHEDULER], app[SESSION], app[TELEMETRY], app[SETTINGS], app[REQUESTS] = (
        scheduler,
        session,
        telemetry,
        settings,
        requests,
    )
    app.router.add_post("/v1/completions", proxy.completions)
    app.router.add_post("/v1/chat/completions", proxy.completions)
    app.router.add_get("/v1/models", proxy.models)
    app.router.add_get("/health", proxy.health)
    app.router.add_get("/livez", proxy.livez)
    app.router.add_get("/metrics", proxy.metrics)
    app.router.add_get("/lorapool/requests", proxy.request_counts)
    return app
