"""The router reads a backend's metrics by the release its GET /version names: a backend whose
release no metrics row knows is routed to, and its page is read as nothing (never as the default's).

The backends are small real HTTP servers answering what a vLLM engine answers (models, a metrics
page whose ``lora_requests_info`` lists two foreign adapters in the running batch, a version)."""

from __future__ import annotations

import time

import pytest
from aiohttp import web

from lorapool_dev.testing.scrape import samples, scrape
from lorapool_dev.testing.threaded_app import serve_app
from lorapool_dev.testing.wait import wait_until

from .conftest import StartRouter

pytestmark = pytest.mark.timeout(60)


def page() -> str:
    info = 'vllm:lora_requests_info{max_lora="4",running_lora_adapters="x,y",waiting_lora_adapters="x,y"}'
    return f'vllm:num_requests_running{{model_name="m"}} 2.0\n{info} {time.time()}\n'


def engine_app(version: object) -> web.Application:
    """An engine-shaped app answering ``version`` at GET /version (None: no such route)."""

    async def version_route(request: web.Request) -> web.Response:
        return web.json_response(version) if version is not None else web.Response(status=404)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=page())

    async def models(request: web.Request) -> web.Response:
        cards = [{"id": "m", "root": "m", "parent": None}, {"id": "x", "root": "/a/x", "parent": "m"}]
        return web.json_response({"object": "list", "data": cards})

    app = web.Application()
    app.router.add_get("/version", version_route)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    return app


@pytest.mark.parametrize(
    ("version", "foreign"),
    [({"version": "0.34.0"}, 2), ({"version": "0.35.1"}, 0), ({"detail": "Not Found"}, 0), (None, 0)],
    ids=["supported", "unsupported", "no-version", "no-endpoint"],
)
def test_foreign_adapters_are_read_only_from_a_known_release(
    start_router: StartRouter, version: object, foreign: int
) -> None:
    with serve_app(engine_app(version)) as engine:
        router = start_router([engine])

        def gauges() -> tuple[float, float] | None:
            got = samples(scrape(router))
            up = got.get("lorapool_router_backend_up", [])
            active = got.get("lorapool_router_backend_active_adapters", [])
            return (up[0][1], active[0][1]) if up and active and up[0][1] == 1.0 else None

        up, active = wait_until("the backend polled and up", gauges, 20)
        assert (up, active) == (1.0, float(foreign))
