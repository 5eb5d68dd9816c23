"""The endpoint picker behind a real Envoy: client -> Envoy (ext_proc -> lorapool router) -> simulators.

Envoy is configured only as the GIE endpoint picker protocol says (lorapool_dev.testing.envoy): an
ext_proc filter asks the picker, an ORIGINAL_DST cluster goes where x-gateway-destination-endpoint
says. Each test starts its own simulators, router (HTTP port and --ext-proc-port) and Envoy.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import grpc
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lorapool.router.picker.tls import self_signed
from lorapool_dev.testing.envoy import (
    BodyMode,
    Envoy,
    FailureMode,
    GatewayConfig,
    bootstrap,
    envoy_or_skip,
    start_envoy,
)
from lorapool_dev.testing.processes import RunningProcess, free_port, free_ports
from lorapool_dev.testing.scrape import metric_value as metric
from lorapool_dev.testing.scrape import scrape
from lorapool_dev.testing.wait import wait_until

from .conftest import BASE, StartRouter, StartSim
from .test_router_process import client, counted, post

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(120)]

SERVED = "x-gateway-destination-endpoint-served"
MESSAGE_TIMEOUT_S = 5.0  # Envoy's and the picker's (--ext-proc-message-timeout): above the holds tested


@dataclass
class Gateway:
    url: str  # Envoy's listener: where clients send requests
    router: str  # the router's HTTP port (/metrics counts both doors)
    ext_proc_port: int
    envoy: Envoy


StartGateway = Callable[..., Gateway]


@pytest.fixture
def start_gateway(start_router: StartRouter) -> Iterator[StartGateway]:
    """Start ``lorapool router --ext-proc-port`` in front of ``backends`` and an Envoy in front of it."""
    envoy_or_skip()
    envoys: list[Envoy] = []

    def start(
        backends: Sequence[str],
        *,
        body_mode: BodyMode | None = None,  # None: the modes that keep failure_mode's promise
        failure_mode: FailureMode = FailureMode.FAIL_CLOSE,
        tls: bool = True,
        router_extra: Sequence[str] = (),
        picker_ca: str | None = None,
        picker_port: int | None = None,
        message_timeout_s: float = MESSAGE_TIMEOUT_S,
    ) -> Gateway:
        ext_proc, listen, admin = free_ports(3)
        router = ""
        if picker_port is None:  # else: Envoy asks a picker that is not there
            flags = ["--ext-proc-port", str(ext_proc), "--ext-proc-message-timeout", f"{message_timeout_s:g}"]
            router = start_router(backends, extra=[*flags, *([] if tls else ["--ext-proc-insecure"]), *router_extra])
        cfg = GatewayConfig(
            listen_port=listen, picker=f"127.0.0.1:{picker_port or ext_proc}", admin_port=admin, tls=tls,
            failure_mode=failure_mode, body_mode=body_mode, message_timeout_s=message_timeout_s,
            fallback_endpoints=[urlparse(b).netloc for b in backends], picker_ca=picker_ca, expose_served=True,
        )  # fmt: skip
        envoy = start_envoy(bootstrap(cfg))
        envoys.append(envoy)
        return Gateway(envoy.url, router, ext_proc, envoy)

    yield start
    for envoy in envoys:
        envoy.close()


def served_by(gateway: Gateway, model: str, **extra: object) -> str:
    """Send one completion through the gateway; the ``ip:port`` that served it."""
    resp = client(gateway.url).completions.with_raw_response.create(model=model, prompt="x", max_tokens=1, **extra)
    return str(resp.headers[SERVED])


def endpoint(url: str) -> str:
    return urlparse(url).netloc


@pytest.mark.parametrize(
    "body_mode", [BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED], ids=["full-duplex", "buffered"]
)
def test_plain_streamed_and_chat_requests_route_with_affinity(
    start_sim: StartSim, start_gateway: StartGateway, body_mode: BodyMode
) -> None:
    backends = [start_sim(time_scale=0), start_sim(time_scale=0)]
    gateway = start_gateway(backends, body_mode=body_mode)
    api = client(gateway.url)
    seen = {adapter: {served_by(gateway, adapter) for _ in range(3)} for adapter in ("sql", "chat", "code", "math")}
    assert all(len(where) == 1 for where in seen.values()), seen  # each adapter stays where it is warm
    assert {e for where in seen.values() for e in where} <= {endpoint(b) for b in backends}

    chunks = list(api.completions.create(model="chat", prompt="hi", max_tokens=4, stream=True))
    assert len(chunks) >= 4 and "".join(c.choices[0].text for c in chunks if c.choices)
    chat = api.chat.completions.create(model=BASE, messages=[{"role": "user", "content": "hello"}], max_tokens=3)
    assert chat.choices[0].message.content
    page = scrape(gateway.router)
    assert metric(page, "lorapool_router_decisions_total", kind="miss") == 0
    counted(gateway.router, "lorapool_router_requests_total", 3, model="sql", code="200")
    counted(gateway.router, "lorapool_router_backend_inflight", 0)  # every slot released at the response's end


def test_sse_arrives_chunk_by_chunk(start_sim: StartSim, start_gateway: StartGateway) -> None:
    sim = start_sim(time_scale=1)
    gateway = start_gateway([sim])
    stream = client(gateway.url).completions.create(
        model="sql", prompt="x", max_tokens=40, stream=True, extra_body={"ignore_eos": True}
    )
    events = iter(stream)
    assert next(events).choices
    # The first event reached the client while the engine still generates the rest: not buffered.
    assert metric(scrape(sim), "vllm:num_requests_running") == 1
    rest = list(events)
    assert len(rest) >= 39
    counted(gateway.router, "lorapool_router_time_to_first_token_seconds_count", 1)


def test_http_door_and_picker_share_one_scheduler(start_sim: StartSim, start_gateway: StartGateway) -> None:
    backends = [start_sim(time_scale=0), start_sim(time_scale=0)]
    gateway = start_gateway(backends, router_extra=["--backend-header"])
    through_envoy = served_by(gateway, "sql")
    direct = client(gateway.router).completions.with_raw_response.create(model="sql", prompt="x", max_tokens=1)
    assert endpoint(direct.headers["x-lorapool-backend"]) == through_envoy  # the same policy, the same books
    counted(gateway.router, "lorapool_router_requests_total", 2, model="sql", code="200")


def test_a_request_is_held_for_a_slot_through_envoy(start_sim: StartSim, start_gateway: StartGateway) -> None:
    sim = start_sim(max_loras=1, time_scale=1)
    gateway = start_gateway([sim], router_extra=["--max-wait", "30"])
    api = client(gateway.url)
    holder = api.completions.create(
        model="sql", prompt="x", max_tokens=40, stream=True, extra_body={"ignore_eos": True}
    )
    assert next(iter(holder)).choices  # "sql" holds the only slot now
    waited = api.completions.create(model="chat", prompt="y", max_tokens=1)
    assert waited.model == "chat"
    for _ in holder:
        pass
    page = scrape(gateway.router)
    assert metric(page, "lorapool_router_decisions_total", kind="queued") == 1
    assert metric(page, "lorapool_router_decisions_total", kind="miss") == 0


def test_a_hold_ends_before_the_gateways_message_timeout(start_sim: StartSim, start_gateway: StartGateway) -> None:
    """--max-wait 30 but Envoy waits 1 s per message: the held request is sent best effort in time."""
    sim = start_sim(max_loras=1, time_scale=1)
    gateway = start_gateway([sim], router_extra=["--max-wait", "30"], message_timeout_s=1.0)
    api = client(gateway.url)
    holder = api.completions.create(
        model="sql", prompt="x", max_tokens=150, stream=True, extra_body={"ignore_eos": True}
    )
    assert next(iter(holder)).choices
    started = time.monotonic()
    sent = api.completions.create(model="chat", prompt="y", max_tokens=1)
    assert sent.model == "chat" and time.monotonic() - started < 20
    holder.close()
    page = scrape(gateway.router)
    assert metric(page, "lorapool_router_decisions_total", kind="queued") == 1
    assert metric(page, "lorapool_router_decisions_total", kind="miss") == 1  # best effort, over the slot


def test_refusals_are_immediate_with_the_http_routers_reasons(start_sim: StartSim, start_gateway: StartGateway) -> None:
    sim = start_sim(max_loras=1, time_scale=1)
    gateway = start_gateway([sim], router_extra=["--max-queued", "0", "--max-body-bytes", "4096"])
    cases = [
        (json.dumps({"model": "no-such-adapter", "prompt": "x"}).encode(), 404, "does not exist"),
        (b"{not json", 400, "not valid JSON"),
        (json.dumps({"prompt": "no model"}).encode(), 400, '"model"'),
        (json.dumps({"model": "sql", "prompt": "x" * 5000}).encode(), 413, "--max-body-bytes"),
    ]
    for body, status, words in cases:
        got, _, raw = post(gateway.url, body)
        assert got == status and words in json.loads(raw)["error"]["message"], (body[:20], raw)
    api = client(gateway.url)
    holder = api.completions.create(
        model="sql", prompt="x", max_tokens=500, stream=True, extra_body={"ignore_eos": True}
    )
    assert next(iter(holder)).choices
    status, headers, raw = post(gateway.url, json.dumps({"model": "chat", "prompt": "y", "max_tokens": 1}).encode())
    assert status == 429 and headers["retry-after"] == "1", raw
    assert "saturated" in json.loads(raw)["error"]["message"]
    holder.close()


def test_no_backend_up_is_an_immediate_503(start_gateway: StartGateway) -> None:
    dead = [f"http://127.0.0.1:{free_port()}"]
    gateway = start_gateway(dead, router_extra=["--connect-timeout", "60"])
    status, headers, raw = post(gateway.url, json.dumps({"model": "sql", "prompt": "x"}).encode())
    assert status == 503 and headers["retry-after"] == "1", raw
    assert "no backend is up" in json.loads(raw)["error"]["message"]


def test_the_subset_hint_is_honoured(start_sim: StartSim, start_gateway: StartGateway) -> None:
    backends = [start_sim(time_scale=0), start_sim(time_scale=0)]
    gateway = start_gateway(backends)
    for target in backends:
        hint = {"x-gateway-destination-endpoint-subset": endpoint(target)}
        for adapter in ("sql", "chat"):
            assert served_by(gateway, adapter, extra_headers=hint) == endpoint(target)
    outside = {"x-gateway-destination-endpoint-subset": f"10.255.255.1:{free_port()}"}
    status, _, raw = post(
        gateway.url,
        json.dumps({"model": "sql", "prompt": "x"}).encode(),
        {**outside, "content-type": "application/json"},
    )
    assert status == 503 and "subset" in json.loads(raw)["error"]["message"], raw


def test_client_disconnect_releases_the_slot(start_sim: StartSim, start_gateway: StartGateway) -> None:
    sim = start_sim(time_scale=1)
    gateway = start_gateway([sim])
    parsed = urlparse(gateway.url)
    body = json.dumps(
        {"model": "sql", "prompt": "go on", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    ).encode()
    with socket.create_connection((parsed.hostname, parsed.port), timeout=10) as sock:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)
        received = b""
        while b"data: " not in received:  # generation has started
            chunk = sock.recv(65536)
            assert chunk, "the gateway closed the stream"
            received += chunk
        assert metric(scrape(gateway.router), "lorapool_router_backend_inflight") == 1
    wait_until(
        "the simulator to stop generating for a client that left",
        lambda: metric(scrape(sim), "vllm:num_requests_running") == 0,
        20,
    )
    counted(gateway.router, "lorapool_router_backend_inflight", 0)
    counted(gateway.router, "lorapool_router_requests_total", 1, model="sql", code="200")


def test_a_backend_killed_mid_request_is_taken_out_of_rotation(
    start_sim: StartSim, start_gateway: StartGateway, processes: dict
) -> None:
    first, second = start_sim(time_scale=20), start_sim(time_scale=20)
    gateway = start_gateway([first, second], router_extra=["--poll-interval", "30"])
    prompt = " ".join(["word"] * 2000)
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(
            client(gateway.url).completions.create, model="sql", prompt=prompt, max_tokens=2, stream=True
        )
        victim = wait_until(
            "a backend to run the request",
            lambda: next((b for b in (first, second) if metric(scrape(b), "vllm:num_requests_running")), None),
        )
        processes[victim].popen.kill()
        processes[victim].popen.wait(10)
        with pytest.raises(openai.APIError):  # Envoy cannot retry an ORIGINAL_DST pick elsewhere
            list(call.result(timeout=60))
    counted(gateway.router, "lorapool_router_backend_inflight", 0)
    survivor = second if victim == first else first
    # The next request for that adapter meets the dead endpoint at most once (Envoy's 503), then the
    # picker has it out of rotation; the poller (30 s here) has not looked yet.
    results = []
    for _ in range(3):
        try:
            results.append(served_by(gateway, "sql"))
        except openai.InternalServerError:
            results.append("503")
    assert results[-1] == endpoint(survivor) and results.count("503") <= 1, results
    assert metric(scrape(gateway.router), "lorapool_router_backend_up", backend=victim) == 0


@pytest.mark.parametrize(
    ("failure_mode", "body_mode", "status"),
    [
        (FailureMode.FAIL_CLOSE, None, 503),
        (FailureMode.FAIL_OPEN, None, 200),  # our gateway config: requests BUFFERED, responses STREAMED
        # Envoy fails open under full duplex only until the first body chunk went to the picker
        # (envoyproxy/envoy#41276): a request sent in one write is past that when the connect fails.
        (FailureMode.FAIL_OPEN, BodyMode.FULL_DUPLEX_STREAMED, 503),
    ],
    ids=["FailClose", "FailOpen", "FailOpen-full-duplex"],
)
def test_picker_down(
    start_sim: StartSim, start_gateway: StartGateway, failure_mode: FailureMode, body_mode: BodyMode | None, status: int
) -> None:
    sim = start_sim(time_scale=0)
    gateway = start_gateway([sim], failure_mode=failure_mode, body_mode=body_mode, picker_port=free_port())
    got, headers, raw = post(gateway.url, json.dumps({"model": "sql", "prompt": "x", "max_tokens": 1}).encode())
    assert got == status, gateway.envoy.proc.output()[-3000:]
    if status == 200:  # the route's fallback: every endpoint of the pool
        assert headers[SERVED] == endpoint(sim) and json.loads(raw)["model"] == "sql"


@pytest.mark.parametrize(("failure_mode", "status"), [(FailureMode.FAIL_OPEN, 200), (FailureMode.FAIL_CLOSE, 503)])
def test_a_picker_killed_under_a_running_gateway(
    start_sim: StartSim,
    start_gateway: StartGateway,
    processes: dict[str, RunningProcess],
    failure_mode: FailureMode,
    status: int,
) -> None:
    """The picker dies while the gateway runs: FailOpen still answers (and streams), FailClose
    answers 503 at once; neither hangs (each request is bounded well under Envoy's message timeout)."""
    sim = start_sim(time_scale=0)
    gateway = start_gateway([sim], failure_mode=failure_mode)
    assert served_by(gateway, "sql") == endpoint(sim)  # picked while it lived
    processes[gateway.router].popen.kill()
    processes[gateway.router].popen.wait(10)
    for _ in range(3):
        started = time.monotonic()
        got, _, _ = post(gateway.url, json.dumps({"model": "sql", "prompt": "x", "max_tokens": 1}).encode())
        assert got == status, gateway.envoy.proc.output()[-3000:]
        assert time.monotonic() - started < MESSAGE_TIMEOUT_S, "a lost picker must not hold a request"
    if failure_mode == FailureMode.FAIL_OPEN:
        stream = client(gateway.url).completions.create(model="sql", prompt="x", max_tokens=4, stream=True)
        assert [c.choices[0].text for c in stream], "a streamed answer through the fallback route"


def test_a_30_mb_body_passes_through_the_picker(start_sim: StartSim, start_gateway: StartGateway) -> None:
    sim = start_sim(time_scale=0)
    gateway = start_gateway([sim], router_extra=["--max-body-bytes", str(40 * 1024 * 1024)])
    padding = "x" * (30 * 1024 * 1024)
    body = json.dumps({"model": "sql", "prompt": "hi", "max_tokens": 1, "user": padding}).encode()
    status, _, raw = post(gateway.url, body)
    assert status == 200 and json.loads(raw)["model"] == "sql", gateway.envoy.proc.output()[-3000:]


def test_tls_verified_by_envoy_with_the_secrets_pair(
    start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
) -> None:
    pair = self_signed()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    sim = start_sim(time_scale=0)
    flags = ["--ext-proc-tls-cert", str(cert), "--ext-proc-tls-key", str(key)]
    gateway = start_gateway([sim], router_extra=flags, picker_ca=str(cert))
    assert served_by(gateway, "sql") == endpoint(sim)
    stranger = self_signed()  # a picker Envoy cannot verify: the request fails closed
    other = tmp_path / "other.crt"
    other.write_bytes(stranger.cert_pem)
    refused = start_gateway([sim], router_extra=flags, picker_ca=str(other))
    got, _, _ = post(refused.url, json.dumps({"model": "sql", "prompt": "x", "max_tokens": 1}).encode())
    assert got == 503  # status_on_error: the pool is unavailable, not broken


def test_grpc_health_on_its_own_plaintext_port(start_gateway: StartGateway, start_sim: StartSim) -> None:
    health_port = free_port()
    sim = start_sim(time_scale=0)
    gateway = start_gateway([sim], router_extra=["--ext-proc-health-port", str(health_port)])
    serving = health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            got = wait_until(
                f"{service} SERVING",
                lambda s=service: stub.Check(health_pb2.HealthCheckRequest(service=s), timeout=5).status == serving,
            )
            assert got
    assert gateway.ext_proc_port != health_port
