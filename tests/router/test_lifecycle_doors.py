"""Both front doors run one request lifecycle (router/lifecycle.py): the same scripts driven through
the HTTP router and through a real Envoy asking the endpoint picker, each over fresh simulators,
give the same decisions and the same tickets, field by field.

A script's trace is what each request got (status, error, Retry-After and x-ratelimit-* headers,
which backend served it, how many SSE events) and what the router's books say once every request
ended (answers by model and code, decisions by kind, adapter hits and misses, holds, throttles,
backends up, requests in flight, streamed first tokens). Backends are named by their index, since
the HTTP door names a backend by URL and the gateway by ``ip:port``, and in the order a script
first meets them (fresh simulators are alike, so which port the hash of a URL favours is no
decision of the doors'). Where a protocol differs (the
HTTP router retries a failed backend itself, Envoy cannot retry an ORIGINAL_DST pick), the script
names the fields it leaves out and why.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from lorapool.api.traffic import RateLimits
from lorapool_dev.testing.processes import RunningProcess
from lorapool_dev.testing.scrape import metric_value as metric
from lorapool_dev.testing.scrape import samples, scrape
from lorapool_dev.testing.wait import wait_until

from .conftest import BASE, StartRouter, StartSim
from .test_extproc_envoy import SERVED, StartGateway, start_gateway  # noqa: F401 (its fixture, for the gateway door)
from .test_ratelimit_process import write

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(180)]

DOORS = ("http", "envoy")


@dataclass
class Door:
    """One front door over fresh simulators: where clients send requests, the router's metrics."""

    kind: str
    url: str
    router: str
    backends: list[str]
    processes: dict[str, RunningProcess]

    def index(self, backend: str | None) -> int | None:
        """A backend's index, from a URL (the HTTP door) or an ``ip:port`` (the gateway)."""
        if backend is None:
            return None
        netloc = urlparse(backend).netloc or backend
        return next(i for i, b in enumerate(self.backends) if urlparse(b).netloc == netloc)


@dataclass(frozen=True)
class Got:
    """What one request got at the client."""

    status: int
    error: tuple[str, str] | None = None  # (type, message) of an error body
    headers: tuple[tuple[str, str], ...] = ()  # retry-after and x-ratelimit-*
    backend: int | None = None  # the index of the backend that served it
    events: int = 0  # SSE data events


@dataclass
class Trace:
    """A script's requests and the router's books once they all ended."""

    got: list[Got] = field(default_factory=list)
    answers: dict[tuple[str, str], float] = field(default_factory=dict)  # (model, code) -> count
    decisions: dict[str, float] = field(default_factory=dict)
    adapters: dict[tuple[str, str], float] = field(default_factory=dict)  # (adapter, hit|miss)
    held: dict[str, float] = field(default_factory=dict)  # reason -> holds that ended
    throttled: dict[str, float] = field(default_factory=dict)
    retries: dict[str, float] = field(default_factory=dict)
    up: dict[int, float] = field(default_factory=dict)
    inflight: float = 0.0
    first_tokens: float = 0.0


def request(door: Door, body: dict[str, Any]) -> Got:
    """POST /v1/completions and read the whole answer."""
    parsed = urlparse(door.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    return got(door, resp.status, headers, raw)


def got(door: Door, status: int, headers: dict[str, str], raw: bytes) -> Got:
    error = None
    if status >= 400:
        try:
            detail = json.loads(raw)["error"]
            error = (detail["type"], detail["message"])
        except ValueError:  # not ours: the gateway's own answer
            error = ("gateway", raw.decode(errors="replace"))
    kept = tuple(sorted((k, v) for k, v in headers.items() if k == "retry-after" or k.startswith("x-ratelimit-")))
    served = headers.get("x-lorapool-backend") if door.kind == "http" else headers.get(SERVED)
    return Got(status, error, kept, door.index(served), raw.count(b"data: "))


def books(door: Door, answered: int) -> Trace:
    """The router's books once ``answered`` requests were counted and none is in flight."""

    def settled() -> str | None:
        page = scrape(door.router)
        done = metric(page, "lorapool_router_requests_total") == answered
        return page if done and metric(page, "lorapool_router_backend_inflight") == 0 else None

    page = wait_until(f"{answered} answers counted, none in flight", settled, 30)
    series = samples(page)

    def by(name: str, *labels: str) -> dict[Any, float]:
        found = {}
        for got_labels, value in series.get(name, []):
            key = tuple(got_labels.get(label, "") for label in labels)
            if value:
                found[key[0] if len(key) == 1 else key] = value
        return found

    return Trace(
        answers=by("lorapool_router_requests_total", "model", "code"),
        decisions=by("lorapool_router_decisions_total", "kind"),
        adapters=by("lorapool_router_adapter_requests_total", "adapter", "result"),
        held=by("lorapool_router_queue_wait_seconds_count", "reason"),
        throttled=by("lorapool_router_adapter_throttled_total", "adapter"),
        retries=by("lorapool_router_retries_total", "reason"),
        up={door.index(b) or 0: v for b, v in by("lorapool_router_backend_up", "backend").items()},
        inflight=metric(page, "lorapool_router_backend_inflight"),
        first_tokens=metric(page, "lorapool_router_time_to_first_token_seconds_count"),
    )


def completion(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": "x", "max_tokens": 2, **extra}


# --- the scripts --------------------------------------------------------------------------------
def plain(door: Door) -> Trace:
    first = request(door, completion("sql"))
    again = request(door, completion("sql"))  # where it is warm now
    trace = books(door, 2)
    trace.got = [first, again]
    return trace


def streamed(door: Door) -> Trace:
    adapter = request(door, completion("chat", max_tokens=4, stream=True))
    base = request(door, completion(BASE, max_tokens=3, stream=True))
    trace = books(door, 2)
    trace.got = [adapter, base]
    return trace


def unknown_adapter(door: Door) -> Trace:
    one = request(door, completion("no-such-adapter"))
    trace = books(door, 1)
    trace.got = [one]
    return trace


def throttled(door: Door) -> Trace:
    first = request(door, completion("sql"))
    second = request(door, completion("sql"))  # over its burst of one request
    trace = books(door, 2)
    trace.got = [first, second]
    return trace


def held_then_bound(door: Door) -> Trace:
    """One slot: "chat" waits while "sql" streams, and binds when it ends."""
    holder = stream_open(door, completion("sql", max_tokens=60, ignore_eos=True, stream=True))
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(request, door, completion("chat", max_tokens=1))
        wait_until("chat held", lambda: metric(scrape(door.router), "lorapool_router_decisions_total", kind="queued"))
        first = stream_drain(door, holder)
        second = waiting.result(timeout=60)
    trace = books(door, 2)
    trace.got = [first, second]
    return trace


def client_gone(door: Door) -> Trace:
    """The client leaves mid-stream: the slot is released and the engine stops generating."""
    sock, head, _ = stream_open(door, completion("sql", max_tokens=3000, ignore_eos=True, stream=True))
    sock.close()
    sim = door.backends[0]
    wait_until("the engine to stop", lambda: metric(scrape(sim), "vllm:num_requests_running") == 0, 30)
    trace = books(door, 1)
    trace.got = [Got(head, backend=0)]
    return trace


def backend_failed(door: Door) -> Trace:
    """The backend an adapter is warm on dies: it leaves rotation, the adapter's next request is served
    by the other one."""
    warm = request(door, completion("sql"))
    assert warm.backend is not None
    victim = door.processes[door.backends[warm.backend]].popen
    victim.kill()
    victim.wait(10)
    attempts = [request(door, completion("sql"))]
    if attempts[0].status != 200:  # the gateway's 503: Envoy could not reach the dead backend
        attempts.append(request(door, completion("sql")))
    trace = books(door, 1 + len(attempts))
    trace.got = [warm, attempts[-1]]
    return trace


def stream_open(door: Door, body: dict[str, Any]) -> tuple[socket.socket, int, bytes]:
    """Send a streamed request over a raw socket; returns once its first event arrived."""
    parsed = urlparse(door.url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=30)
    data = json.dumps(body).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    sock.sendall(head.encode() + data)
    received = b""
    while b"data: " not in received:
        chunk = sock.recv(65536)
        assert chunk, "the stream closed before its first event"
        received += chunk
    return sock, int(received.split(b" ", 2)[1]), received


def stream_drain(door: Door, opened: tuple[socket.socket, int, bytes]) -> Got:
    """Read an opened stream to its end (chunked: the zero-length chunk)."""
    sock, status, received = opened
    with sock:
        while not received.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")[1:]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    served = headers.get("x-lorapool-backend") if door.kind == "http" else headers.get(SERVED)
    return Got(status, backend=door.index(served), events=body.count(b"data: "))


@dataclass(frozen=True)
class Script:
    id: str
    run: Callable[[Door], Trace]
    sims: tuple[dict[str, Any], ...] = ({"time_scale": 0}, {"time_scale": 0})
    router_extra: tuple[str, ...] = ()
    traffic: dict[str, RateLimits] = field(default_factory=dict)
    # Fields a protocol answers differently, and why (left out of the comparison).
    protocol: tuple[str, ...] = ()


SCRIPTS = [
    Script("plain", plain),
    Script("streamed", streamed, sims=({"time_scale": 0},)),
    Script("unknown adapter", unknown_adapter),
    Script("throttled", throttled, traffic={"sql": RateLimits(requests_per_second=0.01, burst_requests=1)}),
    Script("held then bound", held_then_bound, sims=({"max_loras": 1, "time_scale": 1},), router_extra=("--max-wait", "30")),
    Script("client gone", client_gone, sims=({"time_scale": 1},)),
    Script(
        "backend failed",
        backend_failed,
        router_extra=("--poll-interval", "30"),
        # The HTTP router retries the request on the other backend itself; Envoy cannot retry an
        # ORIGINAL_DST pick, so its client gets the gateway's 503 once and the next request goes on.
        protocol=("answers", "retries"),
    ),
]  # fmt: skip


@pytest.fixture
def open_door(
    start_sim: StartSim, start_router: StartRouter, processes: dict[str, RunningProcess], tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[[str, Script], Door]]:  # fmt: skip
    """Fresh simulators and one door over them (the gateway's Envoy from test_extproc_envoy's fixture)."""

    def open_(kind: str, script: Script) -> Door:
        backends = [start_sim(**sim) for sim in script.sims]
        extra = list(script.router_extra)
        if script.traffic:
            extra += ["--traffic-file", str(write(tmp_path / f"traffic-{kind}.json", **script.traffic))]
        if kind == "http":
            url = router = start_router(backends, extra=extra)
        else:
            start_gateway: StartGateway = request.getfixturevalue("start_gateway")
            gateway = start_gateway(backends, router_extra=extra, tls=False)
            url, router = gateway.url, gateway.router
        door = Door(kind, url, router, backends, processes)
        wait_until("every backend up", lambda: metric(scrape(router), "lorapool_router_backend_up") == len(backends))
        return door

    yield open_


def in_order_met(trace: Trace) -> Trace:
    """``trace`` with backends renumbered in the order its requests first met them."""
    met = [g.backend for g in trace.got if g.backend is not None] + sorted(trace.up)
    order = {b: i for i, b in enumerate(dict.fromkeys(met))}
    trace.got = [
        dataclasses.replace(g, backend=order.get(g.backend)) if g.backend is not None else g for g in trace.got
    ]
    trace.up = {order[b]: v for b, v in trace.up.items()}
    return trace


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.id)
def test_both_doors_decide_the_same(script: Script, open_door: Callable[[str, Script], Door]) -> None:
    traces = {kind: in_order_met(script.run(open_door(kind, script))) for kind in DOORS}
    http, envoy = traces["http"], traces["envoy"]
    assert len(http.got) == len(envoy.got)
    for i, (a, b) in enumerate(zip(http.got, envoy.got, strict=True)):
        for f in fields(Got):
            assert getattr(a, f.name) == getattr(b, f.name), f"request {i}: {f.name}"
    for f in fields(Trace):
        if f.name != "got" and f.name not in script.protocol:
            assert getattr(http, f.name) == getattr(envoy, f.name), f.name
