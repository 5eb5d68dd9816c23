"""Fair dispatch through the router process under a flood: one adapter's burst fills the router's
queue in front of a real simulator that may run one request at a time (``--max-inflight 1``);
a light adapter's requests then go almost at once with ``--fair-dispatch``, and behind the whole
burst without it (the control that shows the test can fail)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from lorapool_dev.testing.scrape import metric_value as metric
from lorapool_dev.testing.scrape import scrape
from lorapool_dev.testing.wait import wait_until

from .conftest import StartRouter, StartSim
from .test_router_process import post

pytestmark = pytest.mark.timeout(180)

FLOOD = 10


def body(model: str) -> bytes:
    return json.dumps({"model": model, "prompt": "x " * 50, "max_tokens": 12, "ignore_eos": True}).encode()


def timed(router: str, model: str) -> tuple[str, int, float]:
    status, _, _ = post(router, body(model))
    return model, status, time.monotonic()


@pytest.mark.parametrize("fair", [True, False], ids=["fair dispatch", "class then age"])
def test_a_light_adapter_is_served_between_a_floods_requests(
    start_sim: StartSim, start_router: StartRouter, fair: bool
) -> None:
    sim = start_sim(max_loras=4)
    flags = ["--max-inflight", "1", "--max-queue-wait", "120", "--max-loras", "4"]
    router = start_router([sim], extra=[*flags, *(["--fair-dispatch"] if fair else [])])
    assert post(router, body("sql"))[0] == 200  # the backend is polled and serves both adapters
    with ThreadPoolExecutor(max_workers=FLOOD + 2) as pool:
        flood = [pool.submit(timed, router, "sql") for _ in range(FLOOD)]
        # the whole burst is in: one running, the rest held in the router, before the light adapter sends
        wait_until(
            "the flood held in the router",
            lambda: metric(scrape(router), "lorapool_router_queue_depth", model="sql") == FLOOD - 1,
            30,
        )
        light = [pool.submit(timed, router, "chat") for _ in range(2)]
        done = sorted((f.result(timeout=150) for f in (*flood, *light)), key=lambda r: r[2])
    assert all(status == 200 for _, status, _ in done), done
    order = [model for model, _, _ in done]
    last_light = max(i for i, m in enumerate(order) if m == "chat")
    if fair:
        # one flood request runs, the flood's oldest head ties and goes, then they alternate
        assert last_light <= 4, order
    else:
        assert order[-2:] == ["chat", "chat"], order
    page = scrape(router)
    assert metric(page, "lorapool_router_queue_wait_seconds_count", reason="saturated") >= FLOOD
