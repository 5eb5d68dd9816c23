"""``fetch_adapter_config``: an adapter's adapter_config.json, for the operator.

The operator reads ranks and base models of many adapters on every reconcile, so results
are cached keyed by (source, revision), concurrent callers of the same key share one fetch,
and every fetch has a timeout. Failures are not cached: the caller's own backoff decides
when to ask again.

A source is re-read only when it may have changed: a new spec (source or revision) is a new
key; a commit revision (40 hex digits) names fixed content, so its entry never expires; any
other entry (no revision, a branch or a tag) is re-read after ``ttl_s``, at most that often per
adapter. The cache is sized by the catalogue (``fit``: twice the adapters known, so a change of
revision keeps both for a while), between ``MIN_ENTRIES`` and ``MAX_ENTRIES`` (an entry is an
adapter_config.json, ~1 KB: the bound is ~50 MB); below that no reconcile re-reads a source
because an LRU evicted it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lorapool.errors import SourceError
from lorapool.sources.base import Limits, SourceOptions
from lorapool.sources.registry import open_source

_Key = tuple[str, str | None]

MIN_ENTRIES, MAX_ENTRIES = 1024, 50_000
_COMMIT = re.compile(r"[0-9a-f]{40}")


def immutable(revision: str | None) -> bool:
    """A revision that names fixed content (a git commit), so what it read once stays true."""
    return revision is not None and _COMMIT.fullmatch(revision) is not None


class ConfigCache:
    """A TTL + LRU cache of adapter configs, sized by the catalogue, with single-flight fetches."""

    def __init__(
        self,
        *,
        ttl_s: float = 300.0,
        max_entries: int = MIN_ENTRIES,
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
        if not immutable(key[1]) and self._clock() - stored_at > self.ttl_s:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return dict(value)

    def put(self, key: _Key, value: dict[str, Any]) -> None:
        self._entries[key] = (self._clock(), dict(value))
        self._entries.move_to_end(key)
        self._evict()

    def fit(self, adapters: int) -> None:
        """Size the cache for a catalogue of ``adapters`` (all pools): twice that, within the bounds."""
        self.max_entries = min(max(MIN_ENTRIES, 2 * adapters), MAX_ENTRIES)
        self._evict()

    def __len__(self) -> int:
        return len(self._entries)

    def _evict(self) -> None:
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
