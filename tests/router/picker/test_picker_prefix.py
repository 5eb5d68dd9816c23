"""Prefix locality through the gateway door: the picker reads the chat body as the HTTP door does,
so with --prefix-weight a conversation's next turn is picked where its history went, even on the
busier replica; without the flag the pick goes by load (the HTTP door: tests/router/test_prefix_process.py).

Driven by a gRPC client, no Envoy: a request stays in flight until its stream sends the response's
end or is cancelled, so the loads are exactly what the test opened.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.scrape import metric_value as metric
from lorapool_dev.testing.scrape import scrape
from lorapool_dev.testing.wait import wait_until

from ..conftest import BASE, StartRouter, StartSim
from ..test_prefix_process import QUESTION, SYSTEM, Holders, Opened
from .test_picker_grpc import Stream, body, destination, headers, response_headers

pytestmark = pytest.mark.timeout(60)


class Door(NamedTuple):
    stub: Any
    router: str
    backends: list[str]
    prefix: bool  # --prefix-weight given


def chat_body(messages: list[dict[str, str]]) -> Any:
    data = json.dumps({"model": BASE, "messages": messages, "max_tokens": 8}).encode()
    return ext.ProcessingRequest(request_body=ext.HttpBody(body=data, end_of_stream=True))


def picker_holder(stub: Any) -> Callable[[int], Opened]:
    """Picks never answered: each stays in flight until its stream is cancelled."""

    def opener(_: int) -> Opened:
        stream = Stream(stub)
        stream.send(headers(), body(BASE))  # prompt "x": under one block
        return f"http://{destination(stream.answer())}", stream.cancel

    return opener


def turn(stub: Any, router: str, messages: list[dict[str, str]]) -> str:
    """One chat turn picked and run to its end (as Envoy reports it); the backend it was picked for."""
    stream = Stream(stub)
    stream.send(headers(), chat_body(messages))
    endpoint = destination(stream.answer())
    backend = f"http://{endpoint}"
    inflight = lambda: metric(scrape(router), "lorapool_router_backend_inflight", backend=backend)  # noqa: E731
    before = inflight()
    assert stream.answer().HasField("request_body")  # the body, sent back after the pick
    stream.send(response_headers(served=endpoint))
    assert stream.answer().HasField("response_headers")
    stream.send(ext.ProcessingRequest(response_body=ext.HttpBody(body=b"{}", end_of_stream=True)))
    assert stream.answer().HasField("response_body")
    wait_until("the turn's slot released at the response's end", lambda: inflight() == before - 1, 10)
    stream.close()
    return backend


@pytest.fixture
def gateway_door(start_sim: StartSim, start_router: StartRouter, request: Any) -> Iterator[Door]:
    """A router with --ext-proc-port over two simulators, with --prefix-weight when the param says."""
    backends = [start_sim(time_scale=0), start_sim(time_scale=0)]
    port = free_port()
    extra = ["--ext-proc-port", str(port), "--ext-proc-insecure", *(["--prefix-weight"] if request.param else [])]
    router = start_router(backends, extra=extra)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield Door(ext_grpc.ExternalProcessorStub(channel), router, backends, request.param)


@pytest.mark.parametrize("gateway_door", [True, False], ids=["--prefix-weight", "default policy"], indirect=True)
def test_a_conversations_turns_are_picked_where_their_history_is(gateway_door: Door) -> None:
    stub, router, backends, prefix = gateway_door
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    first = turn(stub, router, messages)
    other = next(b for b in backends if b != first)
    holders = Holders(router, picker_holder(stub))
    try:
        holders.load(busy=first, idle=other)
        messages += [
            {"role": "assistant", "content": "1204 orders shipped, 31 of them late."},
            {"role": "user", "content": "And the week before?"},
        ]
        assert turn(stub, router, messages) == (first if prefix else other)
    finally:
        holders.close()
