"""Publish what the engine holds on the sidecar's own Pod: the report channel's writer (shell).

One strategic-merge PATCH of ``pods/<self>/status`` carries both the annotation
``lorapool.io/adapters`` and the pod condition ``lorapool.io/adapters-synced``
(``lorapool.api.report``), written with the Pod's ServiceAccount token, which is projected
into the sidecar container only; the Role allows ``patch`` on ``pods/status`` in the pool's
namespace and nothing else. ``core.Pacer`` decides when: nothing while nothing changes, at
most one write per ``min_interval_s`` while adapters load, retries with backoff.

Credentials: ``--report-kubeconfig`` (local playground and tests: a ServiceAccount token
kubeconfig), else in-cluster. The Pod: ``--pod NAMESPACE/NAME``, else
``$POD_NAMESPACE``/``$POD_NAME`` from the downward API. Without a Pod, reporting is off. The
patch itself, the credentials and ``PodRef`` live in ``lorapool.podstatus``, shared with the
router, which writes its request counts on its own Pod the same way.

``Observer`` scrapes the engine's own ``/metrics`` next to the sidecar (loopback in the pod)
every ``sample_s`` and keeps the last closed window's ``Observations`` (``sidecar.observations``);
the report carries them, so they change, and cost a write, once per window.
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

from lorapool.api.report import Observations
from lorapool.api.vllm_versions import version_of
from lorapool.podstatus import ApiServer, PodRef, patch_status
from lorapool.podstatus import session as api_session
from lorapool.sidecar.observations import Window, parse_sample
from lorapool.sidecar.podreport import Pacer

log = logging.getLogger("lorapool.sidecar")

Build = Callable[[], dict[str, Any]]  # -> the strategic-merge patch body to send


class Reporter:
    """Sends ``build()``'s patch whenever it differs from the last one sent, paced by ``podreport.Pacer``."""

    def __init__(
        self,
        server: ApiServer,
        pod: PodRef,
        build: Build,
        *,
        min_interval_s: float = 2.0,
        check_s: float = 0.5,
        timeout_s: float = 10.0,
        on_write: Callable[[bool], None] | None = None,
    ) -> None:
        self.server, self.pod, self.build = server, pod, build
        self.pacer = Pacer(min_interval_s=min_interval_s)
        self.check_s = check_s
        self.timeout_s = timeout_s
        self.on_write = on_write or (lambda ok: None)
        self.writes = 0
        self.last_error: str | None = None

    def _document(self) -> str:
        return json.dumps(self.build(), sort_keys=True)

    def up_to_date(self) -> bool:
        """The last report sent is what ``build()`` gives now: nothing is waiting to go out."""
        return self.pacer.next_write_at(self._document(), time.monotonic()) is None

    async def run(self, stop: asyncio.Event) -> None:
        async with api_session(self.server, self.timeout_s) as http:
            while not stop.is_set():
                document = self._document()
                due = self.pacer.next_write_at(document, time.monotonic())
                if due is not None and due <= time.monotonic():
                    await self._send(http, document)
                    continue
                wait = self.check_s if due is None else min(self.check_s, due - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(wait, 0.01))

    async def _send(self, http: aiohttp.ClientSession, document: str) -> None:
        error = await patch_status(http, self.server, self.pod, document)
        if error is not None:
            self.pacer = self.pacer.failed(time.monotonic())
            if error != self.last_error:
                log.warning(
                    "Failed to report adapters on Pod",
                    extra={"kv": {"pod": f"{self.pod.namespace}/{self.pod.name}", "error": error}},
                )
            self.last_error = error
            self.on_write(False)
            return
        self.pacer = self.pacer.sent(document, time.monotonic())
        self.writes += 1
        if self.last_error is not None:
            log.info("Reported adapters on Pod again", extra={"kv": {"pod": f"{self.pod.namespace}/{self.pod.name}"}})
        self.last_error = None
        self.on_write(True)


async def read_version(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> str | None:
    """An engine's ``GET /version``; None when it does not answer one (``version_of``)."""
    async with session.get(url, headers=dict(headers)) as resp:
        if resp.status != 200:
            return None
        try:
            return version_of(await resp.json(content_type=None))
        except ValueError:
            return None


class Observer:
    """Samples the engine's ``/metrics`` every ``sample_s``; ``latest`` is the last closed window."""

    def __init__(
        self,
        engine_url: str,
        *,
        window_s: float = 60.0,
        sample_s: float = 2.0,
        timeout_s: float = 5.0,
        headers: dict[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = engine_url.rstrip("/") + "/metrics"
        self.window = Window(window_s=window_s, max_gap_s=max(5 * sample_s, 10.0))
        self.sample_s = sample_s
        self.timeout_s = timeout_s
        self.headers = headers or {}
        self.clock = clock
        self.latest: Observations | None = None
        self.last_error: str | None = None
        self.version_url = engine_url.rstrip("/") + "/version"
        self.version: str | None = None  # the engine's GET /version, read again after any failed scrape

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set():
                await self.sample(session)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.sample_s)

    async def sample(self, session: aiohttp.ClientSession) -> None:
        """One scrape; a failed one is skipped (the window's time weights absorb the gap)."""
        try:
            if self.version is None or self.last_error is not None:  # first, or the engine may have restarted
                self.version = await self._read_version(session)
            async with session.get(self.url, headers=self.headers) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status} from {self.url}")
                sample = parse_sample(await resp.text(), self.version or "unknown")  # unknown: nothing read
        except (aiohttp.ClientError, TimeoutError, RuntimeError, OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if error != self.last_error:
                log.warning("Failed to read engine metrics", extra={"kv": {"url": self.url, "error": error}})
            self.last_error = error
            return
        self.last_error = None
        if (closed := self.window.add(sample, self.clock())) is not None:
            self.latest = closed

    async def _read_version(self, session: aiohttp.ClientSession) -> str | None:
        version = await read_version(session, self.version_url, self.headers)
        if version != self.version:
            log.info("Engine version", extra={"kv": {"url": self.version_url, "version": version or "unknown"}})
        return version
