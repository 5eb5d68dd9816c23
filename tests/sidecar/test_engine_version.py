"""The sidecar reads its engine's vLLM version and reads the engine's metrics by it: a real
simulator process, and small real HTTP servers answering what other engines answer."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from lorapool.api.vllm_versions import CPU_TIER
from lorapool.sidecar.reporter import Observer
from lorapool_dev.testing.components import start_sim
from lorapool_dev.testing.threaded_app import serve_app

pytestmark = pytest.mark.timeout(60)

PAGE = 'vllm:num_requests_running{model_name="m"} 3.0\nvllm:kv_cache_usage_perc{model_name="m"} 0.5\n'


async def observe(url: str, scrapes: int = 1) -> Observer:
    observer = Observer(url, window_s=60.0, sample_s=0.1)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        for _ in range(scrapes):
            await observer.sample(session)
    return observer


def test_the_simulator_is_read_as_the_release_it_takes_on() -> None:
    with start_sim(time_scale=0, timeout_s=30) as sim:
        observer = asyncio.run(observe(sim.url, scrapes=2))
    assert observer.version is not None and observer.version.startswith(f"{CPU_TIER}+lorapool.sim")
    assert observer.last_error is None and len(observer.window._samples) == 2


def engine_app(version: object) -> web.Application:
    """An engine-shaped app answering ``version`` at GET /version (None: no such route)."""

    async def version_route(request: web.Request) -> web.Response:
        return web.json_response(version) if version is not None else web.Response(status=404)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=PAGE)

    app = web.Application()
    app.router.add_get("/version", version_route)
    app.router.add_get("/metrics", metrics)
    return app


@pytest.mark.parametrize(
    ("answer", "version", "read"),
    [
        ({"version": "0.34.0"}, "0.34.0", True),
        ({"version": "0.35.1"}, "0.35.1", False),  # a release no metrics row reads: nothing read
        ({"detail": "Not Found"}, None, False),  # answers no version: unknown, never read as the default
        (None, None, False),  # no /version at all
    ],
)
def test_an_engine_is_read_only_by_a_release_we_know(answer: object, version: str | None, read: bool) -> None:
    with serve_app(engine_app(answer)) as url:
        observer = asyncio.run(observe(url, scrapes=2))
    assert observer.version == version
    assert (len(observer.window._samples) == 2) is read
    assert (observer.last_error is None) is read
    if not read:
        assert "not a release a metrics row reads" in (observer.last_error or "")
