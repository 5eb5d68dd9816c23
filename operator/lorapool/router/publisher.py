"""Write each closed window of request counts, and the policy document in force, on the router's own Pod (shell).

One strategic-merge patch of ``pods/<self>/status`` per closed window, carrying the annotation
``lorapool.io/requests`` (``api.requests``), which the operator sums over its pool's router pods
into each adapter's request rate for placement. One write per router pod per window, never one
per request; with the default 60 s window a pool of 3 routers costs 3 writes a minute.

The router's states go the same way, each in its annotation, written when it changes: the router
policy state (``api.routerpolicy.PolicyState``: the hash of the document in force, and the last edit
refused with its reason) in ``lorapool.io/router-policy``, which the operator reads into the pool's
``RouterPolicyAccepted`` condition; the shared books' state (``api.books.BooksState``: the store
reachable or not, the peers seen) in ``lorapool.io/shared-books``, read into ``SharedBooks``.

A failed write is logged once per distinct reason (no credentials in it) and not retried on its
own: the next window, a fresher one, is written at its close. Serving never waits on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

import aiohttp

from lorapool.api.books import ANNOTATION as BOOKS_ANNOTATION
from lorapool.api.books import BooksState
from lorapool.api.books import encode_state as encode_books
from lorapool.api.requests import ANNOTATION, RequestWindow, encode
from lorapool.api.routerpolicy import ANNOTATION as POLICY_ANNOTATION
from lorapool.api.routerpolicy import PolicyState, encode_state
from lorapool.podstatus import ApiServer, PodRef, patch_status
from lorapool.podstatus import session as api_session
from lorapool.router.core.requestcount import RequestCounter

log = logging.getLogger("lorapool.router.publisher")

# Past a window's end before writing it: the counter closes windows on the clock, so the
# publisher wakes just after the boundary rather than on it.
LATE_S = 0.01


def patch_document(window: RequestWindow) -> str:
    """The Pod status patch that publishes ``window``."""
    return json.dumps({"metadata": {"annotations": {ANNOTATION: encode(window)}}}, separators=(",", ":"))


def annotations_patch(annotations: dict[str, str]) -> str:
    """The Pod status patch that publishes the router's states (annotation -> value)."""
    return json.dumps({"metadata": {"annotations": annotations}}, separators=(",", ":"))


def policy_patch(state: PolicyState) -> str:
    """The Pod status patch that publishes the router's policy state."""
    return annotations_patch({POLICY_ANNOTATION: encode_state(state)})


class Publisher:
    """Writes ``counter``'s last closed window on ``pod`` each time one closes."""

    def __init__(
        self,
        server: ApiServer,
        pod: PodRef,
        counter: RequestCounter,
        *,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.server, self.pod, self.counter = server, pod, counter
        self.timeout_s = timeout_s
        self.clock, self.wall = clock, wall
        self.sent: RequestWindow | None = None  # the last window written
        self.writes = 0
        self.failures = 0
        self.last_error: str | None = None
        self.policy: PolicyState | None = None  # the policy state to publish
        self.states: dict[str, str] = {}  # annotation -> the value to publish (the policy, the books)
        self.states_sent: dict[str, str] = {}  # annotation -> the value last written
        self._wake = asyncio.Event()

    def set_policy_state(self, state: PolicyState) -> None:
        """Publish ``state`` now (at the latest with the next window, when a write fails)."""
        self.policy = state
        self._set_state(POLICY_ANNOTATION, encode_state(state))

    def set_books_state(self, state: BooksState) -> None:
        """Publish the shared books' ``state`` now (as the policy state)."""
        self._set_state(BOOKS_ANNOTATION, encode_books(state))

    def _set_state(self, annotation: str, value: str) -> None:
        self.states[annotation] = value
        self._wake.set()

    def _unsent(self) -> dict[str, str]:
        return {k: v for k, v in self.states.items() if self.states_sent.get(k) != v}

    async def run(self, stop: asyncio.Event) -> None:
        async with api_session(self.server, self.timeout_s) as http:
            while not stop.is_set():
                if unsent := self._unsent():
                    await self._write_states(http, unsent)
                wait_s = self.counter.closes_at_s - self.clock() + LATE_S
                await self._sleep(stop, max(wait_s, LATE_S))
                if stop.is_set():
                    return
                if self._wake.is_set() and self.clock() < self.counter.closes_at_s:
                    continue  # woken for the policy state, not a window
                self.counter.roll(self.clock(), self.wall())
                window = self.counter.last  # GET /lorapool/requests may have closed it already
                if window is not None and window is not self.sent:
                    await self._write(http, window)

    async def _sleep(self, stop: asyncio.Event, wait_s: float) -> None:
        """Until ``stop``, a new policy state or ``wait_s`` seconds, whichever comes first."""
        if self._wake.is_set():
            self._wake.clear()
            if self._unsent():
                return
        waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())}
        try:
            await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()

    async def _write_states(self, http: aiohttp.ClientSession, unsent: dict[str, str]) -> None:
        error = await patch_status(http, self.server, self.pod, annotations_patch(unsent))
        if error is not None:
            self.failures += 1
            log.warning(
                "Failed to publish the router's state on Pod; retrying",
                extra={"kv": {"pod": str(self.pod), "error": error, "annotations": sorted(unsent)}},
            )
            return
        self.states_sent.update(unsent)
        self.writes += 1

    async def _write(self, http: aiohttp.ClientSession, window: RequestWindow) -> None:
        error = await patch_status(http, self.server, self.pod, patch_document(window))
        if error is not None:
            self.failures += 1
            if error != self.last_error:
                log.warning(
                    "Failed to publish request counts on Pod; retrying with the next window",
                    extra={"kv": {"pod": str(self.pod), "error": error}},
                )
            self.last_error = error
            return
        self.sent = window
        self.writes += 1
        if self.last_error is not None:
            log.info("Published request counts on Pod again", extra={"kv": {"pod": str(self.pod)}})
        self.last_error = None
