"""An aiohttp application served on 127.0.0.1 from a thread of its own, for synchronous tests.

Tests that need a small real HTTP server shaped like an engine or a gateway in front of one
(``tests/security``, ``tests/router``, ``tests/sidecar``) build an ``web.Application`` and serve
it here; the test itself stays synchronous and can start real processes against the URL.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from lorapool_dev.testing.processes import free_port


@contextmanager
def serve_app(app: web.Application, *, timeout_s: float = 10.0) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its URL (``http://127.0.0.1:PORT``)."""
    port = free_port()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="threaded-app", daemon=True)
    runner = web.AppRunner(app)

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(start(), loop).result(timeout_s)
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        loop.close()
