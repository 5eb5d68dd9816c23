"""Prefix locality through the real router and simulators: with --prefix-weight a conversation's
next turn goes back to the replica that holds its history even when that replica is the busier
one; without the flag the default policy still goes by load.

The conversation is on the base model, so lora-affinity rates both replicas alike and what is
measured is the prefix against load (affinity's dominance: tests/router/core/test_policy.py).
Load is set with held-open streams, counted exactly in the router's books: the conversation's
replica runs two, the other one, well inside the bounded-load cap (the policy tables say why those
numbers decide). Every step waits for the state it asserts.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from urllib.parse import urlparse

import pytest

from lorapool_dev.testing.scrape import metric_value as metric
from lorapool_dev.testing.scrape import scrape
from lorapool_dev.testing.wait import wait_until

from .conftest import BASE, StartRouter, StartSim
from .test_router_process import client

pytestmark = pytest.mark.timeout(120)

SYSTEM = "You are the orders assistant. Answer from the orders database, in one sentence. " * 35
QUESTION = "How many orders shipped last week, and how many of them were late?"


# An open request: (the backend URL it went to, a call that ends it).
Opened = tuple[str, Callable[[], None]]


class Holders:
    """Requests left open through the router: each is one request in flight on the backend it
    went to until it is closed (their prompts are under one block: no prefix). ``opener(i)``
    opens the i-th through one door."""

    def __init__(self, router: str, opener: Callable[[int], Opened]) -> None:
        self.router, self.opener = router, opener
        self.open: list[Opened] = []

    def add(self) -> str:
        self.open.append(self.opener(len(self.open)))
        return self.open[-1][0]

    def on(self, backend: str) -> int:
        return sum(1 for b, _ in self.open if b == backend)

    def close_one(self, backend: str) -> None:
        index = next(i for i, (b, _) in enumerate(self.open) if b == backend)
        self.open.pop(index)[1]()
        left = self.on(backend)
        wait_until(
            f"{backend} to count {left} requests in flight",
            lambda: metric(scrape(self.router), "lorapool_router_backend_inflight", backend=backend) == left,
            20,
        )

    def load(self, busy: str, idle: str) -> None:
        """Two open on ``busy``, one on ``idle``, whichever way the policy sends each new one."""
        for _ in range(8):
            if self.on(busy) >= 2:
                break
            self.add()
        assert self.on(busy) == 2, self.open
        while self.on(idle) > 1:
            self.close_one(idle)
        while self.on(idle) < 1:  # busy runs two, idle none: the next one goes by load
            assert self.add() == idle
        assert (self.on(busy), self.on(idle)) == (2, 1)

    def close(self) -> None:
        for _, end in self.open:
            end()
        self.open.clear()


def http_holder(router: str) -> Callable[[int], Opened]:
    """Streams through the HTTP door, answered headers first and never read."""

    def opener(i: int) -> Opened:
        parsed = urlparse(router)
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
        body = {"model": BASE, "prompt": f"hold {i}", "max_tokens": 3000, "ignore_eos": True, "stream": True}
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        backend = resp.getheader("x-lorapool-backend")
        assert backend is not None
        return backend, conn.close

    return opener


def turn(router: str, messages: list[dict[str, str]]) -> tuple[str, str]:
    """One chat turn: (the backend it went to, the reply)."""
    resp = client(router).chat.completions.with_raw_response.create(model=BASE, messages=messages, max_tokens=8)
    reply = resp.parse().choices[0].message.content or ""
    return resp.headers["x-lorapool-backend"], reply


@pytest.mark.parametrize("prefix", [True, False], ids=["--prefix-weight", "default policy"])
def test_a_conversations_turns_stay_with_their_history(
    start_sim: StartSim, start_router: StartRouter, prefix: bool
) -> None:
    backends = [start_sim(time_scale=1), start_sim(time_scale=1)]
    router = start_router(backends, extra=["--prefix-weight"] if prefix else [])
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    first, reply = turn(router, messages)
    other = next(b for b in backends if b != first)
    holders = Holders(router, http_holder(router))
    try:
        holders.load(busy=first, idle=other)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And the week before?"}]
        second, reply = turn(router, messages)
        if not prefix:
            assert second == other  # least-load decides, as before the prefix scorer existed
            return
        assert second == first
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Which carrier?"}]
        assert turn(router, messages)[0] == first
    finally:
        holders.close()
