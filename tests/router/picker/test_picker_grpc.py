"""The picker's stream driven directly by a gRPC client (no Envoy): what the Envoy in
tests/router/test_extproc_envoy.py never does on its own (fallback lists, a fallback that served,
list-valued subset hints, STREAMED mode, a cancel mid-response), against a real router process."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lorapool.api.traffic import AdapterTraffic, RateLimits, TrafficPolicy
from lorapool.router.picker import protocol
from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.scrape import metric_value as metric
from lorapool_dev.testing.scrape import scrape
from lorapool_dev.testing.wait import wait_until

from ..conftest import StartRouter, StartSim

pytestmark = pytest.mark.timeout(60)

FULL_DUPLEX = ext.ProtocolConfiguration(  # both ways, as Envoy says it
    request_body_mode=protocol.FULL_DUPLEX_STREAMED, response_body_mode=protocol.FULL_DUPLEX_STREAMED
)


class Stream:
    """One ext_proc stream: messages in through a queue, answers out, cancellable."""

    def __init__(self, stub: Any) -> None:
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.call = stub.Process(iter(self.outbox.get, None), timeout=30)

    def send(self, *messages: Any) -> None:
        for m in messages:
            self.outbox.put(m)

    def answer(self) -> Any:
        return next(self.call)

    def close(self) -> None:
        """Half-close: the request iterator ends (and grpc's thread reading it with it)."""
        self.outbox.put(None)

    def cancel(self) -> None:
        """What Envoy does when the client leaves."""
        self.call.cancel()
        self.close()


def headers(end_of_stream: bool = False, subset: Any = None, **extra: str) -> Any:
    values = {":method": "POST", ":path": "/v1/completions", "content-type": "application/json", **extra}
    message = ext.ProcessingRequest(
        request_headers=ext.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
            ),
            end_of_stream=end_of_stream,
        ),
        protocol_config=FULL_DUPLEX,
    )
    if subset is not None:
        message.metadata_context.filter_metadata["envoy.lb.subset_hint"].update({protocol.SUBSET_KEY: subset})
    return message


def body(model: str) -> Any:
    data = json.dumps({"model": model, "prompt": "x", "max_tokens": 1}).encode()
    return ext.ProcessingRequest(request_body=ext.HttpBody(body=data, end_of_stream=True))


def response_headers(served: str) -> Any:
    message = ext.ProcessingRequest(
        response_headers=ext.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":status", raw_value=b"200")])
        )
    )
    message.metadata_context.filter_metadata["envoy.lb"].update({protocol.SERVED_KEY: served})
    return message


def destination(answer: Any) -> str:
    """The picked endpoints, checked to be the same in the header and the metadata."""
    common = answer.request_headers.response
    header = common.header_mutation.set_headers[0].header.raw_value.decode()
    assert json_format.MessageToDict(answer.dynamic_metadata)["envoy.lb"][protocol.DESTINATION] == header
    return header


@pytest.fixture
def picker(start_sim: StartSim, start_router: StartRouter) -> Iterator[tuple[Any, str, list[str]]]:
    """A router with --ext-proc-port (plaintext) over two simulators: (stub, router URL, backend endpoints)."""
    backends = [start_sim(time_scale=0), start_sim(time_scale=0)]
    port = free_port()
    router = start_router(
        backends, extra=["--ext-proc-port", str(port), "--ext-proc-insecure", "--ext-proc-fallbacks", "1"]
    )
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield ext_grpc.ExternalProcessorStub(channel), router, [b.removeprefix("http://") for b in backends]


def test_the_pick_lists_a_fallback_and_a_fallback_that_served_carries_the_slot(
    picker: tuple[Any, str, list[str]],
) -> None:
    stub, router, endpoints = picker
    stream = Stream(stub)
    stream.send(headers(), body("sql"))
    primary, fallback = destination(stream.answer()).split(",")
    assert {primary, fallback} == set(endpoints)
    assert stream.answer().request_body.response.body_mutation.streamed_response.end_of_stream  # the body, sent back
    inflight = lambda e: metric(scrape(router), "lorapool_router_backend_inflight", backend=f"http://{e}")  # noqa: E731
    assert inflight(primary) == 1 and inflight(fallback) == 0
    stream.send(response_headers(served=fallback))  # Envoy fell back: the request runs there
    assert stream.answer().HasField("response_headers")
    assert inflight(primary) == 0 and inflight(fallback) == 1
    stream.send(ext.ProcessingRequest(response_body=ext.HttpBody(body=b"{}", end_of_stream=True)))
    assert stream.answer().response_body.response.body_mutation.streamed_response.body == b"{}"
    wait_until("the slot released at the response's end", lambda: inflight(fallback) == 0, 10)
    stream.close()


def test_a_cancelled_stream_releases_its_slot(picker: tuple[Any, str, list[str]]) -> None:
    stub, router, _ = picker
    stream = Stream(stub)
    stream.send(headers(), body("chat"))
    primary = destination(stream.answer()).split(",")[0]
    read = lambda: metric(scrape(router), "lorapool_router_backend_inflight", backend=f"http://{primary}")  # noqa: E731
    assert read() == 1
    stream.cancel()
    wait_until("the slot released on cancel", lambda: read() == 0, 10)


@pytest.mark.parametrize("as_list", [True, False], ids=["list", "string"])
def test_a_subset_hint_restricts_the_pick(picker: tuple[Any, str, list[str]], as_list: bool) -> None:
    stub, _, endpoints = picker
    for target in endpoints:
        stream = Stream(stub)
        stream.send(headers(subset=[target] if as_list else target), body("sql"))
        assert destination(stream.answer()) == target  # no fallback outside the subset
        stream.close()


def test_streamed_mode_needs_the_model_header(picker: tuple[Any, str, list[str]]) -> None:
    stub, _, _ = picker
    streamed = ext.ProtocolConfiguration(request_body_mode=protocol.STREAMED)
    stream = Stream(stub)
    message = headers()
    message.protocol_config.CopyFrom(streamed)
    stream.send(message)
    refused = stream.answer().immediate_response
    assert refused.status.code == 400 and protocol.MODEL_HEADER.encode() in refused.body
    stream.close()
    told = Stream(stub)
    message = headers(**{protocol.MODEL_HEADER: "sql"})
    message.protocol_config.CopyFrom(streamed)
    told.send(message)
    assert destination(told.answer())  # picked at the headers, before any body
    told.close()


def test_readiness_follows_the_backends_and_liveness_does_not(start_router: StartRouter) -> None:
    health_port, port = free_port(), free_port()
    dead = [f"http://127.0.0.1:{free_port()}"]
    start_router(
        dead, extra=["--ext-proc-port", str(port), "--ext-proc-insecure", "--ext-proc-health-port", str(health_port)]
    )
    with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        def status(service: str) -> int:
            return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status)

        wait_until("liveness SERVING", lambda: status("liveness") == health_pb2.HealthCheckResponse.SERVING, 10)
        for service in ("readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            wait_until(
                f"{service} NOT_SERVING", lambda s=service: status(s) == health_pb2.HealthCheckResponse.NOT_SERVING, 10
            )


def test_over_its_rate_limit_the_gateway_door_answers_429_with_the_same_headers(
    start_sim: StartSim, start_router: StartRouter, tmp_path: Path
) -> None:
    traffic = tmp_path / "traffic.json"
    limits = RateLimits(requests_per_second=0.01, burst_requests=1)
    traffic.write_text(TrafficPolicy(adapters={"sql": AdapterTraffic(limits=limits)}).to_json())
    port = free_port()
    router = start_router(
        [start_sim(time_scale=0)],
        extra=["--ext-proc-port", str(port), "--ext-proc-insecure", "--traffic-file", str(traffic)],
    )
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = ext_grpc.ExternalProcessorStub(channel)
        first = Stream(stub)
        first.send(headers(), body("sql"))
        served = destination(first.answer())
        first.answer()  # the body, sent back
        first.send(response_headers(served=served))
        added = {
            h.header.key: h.header.raw_value.decode()
            for h in first.answer().response_headers.response.header_mutation.set_headers
        }
        assert added["x-ratelimit-limit-requests"] == "1" and added["x-ratelimit-remaining-requests"] == "0"
        first.close()
        second = Stream(stub)
        second.send(headers(), body("sql"))
        refused = second.answer().immediate_response
        assert refused.status.code == 429
        sent = {h.header.key: h.header.raw_value.decode() for h in refused.headers.set_headers}
        assert int(sent["retry-after"]) >= 90 and sent["x-ratelimit-remaining-requests"] == "0"
        assert json.loads(refused.body)["error"]["type"] == "RateLimitError"
        second.close()
        other = Stream(stub)
        other.send(headers(), body("chat"))  # not limited
        assert destination(other.answer()) == served
        other.close()
    wait_until(
        "the throttle counted",
        lambda: metric(scrape(router), "lorapool_router_adapter_throttled_total", adapter="sql", limit="requests") == 1,
        10,
    )
