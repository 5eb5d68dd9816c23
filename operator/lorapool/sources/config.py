"""``fetch_adapter_config``: an adapter's adapter_config.json, for the operator.

The operator reads ranks and base models of many adapters on every reconcile, so
results are cached for a short TTL keyed by (source, revision), concurrent callers of
the same key share one fetch, and every fetch has a timeout. Failures are not cached:
the caller's own backoff decides when to ask again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lorapool.errors import SourceError
from lorapool.sources.base import Limits, SourceOptions
from lorapool.sources.registry import open_source

_Key = tuple[str, str | None]


class ConfigCache:
    """A small TTL + LRU cache of adapter configs with single-flight fetches."""

    def __init__(
        self,
        *,
        ttl_s: float = 300.0,
        max_entries: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[_Key, tuple[float, dict[str, Any]]] = OrderedDict()
        self._inflight: dict[_Key, asyncio.Future[dict[str, Any]]] = {}

    def get(self, key: _Key) -> dict[str, Any] | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        stored_at, value = hit
        if self._clock() - stored_at > self.ttl_s:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return dict(value)

    def put(self, key: _Key, value: dict[str, Any]) -> None:
        self._entries[key] = (self._clock(), dict(value))
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


DEFAULT_CACHE = ConfigCache()


async def fetch_adapter_config(
    source: str,
    *,
    revision: str | None = None,
    timeout_s: float = 30.0,
    cache: ConfigCache | None = DEFAULT_CACHE,
    limits: Limits | None = None,
    options: SourceOptions | None = None,
) -> dict[str, Any]:
    """The adapter_config.json object of ``source`` at ``revision`` (a copy; safe to mutate).

    Feed it to ``lorapool.api.peft.parse_adapter_config``. Raises ``SourceError`` (its
    ``transient`` flag says whether to retry) or ``AdapterError`` (the file is not a
    usable config). ``cache=None`` bypasses caching.
    """
    key: _Key = (source, revision)
    if cache is not None:
        if (hit := cache.get(key)) is not None:
            return hit
        loop = asyncio.get_running_loop()
        shared = cache._inflight.get(key)
        if shared is not None and shared.get_loop() is loop:
            return dict(await asyncio.shield(shared))
    limits = replace(limits or Limits(), config_timeout_s=timeout_s)
    src = open_source(source, revision=revision, options=options)

    async def fetch() -> dict[str, Any]:
        try:
            return await asyncio.wait_for(src.fetch_config(limits=limits), timeout_s)
        except TimeoutError as exc:
            raise SourceError(
                f"{src.describe()}: reading adapter_config.json timed out after {timeout_s:g}s; "
                "check the source or raise the timeout"
            ) from exc

    if cache is None:
        return await fetch()
    task = asyncio.ensure_future(fetch())
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if all waiters left
    cache._inflight[key] = task
    try:
        value = await asyncio.shield(task)
    finally:
        if cache._inflight.get(key) is task:
            del cache._inflight[key]
    cache.put(key, value)
    return dict(value)
