"""The sidecar's HTTP surface: ``/status``, ``/healthz`` and ``/metrics`` (aiohttp). Shell.

``agent.Agent.run`` starts it with itself as the ``Surface``: the status document
(``core.status_document`` plus the agent's slot and report), why the reconcile loop counts as
stalled (``health.stalled``), and the metrics refreshed for a scrape. Nothing here decides.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lorapool.sidecar.metrics import SidecarMetrics


class Surface(Protocol):
    """What the endpoints read from the agent."""

    def status(self) -> dict[str, Any]:
        """The /status document."""
        ...

    def stalled(self) -> str | None:
        """Why the sidecar is not live (answered with 503 on /healthz); None while it is."""
        ...

    def scrape(self) -> SidecarMetrics:
        """The metrics, their gauges set to now."""
        ...


def build_app(surface: Surface) -> web.Application:
    async def status(request: web.Request) -> web.Response:
        return web.json_response(surface.status())

    async def healthz(request: web.Request) -> web.Response:
        if (error := surface.stalled()) is not None:
            return web.json_response({"ok": False, "error": error}, status=503)
        return web.json_response({"ok": True})

    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(surface.scrape().registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/status", status)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app


async def start_http(surface: Surface, host: str, port: int) -> web.AppRunner:
    """Serve the endpoints on ``host:port``; ``cleanup()`` the runner returned to stop."""
    runner = web.AppRunner(build_app(surface), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
