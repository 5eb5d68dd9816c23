"""A backend that leaves the pool's endpoints while a request waits on it (its pod stopping, its
engine hung): the HTTP door gives it ``--departed-grace`` for the first byte, then retries the
request on another backend, which answers. Nothing of the answer had reached the client, so the
retry is invisible but for the time.

In-process router pieces (scheduler, poller, app) over real simulator processes, because the
departure is an EndpointSlice change, which the API server refuses to publish for loopback
addresses; the hung engine is a simulator stopped with SIGSTOP (its socket still accepts).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web

from lorapool.router.app import BACKEND_HEADER, build_app
from lorapool.router.policyfile import from_flags
from lorapool.router.poller import Poller
from lorapool.router.scheduler import Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry
from lorapool_dev.testing.processes import RunningProcess, free_port
from lorapool_dev.testing.wait import wait_until_async

from .conftest import StartSim

pytestmark = pytest.mark.timeout(60)


@asynccontextmanager
async def _router(settings: RouterSettings) -> AsyncIterator[tuple[Scheduler, Poller, str]]:
    loaded = from_flags(settings.policy_overrides())
    telemetry = Telemetry()
    scheduler = Scheduler(loaded.scheduling, settings, telemetry, knobs=loaded.knobs)
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        poller = Poller(scheduler, session, settings)
        runner = web.AppRunner(build_app(scheduler, session, telemetry, settings), handler_cancellation=True)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            yield scheduler, poller, f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


async def _departed(hung: str, good: str, hung_proc: RunningProcess) -> tuple[int, str, float]:
    settings = replace(RouterSettings(), departed_grace_s=0.5, backend_header=True, poll_interval_s=60)
    async with _router(settings) as (scheduler, poller, url), aiohttp.ClientSession() as client:
        scheduler.set_backends([hung])
        await poller.poll_all()
        os.kill(hung_proc.pid, signal.SIGSTOP)  # accepts connections, answers nothing
        body = {"model": "sql", "prompt": "x", "max_tokens": 1}
        request = asyncio.create_task(client.post(f"{url}/v1/completions", json=body))
        state = scheduler.backend(hung)
        assert state is not None
        await wait_until_async("the request bound to the hung backend", lambda: state.inflight_total == 1, 10)
        loop = asyncio.get_running_loop()
        left = loop.time()
        scheduler.set_backends([good])  # the hung one's pod leaves the endpoints
        await poller.poll_all()
        async with asyncio.timeout(20):
            resp = await request
        return resp.status, resp.headers.get(BACKEND_HEADER, ""), loop.time() - left


def test_a_request_waiting_on_a_departed_backend_is_retried_elsewhere_after_the_grace(
    start_sim: StartSim, processes: dict[str, RunningProcess]
) -> None:
    hung, good = start_sim(time_scale=0), start_sim(time_scale=0)
    try:
        status, served_by, waited = asyncio.run(_departed(hung, good, processes[hung]))
    finally:
        os.kill(processes[hung].pid, signal.SIGCONT)
    assert (status, served_by) == (200, good)
    assert waited >= 0.5  # it had the grace to answer first
