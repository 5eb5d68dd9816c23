"""fetch_adapter_config: the operator's entry point (timeout, TTL cache, single flight)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from loopback_http import LoopbackServer

from lorapool.errors import AdapterError, SourceError
from lorapool.sources import ConfigCache, fetch_adapter_config


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_cache_hits_until_the_ttl_expires(adapter: Path, http_server: LoopbackServer) -> None:
    url = http_server.add_dir("/sql", adapter)
    clock = Clock()
    cache = ConfigCache(ttl_s=60, clock=clock)

    async def scenario() -> None:
        first = await fetch_adapter_config(url, cache=cache)
        first["r"] = 999  # callers get copies
        assert (await fetch_adapter_config(url, cache=cache))["r"] == 8
        await fetch_adapter_config(url, revision="v2", cache=cache)  # another key
        clock.now = 61
        await fetch_adapter_config(url, cache=cache)

    asyncio.run(scenario())
    assert http_server.hits["/sql/adapter_config.json"] == 3


def test_concurrent_callers_share_one_fetch(adapter: Path, http_server: LoopbackServer) -> None:
    url = http_server.add_dir("/sql", adapter)
    http_server.delay_s = 0.2
    cache = ConfigCache()

    async def scenario() -> list[dict[str, object]]:
        return await asyncio.gather(*(fetch_adapter_config(url, cache=cache) for _ in range(5)))

    results = asyncio.run(scenario())
    assert [r["r"] for r in results] == [8] * 5
    assert http_server.hits["/sql/adapter_config.json"] == 1


def test_timeout_and_failures_are_not_cached(adapter: Path, http_server: LoopbackServer) -> None:
    url = http_server.add_dir("/sql", adapter)
    cache = ConfigCache()
    http_server.delay_s = 1.0
    with pytest.raises(SourceError, match=r"timed out after 0\.2s") as err:
        asyncio.run(fetch_adapter_config(url, timeout_s=0.2, cache=cache))
    assert err.value.transient
    http_server.delay_s = 0.0
    assert asyncio.run(fetch_adapter_config(url, cache=cache))["r"] == 8


def test_unknown_scheme_and_bad_json(http_server: LoopbackServer) -> None:
    with pytest.raises(SourceError, match="unsupported source scheme 'ftp'") as err:
        asyncio.run(fetch_adapter_config("ftp://x/y", cache=None))
    assert not err.value.transient
    http_server.routes["/bad/adapter_config.json"] = b"{not json"
    with pytest.raises(AdapterError, match="not valid JSON"):
        asyncio.run(fetch_adapter_config(f"{http_server.url}/bad", cache=None))
