"""The router as a real process between the official openai client and real simulator processes."""

from __future__ import annotations

import http.client
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import openai
import pytest

from lorapool.api.common import RouterPolicy
from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.scrape import metric_value as metric
from lorapool_dev.testing.scrape import scrape
from lorapool_dev.testing.wait import wait_until

from .conftest import BASE, StartRouter, StartSim
from .test_requests_process import Windows

pytestmark = pytest.mark.timeout(120)


def client(url: str, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=retries, timeout=30)


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """A raw POST, for bodies the openai client would refuse to send."""
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", body=body, headers=headers or {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_completions_and_chat_through_the_router(start_sim: StartSim, start_router: StartRouter) -> None:
    router = start_router([start_sim(time_scale=0), start_sim(time_scale=0)])
    api = client(router)

    ids = {m.id for m in api.models.list().data}
    assert ids == {BASE, "sql", "chat", "code", "math"}

    done = api.completions.create(model="sql", prompt="select one row", max_tokens=5)
    assert done.model == "sql" and done.usage is not None and done.usage.completion_tokens == 5

    chunks = list(api.completions.create(model="chat", prompt="hi", max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices)  # text arrived in pieces
    assert len(chunks) >= 4

    chat = api.chat.completions.create(
        model="code", messages=[{"role": "user", "content": "write a loop"}], max_tokens=3
    )
    assert chat.choices[0].message.content

    streamed = api.chat.completions.create(
        model=BASE, messages=[{"role": "user", "content": "hello"}], max_tokens=3, stream=True
    )
    assert sum(1 for c in streamed if c.choices and c.choices[0].delta.content) == 3

    with pytest.raises(openai.NotFoundError, match="does not exist"):
        api.completions.create(model="no-such-adapter", prompt="x", max_tokens=1)

    # counted as each response ends, which the client may see first: wait for the counts
    counted(router, "lorapool_router_requests_total", 1, model="sql", code="200")
    counted(router, "lorapool_router_requests_total", 1, model="unknown", code="404")
    counted(router, "lorapool_router_time_to_first_token_seconds_count", 2)


def test_affinity_groups_an_adapter_on_one_backend(start_sim: StartSim, start_router: StartRouter) -> None:
    backends = [start_sim(time_scale=0), start_sim(time_scale=0)]
    router = start_router(backends)
    seen = {}
    for adapter in ("sql", "chat", "code", "math"):
        where = set()
        for _ in range(3):
            resp = client(router).completions.with_raw_response.create(model=adapter, prompt="x", max_tokens=1)
            where.add(resp.headers["x-lorapool-backend"])
        seen[adapter] = where
    # Sequential requests of one adapter stay where it is warm.
    assert all(len(where) == 1 for where in seen.values()), seen
    page = scrape(router)
    assert metric(page, "lorapool_router_decisions_total", kind="miss") == 0


def test_malformed_and_oversized_bodies_are_refused_and_the_router_keeps_serving(
    start_sim: StartSim, start_router: StartRouter
) -> None:
    router = start_router([start_sim(time_scale=0)], extra=["--max-body-bytes", "4096"])
    cases = [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (json.dumps({"prompt": "no model"}).encode(), 400),
        (json.dumps({"model": 7, "prompt": "x"}).encode(), 400),
        (b"\xff\xfe", 400),
        (json.dumps({"model": "sql", "prompt": "x" * 5000}).encode(), 413),
    ]
    for body, status in cases:
        got, _, raw = post(router, body)
        assert got == status, (body[:20], raw)
        assert json.loads(raw)["error"]["code"] == status
    done = client(router).completions.create(model="sql", prompt="still here", max_tokens=2)
    assert done.usage is not None and done.usage.completion_tokens == 2


def test_all_backends_down_answers_503_at_once(start_router: StartRouter) -> None:
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    router = start_router(dead, extra=["--connect-timeout", "60"])
    started = time.monotonic()
    status, headers, raw = post(router, json.dumps({"model": "sql", "prompt": "x"}).encode())
    elapsed = time.monotonic() - started
    assert status == 503 and headers["Retry-After"] == "1", raw
    # Far below the 60 s connect timeout (a loaded machine may take seconds): nothing was waited for.
    assert elapsed < 20.0
    with pytest.raises(openai.InternalServerError):
        client(router).completions.create(model="sql", prompt="x", max_tokens=1)


def test_requests_fail_over_when_a_backend_is_killed(
    start_sim: StartSim, start_router: StartRouter, processes: dict
) -> None:
    first, second = start_sim(time_scale=0), start_sim(time_scale=0)
    # Round-robin is sure to try the dead one; a slow poll leaves the discovery to requests.
    router = start_router([first, second], policy=RouterPolicy.ROUND_ROBIN, extra=["--poll-interval", "30"])
    processes[first].popen.kill()
    processes[first].popen.wait(10)
    for adapter in ("sql", "chat", "code", "math", "sql", "chat"):
        resp = client(router).completions.with_raw_response.create(model=adapter, prompt="x", max_tokens=1)
        assert resp.headers["x-lorapool-backend"] == second
    page = scrape(router)
    assert metric(page, "lorapool_router_backend_up", backend=first) == 0
    assert metric(page, "lorapool_router_retries_total", reason="connect") >= 1


def test_backend_dying_mid_stream_gives_a_clean_error(
    start_sim: StartSim, start_router: StartRouter, processes: dict
) -> None:
    first, second = start_sim(time_scale=1), start_sim(time_scale=1)
    router = start_router([first, second], extra=["--poll-interval", "30"])
    api = client(router)
    stream = api.completions.with_raw_response.create(
        model="sql", prompt="a long answer please", max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
    )
    victim = stream.headers["x-lorapool-backend"]
    events = iter(stream.parse())
    assert next(events).choices  # the stream is flowing
    processes[victim].popen.kill()
    with pytest.raises(openai.APIError, match="mid-stream"):
        for _ in events:
            pass
    survivor = second if victim == first else first
    for adapter in ("sql", "chat"):
        resp = api.completions.with_raw_response.create(model=adapter, prompt="x", max_tokens=1)
        assert resp.headers["x-lorapool-backend"] == survivor
    counted(router, "lorapool_router_backend_up", 0, backend=victim)
    counted(router, "lorapool_router_upstream_failures_total", 1)


def test_backend_dying_before_the_first_byte_is_retried_elsewhere(
    start_sim: StartSim, start_router: StartRouter, processes: dict
) -> None:
    # A long prompt on a slow clock: each sim sends its stream headers at once and the first
    # token seconds later, so the victim dies after its headers and before anything reached the client.
    first, second = start_sim(time_scale=20), start_sim(time_scale=20)
    # The request is counted once, not per try: its windows are read from before it is sent.
    router = start_router([first, second], extra=["--poll-interval", "30", "--requests-window-s", "5"])
    prompt = " ".join(["word"] * 2000)
    with Windows(router) as windows, ThreadPoolExecutor(1) as pool:
        call = pool.submit(
            client(router).completions.with_raw_response.create,
            model="sql", prompt=prompt, max_tokens=2, stream=True, extra_body={"ignore_eos": True},
        )  # fmt: skip
        victim = wait_until(
            "a backend to run the request", lambda: next((b for b in (first, second) if _running(b)), None)
        )
        processes[victim].popen.kill()
        resp = call.result(timeout=60)
        counts = windows.counted_until(time.time())
    survivor = second if victim == first else first
    assert resp.headers["x-lorapool-backend"] == survivor
    assert "".join(c.choices[0].text for c in resp.parse() if c.choices)  # a whole answer, no error event
    page = scrape(router)
    assert metric(page, "lorapool_router_retries_total", reason="dropped") == 1
    assert metric(page, "lorapool_router_backend_up", backend=victim) == 0
    assert metric(page, "lorapool_router_upstream_failures_total") == 0  # nothing was cut short
    assert counts == {"sql": 1}


def counted(router: str, name: str, expected: float, **labels: str) -> None:
    """Wait until the router's metric ``name`` reads ``expected`` (it is updated as responses end)."""
    wait_until(
        f"{name}{labels or ''} == {expected:g}",
        lambda: metric(scrape(router), name, **labels) == expected,
        10,
        describe=lambda: metric(scrape(router), name, **labels),
    )


def _running(url: str) -> float:
    return metric(scrape(url), "vllm:num_requests_running")


def test_client_disconnect_cancels_the_upstream_request(start_sim: StartSim, start_router: StartRouter) -> None:
    sim = start_sim(time_scale=1)
    router = start_router([sim])
    parsed = urlparse(router)
    body = json.dumps(
        {"model": "sql", "prompt": "go on", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    ).encode()
    with socket.create_connection((parsed.hostname, parsed.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        received = b""
        while b"data: " not in received:  # generation has started
            chunk = sock.recv(65536)
            assert chunk, "the router closed the stream"
            received += chunk
        assert _running(sim) == 1
    wait_until("the simulator to stop generating for a client that left", lambda: _running(sim) == 0, 20)
    wait_until(
        "the router to count nothing in flight",
        lambda: metric(scrape(router), "lorapool_router_backend_inflight") == 0,
        10,
        describe=lambda: scrape(router),
    )


def test_a_request_waits_for_a_slot_then_binds(start_sim: StartSim, start_router: StartRouter) -> None:
    sim = start_sim(max_loras=1, time_scale=1)
    router = start_router([sim], extra=["--max-wait", "30"])
    api = client(router)
    holder = api.completions.create(
        model="sql", prompt="x", max_tokens=60, stream=True, extra_body={"ignore_eos": True}
    )
    assert next(iter(holder)).choices  # "sql" holds the only slot now
    started = time.monotonic()
    waited = api.completions.create(model="chat", prompt="y", max_tokens=1)
    assert waited.model == "chat"
    for _ in holder:
        pass
    page = scrape(router)
    assert metric(page, "lorapool_router_decisions_total", kind="queued") == 1
    assert metric(page, "lorapool_router_decisions_total", kind="miss") == 0
    assert metric(page, "lorapool_router_queue_wait_seconds_count") == 1
    assert time.monotonic() - started < 30  # bound by the holder's end, not by --max-wait


def test_hold_if_active_sends_an_adapter_running_nowhere_at_once(
    start_sim: StartSim, start_router: StartRouter
) -> None:
    """--hold-rule hold-if-active: "chat" runs on no replica, so it is not held; it goes to the
    engine at once (a miss), which runs it when the slot frees."""
    sim = start_sim(max_loras=1, time_scale=1)
    router = start_router([sim], extra=["--max-wait", "30", "--hold-rule", "hold-if-active"])
    api = client(router)
    holder = api.completions.create(
        model="sql", prompt="x", max_tokens=60, stream=True, extra_body={"ignore_eos": True}
    )
    assert next(iter(holder)).choices  # "sql" holds the only slot now
    sent = api.completions.create(model="chat", prompt="y", max_tokens=1)
    assert sent.model == "chat"
    for _ in holder:
        pass
    page = scrape(router)
    assert metric(page, "lorapool_router_decisions_total", kind="queued") == 0
    assert metric(page, "lorapool_router_decisions_total", kind="miss") == 1


def test_a_full_queue_answers_429_with_retry_after(start_sim: StartSim, start_router: StartRouter) -> None:
    sim = start_sim(max_loras=1, time_scale=1)
    router = start_router([sim], extra=["--max-queued", "0"])
    api = client(router)
    holder = api.completions.create(
        model="sql", prompt="x", max_tokens=500, stream=True, extra_body={"ignore_eos": True}
    )
    assert next(iter(holder)).choices
    status, headers, raw = post(router, json.dumps({"model": "chat", "prompt": "y", "max_tokens": 1}).encode())
    assert status == 429 and headers["Retry-After"] == "1", raw
    holder.close()
