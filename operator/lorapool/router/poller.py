"""Keeps each backend's state fresh: /metrics and /v1/models every ``poll_interval_s``, the metrics
read by the backend's release (its ``GET /version``: an unknown one is read as nothing).

A connection refusal takes a backend out of rotation at once; slow or broken answers only
after ``poll_failures_down`` in a row (a busy engine can be slow to render /metrics). A
successful poll puts it back. Shell: aiohttp client, asyncio tasks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from lorapool.api.vllm_metrics import parse_metrics
from lorapool.api.vllm_versions import version_of
from lorapool.router.core.state import ReadOnlyBackendState
from lorapool.router.scheduler import Scheduler
from lorapool.router.settings import RouterSettings

log = logging.getLogger("lorapool.router.poller")


class Poller:
    """Polls every backend the scheduler knows, concurrently."""

    def __init__(self, scheduler: Scheduler, session: aiohttp.ClientSession, settings: RouterSettings) -> None:
        self.scheduler = scheduler
        self.session = session
        self.settings = settings
        self._failures: dict[str, int] = {}
        # Each backend's GET /version (api.vllm_versions.version_of; None: not a version), read when
        # first polled and again after a failed poll (it may have restarted as another release).
        self._versions: dict[str, str | None] = {}
        self._models_refresh: asyncio.Task[None] | None = None
        self._last_models_refresh = -1e9
        scheduler.refresh_models = self.refresh_models

    async def poll_all(self) -> None:
        """One round over every backend (also used before the router starts serving)."""
        await asyncio.gather(*(self._poll(s) for s in self.scheduler.backends()))
        self.scheduler.changed()

    async def run(self) -> None:
        """Poll forever."""
        while True:
            await asyncio.sleep(self.settings.poll_interval_s)
            await self.poll_all()

    async def _get(self, url: str, *, as_json: bool) -> Any:
        timeout = aiohttp.ClientTimeout(total=self.settings.poll_timeout_s)
        async with self.session.get(url, timeout=timeout) as resp:
            resp.raise_for_status()
            return await (resp.json(content_type=None) if as_json else resp.text())

    async def _poll(self, state: ReadOnlyBackendState) -> None:
        self.scheduler.scrape_started(state)
        try:
            if state.id not in self._versions:
                self._versions[state.id] = await self._version(state)
            page, models = await asyncio.gather(
                self._get(f"{state.id}/metrics", as_json=False),
                self._get(f"{state.id}/v1/models", as_json=True),
            )
            metrics = parse_metrics(page, self._versions[state.id] or "unknown")  # unknown: nothing read
            cards = models.get("data") if isinstance(models, dict) else None
            if not isinstance(cards, list):
                raise ValueError("/v1/models has no data list")
        except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
            self._failed(state, f"connection failed: {exc}", at_once=True)
            return
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self._failed(state, f"poll failed: {exc!r}", at_once=False)
            return
        self._failures.pop(state.id, None)
        if not state.up:
            log.info("Marked backend up", extra={"backend": state.id})
        self.scheduler.polled(state, metrics, (c for c in cards if isinstance(c, dict)))

    async def _version(self, state: ReadOnlyBackendState) -> str | None:
        """The backend's release; None when it answers no version (another server: routed, not read)."""
        try:
            return version_of(await self._get(f"{state.id}/version", as_json=True))
        except (aiohttp.ClientResponseError, ValueError):
            return None

    def _failed(self, state: ReadOnlyBackendState, reason: str, *, at_once: bool) -> None:
        self._versions.pop(state.id, None)
        count = self._failures.get(state.id, 0) + 1
        self._failures[state.id] = count
        if state.up and (at_once or count >= self.settings.poll_failures_down):
            log.warning("Marked backend down", extra={"backend": state.id, "reason": reason})
            self.scheduler.mark_down(state, reason)

    async def refresh_models(self) -> None:
        """Re-read /v1/models everywhere now (a model was unknown); at most once a second."""
        loop = asyncio.get_running_loop()
        if self._models_refresh is None or self._models_refresh.done():
            if loop.time() - self._last_models_refresh < 1.0:
                return
            self._last_models_refresh = loop.time()
            self._models_refresh = loop.create_task(self._refresh_models())
        await asyncio.shield(self._models_refresh)

    async def _refresh_models(self) -> None:
        async def one(state: ReadOnlyBackendState) -> None:
            try:
                models = await self._get(f"{state.id}/v1/models", as_json=True)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return
            if isinstance(models, dict) and isinstance(models.get("data"), list):
                self.scheduler.models_read(state, (c for c in models["data"] if isinstance(c, dict)))

        await asyncio.gather(*(one(s) for s in self.scheduler.backends() if s.up))
